"""Queued work of kind ``compare``: the comparison of a stored result, computed off the request path.

The ingest (``crud.store_result``) stores a result's raw samples and, in the same transaction,
queues one ``compare_tasks`` row for it (``enqueue``): a crash after the commit loses nothing,
one before it stores neither. A compare worker (``kernelab.service.server.compare_worker``, started by
``kernelab serve`` or alone as ``kernelab compare-worker``) claims a task under a lease, computes
``stats.compare`` and stores the comparison, the job's verdict summary, the node-health judgement
and the history points, and marks the task ``done``, all in one transaction that first checks it
still holds the lease.

The lease works as the job queue's (``kernelab.service.server.queue``): a claim takes the oldest queued
task (``FOR UPDATE SKIP LOCKED`` on PostgreSQL; a conditional ``UPDATE ... WHERE status =
'queued'`` on SQLite, whose writers are serialised), a heartbeat extends the lease, and an
expired lease is noticed at claim time: the task goes back to ``queued`` while ``attempts <
max_attempts`` (a worker killed mid-task is retried by another), else it fails with the reason.
Every time compared or written is the database's clock (``kernelab.service.server.core.clock.db_now``).

Tasks of kind ``pair`` share the queue, its lease and its worker: job vs job of two stored jobs
(``kernelab.service.server.job_vs_job``) too large for a request, queued by the reader that asked
(``enqueue_pair``; one per jobs and side), its answer stored on the task by ``finish(output=)``
and read back with ``pair_state``.
Tasks of kind ``workload`` judge a workload job (``kernelab.service.judge.workload_stats``) once every
node has posted (``enqueue_workload``, one per job), the ``WorkloadComparison`` stored on the task
by ``finish(output=)`` and read back by ``kernelab.service.server.workload_store.comparison_state``.
A worker stopped gracefully hands its task back (``release``: queued again, the attempt not
counted) instead of finishing it. Functions take ``session`` and never commit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal, NamedTuple

from sqlalchemy import ColumnElement, CursorResult, and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kernelab.service.judge import verdicts
from kernelab.service.server.core.clock import db_now
from kernelab.service.server.models import CompareTask, Result

_CLAIM_CANDIDATES = 16  # queued tasks tried per claim on SQLite
OPEN = ("queued", "running")

ComparisonStatus = Literal["none", "comparing", "ready", "failed"]
"""Where a job's comparison stands: ``none`` (no result), ``comparing`` (queued or being computed),
``ready`` (stored), ``failed`` (``stats.compare`` raised; the task's error says why)."""


class TaskLease(NamedTuple):
    """A claimed task: ids, the attempt number (1 for the first claim), the lease's end (aware UTC),
    its ``kind`` and, for a ``pair`` task, job B (``pair_job_id``) and the ``side`` compared."""

    id: int
    result_id: int | None
    job_id: int | None
    attempts: int
    lease_expires_at: datetime
    kind: str = "compare"
    pair_job_id: int | None = None
    side: str | None = None


class TaskLeaseLostError(Exception):
    """The worker does not hold the task's lease (any more): expired and re-queued, or finished."""


def _rowcount(result: object) -> int:
    assert isinstance(result, CursorResult)
    return result.rowcount


def enqueue(session: Session, *, result_id: int, job_id: int | None, max_attempts: int) -> None:
    """Queue the comparison of result ``result_id``: a new task, or its finished (``done`` or
    ``failed``) task queued again with its attempts reset. An open task is left as it is."""
    existing = session.scalar(select(CompareTask.status).where(CompareTask.result_id == result_id))
    if existing is None:
        session.add(CompareTask(result_id=result_id, job_id=job_id, status="queued", attempts=0,
                                max_attempts=max_attempts))  # fmt: skip
        session.flush()
    elif existing not in OPEN:
        session.execute(
            update(CompareTask).where(CompareTask.result_id == result_id, CompareTask.status.not_in(OPEN))
            .values(status="queued", attempts=0, max_attempts=max_attempts, error=None, worker=None,
                    lease_expires_at=None, finished_at=None)
        )  # fmt: skip


def _stale() -> ColumnElement[bool]:
    version = Result.comparison["method_version"].as_integer()
    return or_(Result.comparison.is_(None), version.is_(None), version < verdicts.METHOD_VERSION)


def enqueue_stale(session: Session, *, max_attempts: int) -> int:
    """Queue the comparison of every stored result that has none, or one judged by older verdict
    rules (``comparison.method_version < verdicts.METHOD_VERSION``), unless its task is open.
    Returns how many were queued. Run by a compare worker when it starts."""
    rows = session.execute(
        select(Result.id, Result.job_id).outerjoin(CompareTask, CompareTask.result_id == Result.id)
        .where(_stale(), or_(CompareTask.id.is_(None), CompareTask.status.not_in(OPEN)))
        .order_by(Result.id)
    ).all()  # fmt: skip
    for result_id, job_id in rows:
        try:
            with session.begin_nested():
                enqueue(session, result_id=result_id, job_id=job_id, max_attempts=max_attempts)
        except IntegrityError:  # another worker queued it first
            continue
    return len(rows)


def requeue_expired(session: Session) -> int:
    """Re-queue (or fail, out of attempts) running tasks whose lease has ended by the database's
    clock; each by a conditional UPDATE, so two callers never both move one. Returns how many."""
    expired = session.execute(
        select(CompareTask.id, CompareTask.attempts, CompareTask.max_attempts, CompareTask.worker)
        .where(CompareTask.status == "running", CompareTask.lease_expires_at < db_now())
    ).all()  # fmt: skip
    moved = 0
    for task_id, attempts, max_attempts, worker in expired:
        reason = f"lease of compare worker {worker} expired on attempt {attempts}/{max_attempts}"
        values: dict[str, object] = {"worker": None, "lease_expires_at": None}
        if attempts < max_attempts:
            values.update(status="queued", error=reason)
        else:
            values.update(status="failed", finished_at=db_now(), error=f"{reason}; no attempts left")
        won = session.execute(
            update(CompareTask)
            .where(CompareTask.id == task_id, CompareTask.status == "running",
                   CompareTask.lease_expires_at < db_now())
            .values(**values)
        )  # fmt: skip
        moved += _rowcount(won)
    return moved


_LEASE_COLUMNS = (CompareTask.id, CompareTask.result_id, CompareTask.job_id, CompareTask.attempts,
                  CompareTask.lease_expires_at, CompareTask.kind, CompareTask.pair_job_id,
                  CompareTask.side)  # fmt: skip


def claim(session: Session, *, worker: str, lease_s: float) -> TaskLease | None:
    """Take the oldest queued task for ``worker`` under a lease of ``lease_s`` seconds (from the
    database's now), after re-queueing expired leases. None when nothing is queued."""
    requeue_expired(session)
    take = update(CompareTask).values(
        status="running", attempts=CompareTask.attempts + 1, worker=worker, lease_expires_at=db_now(lease_s)
    ).returning(*_LEASE_COLUMNS)  # fmt: skip
    queued = select(CompareTask.id).where(CompareTask.status == "queued").order_by(CompareTask.id)
    if session.get_bind().dialect.name == "postgresql":
        oldest = queued.limit(1).with_for_update(skip_locked=True).scalar_subquery()
        row = session.execute(
            take.where(CompareTask.id == oldest, CompareTask.status == "queued")
        ).one_or_none()
        return None if row is None else TaskLease._make(row)
    for task_id in session.scalars(queued.limit(_CLAIM_CANDIDATES)).all():
        row = session.execute(
            take.where(CompareTask.id == task_id, CompareTask.status == "queued")
        ).one_or_none()
        if row is not None:
            return TaskLease._make(row)
    return None


def _held(task_id: int, worker: str) -> ColumnElement[bool]:
    return and_(CompareTask.id == task_id, CompareTask.status == "running", CompareTask.worker == worker)


def heartbeat(session: Session, task_id: int, *, worker: str, lease_s: float) -> datetime:
    """Extend ``worker``'s lease of the task to ``lease_s`` seconds from the database's now (an
    expired lease that no claim re-queued yet too); returns its new end. Raises
    ``TaskLeaseLostError``."""
    end = session.scalar(
        update(CompareTask).where(_held(task_id, worker)).values(lease_expires_at=db_now(lease_s))
        .returning(CompareTask.lease_expires_at)
    )  # fmt: skip
    if end is None:
        raise TaskLeaseLostError(f"compare worker {worker} does not hold task {task_id}")
    return end


def finish(session: Session, task_id: int, *, worker: str, output: dict[str, object] | None = None) -> None:
    """Mark ``worker``'s task ``done`` (a ``pair`` task with its ``output``). Raises
    ``TaskLeaseLostError`` (nothing changed) when it does not hold the lease: the caller rolls back
    what it stored."""
    values: dict[str, object] = {"status": "done", "finished_at": db_now(), "worker": None,
                                 "lease_expires_at": None, "error": None}  # fmt: skip
    if output is not None:
        values["output"] = output
    won = session.execute(update(CompareTask).where(_held(task_id, worker)).values(**values))
    if _rowcount(won) != 1:
        raise TaskLeaseLostError(f"compare worker {worker} does not hold task {task_id}")


def fail(session: Session, task_id: int, *, worker: str, error: str) -> None:
    """Mark ``worker``'s task ``failed`` with ``error`` (``stats.compare`` raised: a retry of the same
    samples would raise again). Raises ``TaskLeaseLostError``."""
    won = session.execute(
        update(CompareTask).where(_held(task_id, worker))
        .values(status="failed", finished_at=db_now(), worker=None, lease_expires_at=None, error=error)
    )  # fmt: skip
    if _rowcount(won) != 1:
        raise TaskLeaseLostError(f"compare worker {worker} does not hold task {task_id}")


def release(session: Session, task_id: int, *, worker: str) -> bool:
    """Hand ``worker``'s task back (a graceful stop): queued again, this attempt not counted.
    Returns False when the worker no longer held it."""
    won = session.execute(
        update(CompareTask).where(_held(task_id, worker))
        .values(status="queued", attempts=CompareTask.attempts - 1, worker=None, lease_expires_at=None)
    )  # fmt: skip
    return _rowcount(won) == 1


def claimable(session: Session) -> int:
    """How many tasks a claim could take now: queued ones and running ones whose lease expired."""
    return session.scalar(
        select(func.count()).select_from(CompareTask).where(
            (CompareTask.status == "queued")
            | and_(CompareTask.status == "running", CompareTask.lease_expires_at < db_now())
        )
    ) or 0  # fmt: skip


class TaskState(NamedTuple):
    """A result's comparison task as readers see it: ``status`` (``ComparisonStatus``) and the
    failed task's ``error``."""

    status: ComparisonStatus
    error: str | None = None


def states(session: Session, job_ids: list[int]) -> dict[int, TaskState]:
    """Job id -> ``TaskState`` of its result's comparison, for the jobs of ``job_ids`` that have a
    result (one query). A result without a task (stored before tasks existed and not swept yet)
    is ``ready`` when its comparison is stored, else ``comparing``."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(Result.job_id, Result.comparison.is_not(None), CompareTask.status, CompareTask.error)
        .outerjoin(CompareTask, CompareTask.result_id == Result.id).where(Result.job_id.in_(job_ids))
    ).all()  # fmt: skip
    out: dict[int, TaskState] = {}
    workload = session.execute(
        select(CompareTask.job_id, CompareTask.status, CompareTask.error)
        .where(CompareTask.kind == "workload", CompareTask.job_id.in_(job_ids))
    ).all()  # fmt: skip
    for job_id, status, error in workload:
        if job_id is None:
            continue
        failed = status == "failed"
        out[job_id] = TaskState("comparing" if status in OPEN else "failed" if failed else "ready",
                                error if failed else None)  # fmt: skip
    for job_id, stored, status, error in rows:
        if job_id is None:
            continue
        if status in OPEN or (status is None and not stored):
            out[job_id] = TaskState("comparing")
        elif status == "failed":
            out[job_id] = TaskState("failed", error)
        else:
            out[job_id] = TaskState("ready")
    return out


class PairState(NamedTuple):
    """A job-vs-job task as its reader sees it: ``status`` (``TASK_STATUSES``), the stored
    ``output`` of a done one, the ``error`` of a failed one."""

    id: int
    status: str
    output: dict[str, object] | None
    error: str | None
    finished_at: datetime | None = None


def _pair(a: int, b: int, side: str) -> ColumnElement[bool]:
    return and_(CompareTask.kind == "pair", CompareTask.job_id == a, CompareTask.pair_job_id == b,
                CompareTask.side == side)  # fmt: skip


def pair_state(session: Session, *, a: int, b: int, side: str) -> PairState | None:
    """The ``pair`` task of job ``b`` against job ``a`` on ``side``, or None when none was queued."""
    row = session.execute(
        select(
            CompareTask.id, CompareTask.status, CompareTask.output, CompareTask.error, CompareTask.finished_at
        ).where(_pair(a, b, side))
    ).one_or_none()
    return None if row is None else PairState(*row)


def enqueue_workload(session: Session, *, job_id: int, max_attempts: int) -> None:
    """Queue the comparison of workload job ``job_id``: a new ``workload`` task, or its finished task
    queued again (attempts reset, its old output dropped); an open task is left as it is."""
    status = session.scalar(
        select(CompareTask.status).where(CompareTask.kind == "workload", CompareTask.job_id == job_id)
    )
    if status is None:
        session.add(CompareTask(kind="workload", result_id=None, job_id=job_id, status="queued", attempts=0,
                                max_attempts=max_attempts))  # fmt: skip
        session.flush()
    elif status not in OPEN:
        session.execute(
            update(CompareTask).where(CompareTask.kind == "workload", CompareTask.job_id == job_id)
            .values(status="queued", attempts=0, max_attempts=max_attempts, error=None, worker=None,
                    lease_expires_at=None, finished_at=None, output=None)
        )  # fmt: skip


def enqueue_pair(session: Session, *, a: int, b: int, side: str, max_attempts: int) -> None:
    """Queue job vs job, ``b`` against ``a`` on ``side``: a new ``pair`` task, or its finished task
    queued again (attempts reset, its old output dropped). An open task is left as it is; a task
    another request queued first (the unique index) is taken as this one."""
    state = pair_state(session, a=a, b=b, side=side)
    if state is None:
        try:
            with session.begin_nested():
                session.add(CompareTask(kind="pair", result_id=None, job_id=a, pair_job_id=b, side=side,
                                        status="queued", attempts=0, max_attempts=max_attempts))  # fmt: skip
        except IntegrityError:  # another request queued it first
            pass
    elif state.status not in OPEN:
        session.execute(
            update(CompareTask).where(CompareTask.id == state.id, CompareTask.status.not_in(OPEN))
            .values(status="queued", attempts=0, max_attempts=max_attempts, error=None, worker=None,
                    lease_expires_at=None, finished_at=None, output=None)
        )  # fmt: skip
