"""The client and the daemon under server faults: what is retried and what is final, a daemon
that survives any answer, a spool that keeps what the server did not definitively refuse, and
a heartbeat that stalls while the result is ready.

The server that answers 500, 429 or garbage is a scripted HTTP server on loopback (``Scripted``:
real HTTP, answers chosen by the test, since a real kernelab server only says so under a real
fault, which ``tests/service/test_fault_drills_fleet.py`` drills); the stalled heartbeat runs
against a real server process, delayed in the client's transport.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable
from kernelab.runners.daemon import RunnerDaemon
from kernelab.runners.local import ServerProcess, admin_token, free_port
from kernelab.service.contract.schemas import JobResult, JobSpec

Answer = tuple[int, dict[str, str], bytes]
ME = (200, {}, b'{"runner_id": 7, "name": "scripted"}')


class Scripted:
    """An HTTP server on 127.0.0.1 that answers each path with the next of its scripted answers
    (the last one again once they run out) and counts the requests per path."""

    def __init__(self, script: dict[str, list[Answer]]):
        self.script = {path: deque(answers) for path, answers in script.items()}
        self.seen: dict[str, int] = defaultdict(int)
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                path = self.path.split("?")[0]
                scripted.seen[path] += 1
                queue = scripted.script.get(path) or deque([(404, {}, b'{"detail": "not scripted"}')])
                status, headers, body = queue.popleft() if len(queue) > 1 else queue[0]
                self.send_response(status)
                for name, value in {"content-type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:  # quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted() -> Iterator[Any]:
    servers: list[Scripted] = []

    def make(script: dict[str, list[Answer]]) -> Scripted:
        servers.append(Scripted(script))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


def _json(status: int, body: Any, **headers: str) -> Answer:
    return status, headers, json.dumps(body).encode()


def test_client_retries_everything_but_a_definite_refusal(scripted) -> None:  # type: ignore[no-untyped-def]
    server = scripted({
        "/api/v1/runners/me": [_json(500, {"detail": "boom"}), (200, {}, b"<html>proxy</html>"),
                               _json(429, {"detail": "slow down"}, **{"Retry-After": "1"}),
                               _json(502, {"detail": "bad gateway"}), ME],
        "/api/v1/jobs/1": [_json(409, {"detail": "job 1 has no result yet"})],
        "/api/v1/jobs/2": [_json(500, {"detail": "still broken"})],
        "/api/v1/runners/claim": [(200, {}, b"garbage")],
    })  # fmt: skip
    client = KernelabClient(server.url, "t", retries=4, backoff_s=0.01, max_backoff_s=2.0)
    started = time.monotonic()
    assert client.whoami().name == "scripted"  # 500, garbled 200, 429, 502, then the answer
    assert server.seen["/api/v1/runners/me"] == 5
    assert time.monotonic() - started >= 1.0  # the 429's Retry-After: 1 was waited out
    with pytest.raises(KernelabAPIError) as refused:
        client.get_job(1)
    assert refused.value.status_code == 409 and server.seen["/api/v1/jobs/1"] == 1  # final: not retried
    with pytest.raises(KernelabUnavailable, match="HTTP 500: still broken") as gave_up:
        client.get_job(2)
    assert gave_up.value.status_code == 500 and server.seen["/api/v1/jobs/2"] == 5
    with pytest.raises(KernelabUnavailable, match="not retried: not idempotent"):
        client.claim()  # a garbled claim answer: not repeated (a second claim could take a second job)
    assert server.seen["/api/v1/runners/claim"] == 1
    client.close()


def test_daemon_survives_any_answer_to_its_claims(scripted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    server = scripted({
        "/api/v1/runners/register": [_json(403, {"detail": "not an admin token"})],
        "/api/v1/runners/claim": [_json(500, {"detail": "Internal Server Error"}), (200, {}, b"{not json"),
                                  _json(404, {"detail": "Not Found"}), _json(422, {"detail": "?"}),
                                  _json(503, {"detail": "the database is unavailable"}), (204, {}, b"")],
    })  # fmt: skip
    client = KernelabClient(server.url, "runner-token", retries=1, backoff_s=0.01)
    runner = RunnerDaemon(client, "survivor", poll_s=1.0, work_dir=tmp_path / "runner")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            runner.run()
        except BaseException as exc:  # handed to the assertion below
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while server.seen["/api/v1/runners/claim"] < 8 and thread.is_alive():
        assert time.monotonic() < deadline, "the daemon stopped claiming"
        time.sleep(0.1)
    assert thread.is_alive() and errors == []  # every answer was survived: it still claims
    runner.stop()
    thread.join(timeout=30)
    assert not thread.is_alive() and errors == []
    client.close()


def test_spool_keeps_results_the_server_did_not_refuse_for_good(scripted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = "/api/v1/jobs/1/results"
    refused = _json(422, {"detail": [{"loc": ["body", "cells"], "msg": "bad"}]})
    server = scripted({path: [_json(500, {"detail": "boom"}), _json(503, {"detail": "database"}),
                              _json(401, {"detail": "invalid or revoked token"}), _json(429, {"detail": "x"}),
                              refused]})  # fmt: skip
    runner = RunnerDaemon(KernelabClient(server.url, "t", retries=0), "spooler", work_dir=tmp_path / "runner")
    result = runner.spool.put(_result())
    for answer in (500, 503, 401, 429):  # each: the result stays pending, to be re-sent
        assert runner.flush_spool() == 0, answer
        assert runner.spool.pending() == [result] and not runner.spool.rejected_dir.exists(), answer
    assert runner.flush_spool() == 0  # 422: refused for good, kept under rejected/
    assert runner.spool.pending() == [] and (runner.spool.rejected_dir / result.name).exists()
    assert server.seen[path] == 5
    runner.client.close()


def _result(job_id: int = 1) -> JobResult:
    from datetime import UTC, datetime

    spec = JobSpec.model_validate({
        "benchmark": "softmax", "baseline": {"variant": "torch"}, "candidate": {"variant": "triton"},
        "sweep": {"M": [4], "N": [64]},
    })  # fmt: skip
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    return JobResult.model_validate({
        "idempotency_key": f"faults-{job_id:08d}", "job_id": job_id, "spec": spec.model_dump(mode="json"),
        "node": {"hostname": "spooler", "device_type": "cpu"}, "timer": "perf_counter",
        "started_at": t0.isoformat(), "finished_at": t0.isoformat(), "cells": [], "error": "no cells",
    })  # fmt: skip


# ------------------------------------------------------------------------------------------------
# a heartbeat that stalls


class StallingTransport(httpx.HTTPTransport):
    """Real HTTP, except that heartbeat requests wait for ``release`` before they are sent."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.stalled = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/heartbeat"):
            self.stalled += 1
            self.release.wait(timeout=150)
        return super().handle_request(request)


