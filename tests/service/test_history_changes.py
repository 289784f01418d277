"""History for every job: each point's median has its 95% CI, a planted slowdown is a change point
of its lines, and the fleet's regression list names it with the jobs on both sides; the filters
of ``GET /api/v1/history`` and their 422s. Through the real app on SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from test_history import CELL, H200, _post_job

A100 = "NVIDIA A100-SXM4-80GB"


def _plant(api, *, before: int = 4, after: int = 4, step: float = 1.3, model: str = H200) -> list[int]:  # type: ignore[no-untyped-def]
    """``before`` ordinary jobs at 1000 ns (baseline of cell 0), then ``after`` at ``step`` x that."""
    return [
        _post_job(
            api, hostname="h200-a", model=model, base_ns=1000.0 * (step if i >= before else 1.0), days=i
        )
        for i in range(before + after)
    ]


def test_a_planted_slowdown_is_a_change_point_and_a_regression(api) -> None:  # type: ignore[no-untyped-def]
    jobs = _plant(api)
    r = api.client.get("/api/v1/history", params={"benchmark": "softmax"}, headers=api.admin)
    assert r.status_code == 200, r.text
    page = r.json()
    assert "PELT" in page["method"] and "ruptures" in page["method"]
    assert page["series"]
    for line in page["series"]:
        for p in line["points"]:
            assert p["ci_low_ns"] is not None and p["ci_low_ns"] <= p["median_ns"] <= p["ci_high_ns"]
        (cp,) = line["change_points"]
        assert (cp["job_before"], cp["job_after"]) == (jobs[3], jobs[4])
        assert cp["direction"] == "slower" and 25 < cp["change_pct"] < 35
    regressions = api.client.get("/api/v1/history/regressions", headers=api.admin)
    assert regressions.status_code == 200, regressions.text
    body = regressions.json()
    assert body["benchmarks"] == 1 and "PELT" in body["method"]
    listed = {(r["code"], r["cell"]) for r in body["data"]}
    assert ("torch", CELL) in listed and len(listed) == len(page["series"])
    assert {(r["change"]["job_before"], r["change"]["job_after"]) for r in body["data"]} == {
        (jobs[3], jobs[4])
    }


def test_a_line_that_recovered_is_no_regression(api) -> None:  # type: ignore[no-untyped-def]
    for i, base in enumerate([1000.0] * 3 + [1400.0] * 3 + [1000.0] * 3):
        _post_job(api, hostname="h200-a", model=H200, base_ns=base, days=i)
    page = api.client.get("/api/v1/history", params={"benchmark": "softmax"}, headers=api.admin).json()
    assert [c["direction"] for c in page["series"][0]["change_points"]] == ["slower", "faster"]
    assert api.client.get("/api/v1/history/regressions", headers=api.admin).json()["data"] == []


def _lines(api, **params: Any) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = api.client.get("/api/v1/history", params={"benchmark": "softmax", **params}, headers=api.admin)
    assert r.status_code == 200, r.text
    return r.json()["series"]


def test_filters_by_cell_and_gpu_model(api) -> None:  # type: ignore[no-untyped-def]
    _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    _post_job(api, hostname="a100-a", model=A100, base_ns=1000.0, days=1)
    everything = _lines(api)
    assert {s["gpu_model"] for s in everything} == {H200, A100}
    assert {s["gpu_model"] for s in _lines(api, gpu_model=A100)} == {A100}
    m4 = _lines(api, cell=["M=4", "N=64"])
    assert m4 and {s["cell"] for s in m4} == {CELL} and all(s["params"]["M"] == 4 for s in m4)
    assert _lines(api, cell="M=12345") == []
    bad = api.client.get("/api/v1/history", params={"benchmark": "softmax", "cell": "M"}, headers=api.admin)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "cell"]
    from kernelab.service.server.api.routes.history import CELL_FILTER_MAX_CHARS

    longest = "M=" + "4" * (CELL_FILTER_MAX_CHARS - 2)  # a URL a server takes (h11: 16 KiB head)
    assert _lines(api, cell=longest) == []
    too_long = api.client.get(
        "/api/v1/history", params={"benchmark": "softmax", "cell": longest + "4"}, headers=api.admin
    )
    assert too_long.status_code == 422
    errors = [(e["loc"], e["type"]) for e in too_long.json()["detail"]]
    assert errors == [(["query", "cell", 0], "string_too_long")]
    assert (
        api.client.get("/api/v1/history/regressions", params={"limit": 0}, headers=api.admin).status_code
        == 422
    )
    assert api.client.get("/api/v1/history/regressions").status_code == 401
