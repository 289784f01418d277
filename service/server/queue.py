"""The job queue, in the database: submit, claim under a lease, heartbeat, fail, cancel, complete.

Claims are safe with several server processes on one database:

* PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED`` picks the oldest queued job nobody else is
  claiming, then a conditional ``UPDATE`` takes it.
* SQLite: a conditional ``UPDATE jobs ... WHERE id = ? AND status = 'queued'`` whose rowcount says
  whether this transaction won; SQLite serialises writers, so exactly one claimer sees rowcount 1.

Every state change is one conditional ``UPDATE ... RETURNING`` (the row comes back in the same
round trip); only when it matches nothing is the job read again, to say why (404 or which 409).
The statements run on every heartbeat and claim are built once, at import, as Core statements
with bound parameters (``_HEARTBEAT``, ``_SEEN``, ...): building and ORM-compiling them per call
cost more CPU than the database work itself.

A runner that advertised benchmarks (``kernelab.service.server.offers``) is handed only jobs that need
none (sourced jobs, jobs from before advertisements) or whose ``(needs_benchmark, schema_sha256)``
it advertises, in the same one statement (a row-value ``IN``); jobs of an advertised benchmark
accepted against another schema are checked against the runner's schema only when no such job
is queued (``_OTHER_SCHEMA``).

Expired leases are noticed at claim time (no background thread): the job goes back to ``queued``
while ``attempts < max_attempts``, else it fails with the reason. Until then the job is nobody
else's, so its runner's late heartbeat or result is still taken. Every claim is a row in
``job_attempts``. Functions take ``session`` and never commit: the request commits once.

Every time the queue compares or writes (lease ends, claim, attempt and finish times, a runner's
last-seen time) is the database's clock (``kernelab.service.server.core.clock.db_now``), never the app host's:
two
app hosts whose clocks disagree judge a lease the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Update,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import JobSpec
from kernelab.service.server import models
from kernelab.service.server import offers as offers_mod
from kernelab.service.server.core.clock import db_now
from kernelab.service.server.models import Job

_CLAIM_CANDIDATES = 16  # queued jobs tried per claim on SQLite before giving up for this poll
TERMINAL = ("succeeded", "failed", "cancelled")

_jobs, _attempts, _runners = (models.Base.metadata.tables[t] for t in ("jobs", "job_attempts", "runners"))
_UNTIL = db_now(bindparam("p_lease_s"))  # the end of a lease of p_lease_s seconds from now
_SEEN = update(_runners).where(_runners.c.id == bindparam("p_runner_id")).values(last_seen_at=db_now())
_END_ATTEMPT = (
    update(_attempts)
    .where(_attempts.c.job_id == bindparam("p_job_id"), _attempts.c.attempt == bindparam("p_attempt"),
           _attempts.c.outcome == "running")
    .values(outcome=bindparam("p_outcome"), ended_at=db_now(), error=bindparam("p_error"))
)  # fmt: skip
_START_ATTEMPT = insert(_attempts).values(
    job_id=bindparam("p_job_id"), attempt=bindparam("p_attempt"), runner_id=bindparam("p_runner_id"),
    claimed_at=db_now(), outcome="running",
)  # fmt: skip
_IS_EXPIRED = and_(_jobs.c.status == "running", _jobs.c.lease_expires_at < db_now())
_EXPIRED = select(_jobs.c.id, _jobs.c.attempts, _jobs.c.max_attempts, _jobs.c.lease_runner_id).where(
    _IS_EXPIRED
)
_LEASED = (_jobs.c.id, _jobs.c.attempts, _jobs.c.spec, _jobs.c.lease_expires_at)  # LeasedJob's columns
_LEASE = (_jobs.c.id, _jobs.c.attempts, _jobs.c.lease_expires_at)  # Lease's columns
_HEARTBEAT = (  # an expired lease not yet re-queued is still the runner's: extended too
    update(_jobs)
    .where(_jobs.c.id == bindparam("p_job_id"), _jobs.c.status == "running",
           _jobs.c.lease_runner_id == bindparam("p_runner_id"))
    .values(lease_expires_at=_UNTIL)
    .returning(*_LEASE)
)  # fmt: skip
# PostgreSQL: the lease extension and the runner's last-seen time in one statement (a
# data-modifying CTE runs to completion whether or not the primary query reads it; PostgreSQL
# manual, "Data-Modifying Statements in WITH"). SQLite has no UPDATE inside WITH: two statements.
# A heartbeat carrying progress (schemas.JobProgress) stores it with the server's time of arrival.
_HEARTBEAT_PROGRESS = _HEARTBEAT.values(
    progress=bindparam("p_progress", type_=_jobs.c.progress.type), progress_at=db_now()
)


def _with_seen(heartbeat: Any) -> Any:
    extended = heartbeat.cte("extended")
    return select(*extended.c).add_cte(
        update(_runners)
        .where(_runners.c.id == bindparam("p_runner_id"), select(extended.c.id).exists())
        .values(last_seen_at=db_now())
        .cte("seen")
    )


_HEARTBEAT_PG = _with_seen(_HEARTBEAT)
_HEARTBEAT_PROGRESS_PG = _with_seen(_HEARTBEAT_PROGRESS)
_ASYNC_COMMIT = text("SET LOCAL synchronous_commit = off")
_TAKE = update(_jobs).values(
    status="running", attempts=_jobs.c.attempts + 1, lease_runner_id=bindparam("p_runner_id"),
    lease_expires_at=_UNTIL, started_at=func.coalesce(_jobs.c.started_at, db_now()),
    progress=null(), progress_at=null(),  # a new attempt starts from nothing
).returning(*_LEASED)  # fmt: skip
_FOR_DEVICE = _jobs.c.device.in_(("auto", bindparam("p_device")))
# A runner that advertised benchmarks (kernelab.service.server.offers) takes jobs that need none (sourced)
# and jobs whose (benchmark, schema digest) it advertises: one row-value IN on the index
# (status, needs_benchmark, id). Jobs of an advertised benchmark accepted against another schema
# are the fallback (_OTHER_SCHEMA), checked against this runner's schema in Python.
_OFFERED = or_(
    _jobs.c.needs_benchmark.is_(None),
    tuple_(_jobs.c.needs_benchmark, _jobs.c.schema_sha256).in_(bindparam("p_offers", expanding=True)),
)
# workload jobs are claimed seat by seat (kernelab.service.server.gangs), never by this claim
_QUEUED = (
    select(_jobs.c.id).where(_jobs.c.status == "queued", _jobs.c.kind == "benchmark").order_by(_jobs.c.id)
)


def _queued(for_device: bool, routed: bool) -> Any:
    query = _QUEUED.where(_FOR_DEVICE) if for_device else _QUEUED
    return query.where(_OFFERED) if routed else query


_KEYS = [(d, r) for d in (False, True) for r in (False, True)]  # (for a device, routed by offers)
_CANDIDATES = {key: _queued(*key).limit(_CLAIM_CANDIDATES) for key in _KEYS}  # SQLite
_TAKE_BY_ID = _TAKE.where(_jobs.c.id == bindparam("p_job_id"), _jobs.c.status == "queued")
_TAKE_OLDEST = {  # PostgreSQL: the oldest queued row nobody else has locked, taken in one statement
    key: _TAKE.where(
        _jobs.c.id == _queued(*key).limit(1).with_for_update(skip_locked=True).scalar_subquery(),
        _jobs.c.status == "queued",
    )
    for key in _KEYS
}
_OTHER_SCHEMA = {
    for_device: select(_jobs.c.id, _jobs.c.needs_benchmark, _jobs.c.created_at)
    .where(_jobs.c.status == "queued", _jobs.c.kind == "benchmark",
           _jobs.c.needs_benchmark.in_(bindparam("p_names", expanding=True)),
           _jobs.c.id > bindparam("p_after"), _FOR_DEVICE if for_device else literal(True))
    .order_by(_jobs.c.id).limit(_CLAIM_CANDIDATES)
    for for_device in (False, True)
}  # fmt: skip
_SPEC_OF = select(_jobs.c.spec).where(_jobs.c.id == bindparam("p_job_id"))
_FALLBACK_SCAN = 1024  # queued jobs of an advertised benchmark a claim's fallback looks at, at most


class LeasedJob(NamedTuple):
    """The columns of a job row held under a lease, as a claim or a heartbeat returns them:
    ``spec`` is the stored ``JobSpec`` JSON, ``lease_expires_at`` aware UTC."""

    id: int
    attempts: int
    spec: dict[str, Any]
    lease_expires_at: datetime


class Lease(NamedTuple):
    """A job's lease as a heartbeat leaves it: ``lease_expires_at`` aware UTC."""

    id: int
    attempts: int
    lease_expires_at: datetime


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


