"""Results over time for one benchmark, per branch: the history of revision A/B jobs.

Every job whose sides came from source revisions (``NodeInfo.revisions``) contributes one point
per side and sweep cell: the side's branch label, commit, the median time per launch of its kept
samples (``service.stats.compare``), and when the job finished. A branch's points over time show
how that branch's kernel moved; the dashboard plots them (``web.figures.branch_history_figure``).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from service import crud, stats
from service.models import Job, Result
from service.schemas import RevisionInfo, Variant

DEFAULT_JOBS = 50  # most recent revision jobs read per history (each is loaded with its samples)


class HistoryPoint(BaseModel):
    """One side of one cell of one revision job. ``median_ns``: ns per launch (None: no samples)."""

    job_id: int
    finished_at: datetime
    branch: str
    sha: str
    side: Variant
    cell: str
    median_ns: float | None
    node: str


def branch_history(*, session: Session, benchmark: str, limit: int = DEFAULT_JOBS) -> list[HistoryPoint]:
    """Points of the ``limit`` most recent results of ``benchmark`` that came from revisions,
    oldest first. Sides that used the installed code are left out (they have no branch)."""
    job_ids = session.scalars(
        select(Result.job_id).join(Job, Job.id == Result.job_id)
        .where(Job.benchmark == benchmark).order_by(Result.finished_at.desc(), Result.id.desc()).limit(limit)
    ).all()
    points: list[HistoryPoint] = []
    for job_id in reversed(job_ids):
        if job_id is None:
            continue
        result = crud.load_result(session=session, job_id=job_id)
        if result is None or result.node.revisions is None:
            continue
        comparison = stats.compare(result, job_id=job_id)
        revs = result.node.revisions
        sides: tuple[tuple[Variant, RevisionInfo], ...] = (
            ("baseline", revs.baseline), ("candidate", revs.candidate))
        for side, rev in sides:
            if not rev.sha:
                continue
            for cell in comparison.cells:
                variant_stats = cell.baseline if side == "baseline" else cell.candidate
                points.append(HistoryPoint(
                    job_id=job_id, finished_at=result.finished_at, branch=rev.branch or rev.ref,
                    sha=rev.sha, side=side, cell=cell.label, median_ns=variant_stats.median_ns,
                    node=result.node.hostname,
                ))
    return points
