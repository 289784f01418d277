"""``kernelab serve --workers 2`` against one PostgreSQL: concurrent claims from many runners
through both API processes never hand one job out twice, and every queued job is handed out."""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from factories import spec_dict
from service_api import Fleet

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(120)]

JOBS, RUNNERS = 40, 8


def test_two_workers_on_postgres_claim_each_job_once(pg_fleet: Fleet) -> None:
    url = pg_fleet.url
    with httpx.Client(base_url=url, timeout=30) as http:
        job_ids = {
            http.post("/api/v1/jobs", json=spec_dict(), headers=pg_fleet.admin).json()["id"]
            for _ in range(JOBS)
        }
        tokens = [
            http.post("/api/v1/runners/register", headers=pg_fleet.admin, json={
                "name": f"mw-{i}", "node": {"hostname": f"mw-{i}", "device_type": "cpu"}}).json()["token"]
            for i in range(RUNNERS)
        ]  # fmt: skip

    def drain(token: str) -> list[int]:
        got = []
        with httpx.Client(base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}) as c:
            while True:
                r = c.post("/api/v1/runners/claim", json={"wait_s": 0, "lease_s": 600})
                if r.status_code == 204:
                    return got
                assert r.status_code == 200, r.text
                got.append(r.json()["job_id"])

    with ThreadPoolExecutor(RUNNERS) as pool:
        claimed = [j for got in pool.map(drain, tokens) for j in got]
    twice = [j for j, n in Counter(claimed).items() if n > 1]
    assert twice == [] and set(claimed) == job_ids
    text = pg_fleet.log_path.read_text()
    pids = {
        line.split("[")[1].split("]")[0] for line in text.splitlines() if "Started server process" in line
    }
    assert len(pids) == 2 and "died" not in text and "Traceback" not in text, text[-3000:]
