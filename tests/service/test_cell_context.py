"""Cells keep how they were measured (timer per variant, contention readings) through the API
and the database (migration 0003_timing)."""

from __future__ import annotations

import pytest

from kernelab.service.contract.schemas import ContentionReading, Placement, TimerCrossCheck
from kernelab.service.server import crud
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


def test_cross_check_and_placement_round_trip(api) -> None:  # type: ignore[no-untyped-def]
    """Both timing methods' figures go through the API and the database (``cells.context``) and
    come back judged: the other method reads the 20%-faster candidate 1.5x slower than its
    baseline, so the cell is ``inconclusive`` with ``timer-disagreement``."""
    job_id = api.submit()
    runner = api.runner("node-a")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    result = job_result(job_id)
    result.cells[0].timers = {"baseline": "cuda-graph", "candidate": "cuda-graph"}
    result.cells[0].placement = Placement(input_sets=2, swap_every_rounds=2)
    result.cells[0].cross_check = TimerCrossCheck(
        methods={"baseline": "cuda-event", "candidate": "cuda-event"}, rounds=5,
        launches={"baseline": 3, "candidate": 3},
        samples_ns={"baseline": [1000.0, 1001.0, 999.0, 1000.5, 1000.0],
                    "candidate": [1500.0, 1501.0, 1499.0, 1500.5, 1500.0]},
    )  # fmt: skip
    result.cells[1].cross_check = TimerCrossCheck(
        methods={"baseline": "cuda-event", "candidate": "cuda-event"}, error="cuda-graph: 1 memcpy node"
    )
    assert api.post_result(job_id, result, runner).status_code == 201
    with api.factory() as session:
        assert crud.load_result(session=session, job_id=job_id) == result
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()
    first, second = comparison["cells"]
    assert first["verdict"] == "inconclusive" and "timer-disagreement" in first["flags"]
    assert first["cross_check"]["cross_median_ns"] == {"baseline": 1000.0, "candidate": 1500.0}
    assert first["cross_check"]["primary_median_ns"]["baseline"] == pytest.approx(1000.0, rel=0.01)
    assert second["cross_check"]["error"] == "cuda-graph: 1 memcpy node"
    assert second["verdict"] == "faster"
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin).text  # the dashboard shows both figures
    assert 'id="cross-check"' in page
    assert "cuda-event 1.500 µs" in page and "no cross-check (cuda-graph: 1 memcpy node)" in page