def submit(
    session: Session, spec: JobSpec, *, max_attempts: int, submitted_by: int | None = None,
    needs_benchmark: str | None = None, schema_sha256: str | None = None,
) -> Job:  # fmt: skip
    """Queue a validated spec as a new job (status ``queued``). ``needs_benchmark``: what a
    claiming runner must advertise (None: any runner), ``schema_sha256``: the advertised schema
    it was accepted against (``kernelab.service.server.offers.check_spec``). Flushes, so ``job.id`` is set."""
    job = Job(
        needs_benchmark=needs_benchmark,
        schema_sha256=schema_sha256,
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


def _end_attempt(session: Session, job_id: int, attempt: int, outcome: str, error: str | None) -> None:
    params = {"p_job_id": job_id, "p_attempt": attempt, "p_outcome": outcome, "p_error": error}
    session.execute(_END_ATTEMPT, params)


def requeue_expired(session: Session) -> int:
    """Re-queue (or fail, when out of attempts) running jobs whose lease has ended by the
    database's clock.

    Each job is moved by a conditional UPDATE, so concurrent callers never both move one job
    (nor one that its runner's heartbeat extended in the meantime). Returns how many jobs this
    call moved.
    """
    expired = session.execute(_EXPIRED).all()
    moved = 0
    for job_id, attempts, max_attempts, runner_id in expired:
        reason = f"lease of runner {runner_id} expired on attempt {attempts}/{max_attempts}"
        retry = attempts < max_attempts
        values: dict[str, object] = {"lease_runner_id": None, "lease_expires_at": None}
        if retry:
            values.update(status="queued")
        else:
            values.update(status="failed", finished_at=db_now(), error=f"{reason}; no attempts left")
        won = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.lease_expires_at < db_now())
            .values(**values)
        )
        if _rowcount(won) == 1:
            _end_attempt(session, job_id, attempts, "expired", reason)
            moved += 1
    return moved


