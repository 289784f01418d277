"""Helpers of the fault drills (``test_fault_drills*.py``): the drill job spec, waiting, and
what the database and the server's JSON log hold afterwards."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import func, select

from kernelab.service.server.core.db import make_engine
from kernelab.service.server.models import Cell, Job, JobAttempt, Result, SampleBlock

TOKEN = "drill-admin-token-0123456789abcdef0123456789"
LEASE_S = 5.0  # the shortest lease the API accepts (ClaimRequest.lease_s >= 5)


def spec(budget_ms: float, cells: int = 1) -> dict[str, Any]:
    """A softmax job (torch vs triton, CPU) of ``cells`` cells measured for ``budget_ms`` each."""
    return {
        "name": "drill", "benchmark": "softmax", "baseline": {"variant": "torch"},
        "candidate": {"variant": "triton"}, "sweep": {"M": [8], "N": [16 * (i + 1) for i in range(cells)]},
        "measurement": {"warmup_ms": 1, "budget_ms": budget_ms, "min_rounds": 4},
        "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False}, "timeout_s": 120,
    }  # fmt: skip


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def events(log_path: Path) -> list[dict[str, Any]]:
    """The JSON records of the server's log (complete lines only)."""
    out = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and line.endswith("}"):
            out.append(json.loads(line))
    return out


def counts(url: str, job_id: int) -> dict[str, int]:
    """What the database holds of ``job_id``: results, cells, samples, status, attempts."""
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