def _spec(budget_ms: float) -> JobSpec:
    return JobSpec.model_validate({
        "name": "stall", "benchmark": "softmax", "baseline": {"variant": "torch"},
        "candidate": {"variant": "triton"}, "sweep": {"M": [8], "N": [16]},
        "measurement": {"warmup_ms": 1, "budget_ms": budget_ms, "min_rounds": 4},
        "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False}, "timeout_s": 120,
    })  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_result_is_posted_while_a_heartbeat_stalls_past_the_lease(
    server_for_test: Any, tmp_path: Path
) -> None:
    server, token = server_for_test, server_for_test.token
    admin = KernelabClient(server.url, token, retries=1, backoff_s=0.05)
    job = admin.submit(_spec(budget_ms=3000))
    transport = StallingTransport()
    client = KernelabClient(server.url, token, retries=1, backoff_s=0.05, transport=transport)
    runner = RunnerDaemon(client, "stall-node", once=True, lease_s=5, work_dir=tmp_path / "runner")
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 90
        while admin.get_job(job.id).status != "succeeded":  # posted with the heartbeat still stalled
            assert time.monotonic() < deadline, f"no result while the heartbeat stalls: {runner!r}"
            time.sleep(0.2)
        assert transport.stalled >= 1 and not transport.release.is_set()
    finally:
        transport.release.set()
        thread.join(timeout=60)
    assert not thread.is_alive() and (runner.done, runner.lost, runner.posted) == (1, 0, 1)
    attempts = admin.call("GET", f"/jobs/{job.id}/attempts", lambda r: r.json(), idempotent=True)
    assert [a["outcome"] for a in attempts["data"]] == ["succeeded"]  # the late result was taken
    runner.close()
    client.close()
    admin.close()


# ------------------------------------------------------------------------------------------------
# the work dir's disk full: a real, small filesystem (tmpfs), filled up


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs mounted for the test (mounting needs root: skipped otherwise)."""
    import os
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    command = ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)]
    done = subprocess.run(command, capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def _fill(disk: Path) -> Path:
    """Write to ``disk`` until it is full (ENOSPC); the filler file's path."""
    import errno

    filler = disk / "filler"
    with filler.open("wb", buffering=0) as fh:  # unbuffered: nothing left to flush on close
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc
    return filler


class _Stack:
    """A server of the test's own on a temp SQLite file (``root``), which it may stop and start, or
    (``_Stack.shared``) the shared server of ``tests/conftest.py``, which it leaves running."""

    def __init__(self, root: Path):
        self.token = admin_token(root)
        self.port = free_port()
        self.server = ServerProcess(f"sqlite:///{root / 'k.db'}", port=self.port, admin_token=self.token,
                                    log_path=root / "server.log")  # fmt: skip
        self.url = self.server.url

    @classmethod
    def shared(cls, live: Any) -> _Stack:
        stack = cls.__new__(cls)
        stack.token, stack.port, stack.server, stack.url = (
            live.token,
            live.process.port,
            live.process,
            live.url,
        )
        return stack

    def client(self, token: str | None = None) -> KernelabClient:
        return KernelabClient(self.url, token or self.token, retries=1, backoff_s=0.05)


