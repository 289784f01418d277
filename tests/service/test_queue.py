"""The job queue: claim, lease heartbeat, expiry re-queue, bounded retries, fail, cancel,
long-poll, and concurrent claimers (threads, several connections) on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import pytest
from factories import spec_dict
from sqlalchemy import select

from kernelab.service.contract.schemas import JobSpec
from kernelab.service.server import queue
from kernelab.service.server.core.db import make_engine, make_session_factory
from kernelab.service.server.models import Job, JobAttempt, utcnow


def _expire(api, job_id: int) -> None:  # type: ignore[no-untyped-def]
    """Move the job's lease end into the past (a runner that died)."""
    with api.factory.begin() as session:
        session.get(Job, job_id).lease_expires_at = utcnow() - timedelta(seconds=1)


def _attempts(api, job_id: int) -> list[tuple[int, str]]:  # type: ignore[no-untyped-def]
    with api.factory() as session:
        rows = session.execute(
            select(JobAttempt.attempt, JobAttempt.outcome)
            .where(JobAttempt.job_id == job_id)
            .order_by(JobAttempt.id)
        )
        return [tuple(r) for r in rows]


def test_claim_heartbeat_and_lease_loss(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    a, b = api.runner("a"), api.runner("b")
    claim = api.client.post("/api/v1/runners/claim", json={"lease_s": 30}, headers=a)
    assert claim.status_code == 200 and (claim.json()["job_id"], claim.json()["attempt"]) == (job_id, 1)
    assert api.client.post("/api/v1/runners/claim", json={}, headers=b).status_code == 204
    before = claim.json()["lease_expires_at"]
    hb = api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={"lease_s": 600}, headers=a)
    at = datetime.fromisoformat  # instants, not text: RFC 3339 leaves out a zero fraction
    assert hb.status_code == 200 and at(hb.json()["lease_expires_at"]) > at(before)
    assert api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={}, headers=b).status_code == 409
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert (job["status"], job["node"]) == ("running", "a")
    _expire(api, job_id)
    late = api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={"lease_s": 30}, headers=a)
    assert late.status_code == 200  # expired, but nobody took the job over: still a's lease
    _expire(api, job_id)
    taken = api.client.post("/api/v1/runners/claim", json={}, headers=b)  # re-queues it and takes it
    assert taken.status_code == 200 and taken.json()["attempt"] == 2
    lost = api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={}, headers=a)
    assert lost.status_code == 409 and "does not hold the lease" in lost.json()["detail"]


def _last_seen(api, name: str):  # type: ignore[no-untyped-def]
    from kernelab.service.server.models import Runner

    with api.factory() as session:
        return session.scalar(select(Runner.last_seen_at).where(Runner.name == name))


def _set_last_seen(api, name: str, when) -> None:  # type: ignore[no-untyped-def]
    from kernelab.service.server.models import Runner

    with api.factory.begin() as session:
        session.scalars(select(Runner).where(Runner.name == name)).one().last_seen_at = when


def test_heartbeat_answers_the_lease_and_marks_only_the_holder_seen(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    a, b = api.runner("a"), api.runner("b")
    claim = api.client.post("/api/v1/runners/claim", json={"lease_s": 30}, headers=a).json()
    long_ago = utcnow() - timedelta(days=1)
    _set_last_seen(api, "a", long_ago)
    _set_last_seen(api, "b", long_ago)
    hb = api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={"lease_s": 600}, headers=a)
    assert hb.status_code == 200
    body = hb.json()
    assert set(body) == {"job_id", "attempt", "lease_expires_at"}
    assert (body["job_id"], body["attempt"]) == (job_id, claim["attempt"])
    at = datetime.fromisoformat  # instants, not text: RFC 3339 leaves out a zero fraction
    assert at(body["lease_expires_at"]) > at(claim["lease_expires_at"])
    assert _last_seen(api, "a") > long_ago + timedelta(hours=23)  # the holder's heartbeat marks it seen
    refused = api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={}, headers=b)
    assert refused.status_code == 409
    assert _last_seen(api, "b") == long_ago  # a refused heartbeat changes nothing (rolled back)
    with api.factory() as session:
        stored = session.get(Job, job_id).lease_expires_at
    assert stored.isoformat().replace("+00:00", "Z") == body["lease_expires_at"].replace("+00:00", "Z")