def claim(
    session: Session,
    *,
    runner_id: int,
    lease_s: float,
    device_type: str | None = None,
    offers: offers_mod.Offers | None = None,
) -> LeasedJob | None:
    """Take the oldest queued job for ``runner_id`` under a lease of ``lease_s`` seconds (from
    the database's now).

    ``device_type`` ("cpu"/"cuda", from the runner's ``NodeInfo``) skips jobs whose spec asks for
    the other device; None takes any job. ``offers`` (the runner's advertisement,
    ``kernelab.service.server.offers``) restricts the claim to jobs that need no benchmark and jobs of an
    advertised benchmark whose spec fits the advertised schema: first those accepted against the
    same schema (one statement), then, when there are none, those accepted against another schema
    or none, checked in Python (``offers.fits``; cached per job and schema). None: any job (a
    runner that advertises nothing). Expired leases are re-queued first. Returns the job (now
    ``running``, ``attempts`` incremented) or None when nothing is queued.
    """
    requeue_expired(session)
    params: dict[str, Any] = {"p_runner_id": runner_id, "p_lease_s": float(lease_s), "p_device": device_type}
    key = (device_type is not None, offers is not None)
    if offers is not None:
        params["p_offers"] = offers.pairs()
    row = None
    if session.get_bind().dialect.name == "postgresql":
        row = session.execute(_TAKE_OLDEST[key], params).one_or_none()
    else:
        row = _take_first(session, session.scalars(_CANDIDATES[key], params).all(), params)
    if row is None and offers is not None and offers.adverts:
        row = _take_fitting(session, offers, params, for_device=key[0])
    if row is None:
        return None
    job = LeasedJob(*row)
    session.execute(_START_ATTEMPT, {"p_job_id": job.id, "p_attempt": job.attempts, "p_runner_id": runner_id})
    _seen(session, runner_id)
    return job


