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

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from drills import LEASE_S, TOKEN, counts, events, spec, wait_for
from factories import big_result

from kernelab.runners.client import KernelabClient
from kernelab.runners.daemon import RunnerDaemon
from kernelab.runners.local import ServerProcess, free_port
from kernelab.service.contract.schemas import NodeInfo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def server(migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ServerProcess]:
    monkeypatch.setenv("KERNELAB_LOG_FORMAT", "json")  # the drill reads the server's structured log
    with ServerProcess(
        migrated_url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "server.log"
    ) as s:
        yield s


def test_runner_killed_mid_job_the_job_completes_on_another_runner(
    server: ServerProcess, migrated_url: str, tmp_path: Path
) -> None:
    admin = KernelabClient(server.url, TOKEN, retries=1, backoff_s=0.05)
    job = admin.submit(spec(budget_ms=3000))
    env = {**os.environ, "KERNELAB_TOKEN": TOKEN}
    victim = subprocess.Popen(
        [sys.executable, "-m", "kernelab.runners.cli", "runner", "--server", server.url, "--name", "victim",
         "--lease-s", str(LEASE_S), "--poll-s", "1", "--work-dir", str(tmp_path / "victim")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: admin.get_job(job.id).status == "running", 60, "the victim's claim")
        time.sleep(1.0)  # the worker child is measuring now
    finally:
        os.killpg(victim.pid, signal.SIGKILL)  # runner and its worker child, no goodbye
        victim.wait()
    killed_at = time.monotonic()
    assert admin.get_job(job.id).status == "running"  # the dead runner still holds the lease

    rescuer = RunnerDaemon(admin, "rescuer", once=True, work_dir=tmp_path / "rescuer", lease_s=30)
    try:
        time.sleep(max(0.0, killed_at + LEASE_S + 0.5 - time.monotonic()))  # the lease runs out
        rescuer.run()
    finally:
        rescuer.close()
    assert (rescuer.done, rescuer.posted) == (1, 1)
    finished = admin.get_job(job.id)
    assert finished.status == "succeeded" and finished.attempts == 2 and finished.node == "rescuer"
    stored = counts(migrated_url, job.id)
    assert stored["results"] == 1 and stored["cells"] == 1
    assert stored["attempts"] == [(1, "expired"), (2, "succeeded")]
    assert stored["samples"] == len(admin.samples(job.id)) > 0
    admin.close()


def test_server_killed_during_a_large_ingest_leaves_no_partial_result(
    server: ServerProcess, migrated_url: str
) -> None:
    admin = KernelabClient(server.url, TOKEN, retries=1, backoff_s=0.05)
    job = admin.submit(spec(budget_ms=100, cells=1000))
    token = admin.register("ingest-node", NodeInfo(hostname="ingest-node", device_type="cpu")).token
    runner = admin.with_token(token)
    claim = runner.claim(wait_s=0, lease_s=600)
    assert claim is not None and claim.job_id == job.id
    # Large enough that storing it (after the "ingest started" line the drill waits for) takes far
    # longer than the drill's 50 ms polling: 1,000 cells and blocks of 1,000 samples (~0.5-1 s).
    result = big_result(job.id, claim.spec, "ingest-node", cells=1000, samples_per_cell=1000)
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
    wait_for(lambda: any(e.get("event") == "ingest started" and e.get("job_id") == job.id
                          for e in events(server.log_path)), 60, "the ingest to start")  # fmt: skip
    assert server.proc is not None
    server.proc.kill()  # SIGKILL in the middle of the transaction
    server.proc.wait()
    server.stop()  # already dead: only closes its log file
    poster.join(timeout=60)
    assert len(answers) == 1 and isinstance(answers[0], httpx.HTTPError), answers  # no answer came

    stored = counts(migrated_url, job.id)
    assert (stored["results"], stored["cells"], stored["samples"]) == (0, 0, 0), stored
    assert stored["status"] == "running"  # the lease is still the runner's: it can re-post

    server.start()  # same database and port
    again = runner.post_result(job.id, result)
    assert not again.duplicate
    stored = counts(migrated_url, job.id)
    assert (stored["results"], stored["cells"], stored["samples"]) == (1, 1000, 1_000_000), stored
    assert runner.post_result(job.id, result).duplicate  # a retry stores nothing more
    assert counts(migrated_url, job.id)["samples"] == 1_000_000
    assert any(
        e.get("event") == "ingest stored" and e.get("job_id") == job.id for e in events(server.log_path)
    )
    runner.close()
    admin.close()