def test_expired_lease_requeues_then_fails_after_max_attempts(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner()
    for attempt in (1, 2, 3):
        claim = api.client.post("/api/v1/runners/claim", json={}, headers=runner)
        assert claim.status_code == 200 and claim.json()["attempt"] == attempt
        _expire(api, job_id)
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 204
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert (job["status"], job["attempts"]) == ("failed", 3)
    assert "expired on attempt 3/3" in job["error"] and "no attempts left" in job["error"]
    assert _attempts(api, job_id) == [(1, "expired"), (2, "expired"), (3, "expired")]


def test_fail_with_and_without_retry(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner, other = api.runner("a"), api.runner("b")
    api.client.post("/api/v1/runners/claim", json={}, headers=runner)
    body = {"error": "CUDA error: an illegal memory access", "retry": True}
    assert api.client.post(f"/api/v1/runners/jobs/{job_id}/fail", json=body, headers=other).status_code == 409
    r = api.client.post(f"/api/v1/runners/jobs/{job_id}/fail", json=body, headers=runner)
    assert r.status_code == 200 and r.json()["status"] == "queued"
    api.client.post("/api/v1/runners/claim", json={}, headers=other)
    r = api.client.post(f"/api/v1/runners/jobs/{job_id}/fail", json={**body, "retry": False}, headers=other)
    assert r.status_code == 200 and r.json()["status"] == "failed" and r.json()["error"] == body["error"]
    assert _attempts(api, job_id) == [(1, "failed"), (2, "failed")]


def test_cancel_running_job_takes_the_lease(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner()
    api.client.post("/api/v1/runners/claim", json={}, headers=runner)
    assert api.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=api.admin).json()["status"] == "cancelled"
    assert (
        api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={}, headers=runner).status_code
        == 409
    )
    assert _attempts(api, job_id) == [(1, "cancelled")]


def test_device_filter(api) -> None:  # type: ignore[no-untyped-def]
    cuda_job = api.submit(spec_dict(device="cuda"))
    cpu_runner, gpu_runner = api.runner("cpu-node"), api.runner("gpu-node", device_type="cuda")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=cpu_runner).status_code == 204
    assert api.client.post("/api/v1/runners/claim", json={}, headers=gpu_runner).json()["job_id"] == cuda_job


def test_long_poll_returns_a_job_submitted_while_waiting(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner()
    submitted: list[int] = []
    submitter = api.when_claims_wait(1, lambda: submitted.append(api.submit()))
    r = api.client.post("/api/v1/runners/claim", json={"wait_s": 30}, headers=runner)
    submitter.join()
    # A 200 with the job submitted while the claim waited: woken by it (a timed-out claim is a 204).
    assert r.status_code == 200 and r.json()["job_id"] == submitted[0]
    t0 = time.monotonic()
    assert api.client.post("/api/v1/runners/claim", json={"wait_s": 0.3}, headers=runner).status_code == 204
    assert time.monotonic() - t0 >= 0.3  # it waited wait_s before the 204 (load only makes it longer)


def test_a_token_revoked_during_a_long_poll_gets_no_job(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner("revoked-node")
    tokens = api.client.get("/api/v1/tokens", params={"revoked": "false"}, headers=api.admin).json()["data"]
    (token_id,) = [t["id"] for t in tokens if t["name"] == "runner:revoked-node"]
    submitted: list[int] = []

    def revoke_then_submit() -> None:
        revoked = api.client.post(f"/api/v1/tokens/{token_id}/revoke", headers=api.admin)
        assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
        submitted.append(api.submit())

    revoker = api.when_claims_wait(1, revoke_then_submit)  # while the claim below waits
    r = api.client.post("/api/v1/runners/claim", json={"wait_s": 30}, headers=runner)
    revoker.join()
    assert r.status_code == 401, r.text
    job = api.client.get(f"/api/v1/jobs/{submitted[0]}", headers=api.admin).json()
    assert (job["status"], job["attempts"]) == ("queued", 0)


def test_concurrent_claimers_never_share_a_job(migrated_url: str) -> None:
    """8 threads, each with its own connection, drain 40 jobs: every job claimed exactly once."""
    engine = make_engine(migrated_url, pool_size=10)
    factory = make_session_factory(engine)
    spec = JobSpec.model_validate(spec_dict())
    try:
        with factory.begin() as session:
            job_ids = {queue.submit(session, spec, max_attempts=3).id for _ in range(40)}
        claimed: list[int] = []
        errors: list[BaseException] = []
        barrier = threading.Barrier(8)

        def worker(runner_id: int) -> None:
            try:
                barrier.wait()
                while True:
                    with factory.begin() as session:
                        job = queue.claim(session, runner_id=runner_id, lease_s=60)
                        if job is None:
                            return
                        claimed.append(job.id)
            except BaseException as exc:  # surfaced by the assertion below
                errors.append(exc)

        with factory.begin() as session:
            from kernelab.service.server.models import Runner

            runners = [Runner(name=f"r{i}") for i in range(8)]
            session.add_all(runners)
            session.flush()
            runner_ids = [r.id for r in runners]
        threads = [threading.Thread(target=worker, args=(rid,)) for rid in runner_ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert sorted(claimed) == sorted(job_ids)
        with factory() as session:
            assert set(session.scalars(select(Job.status))) == {"running"}
            assert session.scalar(select(JobAttempt.id).where(JobAttempt.attempt != 1)) is None
    finally:
        engine.dispose()


@pytest.mark.parametrize("retry", [True, False])
def test_queue_functions_without_http(migrated_url: str, retry: bool) -> None:
    engine = make_engine(migrated_url)
    factory = make_session_factory(engine)
    try:
        with factory.begin() as session:
            from kernelab.service.server.models import Runner

            session.add(Runner(name="r"))
            session.flush()
            runner_id = session.scalar(select(Runner.id))
            job = queue.submit(session, JobSpec.model_validate(spec_dict()), max_attempts=1)
            job_id = job.id
        with factory.begin() as session:
            assert queue.claim(session, runner_id=runner_id, lease_s=10).id == job_id
        with factory.begin() as session:
            assert queue.requeue_expired(session) == 0  # a 10 s lease from the database's now
            with pytest.raises(queue.JobNotFoundError):
                queue.heartbeat(session, job_id + 1000, runner_id=runner_id, lease_s=10)
            job = queue.fail(session, job_id, runner_id=runner_id, error="boom", retry=retry)
            assert job.status == "failed"  # max_attempts=1: no retry either way
    finally:
        engine.dispose()
