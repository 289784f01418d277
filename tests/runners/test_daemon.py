"""The runner daemon against a real server process: spool and re-send, idempotent re-post,
timeouts, lost leases, token reuse. The tests share the one server process of the test process
(``server_for_test``: its queue emptied before each); the test that stops and restarts its server
starts its own on a temp SQLite file (``own_stack``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable
from kernelab.runners.daemon import RunnerDaemon
from kernelab.runners.local import ServerProcess, admin_token, free_port
from kernelab.runners.spool import Spool
from kernelab.service.contract.schemas import SAMPLE_FIELDS, JobPublic, JobResult, JobSpec, ProbeSpec
from kernelab.service.judge import stats
from kernelab.service.server import crud
from kernelab.service.server.core.db import make_engine, make_session_factory

pytestmark = pytest.mark.slow  # runner daemons and their worker processes


def _spec(*, budget_ms: float, timeout_s: float = 120.0, cells: int = 1) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "daemon-test",
            "benchmark": "softmax",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"},
            "sweep": {"M": [8], "N": [16 * (i + 1) for i in range(cells)]},
            "measurement": {"warmup_ms": 1, "budget_ms": budget_ms, "min_rounds": 4},
            "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
            "timeout_s": timeout_s,
        }
    )


class Stack:
    """A server process on a temp SQLite file that can be stopped and started again, or (with
    ``shared``) the shared server, which this stack never stops."""

    def __init__(self, root: Path, shared: Any = None):
        self.root = root
        self.token = shared.token if shared else admin_token(root)
        self.database_url = shared.process.database_url if shared else f"sqlite:///{root / 'kernelab.db'}"
        self.port = shared.process.port if shared else free_port()
        self.server: ServerProcess | None = None
        self.starts = 0
        self.opened: list[KernelabClient | RunnerDaemon] = []

    def start(self) -> ServerProcess:
        self.starts += 1
        self.server = ServerProcess(
            self.database_url,
            port=self.port,
            admin_token=self.token,
            log_path=self.root / f"server-{self.starts}.log",
        ).start()
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def client(self, token: str | None = None) -> KernelabClient:
        """A client with the admin token (or ``token``) that gives up quickly on a dead server."""
        url = f"http://127.0.0.1:{self.port}"
        return self.track(KernelabClient(url, token or self.token, retries=1, backoff_s=0.05))

    def runner(self, name: str, work_dir: Path, **kwargs: float) -> RunnerDaemon:
        return self.track(RunnerDaemon(self.client(), name, once=True, work_dir=work_dir, **kwargs))

    def track(self, obj):  # closed at teardown
        self.opened.append(obj)
        return obj

    def close(self) -> None:
        for obj in self.opened:
            obj.close()
        self.stop()


def _stored_result(database_url: str, job_id: int) -> JobResult:
    engine = make_engine(database_url)
    try:
        with make_session_factory(engine)() as session:
            stored = crud.load_result(session=session, job_id=job_id)
    finally:
        engine.dispose()
    assert stored is not None
    return stored


@pytest.fixture
def stack(server_for_test: Any, tmp_path: Path) -> Iterator[Stack]:
    """The shared server (``tests/conftest.py``), its queue empty; clients closed after the test."""
    s = Stack(tmp_path, shared=server_for_test)
    yield s
    s.close()


@pytest.fixture
def own_stack(tmp_path: Path) -> Iterator[Stack]:
    """A server of this test's own, which the test may stop and start again."""
    s = Stack(tmp_path)
    s.start()
    yield s
    s.close()


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def _status(client: KernelabClient, job: JobPublic) -> str:
    return client.get_job(job.id).status


def _run_in_thread(runner: RunnerDaemon) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def target() -> None:
        try:
            runner.run()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, errors


