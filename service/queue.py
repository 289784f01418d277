"""The job queue, in the database: submit, claim under a lease, heartbeat, fail, cancel, complete.

Claims are safe with several server processes on one database:

* PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` picks the oldest queued job nobody else is
  claiming, then a conditional ``UPDATE`` takes it.
* SQLite: a conditional ``UPDATE jobs ... WHERE id = ? AND status = 'queued'`` whose rowcount says
  whether this transaction won; SQLite serialises writers, so exactly one claimer sees rowcount 1.

Expired leases are noticed at claim time (no background thread): the job goes back to ``queued``
while ``attempts < max_attempts``, else it fails with the reason. Every claim is a row in
``job_attempts``. Functions take ``session`` and never commit: the request commits once.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from service import models
from service.models import Job, JobAttempt, utcnow
from service.schemas import JobSpec

_CLAIM_CANDIDATES = 16  # queued jobs tried per claim on SQLite before giving up for this poll
TERMINAL = ("succeeded", "failed", "cancelled")


class QueueError(Exception):
    """Base of queue errors; ``job_id`` names the job."""

    def __init__(self, message: str, job_id: int):
        super().__init__(message)
        self.job_id = job_id


class JobNotFoundError(QueueError):
    """No job with this id (HTTP 404)."""


class LeaseLostError(QueueError):
    """The caller does not hold the job's lease (any more): expired, re-queued, cancelled (HTTP 409)."""


class InvalidTransitionError(QueueError):
    """The job's status does not allow this operation, e.g. cancelling a finished job (HTTP 409)."""


def _rowcount(result: object) -> int:
    assert isinstance(result, CursorResult)
    return result.rowcount


def get_job(session: Session, job_id: int) -> Job:
    """The job row. Raises ``JobNotFoundError``."""
    job = session.get(Job, job_id)
    if job is None:
        raise JobNotFoundError(f"job {job_id} does not exist", job_id)
    return job


def submit(session: Session, spec: JobSpec, *, max_attempts: int, submitted_by: int | None = None) -> Job:
    """Queue a validated spec as a new job (status ``queued``). Flushes, so ``job.id`` is set."""
    job = Job(
        name=spec.name,
        benchmark=spec.benchmark,
        spec=spec.model_dump(mode="json"),
        device=spec.device,
        status="queued",
        attempts=0,
        max_attempts=max_attempts,
        submitted_by=submitted_by,
    )
    session.add(job)
    session.flush()
    return job


def _end_attempt(
    session: Session, job_id: int, attempt: int, outcome: str, now: datetime, error: str | None
) -> None:
    session.execute(
        update(JobAttempt)
        .where(JobAttempt.job_id == job_id, JobAttempt.attempt == attempt, JobAttempt.outcome == "running")
        .values(outcome=outcome, ended_at=now, error=error)
    )


def requeue_expired(session: Session, *, now: datetime | None = None) -> int:
    """Re-queue (or fail, when out of attempts) running jobs whose lease ended before ``now``.

    Each job is moved by a conditional UPDATE, so concurrent callers never both move one job.
    Returns how many jobs this call moved.
    """
    now = now or utcnow()
    expired = session.execute(
        select(Job.id, Job.attempts, Job.max_attempts, Job.lease_runner_id).where(
            Job.status == "running", Job.lease_expires_at < now
        )
    ).all()
    moved = 0
    for job_id, attempts, max_attempts, runner_id in expired:
        reason = f"lease of runner {runner_id} expired on attempt {attempts}/{max_attempts}"
        retry = attempts < max_attempts
        values: dict[str, object] = {"lease_runner_id": None, "lease_expires_at": None}
        if retry:
            values.update(status="queued")
        else:
            values.update(status="failed", finished_at=now, error=f"{reason}; no attempts left")
        won = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.lease_expires_at < now)
            .values(**values)
        )
        if _rowcount(won) == 1:
            _end_attempt(session, job_id, attempts, "expired", now, reason)
            moved += 1
    return moved


def claim(
    session: Session,
    *,
    runner_id: int,
    lease_s: float,
    device_type: str | None = None,
    now: datetime | None = None,
) -> Job | None:
    """Take the oldest queued job for ``runner_id`` under a lease of ``lease_s`` seconds.

    ``device_type`` ("cpu"/"cuda", from the runner's ``NodeInfo``) skips jobs whose spec asks for
    the other device; None takes any job. Expired leases are re-queued first. Returns the job
    (status ``running``, ``attempts`` incremented) or None when nothing is queued.
    """
    now = now or utcnow()
    requeue_expired(session, now=now)
    query = select(Job.id).where(Job.status == "queued").order_by(Job.id)
    if device_type is not None:
        query = query.where(Job.device.in_(("auto", device_type)))
    is_postgres = session.get_bind().dialect.name == "postgresql"
    if is_postgres:
        candidates = list(session.scalars(query.limit(1).with_for_update(skip_locked=True)))
    else:
        candidates = list(session.scalars(query.limit(_CLAIM_CANDIDATES)))
    for job_id in candidates:
        won = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "queued")
            .values(
                status="running",
                attempts=Job.attempts + 1,
                lease_runner_id=runner_id,
                lease_expires_at=now + timedelta(seconds=lease_s),
                started_at=func.coalesce(Job.started_at, now),
            )
            .execution_options(synchronize_session=False)
        )
        if _rowcount(won) != 1:
            continue
        job = session.get(Job, job_id, populate_existing=True)
        assert job is not None
        session.add(JobAttempt(job_id=job_id, attempt=job.attempts, runner_id=runner_id, claimed_at=now))
        session.execute(update(models.Runner).where(models.Runner.id == runner_id).values(last_seen_at=now))
        session.flush()
        return job
    return None


