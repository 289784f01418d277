"""Managing jobs over the API: progress sent with heartbeats, stored and shown while the job runs
(reset by a new claim); cancel and re-run with their scopes; the bisect record and its rules."""

from __future__ import annotations

from datetime import timedelta

from factories import spec_dict
from sqlalchemy import select

from kernelab.service.server.models import Job, JobAttempt, utcnow

PROGRESS = {
    "cell": 1,
    "cells": 4,
    "cells_done": 1,
    "phase": "measuring",
    "message": "round 8: ratio 1.01",
    "elapsed_s": 12.5,
    "eta_s": 30.0,
}


def test_heartbeat_progress_is_stored_shown_while_running_and_reset_by_a_new_claim(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner()
    assert api.client.post("/api/v1/runners/claim", json={"lease_s": 30}, headers=runner).status_code == 200
    beat = api.client.post(
        f"/api/v1/runners/jobs/{job_id}/heartbeat", json={"progress": PROGRESS}, headers=runner
    )
    assert beat.status_code == 200, beat.text
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert job["progress"] == PROGRESS and job["progress_at"] is not None
    # a heartbeat without progress keeps the last one
    assert (
        api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={}, headers=runner).status_code
        == 200
    )
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["progress"] == PROGRESS
    listed = api.client.get("/api/v1/jobs?status=running", headers=api.admin).json()["data"]
    assert [j["progress"] for j in listed if j["id"] == job_id] == [PROGRESS]
    # the lease runs out; another claim starts from nothing
    with api.factory.begin() as session:
        session.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)
    assert api.client.post("/api/v1/runners/claim", json={}, headers=api.runner("b")).json()["attempt"] == 2
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["progress"] is None


def test_bad_progress_is_a_422_naming_the_field(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner()
    api.client.post("/api/v1/runners/claim", json={}, headers=runner)
    for field, value in (("phase", "napping"), ("cell", -1), ("eta_s", -3.0)):
        r = api.client.post(
            f"/api/v1/runners/jobs/{job_id}/heartbeat",
            json={"progress": {**PROGRESS, field: value}},
            headers=runner,
        )
        assert r.status_code == 422 and ["body", "progress", field] in [e["loc"] for e in r.json()["detail"]]


def test_cancel_needs_submit_and_names_the_token(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    assert api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.token("read")).status_code == 403
    assert api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.token("submit")).status_code == 200
    with api.factory() as session:
        [error] = session.scalars(select(JobAttempt.error).where(JobAttempt.job_id == job_id)).all() or [None]
    # a queued job has no attempt to end; a running one's attempt names who cancelled
    assert error is None
    running = api.submit()
    api.client.post("/api/v1/runners/claim", json={}, headers=api.runner())
    assert api.client.post(f"/api/v1/jobs/{running}/cancel", headers=api.admin).status_code == 200
    with api.factory() as session:
        [error] = session.scalars(select(JobAttempt.error).where(JobAttempt.job_id == running)).all()
    assert error.startswith("cancelled by token ")


def test_rerun_queues_the_spec_again_with_a_link(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit(spec_dict(name="to run again"))
    api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.admin)
    assert api.client.post(f"/api/v1/jobs/{job_id}/rerun", headers=api.token("read")).status_code == 403
    r = api.client.post(f"/api/v1/jobs/{job_id}/rerun", headers=api.token("submit"))
    assert r.status_code == 201, r.text
    new = r.json()
    assert new["id"] != job_id and new["rerun_of"] == job_id and new["status"] == "queued"
    assert (
        new["name"] == "to run again"
        and new["spec"] == api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["spec"]
    )
    assert api.client.post("/api/v1/jobs/987654/rerun", headers=api.admin).status_code == 404


def _bisect_body(commits: list[str]) -> dict[str, object]:
    return {
        "name": "b",
        "repo": "/r",
        "good": "aaaa",
        "bad": commits[-1],
        "good_ref": "v1",
        "bad_ref": "main",
        "commits": [{"sha": c, "subject": f"s {c}"} for c in commits],
        "spec": spec_dict(),
    }


def test_bisect_record_steps_and_finish(api) -> None:  # type: ignore[no-untyped-def]
    submit, read = api.token("submit"), api.token("read")
    assert api.client.post("/api/v1/bisects", json=_bisect_body(["bbbb"]), headers=read).status_code == 403
    created = api.client.post("/api/v1/bisects", json=_bisect_body(["bbbb", "cccc", "dddd"]), headers=submit)
    assert created.status_code == 201, created.text
    bid = created.json()["id"]
    assert created.json()["status"] == "running" and created.json()["benchmark"] == "softmax"
    step = {
        "job_id": 1,
        "commit": "dddd",
        "role": "ends",
        "outcome": "bad",
        "verdict": "slower",
        "cell": "N=1",
        "ratio": 3.0,
        "ci_low": 2.9,
        "ci_high": 3.1,
        "summary": {"slower": 1},
    }
    r = api.client.post(f"/api/v1/bisects/{bid}/steps", json=step, headers=submit)
    assert r.status_code == 200 and r.json()["steps"][0]["ratio"] == 3.0
    outside = api.client.post(f"/api/v1/bisects/{bid}/steps", json={**step, "commit": "eeee"}, headers=submit)
    assert outside.status_code == 409 and "eeee" in outside.json()["detail"]
    wrong = api.client.post(
        f"/api/v1/bisects/{bid}/finish", json={"status": "found", "first_bad": "eeee"}, headers=submit
    )
    assert wrong.status_code == 409
    done = api.client.post(
        f"/api/v1/bisects/{bid}/finish", json={"status": "found", "first_bad": "cccc"}, headers=submit
    )
    assert done.status_code == 200 and done.json()["first_bad"] == "cccc" and done.json()["finished_at"]
    assert api.client.post(f"/api/v1/bisects/{bid}/steps", json=step, headers=submit).status_code == 409
    listed = api.client.get("/api/v1/bisects", headers=read).json()
    assert listed["data"][0]["id"] == bid and listed["data"][0]["status"] == "found"
    bad = api.client.post("/api/v1/bisects", json={**_bisect_body(["bbbb"]), "good": "XYZ!"}, headers=submit)
    assert bad.status_code == 422 and ["body", "good"] in [e["loc"] for e in bad.json()["detail"]]