def test_result_spooled_while_server_down_is_resent_after_restart(own_stack: Stack, tmp_path: Path) -> None:
    stack = own_stack
    admin = stack.client()
    job = admin.submit(_spec(budget_ms=500, cells=2))
    work_dir = tmp_path / "runner"
    runner = stack.runner("spool-node", work_dir, lease_s=60)
    thread, errors = _run_in_thread(runner)
    _wait_for(lambda: _status(admin, job) == "running", 60, "the claim")
    stack.stop()  # the server goes away while the worker measures

    thread.join(timeout=180)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], KernelabUnavailable)  # once: gives up claiming
    assert (runner.done, runner.failed, runner.posted) == (1, 0, 0)
    pending = runner.spool.pending()
    assert len(pending) == 1
    result = Spool.load(pending[0])
    assert result.job_id == job.id and len(result.cells) == 2
    assert not (work_dir / "jobs" / f"{job.id}-1").exists()  # scratch removed once spooled
    token_file = runner.token_file.read_text()
    assert "spool-node" in repr(runner) and "done=1" in repr(runner)

    stack.start()  # same database, same port; a new daemon process re-sends on start
    admin = stack.client()
    restarted = stack.runner("spool-node", work_dir)
    restarted.run()
    assert restarted.posted == 1 and restarted.spool.pending() == []
    assert runner.token_file.read_text() == token_file  # the saved runner token was reused
    finished = admin.get_job(job.id)
    assert finished.status == "succeeded"
    samples = admin.samples(job.id)
    n_samples = sum(len(c.samples) for c in result.cells)
    assert len(samples) == n_samples > 0
    stored = _stored_result(stack.database_url, job.id)  # engine -> file -> HTTP -> database, read back
    for posted, kept in zip(result.cells, stored.cells, strict=True):
        for name in SAMPLE_FIELDS:
            mine, theirs = getattr(posted.samples, name), getattr(kept.samples, name)
            assert mine.dtype == theirs.dtype and mine.tobytes() == theirs.tobytes(), name
    assert stats.compare(stored).model_dump_json() == stats.compare(result).model_dump_json()

    again = restarted.client.post_result(job.id, result)  # a retried post stores nothing new
    assert again.duplicate and again.job_id == job.id
    assert len(admin.samples(job.id)) == n_samples


def test_worker_past_timeout_is_killed_and_job_failed(stack: Stack, tmp_path: Path) -> None:
    admin = stack.client()
    job = admin.submit(_spec(budget_ms=60_000, timeout_s=2.0))
    runner = stack.runner("timeout-node", tmp_path / "runner")
    started = time.monotonic()
    runner.run()
    assert time.monotonic() - started < 60  # not the 60 s budget
    assert (runner.done, runner.failed) == (0, 1)
    failed = admin.get_job(job.id)
    assert failed.status == "failed"
    assert "timed out" in failed.error and "timeout_s = 2 s" in failed.error
    assert (tmp_path / "runner" / "jobs" / f"{job.id}-1" / "spec.json").exists()  # kept for a look


def test_lost_lease_stops_the_worker_and_posts_nothing(stack: Stack, tmp_path: Path) -> None:
    admin = stack.client()
    job = admin.submit(_spec(budget_ms=20_000))
    runner = stack.runner("lease-node", tmp_path / "runner", lease_s=5)
    thread, errors = _run_in_thread(runner)
    _wait_for(lambda: _status(admin, job) == "running", 60, "the claim")
    admin.cancel(job.id)  # the runner's next heartbeat answers 409
    thread.join(timeout=60)
    assert not thread.is_alive() and errors == []
    assert (runner.lost, runner.done, runner.failed) == (1, 0, 0)
    assert runner.spool.pending() == []
    assert admin.get_job(job.id).status == "cancelled"


def test_runner_token_is_used_directly_and_bad_token_refused(stack: Stack, tmp_path: Path) -> None:
    registered = stack.client().register("given-token-node")
    with pytest.raises(ValueError, match="must match"):
        RunnerDaemon(stack.client(), "bad/name", work_dir=tmp_path)  # names are folder names too
    runner = stack.track(
        RunnerDaemon(
            stack.client(registered.token), "given-token-node", once=True, work_dir=tmp_path / "runner"
        )
    )
    runner.run()  # registration answers 403 for a runner token: it is used as is; queue empty
    assert not runner.token_file.exists()
    bad = stack.track(RunnerDaemon(stack.client("not-a-token"), "x", once=True, work_dir=tmp_path / "bad"))
    with pytest.raises(KernelabAPIError) as info:
        bad.run()
    assert info.value.status_code == 401


