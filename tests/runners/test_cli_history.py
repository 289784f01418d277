"""``kernelab history`` and ``kernelab compare-jobs`` against a real server over real HTTP: a planted
slowdown is printed as a change point with the jobs on both sides, the JSON file holds what the
REST endpoint answers, filters narrow the lines, job vs job prints the verdict and gates on it,
and bad input is one line with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import history_seed
import httpx
import pytest
from servers import serve_process
from typer.testing import CliRunner

from kernelab.runners.cli import app
from kernelab.runners.client import KernelabAPIError, KernelabClient, is_settled

GPU = "CLI-HISTORY-GPU"  # a model no other test's node has: the lines are this module's


def _cli(server: tuple[str, str], *args: str):  # type: ignore[no-untyped-def]
    url, token = server
    return CliRunner().invoke(app, [*args, "--server", url, "--token", token])


def test_history_prints_the_planted_change_point_and_writes_json(
    server: tuple[str, str], tmp_path: Path
) -> None:
    url, token = server
    jobs = history_seed.seed(url, token, [1000.0] * 4 + [1500.0] * 4, node="cli-history-node", gpu_model=GPU,
                             baseline_ns=1000.0)  # fmt: skip
    history_seed.wait_compared(url, token, jobs)
    out = tmp_path / "history.json"
    r = _cli(server, "history", "softmax", "--gpu", GPU, "--cell", "M=4", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "change point +" in r.output and f"jobs #{jobs[3]} -> #{jobs[4]}" in r.output
    assert "PELT" in r.output
    page = json.loads(out.read_text())
    assert {s["gpu_model"] for s in page["series"]} == {GPU}
    lines = {s["code"]: s for s in page["series"]}
    assert lines["triton"]["change_points"][0]["job_after"] == jobs[4]  # the candidate's own step
    assert lines["torch"]["change_points"] == []  # the baseline every job ran did not move
    none = _cli(server, "history", "softmax", "--gpu", GPU, "--cell", "M=99999")
    assert none.exit_code == 0 and "no line to show" in none.output

    vs = tmp_path / "vs.json"
    r = _cli(server, "compare-jobs", str(jobs[0]), str(jobs[-1]), "--json", str(vs))
    assert r.exit_code == 1, r.output  # the default gate (failed, incorrect, slower) holds the slowdown
    assert "slower" in r.output and "cli-history-node" in r.output
    assert json.loads(vs.read_text())["cells"][0]["verdict"] == "slower"
    gated = _cli(server, "compare-jobs", str(jobs[0]), str(jobs[-1]), "--fail-on", "slower")
    assert gated.exit_code == 1 and "M=4, N=64: slower" in gated.output


def test_bad_input_is_one_line_and_exit_2(server: tuple[str, str]) -> None:
    url, token = server
    r = _cli(server, "history", "softmax", "--cell", "M")
    assert r.exit_code == 2 and "--cell: expected k=v" in r.output
    # A job of this test's own, compared, so the unknown one is the only fault (not job 1's state).
    (job,) = history_seed.seed(url, token, [1000.0], node="cli-history-bad-node", gpu_model=GPU)
    history_seed.wait_compared(url, token, [job])
    r = _cli(server, "compare-jobs", str(job), "999999999")
    assert r.exit_code == 2 and "no job #999999999" in r.output and "Traceback" not in r.output
    r = _cli(server, "compare-jobs", "1", "2", "--side", "both")
    assert r.exit_code == 2 and "--side" in r.output


def test_client_wait_returns_the_settled_job_and_times_out_naming_its_state(server: tuple[str, str]) -> None:
    url, token = server
    (job_id,) = history_seed.seed(url, token, [1000.0], node="cli-history-wait-node", gpu_model=GPU)
    with KernelabClient(url, token) as client:
        job = client.wait(job_id, timeout_s=300, poll_s=0.05)
        assert is_settled(job) and job.status == "succeeded"
        assert client.comparison(job_id).cells  # no 409: the comparison is there
        queued = client.submit(history_seed.spec("never claimed")).id
        try:
            with pytest.raises(TimeoutError, match=f"job {queued} still queued after 0.2 s"):
                client.wait(queued, timeout_s=0.2, poll_s=0.05)
        finally:
            client.cancel(queued)  # the next seed's claim must get its own job
        with pytest.raises(KernelabAPIError) as unknown:
            client.wait(999_999_999, timeout_s=5)
        assert unknown.value.status_code == 404


@pytest.mark.slow  # a server process of its own (its inline bound)
@pytest.mark.timeout(600)
def test_a_large_pair_is_computed_by_the_compare_worker_and_the_cli_waits_for_it(tmp_path: Path) -> None:
    """``kernelab serve`` (with its compare worker) whose inline bound every pair exceeds: REST
    answers 202, ``compare-jobs`` waits for the worker's answer and prints it; with no time to
    wait it exits 3 naming the pair."""
    token = "large-pair-admin-token-0123456789abcdef"
    env = {"KERNELAB_ADMIN_TOKEN": token, "KERNELAB_JOB_VS_JOB_INLINE_SAMPLES": "10"}
    with serve_process(tmp_path, env) as (_, url, _log):
        jobs = history_seed.seed(url, token, [1000.0, 1500.0], node="large-pair-node", gpu_model=GPU,
                                 baseline_ns=1000.0)  # fmt: skip
        history_seed.wait_compared(url, token, jobs)
        first = httpx.get(f"{url}/api/v1/compare", params={"a": jobs[0], "b": jobs[1], "side": "baseline"},
                          headers={"Authorization": f"Bearer {token}"})  # fmt: skip
        assert first.status_code == 202 and first.json()["status"] == "comparing"
        r = _cli((url, token), "compare-jobs", str(jobs[0]), str(jobs[1]), "--wait", "0")
        assert r.exit_code == 3 and f"job #{jobs[1]} against job #{jobs[0]}: still being compared" in r.output
        r = _cli((url, token), "compare-jobs", str(jobs[0]), str(jobs[1]), "--wait", "300")
        assert r.exit_code == 1, r.output  # computed, and the default gate holds the slower cell
        assert "slower" in r.output and "large-pair-node" in r.output
