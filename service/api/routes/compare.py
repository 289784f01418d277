"""``/compare``: job vs job, two stored jobs of one benchmark cell by cell (read).

The statistics and the verdict rules are ``kernelab.service.job_vs_job``'s (unpaired: the two
jobs' rounds were not interleaved); a pair of jobs too large to compare in a request answers 413.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query

from kernelab.service import job_vs_job
from kernelab.service.api.deps import ReadToken, SessionDep, SettingsDep
from kernelab.service.schemas import JobVsJob, Side

router = APIRouter(prefix="/compare", tags=["compare"])

JobIdQuery = Annotated[int, Query(ge=1, le=2**62)]


def compared(session: SessionDep, settings: SettingsDep, a: int, b: int, side: Side) -> JobVsJob:
    """``job_vs_job.compare_jobs``, its errors as HTTP errors whose detail names the query field (the
    request's session commits what a first read judged)."""
    try:
        out = job_vs_job.compare_jobs(session=session, a=a, b=b, settings=settings, side=side)
    except job_vs_job.JobVsJobError as exc:
        raise HTTPException(exc.status, [{"loc": ["query", exc.field], "msg": exc.message}]) from None
    return out


@router.get("")
def get_compare(
    _: ReadToken, session: SessionDep, settings: SettingsDep, a: JobIdQuery, b: JobIdQuery,
    side: Annotated[Side, Query()] = "candidate",
) -> JobVsJob:  # fmt: skip
    """Job ``b`` against job ``a`` (same benchmark): per cell matched by its parameters, the ratio
    of ``side``'s medians B/A with an unpaired round-bootstrap CI, Hodges-Lehmann, Mann-Whitney
    (BH-adjusted), the verdict (a failed or incorrect side in either job outranks speed), and both
    nodes' health. 404 unknown job, 409 no stored comparison yet, 413 too many samples, 422
    different benchmarks or a bad query field."""
    return compared(session, settings, a, b, side)