def _held(session: Session, job_id: int, runner_id: int, now: datetime, *, allow_expired: bool) -> Job:
    job = get_job(session, job_id)
    session.refresh(job)
    if job.status != "running" or job.lease_runner_id != runner_id:
        raise LeaseLostError(
            f"runner {runner_id} does not hold the lease of job {job_id} (status {job.status})", job_id
        )
    if not allow_expired and job.lease_expires_at is not None and job.lease_expires_at < now:
        raise LeaseLostError(
            f"the lease of job {job_id} expired at {job.lease_expires_at.isoformat()}", job_id
        )
    return job


def heartbeat(
    session: Session, job_id: int, *, runner_id: int, lease_s: float, now: datetime | None = None
) -> Job:
    """Extend the lease to ``now + lease_s`` seconds.

    Raises ``JobNotFoundError``, or ``LeaseLostError`` when the lease expired, the job was
    re-queued, cancelled or finished, or another runner holds it.
    """
    now = now or utcnow()
    _held(session, job_id, runner_id, now, allow_expired=False)
    won = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == "running", Job.lease_runner_id == runner_id)
        .values(lease_expires_at=now + timedelta(seconds=lease_s))
        .execution_options(synchronize_session=False)
    )
    if _rowcount(won) != 1:
        raise LeaseLostError(f"runner {runner_id} lost the lease of job {job_id}", job_id)
    session.execute(update(models.Runner).where(models.Runner.id == runner_id).values(last_seen_at=now))
    return session.get(Job, job_id, populate_existing=True)  # type: ignore[return-value]


def fail(
    session: Session, job_id: int, *, runner_id: int, error: str, retry: bool, now: datetime | None = None
) -> Job:
    """The lease holder reports that the job failed. With ``retry`` and attempts left the job
    goes back to ``queued``; otherwise it is ``failed`` with ``error``.

    Raises ``JobNotFoundError`` or ``LeaseLostError``.
    """
    now = now or utcnow()
    job = _held(session, job_id, runner_id, now, allow_expired=True)
    if retry and job.attempts < job.max_attempts:
        values: dict[str, object] = {"status": "queued", "error": error}
    else:
        values = {"status": "failed", "error": error, "finished_at": now}
    return _finish_held(session, job, runner_id, "failed", now, error, values)


def _finish_held(
    session: Session,
    job: Job,
    runner_id: int,
    outcome: str,
    now: datetime,
    error: str | None,
    values: dict[str, object],
) -> Job:
    won = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == "running", Job.lease_runner_id == runner_id)
        .values(lease_runner_id=None, lease_expires_at=None, **values)
        .execution_options(synchronize_session=False)
    )
    if _rowcount(won) != 1:
        raise LeaseLostError(f"runner {runner_id} lost the lease of job {job.id}", job.id)
    _end_attempt(session, job.id, job.attempts, outcome, now, error)
    session.refresh(job)
    return job


def cancel(session: Session, job_id: int, *, now: datetime | None = None) -> Job:
    """Cancel a queued or running job (a runner holding it loses its lease: 409 on heartbeat).

    Raises ``JobNotFoundError``, or ``InvalidTransitionError`` for a finished job.
    """
    now = now or utcnow()
    job = get_job(session, job_id)
    won = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(("queued", "running")))
        .values(status="cancelled", finished_at=now, lease_runner_id=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    session.refresh(job)
    if _rowcount(won) != 1:
        raise InvalidTransitionError(
            f"job {job_id} is {job.status}; only queued or running jobs cancel", job_id
        )
    _end_attempt(session, job_id, job.attempts, "cancelled", now, "cancelled by a user")
    return job


def complete(
    session: Session, job_id: int, *, runner_id: int, error: str | None, now: datetime | None = None
) -> Job:
    """Finish the job when its result arrives: ``succeeded``, or ``failed`` when ``error`` is set.

    A lease that expired but was not yet taken over still counts (the measurement is kept).
    Raises ``JobNotFoundError`` or ``LeaseLostError``.
    """
    now = now or utcnow()
    job = _held(session, job_id, runner_id, now, allow_expired=True)
    outcome = "failed" if error else "succeeded"
    return _finish_held(
        session, job, runner_id, outcome, now, error, {"status": outcome, "error": error, "finished_at": now}
    )
