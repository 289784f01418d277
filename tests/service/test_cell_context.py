"""Cells keep how they were measured (timer per variant, contention readings) through the API
and the database (migration 0003_timing)."""

from __future__ import annotations

import pytest

from kernelab.service import crud
from kernelab.service.schemas import ContentionReading
from tests.service.factories import job_result

pytestmark = pytest.mark.timeout(60)


def test_timers_and_contention_round_trip(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner("node-a")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    result = job_result(job_id)
    result.timer = "cuda-graph+cuda-event"
    result.cells[0].timers = {"baseline": "cuda-graph", "candidate": "cuda-event"}
    result.cells[0].contention = [
        ContentionReading(round=0, processes=[{"pid": 7, "own": True, "used_memory_bytes": 5,
                                               "sm_util_pct": None}]),
        ContentionReading(round=9, processes=[{"pid": 7, "own": True}, {"pid": 8, "own": False,
                                               "used_memory_bytes": None, "sm_util_pct": 40.0}]),
    ]  # fmt: skip
    assert api.post_result(job_id, result, runner).status_code == 201
    with api.factory() as session:
        assert crud.load_result(session=session, job_id=job_id) == result
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()
    assert comparison["timer"] == "cuda-graph+cuda-event"
    assert comparison["cells"][0]["timers"] == {"baseline": "cuda-graph", "candidate": "cuda-event"}
    assert "contended" in comparison["cells"][0]["flags"] and "contended" in comparison["flags"]
    assert "contended" not in comparison["cells"][1]["flags"]
