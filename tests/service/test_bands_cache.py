"""Node-health bands are cached per node and per GPU model (``node_health.BANDS``) and recomputed
when a new probe report lands (any process: the database's newest report id) or when the entry
has expired (a fake clock here, never a sleep)."""

from __future__ import annotations

from typing import Any

import pytest
from health_fixtures import h200x2_report

from kernelab.service.judge import health
from kernelab.service.server import node_health

pytestmark = pytest.mark.timeout(120)
NODE = "h200-node-1"


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(node_health, "BANDS", node_health.BandsCache(ttl_s=60.0, clock=fake))
    return fake


@pytest.fixture
def computed(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often a node's bands and a model's fleet bands are computed from their reports."""
    counts = {"node": 0, "fleet": 0}
    real_history, real_fleet = health.evaluate_history, health.fleet_bands

    def history(*args: Any, **kwargs: Any) -> Any:
        counts["node"] += 1
        return real_history(*args, **kwargs)

    def fleet(*args: Any, **kwargs: Any) -> Any:
        counts["fleet"] += 1
        return real_fleet(*args, **kwargs)

    monkeypatch.setattr(health, "evaluate_history", history)
    monkeypatch.setattr(health, "fleet_bands", fleet)
    return counts


def _post(api, runner, minutes: float) -> None:  # type: ignore[no-untyped-def]
    report = h200x2_report(minutes)
    r = api.client.post(f"/api/v1/nodes/{NODE}/probes", content=report.model_dump_json(),
                        headers={**runner, "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 201, r.text


def _node(api) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = api.client.get(f"/api/v1/nodes/{NODE}", headers=api.admin)
    assert r.status_code == 200, r.text
    return r.json()


def test_bands_are_cached_until_a_probe_lands(api, clock: FakeClock, computed: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(NODE)
    for minute in range(3):
        _post(api, runner, minute)
    first = _node(api)
    assert computed["node"] == 1 and computed["fleet"] == 1
    for _ in range(3):  # the node's REST view and page again: bands from the cache
        assert _node(api) == first
        assert api.client.get(f"/nodes/{NODE}", headers=api.admin).status_code == 200
    assert computed == {"node": 1, "fleet": 1} and node_health.BANDS.hits >= 6

    _post(api, runner, 3)  # a new probe report invalidates: the next read sees it
    after = _node(api)
    assert computed == {"node": 2, "fleet": 2}
    assert after["health"]["taken_at"] != first["health"]["taken_at"]
    _node(api)
    assert computed == {"node": 2, "fleet": 2}


def test_cached_bands_expire(api, clock: FakeClock, computed: dict[str, int]) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(NODE)
    _post(api, runner, 0)
    _node(api)
    clock.now_s += 59.0
    _node(api)
    assert computed == {"node": 1, "fleet": 1}
    clock.now_s += 2.0  # past ttl_s since the entry was made
    _node(api)
    assert computed == {"node": 2, "fleet": 2}
