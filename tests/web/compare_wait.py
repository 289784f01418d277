"""The compare worker beside a dashboard test's server, and waiting for what it stores.

The dashboard tests run the app under uvicorn directly, as a fleet does; comparisons are computed
by a compare worker process of their own (``python -m kernelab.service.server.compare_worker``), as
``kernelab compare-worker`` runs one. Waiting reads the job's ``comparison_status`` (the protocol),
never a duration."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from typing import IO

import httpx

DEADLINE_S = 300.0  # a comparison not stored by then fails the test
POLL_S = 0.1


def start(env: Mapping[str, str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    """A compare worker process on the database of ``env`` (``KERNELAB_DATABASE_URL``)."""
    return subprocess.Popen([sys.executable, "-m", "kernelab.service.server.compare_worker"],
                            env={**env, "KERNELAB_COMPARE_POLL_S": "0.05"}, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (it hands its task back and exits), SIGKILL after 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def until_compared(api: httpx.Client, job_ids: Iterable[int], headers: Mapping[str, str]) -> None:
    """Wait until no job of ``job_ids`` reads ``comparing`` (``api``: a client of ``/api/v1``)."""
    deadline = time.monotonic() + DEADLINE_S
    for job_id in job_ids:
        while api.get(f"/jobs/{job_id}", headers=dict(headers)).json()["comparison_status"] == "comparing":
            assert time.monotonic() < deadline, f"job {job_id} still comparing"
            time.sleep(POLL_S)
