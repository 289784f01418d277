"""A job's children fork from one warm process (``kernelab.runners.forkserver``): the probes
before, the cells and the probes after each run in a child of their own, as fresh of benchmark
code as a new interpreter, and a child that overruns, fails or cannot load its benchmark is
reported as before. A server that dies leaves the job to start its children cold."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from test_job import double_spec

from kernelab.kernels import BenchmarkError
from kernelab.runners import forkserver
from kernelab.runners.children import MeasureError, _child_env, measure_in_child, probes_in_child
from kernelab.runners.job import run_job

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PROBES = {"copy_bandwidth": True, "all_reduce": True, "nvml": True}


def test_a_job_with_probes_forks_its_three_children_from_one_server(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[forkserver.ForkServer] = []
    real = forkserver.ForkServer.__init__

    def remember(self: forkserver.ForkServer, env: dict[str, str]) -> None:
        real(self, env)
        made.append(self)

    monkeypatch.setattr(forkserver.ForkServer, "__init__", remember)
    result = run_job(double_spec(probes=PROBES))
    assert [p.phase for p in result.probes] == ["before", "after"]
    assert all(p.errors == {} for p in result.probes), [p.errors for p in result.probes]
    assert all(p.all_reduce and all(r.correct for r in p.all_reduce) for p in result.probes)
    assert result.error is None and len(result.cells) == 1
    (server,) = made
    assert server.forked == 3 and not server.alive()  # probes, cells, probes; closed with the job
    assert forkserver.active() is None


def test_a_job_without_probes_starts_one_plain_child(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("no fork server for a single child")

    monkeypatch.setattr(forkserver.ForkServer, "__init__", refuse)
    assert run_job(double_spec()).error is None


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def test_an_overrunning_child_is_killed_and_the_server_serves_the_next() -> None:
    spec = double_spec(params={"n": 64}, measurement={"warmup_ms": 1.0, "budget_ms": 60_000.0,
                       "min_rounds": 3, "max_rounds": 100_000, "target_ci_pct": 0.0001,
                       "stop_rule": "target-ci"})  # fmt: skip
    with forkserver.ForkServer(_child_env()) as server:
        t0 = time.monotonic()
        with pytest.raises(MeasureError, match="timed out"):
            measure_in_child(spec, device="cpu", timeout_s=3.0)
        assert time.monotonic() - t0 < 20
        assert _children(server.proc.pid) == []  # the child and its group are gone
        cells, _node, _timer = measure_in_child(double_spec(), device="cpu", timeout_s=120)
        assert len(cells) == 1 and server.forked == 2


def test_a_benchmark_that_cannot_load_is_reported_through_the_server() -> None:
    with forkserver.ForkServer(_child_env()), pytest.raises(BenchmarkError, match="no_such_module"):
        measure_in_child(double_spec(benchmark="no_such_module:Bench"), device="cpu", timeout_s=120)


def test_a_dead_server_leaves_the_children_to_start_cold(capfd: pytest.CaptureFixture[str]) -> None:
    with forkserver.ForkServer(_child_env()) as server:
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        spec = double_spec(probes=PROBES)
        reports = probes_in_child(spec, phase="before", device_type="cpu", timeout_s=120)
        assert reports[0].errors == {} and reports[0].copy_bandwidth
        assert server.forked == 0


def test_the_server_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    """A job's process killed with -9 leaves no fork server behind (its death signal, and the end
    of its control socket)."""
    code = (
        "import sys, time\n"
        "from kernelab.runners import forkserver\n"
        "from kernelab.runners.children import _child_env\n"
        "server = forkserver.ForkServer(_child_env())\n"
        "print(server.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    with subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) as parent:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        time.sleep(1.0)  # the server has set its death signal (its first statement) by now
        parent.kill()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(server_pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"fork server {server_pid} outlived its parent")


STOPPER = """
import os, signal, time
import torch
import kernelab

bench = kernelab.benchmark("stopper", params={"n": 64})


@bench.inputs
def inputs(p, device, seed):
    return {"x": torch.randn(p.n, generator=torch.Generator().manual_seed(seed)).to(device)}


@bench.prepared("stop")
def stop(p, x):
    os.kill(os.getppid(), signal.SIGSTOP)  # the process that forked this one: the fork server
    time.sleep(600)
    return lambda: torch.neg(x)


@bench.variant("plain")
def plain(p, x):
    return -x


@bench.reference
def reference(p, x):
    return -x.double()


@bench.work
def work(p, variant):
    return kernelab.Work(bytes_read=4 * p.n, bytes_written=4 * p.n)
"""


def test_a_child_that_stops_its_server_still_ends_at_the_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Benchmark code that SIGSTOPs the fork server (which would never report its child's end) and
    hangs: the job's timeout still ends the wait, the server is killed with the child, and the
    job's next child starts cold."""
    (tmp_path / "kl_stopper.py").write_text(STOPPER, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = double_spec(benchmark="kl_stopper:bench", baseline={"variant": "stop"},
                       candidate={"variant": "plain"}, params={"n": 64})  # fmt: skip
    with forkserver.ForkServer(_child_env()) as server:
        t0 = time.monotonic()
        with pytest.raises(MeasureError, match="timed out"):
            measure_in_child(spec, device="cpu", timeout_s=3.0)
        assert time.monotonic() - t0 < 3.0 + 2 * 5.0 + 10  # timeout, TERM and KILL grace, slack
        assert not server.alive() and forkserver.active() is None
        cells, _node, _timer = measure_in_child(double_spec(), device="cpu", timeout_s=120)  # cold
        assert len(cells) == 1 and server.forked == 1


def test_a_server_too_slow_to_fork_leaves_the_job_to_cold_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server whose imports outlast the fork wait (a loaded node) is killed, and the job's
    children start cold: the job succeeds, no child is forked later from the queued request."""
    monkeypatch.setattr(forkserver, "_START_TIMEOUT_S", 0.001)
    result = run_job(double_spec(probes=PROBES))
    assert result.error is None and len(result.cells) == 1
    assert all(p.errors == {} for p in result.probes), [p.errors for p in result.probes]


def test_poll_of_a_running_child_is_none() -> None:
    spec = double_spec(measurement={"warmup_ms": 1.0, "budget_ms": 3_000.0, "min_rounds": 3,
                       "max_rounds": 100_000, "target_ci_pct": 0.0001, "stop_rule": "target-ci"})  # fmt: skip
    with forkserver.ForkServer(_child_env()) as server, tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp, "spec.json"), Path(tmp, "out.json")
        spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
        with Path(tmp, "err").open("w") as err:
            child = server.spawn(["cells", str(spec_path), str(out_path), "--device", "cpu"], err)
            assert child.poll() is None  # running (Popen.poll's answer), not an error
            assert child.wait(timeout=120) == 0 and child.poll() == 0
            assert child.stdout is not None
            child.stdout.close()