def test_worker_rejects_an_unreadable_spec(tmp_path: Path) -> None:
    spec_file = tmp_path / "spec.json"
    spec_file.write_text('{"benchmark": "softmax"}')
    proc = subprocess.run(
        [sys.executable, "-m", "kernelab.runners.worker", str(spec_file), str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "cannot read spec" in proc.stderr and "baseline" in proc.stderr
    assert not (tmp_path / "out.json").exists()


def test_worker_result_the_server_refuses_is_kept_under_rejected(stack: Stack, tmp_path: Path) -> None:
    admin = stack.client()
    job = admin.submit(_spec(budget_ms=100))
    admin.cancel(job.id)  # nobody holds its lease: a result for it is refused with 409
    spec_file, out_file = tmp_path / "spec.json", tmp_path / "out.json"
    spec_file.write_text(_spec(budget_ms=100).model_dump_json())
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelab.runners.worker",
            str(spec_file),
            str(out_file),
            "--job-id",
            str(job.id),
            "--idempotency-key",
            "refused-result-1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "progress: [1/1]" in proc.stdout
    runner = stack.runner("reject-node", tmp_path / "runner")
    runner.ensure_token()
    spooled = runner.spool.adopt(out_file, job_id=job.id, key="refused-result-1")
    assert Spool.load(spooled).idempotency_key == "refused-result-1" and not out_file.exists()
    assert runner.flush_spool() == 0
    assert runner.spool.pending() == []
    kept = runner.spool.rejected_dir / spooled.name
    assert Spool.load(kept).job_id == job.id
    assert "409" in kept.with_name(kept.name + ".reason.txt").read_text()


def test_sigterm_lets_the_running_job_finish(stack: Stack, tmp_path: Path) -> None:
    admin = stack.client()
    job = admin.submit(_spec(budget_ms=300, cells=2))
    env = {**os.environ, "KERNELAB_TOKEN": stack.token}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kernelab.runners.cli",
            "runner",
            "--server",
            f"http://127.0.0.1:{stack.port}",
            "--name",
            "sigterm-node",
            "--poll-s",
            "1",
            "--work-dir",
            str(tmp_path / "runner"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        _wait_for(lambda: _status(admin, job) == "running", 60, "the claim")
        second = admin.submit(_spec(budget_ms=100))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "SIGTERM received" in err and "done=1 failed=0" in err
    assert admin.get_job(job.id).status == "succeeded"
    assert admin.get_job(second.id).status == "queued"  # no new claim after SIGTERM


def _log_time(line: str) -> float:
    """The Unix time of a daemon log line (``%(asctime)s``: ``2026-12-07 20:10:01,123 ...``)."""
    from datetime import datetime

    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_sigterm_ends_a_waiting_claim_within_two_seconds(stack: Stack, tmp_path: Path) -> None:
    """An idle runner in its long-poll claim (30 s here, the server's cap) stops within 2 s of
    SIGTERM (its own log's timestamps, and the process's exit) and leaves the queue as it was:
    a job submitted after the stop is still queued, nobody's."""
    err_path = tmp_path / "runner.err"
    env = {**os.environ, "KERNELAB_TOKEN": stack.token}
    argv = [sys.executable, "-m", "kernelab.runners.cli", "runner", "--server", f"http://127.0.0.1:{stack.port}",
            "--name", "idle-node", "--poll-s", "30", "--work-dir", str(tmp_path / "runner")]  # fmt: skip
    with err_path.open("w") as err_file:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err_file, text=True, env=env)
    try:
        _wait_for(lambda: "serving" in err_path.read_text(), 120, "the runner to serve")
        time.sleep(1.5)  # its first claim is now waiting in the long poll
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    lines = err_path.read_text().splitlines()
    received = next(line for line in lines if "SIGTERM received" in line)
    stopped = next(line for line in lines if "idle-node stopped" in line)
    assert proc.returncode == 0, "\n".join(lines)
    assert _log_time(stopped) - _log_time(received) <= 2.0, "\n".join(lines)
    assert took < 5.0, f"exit {took:.1f} s after SIGTERM (the long poll is 30 s)"
    job = stack.client().submit(_spec(budget_ms=100))
    time.sleep(0.5)
    assert _status(stack.client(), job) == "queued"  # the abandoned claim took nothing


def test_client_errors_name_the_field_and_give_up_on_a_dead_server(stack: Stack) -> None:
    admin = stack.client()
    bad = _spec(budget_ms=100).model_dump(mode="json")
    bad["sweep"]["M"] = [-1]
    with pytest.raises(KernelabAPIError) as info:
        admin.submit(bad)
    assert info.value.status_code == 422 and "sweep.M" in info.value.detail
    with pytest.raises(KernelabAPIError) as info:
        admin.get_job(999_999)
    assert info.value.status_code == 404
    dead = stack.track(KernelabClient(f"http://127.0.0.1:{free_port()}", "t", retries=2, backoff_s=0.01))
    with pytest.raises(KernelabUnavailable, match="after 2 retries"):
        dead.get_job(1)


def test_probe_pool_serves_the_probes_of_every_job(stack: Stack, tmp_path: Path) -> None:
    # probe_pool="on": a pool on this CPU-only node too (gloo), so the hand-over to the job's
    # worker runs here as it does on a GPU node ("auto" = 2+ GPUs).
    from kernelab.runners.probes.all_reduce import _SEQ_KEY

    admin = stack.client()
    spec = _spec(budget_ms=200).model_copy(
        update={"probes": ProbeSpec(copy_bandwidth=False, all_reduce=True, nvml=False)}
    )
    jobs = [admin.submit(spec), admin.submit(spec)]
    runner = stack.runner("pool-node", tmp_path / "runner", probe_pool="on")
    runner.run()
    assert (runner.done, runner.failed) == (2, 0)
    pool = runner.probe_pool.pool
    assert pool is not None and pool.alive()
    # Before and after each job: four requests, all served by the same two rank processes.
    assert int(pool._run._store.add(_SEQ_KEY, 0)) == 4
    for job in jobs:  # the server's compare worker stores the comparison after the ingest
        _wait_for(lambda j=job: admin.get_job(j.id).comparison_status == "ready", 120, "the comparison")
        probes = admin.comparison(job.id).probes
        assert [p.phase for p in probes] == ["before", "after"]
        for report in probes:
            assert [r.size_bytes for r in report.all_reduce] == [8, 1024 * 1024]
            assert not any("pool failed" in n for n in report.notes)
    pids = list(pool.pids)
    runner.close()
    assert runner.probe_pool.pool is None and not any(_running(p) for p in pids)


def _running(pid: int) -> bool:
    from kernelab.runners.probes.all_reduce import _pid_running

    return _pid_running(pid)


def _measuring_pids(job_dir: Path) -> list[int]:
    """Processes of ``python -m kernelab.runners.measure`` whose working folder is ``job_dir`` (the
    job's measuring child: it runs in a session of its own, so killing the worker's group alone
    does not reach it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if b"kernelab.runners.measure" in cmdline and Path(cwd) == job_dir:
            pids.append(int(entry.name))
    return pids


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # exited, not yet reaped by its new parent


def test_progress_is_heartbeated_and_a_cancel_stops_the_measuring_child(stack: Stack, tmp_path: Path) -> None:
    admin = stack.client()
    job = admin.submit(_spec(budget_ms=60_000, cells=2))
    runner = stack.runner("progress-node", tmp_path / "runner", lease_s=15, heartbeat_s=0.5)
    thread, errors = _run_in_thread(runner)

    def measuring() -> bool:
        progress = admin.get_job(job.id).progress
        return progress is not None and progress.phase == "measuring"

    _wait_for(measuring, 120, "a heartbeat with progress 'measuring'")
    progress = admin.get_job(job.id).progress
    assert progress is not None and (progress.cell, progress.cells, progress.cells_done) == (0, 2, 0)
    assert progress.eta_s is None  # no cell has finished: nothing says how long one takes
    job_dir = tmp_path / "runner" / "jobs" / f"{job.id}-1"
    pids = _measuring_pids(job_dir)
    assert len(pids) == 1, pids
    admin.cancel(job.id)
    thread.join(timeout=60)
    assert not thread.is_alive() and errors == []
    assert runner.lost == 1
    assert _gone(pids[0]), "the cancelled job's measuring process runs on"
    cancelled = admin.get_job(job.id)
    assert cancelled.status == "cancelled" and cancelled.progress is None  # a finished job shows none
