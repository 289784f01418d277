"""``kernelab serve --workers 2`` against one PostgreSQL: concurrent claims from many runners
through both API processes never hand one job out twice, and every queued job is handed out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from factories import spec_dict

from kernelab.runners.local import free_port, wait_healthy

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(120)]

TOKEN = "multiworker-admin-token-0123456789abcdef"
JOBS, RUNNERS = 40, 8


def test_two_workers_on_postgres_claim_each_job_once(pg_url: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "KERNELAB_DATABASE_URL": pg_url, "KERNELAB_ADMIN_TOKEN": TOKEN,
           "KERNELAB_CLAIM_WAIT_MAX_S": "0"}  # fmt: skip
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelab.runners.cli", "serve", "--port", str(port), "--workers", "2"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_healthy(url, proc, timeout_s=60, log_path=log_path)
        admin = {"Authorization": f"Bearer {TOKEN}"}
        with httpx.Client(base_url=url, timeout=30) as http:
            job_ids = {
                http.post("/api/v1/jobs", json=spec_dict(), headers=admin).json()["id"] for _ in range(JOBS)
            }
            tokens = [
                http.post("/api/v1/runners/register", headers=admin, json={
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
        pids = {line.split("[")[1].split("]")[0] for line in log_path.read_text().splitlines()
                if "Started server process" in line}  # fmt: skip
        text = log_path.read_text()
        assert len(pids) == 2 and "died" not in text and "Traceback" not in text, text[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