def _job_status(admin: KernelabClient, job_id: int) -> tuple[str, int]:
    job = admin.get_job(job_id)
    return job.status, job.attempts


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_full_work_dir_claims_nothing_says_why_and_runs_the_job_once_it_has_room(
    small_disk: Path, server_for_test: Any, caplog: pytest.LogCaptureFixture
) -> None:
    stack = _Stack.shared(server_for_test)
    admin = stack.client()
    given = stack.client()
    runner = RunnerDaemon(given, "full-node", poll_s=1.0, work_dir=small_disk, min_free_bytes=1 << 20)
    runner.ensure_token()  # the token file is written while there is room
    filler = _fill(small_disk)
    job = admin.submit(_spec(budget_ms=300))
    thread = threading.Thread(target=runner.run, daemon=True)
    with caplog.at_level("WARNING", logger="kernelab.runners.daemon"):
        thread.start()
        deadline = time.monotonic() + 60
        while caplog.text.count("not claiming: work dir") < 3:  # three claim rounds refused
            assert time.monotonic() < deadline and thread.is_alive(), caplog.text
            time.sleep(0.1)
        assert thread.is_alive() and _job_status(admin, job.id) == ("queued", 0)
        assert "not claiming: work dir" in caplog.text and "full" in caplog.text
        filler.unlink()  # room again: the daemon claims and runs the job
        deadline = time.monotonic() + 120
        while _job_status(admin, job.id)[0] != "succeeded":
            assert time.monotonic() < deadline and thread.is_alive(), repr(runner)
            time.sleep(0.2)
    runner.stop()
    thread.join(timeout=60)
    assert not thread.is_alive() and (runner.done, runner.released) == (1, 0)
    runner.close()
    given.close()
    admin.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_job_claimed_onto_a_full_disk_is_released_not_crashed_on(
    small_disk: Path, server_for_test: Any
) -> None:
    stack = _Stack.shared(server_for_test)
    admin = stack.client()
    given = stack.client()
    runner = RunnerDaemon(given, "full-claim-node", work_dir=small_disk, min_free_bytes=0)
    runner.ensure_token()
    job = admin.submit(_spec(budget_ms=300))
    claim = runner.client.claim(wait_s=0, lease_s=120)  # taken before the disk filled up
    assert claim is not None and claim.job_id == job.id
    _fill(small_disk)
    assert runner.run_claim(claim) == "released"
    assert _job_status(admin, job.id) == ("queued", 1)  # back in the queue at once, not leased
    attempts = admin.call("GET", f"/jobs/{job.id}/attempts", lambda r: r.json(), idempotent=True)["data"]
    assert attempts[0]["outcome"] == "failed" and "No space left on device" in attempts[0]["error"]
    admin.cancel(job.id)  # queued again on the shared server: no later test's runner takes it
    runner.close()
    given.close()
    admin.close()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_result_the_full_disk_cannot_take_is_held_in_memory_and_posted(
    small_disk: Path, tmp_path: Path
) -> None:
    stack = _Stack(tmp_path)
    stack.server.start()
    try:
        admin = stack.client()
        given = stack.client()
        runner = RunnerDaemon(given, "full-node", poll_s=1.0, lease_s=60, work_dir=small_disk,
                        min_free_bytes=1 << 20)  # fmt: skip
        runner.ensure_token()
        job = admin.submit(_spec(budget_ms=6000))
        thread = threading.Thread(target=runner.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while _job_status(admin, job.id)[0] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        _fill(small_disk)  # while the worker measures: its result file, the spool, stderr: all full
        stack.server.stop()  # and the server away, so the result must wait in memory
        deadline = time.monotonic() + 120
        while not (runner.held and runner.done == 1):
            assert time.monotonic() < deadline and thread.is_alive(), repr(runner)
            time.sleep(0.2)
        assert runner.spool.pending() == []  # nothing could be written: the result is in memory only
        stack.server.start()  # same database and port: the held result is posted from memory
        deadline = time.monotonic() + 120
        while _job_status(admin, job.id)[0] != "succeeded":
            assert time.monotonic() < deadline and thread.is_alive(), repr(runner)
            time.sleep(0.2)
        runner.stop()
        thread.join(timeout=60)
        assert not thread.is_alive() and runner.held == {} and runner.posted == 1
        assert len(admin.samples(job.id)) > 0
        runner.close()
        given.close()
        admin.close()
    finally:
        stack.server.stop()
