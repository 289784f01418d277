"""Fault drills, automated, on SQLite and on PostgreSQL, against real server processes
(``kernelab serve``) on loopback:

* ``kill -9`` a runner (and its worker) mid-job: the lease expires, another runner completes the
  job, exactly one result set is stored and the attempt history shows both attempts;
* ``kill -9`` the server while it ingests a large result: nothing of that result is visible
  afterwards (one transaction), and a re-post after the restart stores it whole, once.

The third drill (server stopped while a runner posts: spool, re-send after restart) is
``tests/runners/test_daemon.py::test_result_spooled_while_server_down_is_resent_after_restart``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from runners.client import KernelabClient
from runners.daemon import Runner
from runners.local import ServerProcess, free_port
from service.core.db import make_engine
from service.models import Cell, Job, JobAttempt, Result, SampleBlock
from service.schemas import CellResult, CorrectnessResult, JobResult, JobSpec, NodeInfo, Work

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOKEN = "drill-admin-token-0123456789abcdef0123456789"
LEASE_S = 5.0  # the shortest lease the API accepts (ClaimRequest.lease_s >= 5)


def _spec(budget_ms: float, cells: int = 1) -> dict[str, Any]:
    return {
        "name": "drill", "benchmark": "softmax", "baseline": {"variant": "torch"},
        "candidate": {"variant": "triton"}, "sweep": {"M": [8], "N": [16 * (i + 1) for i in range(cells)]},
        "measurement": {"warmup_ms": 1, "budget_ms": budget_ms, "min_rounds": 4},
        "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False}, "timeout_s": 120,
    }  # fmt: skip


def _wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def server(migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerProcess]:
    monkeypatch.setenv("KERNELAB_LOG_FORMAT", "json")  # the drill reads the server's structured log
    with ServerProcess(
        migrated_url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "server.log"
    ) as s:
        yield s


def _events(log_path: Path) -> list[dict[str, Any]]:
    """The JSON records of the server's log (complete lines only)."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and line.endswith("}"):
            out.append(json.loads(line))
    return out


def _counts(url: str, job_id: int) -> dict[str, int]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            results = conn.scalar(select(func.count()).select_from(Result).where(Result.job_id == job_id))
            cells = conn.scalar(
                select(func.count()).select_from(Cell).join(Result).where(Result.job_id == job_id)
            )
            samples = conn.scalar(
                select(func.coalesce(func.sum(SampleBlock.n), 0))
                .select_from(SampleBlock)
                .join(Cell)
                .join(Result)
                .where(Result.job_id == job_id)
            )
            status = conn.scalar(select(Job.status).where(Job.id == job_id))
            attempts = [tuple(r) for r in conn.execute(
                select(JobAttempt.attempt, JobAttempt.outcome).where(JobAttempt.job_id == job_id)
                .order_by(JobAttempt.attempt)
            )]  # fmt: skip
    finally:
        engine.dispose()
    return {"results": results or 0, "cells": cells or 0, "samples": samples or 0,
            "status": status, "attempts": attempts}  # type: ignore[dict-item]  # fmt: skip


