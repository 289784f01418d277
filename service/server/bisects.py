"""Bisects stored for their page (``schemas.BisectPublic``): created by ``kernelab bisect``
before its first step, a step appended as each revision job is judged, finished with the first
bad commit or the place it stopped. The client decides (``kernelab.runners.bisect``); the
server keeps the record, so the dashboard shows progress and evidence while it runs.

Functions take ``session`` and never commit (the request does)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    STORED,
    BisectCreate,
    BisectFinish,
    BisectPublic,
    BisectsPage,
    BisectStep,
    JobSpec,
    read_stored,
)
from kernelab.service.contract.schemas.bisect import MAX_BISECT_STEPS
from kernelab.service.server.core.clock import db_now
from kernelab.service.server.models import Bisect
from kernelab.service.server.queue import InvalidTransitionError, JobNotFoundError


class BisectNotFoundError(JobNotFoundError):
    """No bisect with this id (HTTP 404); ``job_id`` holds the bisect's id."""


def create(session: Session, body: BisectCreate, *, submitted_by: int | None) -> Bisect:
    """Store a new ``running`` bisect; flushes, so ``id`` is set."""
    row = Bisect(
        name=body.name, benchmark=body.spec.benchmark, repo=body.repo, good=body.good, bad=body.bad,
        good_ref=body.good_ref, bad_ref=body.bad_ref,
        commits=[c.model_dump(mode="json") for c in body.commits], spec=body.spec.model_dump(mode="json"),
        steps=[], status="running", submitted_by=submitted_by,
    )  # fmt: skip
    session.add(row)
    session.flush()
    return row


def get(session: Session, bisect_id: int) -> Bisect:
    """The bisect row. Raises ``BisectNotFoundError``."""
    row = session.get(Bisect, bisect_id)
    if row is None:
        raise BisectNotFoundError(f"bisect {bisect_id} does not exist", bisect_id)
    return row


def _running(session: Session, bisect_id: int) -> Bisect:
    row = get(session, bisect_id)
    if row.status != "running":
        raise InvalidTransitionError(
            f"bisect {bisect_id} is {row.status}; only a running one changes", bisect_id
        )
    return row


def add_step(session: Session, bisect_id: int, step: BisectStep) -> Bisect:
    """Append ``step`` to a running bisect. Raises ``BisectNotFoundError``, or
    ``InvalidTransitionError`` when the bisect has finished, the commit is not one of its range
    or its good end, or it holds ``MAX_BISECT_STEPS`` steps already."""
    row = _running(session, bisect_id)
    if step.commit not in {c["sha"] for c in row.commits}:
        raise InvalidTransitionError(f"commit {step.commit} is not in bisect {bisect_id}'s range", bisect_id)
    if len(row.steps) >= MAX_BISECT_STEPS:
        raise InvalidTransitionError(f"bisect {bisect_id} has {MAX_BISECT_STEPS} steps already", bisect_id)
    row.steps = [*row.steps, step.model_dump(mode="json")]  # a new list: the JSON column sees the change
    session.flush()
    return row


def finish(session: Session, bisect_id: int, body: BisectFinish) -> Bisect:
    """End a running bisect: ``found`` needs ``first_bad`` among its commits. Raises as
    ``add_step`` does."""
    row = _running(session, bisect_id)
    if body.status == "found" and body.first_bad not in {c["sha"] for c in row.commits}:
        raise InvalidTransitionError(
            f"first_bad {body.first_bad} is not in bisect {bisect_id}'s range", bisect_id
        )
    row.status, row.first_bad, row.message = body.status, body.first_bad, body.message or None
    row.finished_at = session.scalar(select(db_now()))
    session.flush()
    return row


def public(row: Bisect) -> BisectPublic:
    """The API view of a bisect row."""
    return read_stored(BisectPublic, dict(
        id=row.id, name=row.name, benchmark=row.benchmark, repo=row.repo, good=row.good, bad=row.bad,
        good_ref=row.good_ref, bad_ref=row.bad_ref, commits=row.commits,
        spec=JobSpec.model_validate(row.spec, context=STORED), steps=row.steps, status=row.status,
        first_bad=row.first_bad, message=row.message, created_at=row.created_at, finished_at=row.finished_at,
    ))  # fmt: skip


def page(session: Session, *, offset: int = 0, limit: int = 50) -> BisectsPage:
    """Bisects, newest first."""
    count = session.scalar(select(func.count()).select_from(Bisect)) or 0
    rows = session.scalars(select(Bisect).order_by(Bisect.id.desc()).offset(offset).limit(limit))
    return BisectsPage(data=[public(r) for r in rows], count=count)
