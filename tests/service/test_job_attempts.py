"""``GET /api/v1/jobs/{id}/attempts`` and the job page's attempts table, on SQLite and PostgreSQL:
a lease that expires once and a second claim that succeeds show as [expired, succeeded] with the
runners' names; scopes (401 without a token, 403 for a runner token); 404 for an unknown job."""

from __future__ import annotations

import typing
from datetime import datetime, timedelta

from factories import job_result
from sqlalchemy import delete, update

from kernelab.service.contract.schemas import AttemptOutcome
from kernelab.service.server.models import ATTEMPT_OUTCOMES, Job, JobAttempt, Runner, utcnow


def _expire(api, job_id: int) -> None:  # type: ignore[no-untyped-def]
    """Move the job's lease end into the past (a runner that died)."""
    with api.factory.begin() as session:
        session.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)


def _expire_then_succeed(api) -> int:  # type: ignore[no-untyped-def]
    """A job claimed by ``node-a`` (lease expires) then by ``node-b`` (posts a result)."""
    job_id = api.submit()
    a, b = api.runner("node-a"), api.runner("node-b")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=a).json()["attempt"] == 1
    _expire(api, job_id)
    claim = api.client.post("/api/v1/runners/claim", json={}, headers=b)
    assert claim.status_code == 200 and claim.json()["attempt"] == 2, claim.text
    assert api.post_result(job_id, job_result(job_id, hostname="node-b"), b).status_code == 201
    return job_id


def test_expired_then_succeeded_attempts_in_order(api) -> None:  # type: ignore[no-untyped-def]
    job_id = _expire_then_succeed(api)
    read = api.token("read")
    r = api.client.get(f"/api/v1/jobs/{job_id}/attempts", headers=read)
    assert r.status_code == 200, r.text
    page = r.json()
    assert page["count"] == 2
    rows = page["data"]
    assert [(x["attempt"], x["runner"], x["outcome"]) for x in rows] == [
        (1, "node-a", "expired"),
        (2, "node-b", "succeeded"),
    ]
    assert all(x["claimed_at"] and x["ended_at"] for x in rows)
    # as instants: RFC 3339 text leaves out a zero fraction ("...:03Z" sorts after "...:03.010000Z")
    claimed = [datetime.fromisoformat(x["claimed_at"]) for x in rows]
    assert claimed[0] <= claimed[1]
    assert "expired" in rows[0]["error"] and rows[1]["error"] is None
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=read).json()
    assert (job["status"], job["attempts"]) == ("succeeded", 2)

    second = api.client.get(f"/api/v1/jobs/{job_id}/attempts?offset=1&limit=1", headers=read).json()
    assert second["count"] == 2 and [x["attempt"] for x in second["data"]] == [2]


def test_running_attempt_and_deleted_runner(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner("gone")
    api.client.post("/api/v1/runners/claim", json={}, headers=runner)
    rows = api.client.get(f"/api/v1/jobs/{job_id}/attempts", headers=api.admin).json()["data"]
    assert [(x["runner"], x["outcome"], x["ended_at"]) for x in rows] == [("gone", "running", None)]
    with api.factory.begin() as session:
        session.execute(delete(Runner).where(Runner.name == "gone"))
    rows = api.client.get(f"/api/v1/jobs/{job_id}/attempts", headers=api.admin).json()["data"]
    assert [(x["attempt"], x["runner"]) for x in rows] == [(1, None)]


def test_no_attempts_yet_and_unknown_job(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    read = api.token("read")
    r = api.client.get(f"/api/v1/jobs/{job_id}/attempts", headers=read)
    assert r.status_code == 200 and r.json() == {"data": [], "count": 0}
    missing = api.client.get("/api/v1/jobs/999999/attempts", headers=read)
    assert missing.status_code == 404 and "job 999999 does not exist" in missing.json()["detail"]
    assert api.client.get("/api/v1/jobs/0/attempts", headers=read).status_code == 422
    assert api.client.get(f"/api/v1/jobs/{job_id}/attempts?limit=0", headers=read).status_code == 422


def test_attempts_need_a_read_token(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner()
    r = api.client.get(f"/api/v1/jobs/{job_id}/attempts")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    bad = api.client.get(f"/api/v1/jobs/{job_id}/attempts", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401
    assert api.client.get(f"/api/v1/jobs/{job_id}/attempts", headers=runner).status_code == 403


def test_job_page_shows_the_attempts(api) -> None:  # type: ignore[no-untyped-def]
    job_id = _expire_then_succeed(api)
    with api.factory.begin() as session:  # an error with markup is shown as text
        session.execute(delete(Runner).where(Runner.name == "node-a"))
        session.execute(update(JobAttempt).where(JobAttempt.job_id == job_id, JobAttempt.attempt == 1)
                        .values(error="<script>alert(1)</script>"))  # fmt: skip
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin)
    assert page.status_code == 200, page.text
    body = page.text
    table = body[body.index('id="attempts-table"') :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 3  # header + 2 attempts
    assert "node-b" in table and "(deleted runner)" in table
    assert "status-expired" in table and "status-succeeded" in table
    assert "<script>alert" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in table
    queued = api.submit()
    assert 'id="attempts-table"' not in api.client.get(f"/jobs/{queued}", headers=api.admin).text


def test_outcomes_match_the_model() -> None:
    assert typing.get_args(AttemptOutcome) == ATTEMPT_OUTCOMES