def _take_fitting(
    session: Session, offers: offers_mod.Offers, params: dict[str, Any], *, for_device: bool
) -> Any:
    """Take the oldest queued job of an advertised benchmark, accepted against another schema or
    none, whose spec fits ``offers`` (``offers.fits_cached``); its row or None. Pages through the
    queue in id order (``_CLAIM_CANDIDATES`` a page, at most ``_FALLBACK_SCAN`` jobs): jobs that
    fit no schema of this runner (a spec queued before anyone advertised its benchmark) never
    hide the jobs behind them. A job's spec is read only when its answer is not cached."""
    query, after = _OTHER_SCHEMA[for_device], 0
    database = session.get_bind().engine.url.render_as_string(hide_password=True)
    for _ in range(_FALLBACK_SCAN // _CLAIM_CANDIDATES):
        page = session.execute(query, {**params, "p_names": sorted(offers.adverts), "p_after": after}).all()
        fitting = []
        for job_id, name, created_at in page:
            job = (database, job_id, created_at)
            fits = offers_mod.cached_fit(offers, job, name)
            if fits is None:
                spec = session.scalar(_SPEC_OF, {"p_job_id": job_id})
                fits = spec is not None and offers_mod.fits_cached(offers, job, name, spec)
            if fits:
                fitting.append(job_id)
        row = _take_first(session, fitting, params)
        if row is not None or len(page) < _CLAIM_CANDIDATES:
            return row
        after = page[-1].id
    return None


def _take_first(session: Session, job_ids: Sequence[int], params: dict[str, Any]) -> Any:
    """Take the first of ``job_ids`` still queued (a conditional UPDATE each); its row or None."""
    for job_id in job_ids:
        row = session.execute(_TAKE_BY_ID, {**params, "p_job_id": job_id}).one_or_none()
        if row is not None:
            return row
    return None


def _returning(session: Session, statement: Update) -> Job | None:
    """Run a conditional ``UPDATE jobs`` and return the updated row (None when none matched)."""
    return session.scalars(
        statement.returning(Job),
        execution_options={"synchronize_session": False, "populate_existing": True},
    ).one_or_none()


def _seen(session: Session, runner_id: int) -> None:
    session.execute(_SEEN, {"p_runner_id": runner_id})


WORKLOADS_OFFER = ("kind:workload", "")
"""The pair a waiting claim's ``offers`` carries when its runner runs workload jobs (``claimable``)."""


def claimable(
    session: Session, *, device_type: str | None = None, offers: Sequence[tuple[str, str]] | None = None,
    limit: int,
) -> int:  # fmt: skip
    """How many jobs (at most ``limit``) a claim by a runner of ``device_type`` could take now:
    queued ones and running ones whose lease has expired (a claim re-queues those first).
    ``offers``: the runner's ``(benchmark, schema digest)`` pairs (``Offers.pairs``): only jobs
    that need none of them or one of them count (None: every benchmark job). Workload jobs count
    only when ``offers`` holds ``WORKLOADS_OFFER`` (a runner that runs them).

    One indexed read of at most ``limit`` rows, cheap enough to poll a few times a second
    (``kernelab.service.server.queue_watch``).
    """
    query = select(Job.id).where((Job.status == "queued") | _IS_EXPIRED)
    if device_type is not None:
        query = query.where(Job.device.in_(("auto", device_type)))
    workloads = offers is not None and WORKLOADS_OFFER in offers
    if offers is not None:
        pairs = [p for p in offers if p != WORKLOADS_OFFER]
        benchmark: ColumnElement[bool] = Job.needs_benchmark.is_(None)
        if pairs:
            benchmark = benchmark | tuple_(Job.needs_benchmark, Job.schema_sha256).in_(pairs)
        query = query.where(
            (Job.kind == "benchmark") & benchmark | (Job.kind == "workload") & literal(workloads)
        )
    else:
        query = query.where(Job.kind == "benchmark")
    return session.scalar(select(func.count()).select_from(query.limit(limit).subquery())) or 0


def _held(session: Session, job_id: int, runner_id: int) -> Job:
    """The job, if ``runner_id`` holds its lease (expired or not: until a claim re-queues it,
    nobody else does). Raises ``JobNotFoundError`` or ``LeaseLostError`` with the reason."""
    job = get_job(session, job_id)
    session.refresh(job)
    if job.status != "running" or job.lease_runner_id != runner_id:
        raise LeaseLostError(
            f"runner {runner_id} does not hold the lease of job {job_id} (status {job.status})", job_id
        )
    return job


def heartbeat(
    session: Session, job_id: int, *, runner_id: int, lease_s: float, durable: bool = True,
    progress: dict[str, Any] | None = None,
) -> Lease:  # fmt: skip
    """Extend the lease to ``lease_s`` seconds from the database's now and mark the runner seen;
    returns the lease. A lease that ran out but that no claim re-queued yet is extended too (the
    job is nobody else's; its runner is still at it).

    On PostgreSQL one statement (``_HEARTBEAT_PG``) does both. ``durable=False`` (PostgreSQL;
    ignored elsewhere) lets this transaction's commit return before its WAL reaches the disk: a
    crash of the database server can then lose the last ~0.6 s of lease extensions
    (``wal_writer_delay`` x 3), which the runner's next heartbeat redoes; the database stays
    consistent (PostgreSQL manual, "Asynchronous Commit"). It saves a disk flush per heartbeat;
    claims and job endings stay durable.

    ``progress`` (``schemas.JobProgress`` as JSON) is stored in the same statement, with the
    database's time (``jobs.progress_at``); None keeps the stored one.

    Raises ``JobNotFoundError``, or ``LeaseLostError`` when the job was re-queued, cancelled or
    finished, or another runner holds it: the runner stops the job (a cancel reaches it with its
    next heartbeat).
    """
    postgres = session.get_bind().dialect.name == "postgresql"
    if postgres and not durable:
        session.execute(_ASYNC_COMMIT)
    params: dict[str, Any] = {"p_job_id": job_id, "p_runner_id": runner_id, "p_lease_s": float(lease_s)}
    if progress is None:
        statement = _HEARTBEAT_PG if postgres else _HEARTBEAT
    else:
        statement = _HEARTBEAT_PROGRESS_PG if postgres else _HEARTBEAT_PROGRESS
        params["p_progress"] = progress
    row = session.execute(statement, params).one_or_none()
    if row is None:
        _held(session, job_id, runner_id)  # raises with the reason
        raise LeaseLostError(f"runner {runner_id} lost the lease of job {job_id}", job_id)
    if not postgres:
        _seen(session, runner_id)
    return Lease(*row)


def fail(session: Session, job_id: int, *, runner_id: int, error: str, retry: bool) -> Job:
    """The lease holder reports that the job failed. With ``retry`` and attempts left the job
    goes back to ``queued``; otherwise it is ``failed`` with ``error``.

    Raises ``JobNotFoundError`` or ``LeaseLostError``.
    """
    requeue = and_(literal(retry), Job.attempts < Job.max_attempts)
    job = _returning(
        session,
        update(Job)
        .where(Job.id == job_id, Job.status == "running", Job.lease_runner_id == runner_id)
        .values(
            status=case((requeue, "queued"), else_="failed"),
            finished_at=case((requeue, Job.finished_at), else_=db_now()),
            error=error, lease_runner_id=None, lease_expires_at=None,
        ),
    )  # fmt: skip
    if job is None:
        _held(session, job_id, runner_id)  # raises with the reason
        raise LeaseLostError(f"runner {runner_id} lost the lease of job {job_id}", job_id)
    _end_attempt(session, job_id, job.attempts, "failed", error)
    return job


def _finish_held(
    session: Session, job: Job, runner_id: int, outcome: str, error: str | None, values: dict[str, object]
) -> Job:
    won = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == "running", Job.lease_runner_id == runner_id)
        .values(lease_runner_id=None, lease_expires_at=None, **values)
        .execution_options(synchronize_session=False)
    )
    if _rowcount(won) != 1:
        raise LeaseLostError(f"runner {runner_id} lost the lease of job {job.id}", job.id)
    _end_attempt(session, job.id, job.attempts, outcome, error)
    session.refresh(job)
    return job


