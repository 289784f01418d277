"""``/compare``: job vs job, two stored jobs of one benchmark cell by cell (read).

The statistics and the verdict rules are ``kernelab.service.server.job_vs_job``'s (unpaired: the two
jobs' rounds were not interleaved). A pair too large to compute in the request is queued for a
compare worker: 202 with the task's state and ``Retry-After`` until its answer is stored, then 200.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import JobVsJob, Side
from kernelab.service.server import job_vs_job
from kernelab.service.server.api.deps import MAX_ROW_ID, ReadToken, SessionDep, SettingsDep
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.core.config import Settings
from kernelab.service.server.job_vs_job import RETRY_AFTER_S

router = APIRouter(prefix="/compare", tags=["compare"], route_class=DoorRoute)

JobIdQuery = Annotated[int, Query(ge=1, le=MAX_ROW_ID)]


def compared(
    session: Session, settings: Settings, a: int, b: int, side: Side
) -> JobVsJob | job_vs_job.Pending:
    """``job_vs_job.request``, its errors as HTTP errors whose detail names the query field. What it
    queued or judged is committed by the request's session (``deps.get_session``, before the
    response is sent: the queued task is visible to the compare worker by then)."""
    try:
        out = job_vs_job.request(session=session, a=a, b=b, settings=settings, side=side)
    except job_vs_job.JobVsJobError as exc:
        raise HTTPException(exc.status, [{"loc": ["query", exc.field], "msg": exc.message}]) from None
    return out


def pending_body(a: int, b: int, pending: job_vs_job.Pending) -> dict[str, Any]:
    """The 202 body of a queued pair: its state, and a message saying to ask again."""
    return {
        "status": "comparing", "task_id": pending.task_id, "task_status": pending.status,
        "detail": f"job #{b} against job #{a} is queued for a compare worker ({pending.status}); "
        f"ask again in {RETRY_AFTER_S} s",
    }  # fmt: skip


@router.get(
    "",
    response_model=JobVsJob,
    responses={202: {"description": "queued for a compare worker: ask again after Retry-After seconds"}},
)
def get_compare(
    _: ReadToken, session: SessionDep, settings: SettingsDep, a: JobIdQuery, b: JobIdQuery,
    side: Annotated[Side, Query()] = "candidate",
) -> Any:  # fmt: skip
    """Job ``b`` against job ``a`` (same benchmark): per cell matched by its parameters, the ratio
    of ``side``'s medians B/A with an unpaired round-bootstrap CI, Hodges-Lehmann, Mann-Whitney
    (BH-adjusted), the verdict (a failed or incorrect side in either job outranks speed), and both
    nodes' health. 202 while a large pair is computed by a compare worker (body: ``status``
    ``comparing``, ``task_id``; header ``Retry-After``); 404 unknown job, 409 no stored comparison
    yet (or the worker failed on the pair), 422 different benchmarks or a bad query field."""
    out = compared(session, settings, a, b, side)
    if isinstance(out, job_vs_job.Pending):
        return JSONResponse(
            pending_body(a, b, out), status_code=202, headers={"Retry-After": str(RETRY_AFTER_S)}
        )
    return out
