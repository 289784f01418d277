"""Retries of one result that race each other (a runner whose first post timed out while the
server was still storing it, then retried at once, several times): one of them stores the
result, every other one gets the 200 duplicate answer, never 409. Against a real server
process (``kernelab serve``) on SQLite and PostgreSQL.

To make the race certain rather than likely, the test holds the job's row (PostgreSQL: ``SELECT
... FOR UPDATE``; SQLite: the database's write lock, ``BEGIN IMMEDIATE``) while the posts arrive,
as a slow transaction would: every post has looked for its key and found none, and waits for
the row; then the test lets go."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import httpx
import pytest
from factories import job_result, spec_dict
from sqlalchemy import func, select

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, free_port
from kernelab.service.contract.schemas import NodeInfo
from kernelab.service.server.core.db import make_engine
from kernelab.service.server.models import Job, Result

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOKEN = "concurrent-admin-token-0123456789abcdef012345"
POSTS = 8


def _ingests_started(log: Path, job_id: int) -> int:
    lines = [json.loads(x) for x in log.read_text(errors="replace").splitlines() if x.startswith("{")]
    return sum(e.get("event") == "ingest started" and e.get("job_id") == job_id for e in lines)


def test_concurrent_retries_with_one_key_all_get_the_duplicate_answer(
    migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELAB_LOG_FORMAT", "json")  # the test reads "ingest started" events
    log = tmp_path / "server.log"
    engine = make_engine(migrated_url)
    with ServerProcess(migrated_url, port=free_port(), admin_token=TOKEN, log_path=log) as server:
        admin = KernelabClient(server.url, TOKEN, retries=1, backoff_s=0.05)
        job = admin.submit(spec_dict())
        token = admin.register("dup-node", NodeInfo(hostname="dup-node", device_type="cpu")).token
        runner = admin.with_token(token)
        claim = runner.claim(wait_s=0, lease_s=600)
        assert claim is not None and claim.job_id == job.id
        body = job_result(job.id, key="raced-key-1", hostname="dup-node").model_dump_json()
        answers: list[httpx.Response] = []

        def post() -> None:
            answers.append(httpx.post(
                f"{server.url}/api/v1/jobs/{job.id}/results", content=body, timeout=120,
                headers={"Authorization": f"Bearer {token}", "content-type": "application/json"},
            ))  # fmt: skip

        threads = [threading.Thread(target=post) for _ in range(POSTS)]
        with engine.connect() as holder:
            if engine.dialect.name == "postgresql":
                holder.execute(select(Job.id).where(Job.id == job.id).with_for_update())
            else:
                holder.exec_driver_sql("BEGIN IMMEDIATE")
            for t in threads:
                t.start()
            deadline = time.monotonic() + 60
            while _ingests_started(log, job.id) < POSTS:
                assert time.monotonic() < deadline, "the posts did not all arrive"
                time.sleep(0.05)
            time.sleep(0.5)  # each looks its key up (none yet), then waits for the job's row
            holder.rollback()  # lets go of the row / the write lock
        for t in threads:
            t.join(timeout=150)
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200] * (POSTS - 1) + [201], [(a.status_code, a.text[:200]) for a in answers]
        ids = {a.json()["result_id"] for a in answers}
        assert len(ids) == 1 and sum(a.json()["duplicate"] for a in answers) == POSTS - 1
        assert admin.get_job(job.id).status == "succeeded"
        runner.close()
        admin.close()
    try:
        with engine.connect() as conn:
            assert conn.scalar(select(func.count()).select_from(Result).where(Result.job_id == job.id)) == 1
    finally:
        engine.dispose()
