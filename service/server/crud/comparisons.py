"""The stored comparison of a result, and where its computation stands."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    Comparison,
    read_stored,
)
from kernelab.service.judge import verdicts
from kernelab.service.server import compare_queue
from kernelab.service.server.compare_queue import ComparisonStatus
from kernelab.service.server.models import Job, Result


def save_comparison(*, session: Session, job_id: int, comparison: Comparison) -> None:
    """Store ``comparison`` (``stats.compare`` of ``job_id``'s result without node-health flags) in
    ``results.comparison`` and its verdict counts in ``jobs.summary``; the caller commits."""
    session.execute(
        update(Result).where(Result.job_id == job_id).values(comparison=comparison.model_dump(mode="json"))
    )
    session.execute(update(Job).where(Job.id == job_id).values(summary=dict(comparison.summary)))


@dataclass(frozen=True)
class StoredComparison:
    """What readers know of a job's comparison: ``status`` (``compare_queue.ComparisonStatus``),
    the stored ``comparison`` when ``ready``, the failed task's ``error``."""

    status: ComparisonStatus
    comparison: Comparison | None = None
    error: str | None = None


def stored_comparison(*, session: Session, job_id: int) -> StoredComparison:
    """The stored comparison of ``job_id``'s result (``stats.compare`` without node-health flags,
    computed by a compare worker: ``kernelab.service.server.compare_queue``), never computed here.

    ``none`` without a result; ``comparing`` while its task is open, and for a comparison judged
    by older verdict rules (``method_version`` below ``verdicts.METHOD_VERSION``: a compare worker
    re-queues those when it starts); ``failed`` with the task's error; else ``ready``."""
    stored = session.execute(select(Result.id, Result.comparison).where(Result.job_id == job_id)).first()
    if stored is None:
        return StoredComparison("none")
    state = compare_queue.states(session, [job_id]).get(job_id, compare_queue.TaskState("comparing"))
    if state.status == "failed":
        return StoredComparison("failed", error=state.error)
    if state.status == "comparing" or stored.comparison is None:
        return StoredComparison("comparing")
    comparison = read_stored(Comparison, stored.comparison)
    if comparison.method_version < verdicts.METHOD_VERSION:  # older rules: re-queued, shown as such
        return StoredComparison("comparing")
    return StoredComparison("ready", comparison)


def base_comparison(*, session: Session, job_id: int) -> Comparison | None:
    """The stored comparison of ``job_id``'s result when it is ready (``stored_comparison``), else
    None (no result, or still comparing, or failed)."""
    return stored_comparison(session=session, job_id=job_id).comparison
