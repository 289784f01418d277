"""Workload jobs on this machine: the reporting API's records (files per rank, stdout lines),
torchrun's command line, a run's timeout, the spec's errors with their lines, and the example under
real ``torchrun`` with two gloo ranks through ``kernelab run`` (a rank killed mid-way)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

import kernelab.workload as kw
from kernelab.runners.specfile import SpecFileError, load_any_spec
from kernelab.runners.workload import torchrun_command
from kernelab.runners.workload.launch import Rendezvous, launch
from kernelab.runners.workload.records import bounded_log, read_records
from kernelab.service.contract.schemas import (
    DigestRecord,
    LaunchSpec,
    MetricRecord,
    PhaseRecord,
    WorkloadSide,
    WorkloadSpec,
)

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "workload"


@pytest.fixture
def records_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(kw.ENV_RECORDS, str(tmp_path))
    monkeypatch.setenv("RANK", "3")
    return tmp_path


def test_records_reach_the_rank_file_and_read_back(records_dir: Path) -> None:
    with kw.phase("rollout"):
        pass
    kw.metric("tokens_per_s", 12.5, unit="tok/s")
    x = torch.tensor([[1.0, -2.5], [3.25, 0.0]], dtype=torch.bfloat16)
    sha = kw.digest("logprobs", x)
    (recs, bad) = read_records(records_dir, "")
    assert bad == 0 and (records_dir / "rank-3.jsonl").exists()
    phase, metric, digest = recs
    assert isinstance(phase, PhaseRecord) and phase.rank == 3 and phase.seconds >= 0
    assert isinstance(metric, MetricRecord) and (metric.value, metric.unit, metric.better) == (
        12.5,
        "tok/s",
        "higher",
    )
    assert isinstance(digest, DigestRecord) and digest.sha256 == sha and digest.shape == [2, 2]
    assert digest.dtype == "bfloat16"
    assert digest.values_b64 is not None
    import base64

    back = np.frombuffer(base64.b64decode(digest.values_b64), dtype="<f8")
    assert back.tolist() == [1.0, -2.5, 3.25, 0.0]  # bf16 values exactly


def test_digest_past_the_cap_keeps_the_fingerprint_only(
    records_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(kw.ENV_DIGEST_MAX_BYTES, "16")
    a, b = torch.arange(8, dtype=torch.float32), torch.arange(8, dtype=torch.float32)
    b[5] = float(np.nextafter(np.float32(5), np.float32(6)))
    assert kw.digest("x", a) != kw.digest("x", b)  # one ulp apart: different fingerprints
    recs, _ = read_records(records_dir, "")
    assert all(isinstance(r, DigestRecord) and r.values_b64 is None for r in recs)


def test_a_torn_last_line_is_counted_and_the_others_kept(records_dir: Path) -> None:
    kw.metric("m", 1.0)
    with (records_dir / "rank-3.jsonl").open("a") as f:
        f.write('{"kernelab":1,"type":"metric","name":"m","val')  # a rank killed mid-write
    recs, bad = read_records(records_dir, "")
    assert len(recs) == 1 and bad == 1


def test_stdout_lines_for_a_workload_without_kernelab(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != kw.ENV_RECORDS}
    code = "from kernelab.workload import metric; metric('loss', 0.5, better='lower')"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    hand_written = '[rank1]: {"kernelab": 1, "type": "phase", "name": "train", "rank": 1, "seconds": 2.0}'
    recs, bad = read_records(None, out + "noise\n" + hand_written + "\n")
    assert bad == 0
    assert [(r.type, r.name, r.rank) for r in recs] == [("metric", "loss", 0), ("phase", "train", 1)]


def test_metric_refuses_non_finite() -> None:
    with pytest.raises(ValueError, match="not finite"):
        kw.metric("m", float("nan"))


def test_torchrun_command_forms() -> None:
    one = LaunchSpec(nproc_per_node=2)
    py = torchrun_command(WorkloadSide(command=["train.py", "--x"], args=["1"]), one)
    assert (
        py[1:3] == ["-m", "torch.distributed.run"]
        and "--standalone" in py
        and py[-3:] == ["train.py", "--x", "1"]
    )
    prog = torchrun_command(WorkloadSide(command=["bash", "run.sh"]), one)
    assert prog[-3:] == ["--no-python", "bash", "run.sh"]
    fn = torchrun_command(WorkloadSide(function="pkg.mod:main", args=["a"]), one)
    assert fn[-4:] == ["-m", "kernelab.runners.workload.call", "pkg.mod:main", "a"]
    two = LaunchSpec(nproc_per_node=1, nnodes=2)
    with pytest.raises(ValueError, match="rendezvous"):
        torchrun_command(WorkloadSide(command=["t.py"]), two)
    multi = torchrun_command(WorkloadSide(command=["t.py"]), two, Rendezvous("127.0.0.1:29400", "job7", 1))
    assert "--standalone" not in multi
    assert multi[multi.index("--rdzv-endpoint") + 1] == "127.0.0.1:29400"
    assert multi[multi.index("--node-rank") + 1] == "1"


@pytest.mark.parametrize(
    ("side", "match"),
    [
        ({"command": ["a.py"], "function": "m:f"}, "exactly one"),
        ({}, "exactly one"),
        ({"command": ["a.py"], "env": {"CUDA_VISIBLE_DEVICES": "0"}}, "set by the runner"),
        ({"command": ["a.py"], "env": {"KERNELAB_TOKEN": "x"}}, "set by the runner"),
        ({"function": "os:system"}, "standard library"),
    ],
)
def test_spec_refuses_bad_sides(side: dict[str, object], match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        WorkloadSpec.model_validate(
            {"kind": "workload", "baseline": side, "candidate": {"command": ["b.py"]}}
        )


def test_spec_file_problem_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("kind: workload\nbaseline:\n  command: [a.py]\ncandidate:\n  command: [b.py]\nruns: 0\n")
    with pytest.raises(SpecFileError) as err:
        load_any_spec(path)
    assert f"{path}:6: runs:" in err.value.render()
    assert isinstance(load_any_spec(EXAMPLE / "workload.yaml"), WorkloadSpec)


def test_a_run_past_its_timeout_is_killed_with_its_group(tmp_path: Path) -> None:
    done = launch(
        ["sh", "-c", "echo started; sleep 30 & wait"],
        dict(os.environ),
        timeout_s=0.5,
        log_path=tmp_path / "log",
    )
    assert (done.outcome, done.exit_code) == ("timeout", None)
    assert "started" in done.output and done.wall_s < 20
    assert "left out" in bounded_log("x" * 5000, 1024) and len(bounded_log("x" * 5000, 1024)) < 1100


def _run_killed_example(folder: Path) -> tuple[Any, dict[str, Any], dict[str, Any], Path, bool, list[str]]:
    """``kernelab run`` of the example with one candidate run's last rank killed, in ``folder``:
    (process, result JSON, comparison JSON, Markdown path, outcomes as expected, logs of the runs
    that did not end ok)."""
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / "died"
    spec = folder / "w.yaml"
    spec.write_text(
        (EXAMPLE / "workload.yaml")
        .read_text()
        .replace("runs: 5", "runs: 2")
        .replace(
            'args: [--attention, math, --steps, "2"]',
            f'args: [--attention, math, --steps, "2"]\n  env: {{EXAMPLE_DIE_ONCE: "{marker}"}}',
        )
        .replace("run_timeout_s: 120", "run_timeout_s: 400")
    )
    out = folder / "c.json"
    res = folder / "r.json"
    md = folder / "c.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelab",
            "run",
            str(spec),
            "--json",
            str(out),
            "--result",
            str(res),
            "--markdown",
            str(md),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1100,
    )
    if proc.returncode != 0 or not res.exists() or not out.exists():  # the caller tries once more
        return proc, {}, {}, md, False, [f"kernelab run exited {proc.returncode}: {proc.stderr[-3000:]}"]
    result, comparison = json.loads(res.read_text()), json.loads(out.read_text())
    outcomes = [r["outcome"] for r in result["runs"]]
    logs = [f"{r['side']} {r['outcome']}: {r['log'][-1500:]}" for r in result["runs"] if r["outcome"] != "ok"]
    return (
        proc,
        result,
        comparison,
        md,
        sorted(outcomes) == ["crashed", "ok", "ok", "ok"] and marker.exists(),
        logs,
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_kernelab_run_example_two_gloo_ranks_with_a_rank_killed(tmp_path: Path) -> None:
    """Acceptance 1 (CPU): the example under torchrun (2 ranks, gloo), one run's last rank killed by
    SIGKILL mid-step: recorded as crashed with its log and the records its ranks finished; the job
    completes with phase verdicts, per-rank times and the consistency table."""
    proc, result, comparison, md, expected, logs = _run_killed_example(tmp_path / "try1")
    if not expected:
        # Under load a gloo rank sometimes aborted at exit after writing all its records (SIGABRT in
        # the group's teardown; the example now meets a barrier before destroying its group), so
        # a second run read crashed, or the job failed. One more try, in a fresh folder: a real
        # defect fails both, and the message carries both tries' logs.
        first = logs
        proc, result, comparison, md, expected, logs = _run_killed_example(tmp_path / "try2")
        assert expected, "first try:\n" + "\n".join(first) + "\nsecond try:\n" + "\n".join(logs)
    crashed = next(r for r in result["runs"] if r["outcome"] == "crashed")
    assert crashed["side"] == "candidate" and crashed["log"]
    assert {(r["name"], r["rank"]) for r in crashed["records"] if r["type"] == "phase"} >= {("rollout", 1)}
    phases = {q["name"]: q for q in comparison["quantities"] if q["kind"] == "phase"}
    assert list(phases) == ["rollout", "log_probs", "actor_train", "step"]
    for q in phases.values():
        assert q["verdict"] == "inconclusive" and q["reasons"][0]["code"] == "too-few-runs"
        assert {r["side"] for r in q["ranks"]} == {"baseline", "candidate"}
        assert all(set(r["medians_s"]) == {"0", "1"} for r in q["ranks"])
    arms = next(r for r in comparison["consistency"] if r["against"] == "arms")
    assert arms["elements"] == 2 * 4 * 8 and arms["mismatches"] is not None
    same_arm = next(r for r in comparison["consistency"] if r["against"] == "runs")
    assert same_arm["bitwise_equal"] is True  # same seeds, same arm: the same log-probs
    text = proc.stdout
    assert "Phases and metrics" in text and "Consistency" in text and "crashed" in text
    assert "| metric | baseline | candidate |" in md.read_text()


def test_validate_a_workload_spec_and_name_the_line_of_a_problem(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelab.runners.cli import app

    ok = CliRunner().invoke(app, ["validate", str(EXAMPLE / "workload.yaml")])
    assert ok.exit_code == 0 and "ok: workload" in ok.output and "10 runs of 2 rank(s)" in ok.output
    bad = tmp_path / "w.yaml"
    bad.write_text(
        "kind: workload\nbaseline:\n  command: [a.py]\n  env: {RANK: '1'}\ncandidate:\n  function: m:f\n"
    )
    out = CliRunner().invoke(app, ["validate", str(bad)])
    assert out.exit_code == 2 and f"{bad}:4: baseline.env.RANK" in out.output


def test_a_timeout_also_ends_processes_in_sessions_of_their_own(tmp_path: Path) -> None:
    """torchrun starts ranks with ``start_new_session``: killing its group alone would leave them."""
    pid_file = tmp_path / "pid"
    code = (
        "import subprocess, time; "
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(300)"
    )
    done = launch([sys.executable, "-c", code], dict(os.environ), timeout_s=8.0, log_path=tmp_path / "log")
    assert done.outcome == "timeout"
    rank = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _running(rank):
        assert time.monotonic() < deadline, f"process {rank} in its own session outlived the run's timeout"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """``pid`` exists and is no zombie (a killed child whose parent died waits for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def test_submit_of_a_workload_spec_checks_it_and_refuses_revision_refs(tmp_path: Path) -> None:
    """``kernelab submit`` reads a workload spec as one (a problem names its line, exit 2) and
    sends it (an unreachable server: exit 3); ``--baseline-ref`` is for benchmark specs (exit 2)."""
    from typer.testing import CliRunner

    from kernelab.runners.cli import app

    example = str(EXAMPLE / "workload.yaml")
    out = CliRunner().invoke(app, ["submit", example, "--server", "http://127.0.0.1:9", "--token", "t" * 20])
    assert out.exit_code == 3 and "server unreachable" in out.output, out.output
    refs = CliRunner().invoke(
        app, ["submit", example, "--baseline-ref", "main", "--server", "http://127.0.0.1:9"]
    )
    assert refs.exit_code == 2 and "--baseline-ref" in refs.output
    bad = tmp_path / "bad.yaml"
    bad.write_text((EXAMPLE / "workload.yaml").read_text().replace("runs: 5", "runs: 0"))
    out = CliRunner().invoke(app, ["submit", str(bad), "--server", "http://127.0.0.1:9"])
    assert out.exit_code == 2 and "runs" in out.output and "bad.yaml:" in out.output, out.output