def cancel(session: Session, job_id: int, *, by: str = "a user") -> Job:
    """Cancel a queued or running job (a runner holding it loses its lease: 409 on its next
    heartbeat, and it stops the job's worker). ``by`` names who cancelled, in the attempt's error.

    Raises ``JobNotFoundError``, or ``InvalidTransitionError`` for a finished job.
    """
    job = get_job(session, job_id)
    won = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(("queued", "running")))
        .values(status="cancelled", finished_at=db_now(), lease_runner_id=None, lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )
    session.refresh(job)
    if _rowcount(won) != 1:
        raise InvalidTransitionError(
            f"job {job_id} is {job.status}; only queued or running jobs cancel", job_id
        )
    _end_attempt(session, job_id, job.attempts, "cancelled", f"cancelled by {by}")
    return job


def rerun(session: Session, job_id: int, spec: JobSpec, **submit_kw: Any) -> Job:
    """Queue ``spec`` (the stored spec of job ``job_id``, checked again by the caller) as a new job
    whose ``rerun_of`` is ``job_id``; ``submit_kw`` as in ``submit``. Any job may be re-run, in
    any status. Raises ``JobNotFoundError``."""
    get_job(session, job_id)
    job = submit(session, spec, **submit_kw)
    job.rerun_of = job_id
    session.flush()
    return job


def complete(session: Session, job_id: int, *, runner_id: int, error: str | None) -> Job:
    """Finish the job when its result arrives: ``succeeded``, or ``failed`` when ``error`` is set.

    A lease that expired but was not yet taken over still counts (the measurement is kept).
    Raises ``JobNotFoundError`` or ``LeaseLostError``.
    """
    job = _held(session, job_id, runner_id)
    outcome = "failed" if error else "succeeded"
    values: dict[str, object] = {"status": outcome, "error": error, "finished_at": db_now()}
    return _finish_held(session, job, runner_id, outcome, error, values)