def test_runner_killed_mid_job_the_job_completes_on_another_runner(
    server: ServerProcess, migrated_url: str, tmp_path: Path
) -> None:
    admin = KernelabClient(server.url, TOKEN, retries=1, backoff_s=0.05)
    job = admin.submit(_spec(budget_ms=3000))
    env = {**os.environ, "KERNELAB_TOKEN": TOKEN}
    victim = subprocess.Popen(
        [sys.executable, "-m", "runners.cli", "runner", "--server", server.url, "--name", "victim",
         "--lease-s", str(LEASE_S), "--poll-s", "1", "--work-dir", str(tmp_path / "victim")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        _wait_for(lambda: admin.get_job(job.id).status == "running", 60, "the victim's claim")
        time.sleep(1.0)  # the worker child is measuring now
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # runner and its worker child, no goodbye
        victim.wait()
    killed_at = time.monotonic()
    assert admin.get_job(job.id).status == "running"  # the dead runner still holds the lease

    rescuer = Runner(admin, "rescuer", once=True, work_dir=tmp_path / "rescuer", lease_s=30)
    try:
        time.sleep(max(0.0, killed_at + LEASE_S + 0.5 - time.monotonic()))  # the lease runs out
        rescuer.run()
    finally:
        rescuer.close()
    assert (rescuer.done, rescuer.posted) == (1, 1)
    finished = admin.get_job(job.id)
    assert finished.status == "succeeded" and finished.attempts == 2 and finished.node == "rescuer"
    counts = _counts(migrated_url, job.id)
    assert counts["results"] == 1 and counts["cells"] == 1
    assert counts["attempts"] == [(1, "expired"), (2, "succeeded")]
    assert counts["samples"] == len(admin.samples(job.id)) > 0
    admin.close()


def _big_result(job_id: int, spec: JobSpec, node: str, *, cells: int, samples_per_cell: int) -> JobResult:
    """A synthetic, valid ``JobResult`` of ``cells`` cells of ``samples_per_cell`` samples each."""
    from service.schemas import Sample as SampleSchema

    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    work = Work(flops=1e6, bytes_read=1e6, bytes_written=1e6)
    ok = CorrectnessResult(passed=True, rel_error=0.0, max_abs_error=0.0, cosine_similarity=1.0, rtol=1e-5,
                           atol=1e-6)  # fmt: skip
    rows = [
        SampleSchema(
            variant="baseline" if i % 2 == 0 else "candidate",
            round=i // 2,
            position=i % 2,  # type: ignore[arg-type]
            duration_ns=1000.0 + (i % 7),
        )  # fmt: skip
        for i in range(samples_per_cell)
    ]
    return JobResult(
        idempotency_key=f"drill-ingest-{job_id:06d}", job_id=job_id, spec=spec,
        node=NodeInfo(hostname=node, device_type="cpu"),
        timer="perf_counter", started_at=t0, finished_at=t0 + timedelta(seconds=60),
        cells=[CellResult(index=i, params=params, work={"baseline": work, "candidate": work},
                          correctness={"baseline": ok, "candidate": ok}, samples=rows)
               for i, params in enumerate(spec.cells("cpu")[:cells])],
    )  # fmt: skip


def test_server_killed_during_a_large_ingest_leaves_no_partial_result(
    server: ServerProcess, migrated_url: str
) -> None:
    admin = KernelabClient(server.url, TOKEN, retries=1, backoff_s=0.05)
    job = admin.submit(_spec(budget_ms=100, cells=1000))
    token = admin.register("ingest-node", NodeInfo(hostname="ingest-node", device_type="cpu")).token
    runner = admin.with_token(token)
    claim = runner.claim(wait_s=0, lease_s=600)
    assert claim is not None and claim.job_id == job.id
    # Large enough that storing it (after the "ingest started" line the drill waits for) takes far
    # longer than the drill's 50 ms polling: 1,000 cells and blocks of 1,000 samples (~0.5-1 s).
    result = _big_result(job.id, claim.spec, "ingest-node", cells=1000, samples_per_cell=1000)
    body = result.model_dump_json()
    answers: list[Any] = []

    def post() -> None:
        try:
            answers.append(httpx.post(f"{server.url}/api/v1/jobs/{job.id}/results", content=body, timeout=120,
                                      headers={"Authorization": f"Bearer {token}",
                                               "content-type": "application/json"}))  # fmt: skip
        except httpx.HTTPError as exc:
            answers.append(exc)

    poster = threading.Thread(target=post, daemon=True)
    poster.start()
    _wait_for(lambda: any(e.get("event") == "ingest started" and e.get("job_id") == job.id
                          for e in _events(server.log_path)), 60, "the ingest to start")  # fmt: skip
    assert server.proc is not None
    server.proc.kill()  # SIGKILL in the middle of the transaction
    server.proc.wait()
    server.stop()  # already dead: only closes its log file
    poster.join(timeout=60)
    assert len(answers) == 1 and isinstance(answers[0], httpx.HTTPError), answers  # no answer came

    counts = _counts(migrated_url, job.id)
    assert (counts["results"], counts["cells"], counts["samples"]) == (0, 0, 0), counts
    assert counts["status"] == "running"  # the lease is still the runner's: it can re-post

    server.start()  # same database and port
    again = runner.post_result(job.id, result)
    assert not again.duplicate
    counts = _counts(migrated_url, job.id)
    assert (counts["results"], counts["cells"], counts["samples"]) == (1, 1000, 1_000_000), counts
    assert runner.post_result(job.id, result).duplicate  # a retry stores nothing more
    assert _counts(migrated_url, job.id)["samples"] == 1_000_000
    assert any(
        e.get("event") == "ingest stored" and e.get("job_id") == job.id for e in _events(server.log_path)
    )
    runner.close()
    admin.close()
