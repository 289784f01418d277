"""The runner's parts behind the node drills (``tests/service/test_fault_drills_node.py``,
``test_fault_drills_host.py``), each on its own: what counts as a fault of the node, the worker
under a real file-descriptor limit, the reaper, the registry of the host's runners, the namespace's
hide list, the daemon that claims nothing while a measured result is not posted (a real server,
its result posts refused in the client's transport), and a shutdown that keeps what it holds."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernelab.runners import jobns
from kernelab.runners.client import KernelabClient
from kernelab.runners.daemon import RunnerDaemon
from kernelab.runners.daemon.host import HostRunners
from kernelab.runners.daemon.keep import keep_at_shutdown
from kernelab.runners.local import ServerProcess, admin_token, free_port
from kernelab.runners.nodefault import (
    EXIT_NODE_FAULT,
    NODE_FAULT_LINE,
    NodeFault,
    node_fault,
    node_fault_text,
)
from kernelab.runners.reaper import descendants
from kernelab.runners.worker import RESULT_MARK
from kernelab.service.contract.schemas import JobResult, JobSpec

NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False}


def _spec(benchmark: str = "softmax", budget_ms: float = 300.0) -> JobSpec:
    return JobSpec.model_validate({
        "name": "node-faults", "benchmark": benchmark, "baseline": {"variant": "torch"},
        "candidate": {"variant": "triton"}, "sweep": {"M": [8], "N": [16]}, "device": "cpu",
        "measurement": {"warmup_ms": 1, "budget_ms": budget_ms, "min_rounds": 4}, "probes": NO_PROBES,
        "timeout_s": 120,
    })  # fmt: skip


def _result(job_id: int, key: str = "node-faults-0001") -> JobResult:
    t0 = datetime(2026, 12, 4, tzinfo=UTC).isoformat()
    return JobResult.model_validate({
        "idempotency_key": key, "job_id": job_id, "spec": _spec().model_dump(mode="json"),
        "node": {"hostname": "n", "device_type": "cpu"}, "timer": "perf_counter", "started_at": t0,
        "finished_at": t0, "cells": [], "error": "no cells",
    })  # fmt: skip


def test_a_node_fault_is_found_in_the_exception_its_chain_and_its_text() -> None:
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/w/jobs/1-1/result.json")
    assert node_fault(full).startswith("ENOSPC: [Errno 28] No space left on device")
    try:
        try:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        except OSError as exc:
            raise RuntimeError("importing the benchmark failed") from exc
    except RuntimeError as chained:
        assert node_fault(chained).startswith("EMFILE: ")
    # the text of an error that crossed a process: a side worker's answer, git's message
    assert node_fault(RuntimeError("candidate: OSError: [Errno 122] Disk quota exceeded"))
    assert node_fault_text("fatal: write error: No space left on device\nmore") == (
        "fatal: write error: No space left on device"
    )
    assert node_fault(NodeFault("the measurement process could not write on this node: x"))
    # the job's own faults stay the job's: a read-only home, a missing file, its own ValueError
    for own in (OSError(errno.EROFS, "Read-only file system"), FileNotFoundError(2, "nope"), ValueError("x")):
        assert node_fault(own) == "", own


def test_the_worker_under_a_file_descriptor_limit_reports_a_node_fault(tmp_path: Path) -> None:
    """A real limit (``prlimit --nofile``): the benchmark's inputs open more files than the node
    allows, the cell fails with EMFILE, the worker exits 4 and hands no result over."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "fdbench.py").write_text(textwrap.dedent('''
        from kernelab.kernels.softmax import SoftmaxBenchmark

        class FdHungry(SoftmaxBenchmark):
            name = "fd-hungry"

            def make_inputs(self, params, device, seed):
                self._files = [open(__file__) for _ in range(200)]  # more than the node allows
                return super().make_inputs(params, device, seed)
    '''))  # fmt: skip
    spec_file, out = tmp_path / "spec.json", tmp_path / "result.json"
    spec_file.write_text(_spec("fdbench:FdHungry").model_dump_json())
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(mods), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        ["prlimit", "--nofile=128:128", sys.executable, "-P", "-m", "kernelab.runners.worker", str(spec_file),
         str(out), "--job-id", "7", "--idempotency-key", "node-faults-0007"],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == EXIT_NODE_FAULT, done.stderr[-3000:]
    [said] = [line for line in done.stdout.splitlines() if line.startswith(NODE_FAULT_LINE)]
    assert "[Errno 24] Too many open files" in said and said.startswith(NODE_FAULT_LINE + "cell 0: ")
    assert "worker: node fault: cell 0:" in done.stderr
    assert not out.exists() and RESULT_MARK not in done.stdout  # not this job's result: measured again


def test_kill_descendants_reaps_a_setsid_grandchild(tmp_path: Path) -> None:
    """A subreaper (``PR_SET_CHILD_SUBREAPER``) catches a process whose parent exits at once, in a
    session of its own, and ``kill_descendants`` kills and reaps it."""
    pid_file = tmp_path / "pid"
    leave = (
        "import subprocess; p = subprocess.Popen(['setsid', 'sleep', '600']); "
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))"
    )
    code = "\n".join([
        "import os, subprocess, sys",
        "from kernelab.runners.reaper import become_subreaper, descendants, kill_descendants",
        "assert become_subreaper()",
        f"subprocess.run([sys.executable, '-c', {leave!r}], check=True)  # its parent is gone at once",
        f"pid = int(open({str(pid_file)!r}).read())",
        "print(pid in descendants(os.getpid()), kill_descendants() == [pid], descendants(os.getpid()))",
    ])  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["True", "True", "[]"], done.stdout + done.stderr
    pid = int(pid_file.read_text())
    assert not Path(f"/proc/{pid}").exists() and pid not in descendants(os.getpid())


def test_kill_descendants_returns_at_once_with_nothing_below() -> None:
    """In a fresh process with no children (never in the test process: under pytest-xdist it has
    children of its own, the module-scoped servers other tests share)."""
    code = "from kernelab.runners.reaper import kill_descendants; print(kill_descendants(timeout_s=1.0))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["[]"], done.stdout + done.stderr


def test_the_registry_knows_every_work_dir_and_which_jobs_are_older(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    a = HostRunners(a_dir, "a", root)
    assert a.register() is True and a.register() is False  # new once, then known
    a.job_started()
    b = HostRunners(b_dir, "b", root)
    assert b.register() is True
    assert b.registered_at is not None
    assert sorted(b.work_dirs()) == [a_dir, b_dir]
    older = b.older_jobs(b.registered_at)
    assert len(older) == 1 and older[0].startswith("a (work dir ")
    stop = threading.Event()
    ended = threading.Timer(0.5, a.job_ended)
    ended.start()
    started = time.monotonic()
    assert b.wait_for_older_jobs(stop) is True  # returns once a's job has ended
    assert time.monotonic() - started >= 0.4
    a.job_started()  # a job that starts after b's registration is no reason to wait
    assert b.older_jobs(b.registered_at) == []
    a.job_ended()
    # a dead daemon's record, or a pid reused by another process, is no job
    record = json.loads(a.live.read_text())
    a.live.write_text(json.dumps({**record, "job_since": 1.0, "pid_start": -1}))
    assert b.older_jobs(time.time()) == []
    a.close()
    assert not a.live.exists()


def test_every_registered_work_dir_is_hidden_but_one_that_holds_what_jobs_run(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    mine, other, python_home = tmp_path / "mine", tmp_path / "other", tmp_path / "py"
    for folder in (mine, other, python_home / "lib"):
        folder.mkdir(parents=True)
    for work_dir, name in ((other, "other"), (python_home, "odd")):
        HostRunners(work_dir, name, root).register()
    daemon = RunnerDaemon(KernelabClient("http://127.0.0.1:9"), "mine", work_dir=mine, host_registry=root)
    daemon.host.register()
    hidden = daemon.supervisor.hidden([python_home / "lib"])
    assert hidden[0] == daemon.work_dir and other in hidden and root in hidden
    assert python_home not in hidden  # hiding it would hide the Python installation jobs run
    daemon.close()


@pytest.mark.skipif(bool(jobns.probe()), reason="no unprivileged user namespaces here")
def test_a_job_namespace_shows_nothing_of_another_runners_work_dir(tmp_path: Path) -> None:
    root = tmp_path / "registry"
    other = tmp_path / "other"
    (other / "spool" / "other").mkdir(parents=True)
    (other / "runner-other.json").write_text('{"token": "other-runner-token"}')
    (other / "spool" / "other" / "1-k.json").write_text("{}")
    HostRunners(other, "other", root).register()
    daemon = RunnerDaemon(KernelabClient("http://127.0.0.1:9"), "mine", work_dir=tmp_path / "mine",
                          host_registry=root, job_isolation="namespace")  # fmt: skip
    daemon.host.register()
    job_dir = daemon.work_dir / "jobs" / "1-1"
    job_dir.mkdir(parents=True)
    look = "import os, sys; print(sorted(os.listdir(sys.argv[1])), sorted(os.listdir(sys.argv[2])))"
    cmd = daemon.supervisor.job_command([sys.executable, "-c", look, str(other), str(root)], job_dir)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "[]"]  # an empty folder in place of each
    daemon.close()


# ------------------------------------------------------------------------------------------------
# a real server, result posts refused in the transport


class RefusingPosts(httpx.HTTPTransport):
    """Real HTTP, except that result posts fail to connect while ``refuse`` is set (the server is
    away for them) and that claims are counted."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse = threading.Event()
        self.claims_while_refused = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.refuse.is_set():
            if request.url.path.endswith("/results"):
                raise httpx.ConnectError("refused by the test", request=request)
            if request.url.path.endswith("/runners/claim"):
                self.claims_while_refused += 1
        return super().handle_request(request)


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[tuple[ServerProcess, str]]:
    token = admin_token(tmp_path)
    with ServerProcess(f"sqlite:///{tmp_path / 'k.db'}", port=free_port(), admin_token=token,
                       log_path=tmp_path / "server.log") as server:  # fmt: skip
        yield server, token


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_no_claim_while_a_measured_result_is_not_posted(own_server: Any, tmp_path: Path) -> None:
    """The lease of the job runs out while its result cannot be posted: a daemon that claimed
    meanwhile would get the same job back (re-queued) and measure it again."""
    server, token = own_server
    admin = KernelabClient(server.url, token, retries=1, backoff_s=0.05)
    transport = RefusingPosts()
    client = KernelabClient(server.url, token, retries=0, transport=transport)
    runner = RunnerDaemon(client, "no-twice", poll_s=1.0, lease_s=5, work_dir=tmp_path / "runner")
    job = admin.submit(_spec(budget_ms=2000))
    transport.refuse.set()
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while not (runner.done == 1 and runner.spool.pending()):
            assert time.monotonic() < deadline and thread.is_alive(), repr(runner)
            time.sleep(0.1)
        transport.claims_while_refused = 0  # the claim of the job itself was before
        time.sleep(7.0)  # the lease (5 s) runs out while the result waits
        assert runner.status()["state"] == "not-claiming" and runner.status()["unposted"] == 1
        assert "measured result(s) not posted yet" in str(runner.status()["post_problem"])
        assert transport.claims_while_refused == 0
        transport.refuse.clear()
        deadline = time.monotonic() + 60
        while admin.get_job(job.id).status != "succeeded":
            assert time.monotonic() < deadline, repr(runner)
            time.sleep(0.1)
    finally:
        runner.stop()
        thread.join(timeout=60)
    attempts = admin.call("GET", f"/jobs/{job.id}/attempts", lambda r: r.json(), idempotent=True)["data"]
    assert [a["outcome"] for a in attempts] == ["succeeded"] and runner.done == 1
    runner.close()
    client.close()
    admin.close()


def test_a_shutdown_writes_what_it_holds_to_the_fallback_spool_else_stderr(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The server unreachable (a port nothing listens on), the result in memory only, no grace; the
    first fallback folder cannot be made (a file is in its way)."""
    dead = f"http://127.0.0.1:{free_port()}"
    fallback, blocked = tmp_path / "fallback", tmp_path / "a-file"
    blocked.write_text("in the way")
    kept = RunnerDaemon(KernelabClient(dead, "t", retries=0), "keeper", work_dir=tmp_path / "w1", grace_s=0,
                        fallback_dirs=[blocked / "sub", fallback])  # fmt: skip
    kept.held["k1"] = _result(11, "keeper-result-0011")
    keep_at_shutdown(kept)
    [path] = (fallback / "keeper").glob("*.json")
    assert JobResult.model_validate_json(path.read_text()).job_id == 11
    assert kept.held == {} and kept.on_stderr == 0 and kept.unposted() == 1  # posted at the next start
    kept.close()

    lone = RunnerDaemon(KernelabClient(dead, "t", retries=0), "lone", work_dir=tmp_path / "w2", grace_s=0)
    lone.held["k2"] = _result(12, "lone-result-00012")
    capfd.readouterr()
    keep_at_shutdown(lone)
    err = capfd.readouterr().err
    [line] = [ln for ln in err.splitlines() if ln.startswith(RESULT_MARK)]
    assert JobResult.model_validate_json(line[len(RESULT_MARK) :]).job_id == 12 and lone.on_stderr == 1
    assert "on_stderr=1" in repr(lone)
    lone.close()


def test_the_status_server_says_what_the_daemon_does(tmp_path: Path) -> None:
    from kernelab.runners.daemon.status import StatusServer

    daemon = RunnerDaemon(KernelabClient("http://127.0.0.1:9"), "shown", work_dir=tmp_path / "w")
    daemon.write_problem, daemon.write_problem_since, daemon.node_faults = "work dir full", 1.5e9, 2
    daemon.held["k"] = _result(3)
    server = StatusServer(daemon, "127.0.0.1", 0)
    try:
        status = httpx.get(f"{server.url}/status", timeout=10).json()
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
        missing = httpx.get(f"{server.url}/nope", timeout=10)
    finally:
        server.close()
        daemon.close()
    assert status["can_write"] is False and status["write_problem"] == "work dir full"
    assert status["node_faults"] == 2 and status["unposted"] == 1 and status["in_memory"] == 1
    assert 'kernelab_runner_can_write{runner="shown"} 0.0' in metrics
    assert 'kernelab_runner_write_problem_since_seconds{runner="shown"} 1.5e+09' in metrics
    assert 'kernelab_runner_jobs_total{outcome="node_fault",runner="shown"} 2.0' in metrics
    assert 'kernelab_runner_results_in_memory{runner="shown"} 1.0' in metrics
    assert missing.status_code == 404
