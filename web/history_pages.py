"""Dashboard pages of the fleet's view over time: ``/history/regressions`` (lines whose latest
change point made them slower), ``/nodes`` (every node, linking to its page) and ``/compare``
(job vs job). ``router`` is included by ``kernelab.web.routes``; templates, filters and the
dashboard-access dependency are that module's. Pages only reshape what
``kernelab.service.server.history`` and ``kernelab.service.server.job_vs_job`` return: the functions the API's
routes call too (``/api/v1/history/regressions``, ``/api/v1/compare``), never the routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from kernelab.service.contract.schemas import Side
from kernelab.service.judge import changepoints
from kernelab.service.server import crud, history, job_vs_job
from kernelab.service.server.api.deps import (
    DEFAULT_LIMIT,
    MAX_ROW_ID,
    Limit,
    MinChangePct,
    Offset,
    SessionDep,
    SettingsDep,
)
from kernelab.service.server.api.door import DoorRoute

router = APIRouter(include_in_schema=False, route_class=DoorRoute)


def _templates():  # type: ignore[no-untyped-def]
    from kernelab.web.routes import templates  # routes includes this router: imported late

    return templates


@router.get("/history/regressions", response_class=HTMLResponse)
def regressions_page(
    request: Request, session: SessionDep, settings: SettingsDep,
    min_change_pct: MinChangePct = changepoints.DEFAULT_MIN_CHANGE_PCT,
) -> HTMLResponse:  # fmt: skip
    """The fleet's regressions, newest first, with the jobs on both sides of each change."""
    page = history.regressions(session=session, settings=settings, min_change_pct=min_change_pct)
    return _templates().TemplateResponse(request, "regressions.html", {"page": page})


@router.get("/nodes", response_class=HTMLResponse)
def nodes_page(
    request: Request, session: SessionDep, offset: Offset = 0, limit: Limit = DEFAULT_LIMIT
) -> HTMLResponse:
    """Every node that sent probe readings or results, by name, linking to its page."""
    nodes, count = crud.list_nodes(session=session, offset=offset, limit=limit)
    return _templates().TemplateResponse(request, "nodes.html", {"nodes": nodes, "count": count})


@router.get("/compare", response_class=HTMLResponse)
def compare_page(
    request: Request, session: SessionDep, settings: SettingsDep,
    a: Annotated[int, Query(ge=1, le=MAX_ROW_ID)], b: Annotated[int, Query(ge=1, le=MAX_ROW_ID)],
    side: Annotated[Side, Query()] = "candidate",
) -> HTMLResponse:  # fmt: skip
    """Job ``b`` against job ``a`` cell by cell, both nodes' health side by side; a pair that cannot
    be compared answers its status with the reason on the page."""
    try:
        result = job_vs_job.request(session=session, a=a, b=b, settings=settings, side=side)
    except job_vs_job.JobVsJobError as exc:
        return _templates().TemplateResponse(request, "not_found.html", {"message": exc.message},
                                             status_code=exc.status)  # fmt: skip
    if isinstance(result, job_vs_job.Pending):
        context = {"a": a, "b": b, "pending": result, "retry_s": job_vs_job.RETRY_AFTER_S}
        return _templates().TemplateResponse(request, "compare_pending.html", context, status_code=202)
    return _templates().TemplateResponse(request, "compare.html", {"cmp": result})
