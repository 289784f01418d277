"""``/api/v1/jobs``: submission and validation, auth scopes, lists, cancel, result views."""

from __future__ import annotations

import json

import pytest
from factories import job_result, spec_dict


def _loc(response) -> list[list]:  # type: ignore[no-untyped-def]
    assert response.status_code == 422, response.text
    return [e["loc"] for e in response.json()["detail"]]


def test_submit_valid_spec(api) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=spec_dict(), headers=api.token("submit"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert (job["status"], job["attempts"], job["max_attempts"], job["benchmark"]) == (
        "queued",
        0,
        3,
        "softmax",
    )
    assert job["spec"]["sweep"] == {"M": [4], "N": [64, 128]}
    assert api.client.get(f"/api/v1/jobs/{job['id']}", headers=api.token("read")).json() == job


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"benchmark": "no-such-benchmark"}, ["body", "benchmark"]),
        ({"sweep": {"M": [4], "N": [-64]}}, ["body", "sweep", "N"]),
        ({"baseline": {"variant": "cublas"}}, ["body", "baseline", "variant"]),
        ({"surprise": 1}, ["body", "surprise"]),
        ({"measurement": {"warmup_ms": -1}}, ["body", "measurement", "warmup_ms"]),
        ({"sweep": {"M": [2**40], "N": [64]}}, ["body", "sweep", "M"]),  # beyond int32: the benchmark
        ({"sweep": {"M": [10**20], "N": [64]}}, ["body", "sweep", "M", 0]),  # beyond int64: the schema
    ],
)
def test_submit_invalid_spec_names_the_field(api, change, loc) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=spec_dict(**change), headers=api.admin)
    assert loc in _loc(r)
    assert api.client.get("/api/v1/jobs", headers=api.admin).json()["count"] == 0


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "1e999"])
def test_non_finite_number_is_a_422_not_a_500(api, literal) -> None:  # type: ignore[no-untyped-def]
    # Python's json module reads NaN/Infinity/1e999; the 422 must still be encodable JSON.
    spec = spec_dict()
    spec.pop("measurement", None)
    body = json.dumps(spec)[:-1] + f', "measurement": {{"budget_ms": {literal}}}}}'
    r = api.client.post(
        "/api/v1/jobs", content=body, headers={**api.admin, "content-type": "application/json"}
    )
    assert ["body", "measurement", "budget_ms"] in _loc(r)


def test_submit_missing_field(api) -> None:  # type: ignore[no-untyped-def]
    spec = spec_dict()
    del spec["candidate"]
    assert ["body", "candidate"] in _loc(api.client.post("/api/v1/jobs", json=spec, headers=api.admin))


def test_auth_scopes(api) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=spec_dict())
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    bad = {"Authorization": "Bearer not-a-token"}
    assert api.client.get("/api/v1/jobs", headers=bad).status_code == 401
    assert api.client.post("/api/v1/jobs", json=spec_dict(), headers=api.token("read")).status_code == 403
    assert api.client.post("/api/v1/jobs", json=spec_dict(), headers=api.runner()).status_code == 403
    assert api.client.get("/api/v1/jobs", headers=api.runner("r2")).status_code == 403
    body = {"name": "x"}
    assert (
        api.client.post("/api/v1/runners/register", json=body, headers=api.token("submit")).status_code == 403
    )
    assert api.client.post("/api/v1/runners/claim", json={}, headers=api.admin).status_code == 403


def test_list_pagination(api) -> None:  # type: ignore[no-untyped-def]
    ids = [api.submit(spec_dict(name=f"job {i}")) for i in range(5)]
    read = api.token("read")
    page = api.client.get("/api/v1/jobs?offset=1&limit=2", headers=read).json()
    assert page["count"] == 5
    assert [j["id"] for j in page["data"]] == sorted(ids, reverse=True)[1:3]
    assert api.client.get("/api/v1/jobs?limit=100000", headers=read).status_code == 422
    assert api.client.get("/api/v1/jobs?offset=-1", headers=read).status_code == 422
    api.client.post(f"/api/v1/jobs/{ids[0]}/cancel", headers=api.admin)
    cancelled = api.client.get("/api/v1/jobs?status=cancelled", headers=read).json()
    assert (cancelled["count"], cancelled["data"][0]["id"]) == (1, ids[0])


def test_cancel(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    r = api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.token("submit"))
    assert r.status_code == 200 and r.json()["status"] == "cancelled" and r.json()["finished_at"]
    again = api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.admin)
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    assert api.client.post("/api/v1/runners/claim", json={}, headers=api.runner()).status_code == 204


def test_comparison_and_report(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    read, runner = api.token("read"), api.runner()
    r = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=read)
    assert r.status_code == 409 and "no result" in r.json()["detail"]
    assert api.client.get(f"/api/v1/jobs/{job_id}/report.md", headers=read).status_code == 409
    api.client.post("/api/v1/runners/claim", json={}, headers=runner)
    result = job_result(job_id)
    assert api.post_result(job_id, result, runner).status_code == 201
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=read).json()
    assert comparison["job_id"] == job_id
    assert [c["verdict"] for c in comparison["cells"]] == ["faster", "faster"]
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=read).json()["summary"] == comparison["summary"]
    report = api.client.get(f"/api/v1/jobs/{job_id}/report.md", headers=read)
    assert report.status_code == 200 and report.headers["content-type"].startswith("text/markdown")
    assert "softmax" in report.text and "faster" in report.text


def test_health(api) -> None:  # type: ignore[no-untyped-def]
    assert api.client.get("/healthz").json() == {"status": "ok"}
    assert api.client.get("/readyz").json() == {"status": "ok"}


def test_readyz_reports_an_unreachable_database(api) -> None:  # type: ignore[no-untyped-def]
    from kernelab.service.server.core.db import make_engine

    api.client.app.state.engine = make_engine("postgresql+psycopg://nobody@127.0.0.1:1/none")
    r = api.client.get("/readyz")
    assert r.status_code == 503 and r.json()["status"] == "unavailable"


def test_request_body_limit(migrated_url, client_class, admin_token) -> None:  # type: ignore[no-untyped-def]
    from kernelab.app import create_app
    from kernelab.service.server.core.config import Settings

    app = create_app(Settings(database_url=migrated_url, admin_token=admin_token, max_request_bytes=2048))
    headers = {"Authorization": f"Bearer {admin_token}"}
    with client_class(app) as client:
        big = spec_dict(name="x" * 100, params={f"p{i}": i for i in range(300)})
        r = client.post("/api/v1/jobs", json=big, headers=headers)
        assert r.status_code == 413 and "2048" in r.json()["detail"]

        def chunks():  # type: ignore[no-untyped-def]
            yield b'{"name": "'
            for _ in range(10):
                yield b"y" * 512

        r = client.post(
            "/api/v1/jobs", content=chunks(), headers={**headers, "content-type": "application/json"}
        )
        assert r.status_code == 413
        assert client.get("/api/v1/jobs", headers=headers).json()["count"] == 0
