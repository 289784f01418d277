"""End to end over real HTTP: ``kernelab serve`` and ``kernelab runner --once`` as separate
processes on a temp SQLite file; jobs submitted through ``kernelab submit --wait`` and REST."""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, free_port
from kernelab.runners.specfile import load_spec

pytestmark = pytest.mark.slow  # server, runner, `kernelab up`: Python processes

VERDICTS = {"faster", "slower", "same", "inconclusive"}

TINY_SPEC = """\
name: e2e softmax
benchmark: softmax
baseline: {variant: torch}
candidate: {variant: triton}
sweep: {M: [64], N: [1024]}
sweep_by_device:
  cpu: {M: [8], N: [16, 200]}
measurement: {warmup_ms: 1, budget_ms: 150, min_rounds: 4}
probes: {copy_bandwidth: true, all_reduce: true, nvml: true}
timeout_s: 300
"""


def _cli(*args: str, env: dict[str, str], timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
    )


@pytest.fixture
def server(server_for_module: Any) -> tuple[ServerProcess, str]:
    """The shared real server (``tests/conftest.py``: ``live_server``), its queue empty."""
    return server_for_module.process, server_for_module.token


def test_submit_run_and_read_back(server: tuple[ServerProcess, str], tmp_path: Path) -> None:
    srv, token = server
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(TINY_SPEC)
    cpu_cells = load_spec(spec_file).cells("cpu")
    env = {**os.environ, "KERNELAB_SERVER": srv.url, "KERNELAB_TOKEN": token}

    with KernelabClient(srv.url, token) as client:
        # Job 1 through REST (probes off to keep the test short), job 2 through `kernelab submit --wait`.
        no_probes = {"copy_bandwidth": False, "all_reduce": False, "nvml": False}
        rest_job = client.submit({**load_spec(spec_file).model_dump(mode="json"), "probes": no_probes})
        submit = subprocess.Popen(
            [sys.executable, "-m", "kernelab.runners.cli", "submit", str(spec_file), "--wait"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        deadline = time.monotonic() + 60
        while client.list_jobs().count < 2:
            assert time.monotonic() < deadline and submit.poll() is None, submit.communicate()
            time.sleep(0.2)

        runner = _cli(
            "runner", "--once", "--name", "e2e-node", "--work-dir", str(tmp_path / "runner"), env=env
        )
        assert runner.returncode == 0, runner.stderr
        assert "done=2 failed=0" in runner.stderr
        out, err = submit.communicate(timeout=120)
        assert submit.returncode == 0, err
        cli_job_id = int(out.splitlines()[0])
        assert cli_job_id != rest_job.id
        assert "verdicts:" in out and "GB/s" in out  # the table and the probe readings
        assert "succeeded" in err  # progress on stderr

        for job_id, with_probes in ((rest_job.id, False), (cli_job_id, True)):
            job = client.get_job(job_id)
            assert job.status == "succeeded" and job.node == "e2e-node"
            comparison = client.comparison(job_id)
            assert [c.params for c in comparison.cells] == cpu_cells
            assert all(c.verdict in VERDICTS and c.error is None for c in comparison.cells)
            assert sum(comparison.summary.values()) == len(cpu_cells)
            samples = client.samples(job_id)
            n_json = len(samples)
            assert n_json == sum(
                c.baseline.n + c.candidate.n + c.baseline.dropped_throttled + c.candidate.dropped_throttled
                for c in comparison.cells
            )
            assert {s["variant"] for s in samples} == {"baseline", "candidate"}
            assert all(s["duration_ns"] > 0 for s in samples)
            rows = list(csv.DictReader(io.StringIO(client.samples(job_id, fmt="csv"))))
            assert len(rows) == n_json and "duration_ns" in rows[0]
            if with_probes:
                assert [p.phase for p in comparison.probes] == ["before", "after"]
                for report in comparison.probes:
                    assert report.copy_bandwidth[0].bandwidth_gbps > 0
                    assert report.all_reduce and all(r.correct for r in report.all_reduce)
            else:
                assert comparison.probes == []

        nodes = client.request("GET", "/nodes", idempotent=True).json()["data"]
        assert nodes, "the node that measured the jobs is listed"
        stored = [client.get_node(n["name"]) for n in nodes]
        probe_jobs = {p["job_id"] for node in stored for p in node["probes"]}
        assert cli_job_id in probe_jobs  # probe readings stored with the node's history

    report = _cli("report", str(cli_job_id), "--markdown", env=env, timeout_s=60)
    assert report.returncode == 0, report.stderr
    assert "|" in report.stdout and "M=8" in report.stdout


def test_up_runs_the_demo_and_reuses_its_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "kernelab-data"
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(
        TINY_SPEC.replace(
            "probes: {copy_bandwidth: true, all_reduce: true, nvml: true}",
            "probes: {copy_bandwidth: false, all_reduce: false, nvml: false}",
        )
    )
    tokens = []
    for demo_job_id in (1, 2):
        proc = _cli(
            "up",
            "--port",
            str(free_port()),
            "--data-dir",
            str(data_dir),
            "--spec",
            str(spec_file),
            "--exit",
            env=dict(os.environ),
            timeout_s=240,
        )
        assert proc.returncode == 0, proc.stderr + (data_dir / "runner.log").read_text()
        assert "verdicts:" in proc.stdout
        # the URL and token come while the server is up, before the demo's table; with --exit they
        # are not shown again at the end, which says the server has stopped
        out = proc.stdout.splitlines()
        dashboard = [i for i, ln in enumerate(out) if ln.startswith("dashboard")]
        table = next(i for i, ln in enumerate(out) if ln.startswith("verdicts:"))
        assert len(dashboard) == 1 and dashboard[0] < table
        assert out[-1].startswith("server stopped (--exit):"), proc.stdout
        assert "no live runner" not in proc.stderr, proc.stderr  # its own runner starting is said so
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("dashboard"))
        assert line.split()[1].endswith("/login")  # a form: sign-in links are refused
        tokens.append(next(ln for ln in proc.stdout.splitlines() if ln.startswith("token")).split()[1])
        assert f"demo job {demo_job_id}:" in proc.stderr  # the second run reuses the database
        assert "[1/2] cell 1/2" in proc.stderr and "[2/2] cell 2/2" in proc.stderr  # progress per cell
        assert proc.stderr.count("[1/2] cell 1/2") == 1, proc.stderr  # this job's, not the last run's
    assert tokens[0] == tokens[1] == (data_dir / "admin-token").read_text().strip()


def test_up_prints_a_url_that_answers_and_again_while_it_serves(tmp_path: Path) -> None:
    """Without --exit: the dashboard URL is printed as soon as the server answers (a GET on it then
    succeeds, before the demo is done), the waiting message names the local runner starting, and
    after the table the URL and token come again while the server still serves; SIGTERM stops it."""
    import signal

    import httpx

    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(TINY_SPEC.replace("all_reduce: true", "all_reduce: false"))
    argv = [sys.executable, "-m", "kernelab.runners.cli", "up", "--port", str(free_port()),
            "--data-dir", str(tmp_path / "data"), "--spec", str(spec_file)]  # fmt: skip
    err_path = tmp_path / "up.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
    assert proc.stdout is not None
    try:
        lines: list[str] = []
        while not lines or not lines[-1].startswith("dashboard"):
            lines.append(proc.stdout.readline().rstrip("\n"))
            assert lines[-1] or proc.poll() is None, err_path.read_text()
        url = lines[-1].split()[1]
        assert httpx.get(url, timeout=10).status_code == 200  # usable when printed
        assert "verdicts:" not in "\n".join(lines)  # printed before the demo's table
        while not lines[-1].startswith("token") or sum(ln.startswith("dashboard") for ln in lines) < 2:
            lines.append(proc.stdout.readline().rstrip("\n"))
            assert lines[-1] or proc.poll() is None, err_path.read_text()
        assert "verdicts:" in "\n".join(lines)
        assert httpx.get(url, timeout=10).status_code == 200  # still served after the table
        _wait_until(lambda: "serving; Ctrl-C to stop" in err_path.read_text(), 30)
        stderr = err_path.read_text()
        assert "starting the local runner" in stderr and "no live runner" not in stderr, stderr
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    assert proc.returncode == 0, err_path.read_text()


NOT_OFFERED_MODULE = """\
from pydantic import Field

from kernelab.kernels import Benchmark, Params


class NParams(Params):
    N: int = Field(gt=0)


class Bench(Benchmark[NParams]):
    name, Params, variants = "kl_up_nobody", NParams, ("a", "b")

    def make_inputs(self, params, device, seed): raise RuntimeError("never run")
    def prepare(self, variant, params, inputs): return lambda: None
    def reference(self, params, inputs): return None
    def work(self, params, variant): return None
"""


def test_up_says_when_its_runner_does_not_offer_the_spec_benchmark(tmp_path: Path) -> None:
    """``up --spec`` naming a module beside the spec, which the local runner does not import (it
    does not import from the current or the spec's folder): first "starting the local runner…",
    then, once the runner serves, the server's reason (no live runner advertises it), and exit 3
    after --timeout-s with the server stopped."""
    (tmp_path / "kl_up_nobody.py").write_text(NOT_OFFERED_MODULE, encoding="utf-8")
    spec_file = tmp_path / "nobody.yaml"
    spec_file.write_text("benchmark: kl_up_nobody:Bench\nbaseline: {variant: a}\ncandidate: {variant: b}\n"
                         "sweep: {N: [4]}\ndevice: cpu\n")  # fmt: skip
    args = ["--data-dir", str(tmp_path / "data"), "--spec", str(spec_file), "--exit", "--timeout-s", "3"]
    proc = _cli("up", "--port", str(free_port()), *args, env=dict(os.environ), timeout_s=240)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    err = proc.stderr
    assert err.index("starting the local runner") < err.index("no live runner advertises it"), err
    assert "still queued after 3 s" in err
    assert proc.stdout.splitlines()[-1].startswith("server stopped (--exit):"), proc.stdout


def _wait_until(predicate: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
