"""Dashboard pages and buttons for managing jobs, and the bisect pages.

* ``POST /jobs/{id}/cancel`` and ``POST /jobs/{id}/rerun``: the job page's buttons (HTML forms).
  They need the signed-in browser's token to hold the ``submit`` scope (``docs/operations.md``,
  "Managing jobs"): the ``kernelab_token`` cookie is read here for a write, so each is refused
  (403) unless it comes from this server's own page (``same_origin``: ``Origin`` and
  ``Sec-Fetch-Site``, as the sign-in form is guarded), besides the cookie's ``SameSite=Lax``.
  A bearer header works too (scripts). They answer 303 to the job page (the new job for a re-run).
* ``GET /bisects`` and ``GET /bisects/{id}``: the record ``kernelab bisect`` keeps on the server
  (``kernelab.service.server.bisects``); a running bisect's page refreshes its steps in place
  (``static/live.js``).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelab.service.server import bisects, crud, models, queue
from kernelab.service.server.api.deps import (
    MAX_ROW_ID,
    TOKEN_COOKIE,
    JobId,
    Limit,
    Offset,
    SessionDep,
    SettingsDep,
    authorize,
)
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.auth import Principal
from kernelab.web.login import same_origin
from kernelab.web.routes import DashboardAccess, templates

router = APIRouter(include_in_schema=False, route_class=DoorRoute)
_bearer = HTTPBearer(auto_error=False)


def _message(request: Request, title: str, message: str, status_code: int) -> HTMLResponse:
    return templates.TemplateResponse(
        request, "message.html", {"title": title, "message": message}, status_code=status_code
    )


def _submitter(
    request: Request, session: Session, credentials: HTTPAuthorizationCredentials | None
) -> Principal | HTMLResponse:
    """The principal allowed to change a job from the dashboard, or the page that says why not."""
    if not same_origin(request):
        return _message(request, "Refused", "Refused: this request came from another site.", 403)
    cookie = request.cookies.get(TOKEN_COOKIE)
    if credentials is None and cookie:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=cookie)
    try:
        return authorize(session, credentials, "submit")
    except HTTPException as exc:
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:
            text = "Sign in (at /login) with a token that has the 'submit' scope to cancel or re-run jobs."
        else:
            text = (
                "Your token can read but not change jobs: cancelling and re-running need the 'submit' scope."
            )
        return _message(request, "Not allowed", text, exc.status_code)


Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


@router.post("/jobs/{job_id}/cancel", response_class=HTMLResponse)
def cancel_button(request: Request, job_id: JobId, session: SessionDep, credentials: Bearer) -> Response:
    """The job page's Cancel button: cancel, then back to the job page (303)."""
    principal = _submitter(request, session, credentials)
    if isinstance(principal, HTMLResponse):
        return principal
    try:
        queue.cancel(session, job_id, by=f"token {principal.name!r} (dashboard)")
    except queue.JobNotFoundError:
        return _message(request, "Not found", f"There is no job #{job_id}.", 404)
    except queue.InvalidTransitionError as exc:
        return _message(request, "Cannot cancel", str(exc), 409)
    return RedirectResponse(f"/jobs/{job_id}", status_code=status.HTTP_303_SEE_OTHER)


@router.post("/jobs/{job_id}/rerun", response_class=HTMLResponse)
def rerun_button(
    request: Request, job_id: JobId, session: SessionDep, settings: SettingsDep, credentials: Bearer
) -> Response:
    """The job page's Re-run button: queue the spec again (``kernelab.service.server.crud.rerun_job``, as
    ``POST /api/v1/jobs/{id}/rerun`` does), then to the new job's page (303)."""
    principal = _submitter(request, session, credentials)
    if isinstance(principal, HTMLResponse):
        return principal
    try:
        job = crud.rerun_job(
            session=session, job_id=job_id, submitted_by=principal.token_id, settings=settings
        )
    except queue.JobNotFoundError:
        return _message(request, "Not found", f"There is no job #{job_id}.", 404)
    except crud.SpecInvalidError as exc:
        errors = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" for e in exc.errors
        )
        return _message(
            request, "Cannot re-run", f"The job's spec no longer fits its benchmark: {errors}", 422
        )
    return RedirectResponse(f"/jobs/{job.id}", status_code=status.HTTP_303_SEE_OTHER)


@router.get("/bisects", response_class=HTMLResponse, dependencies=DashboardAccess)
def bisects_page(
    request: Request, session: SessionDep, offset: Offset = 0, limit: Limit = 50
) -> HTMLResponse:
    """Bisects, newest first."""
    page = bisects.page(session, offset=offset, limit=limit)
    return templates.TemplateResponse(request, "bisects.html", {"bisects": page.data, "count": page.count})


@router.get("/bisects/{bisect_id}", response_class=HTMLResponse, dependencies=DashboardAccess)
def bisect_page(request: Request, bisect_id: JobId, session: SessionDep) -> HTMLResponse:
    """One bisect: its range, each step's job with its verdict, ratio and CI, and its outcome."""
    row = session.get(models.Bisect, bisect_id)
    if row is None:
        return _message(request, "Not found", f"There is no bisect #{bisect_id}.", 404)
    b = bisects.public(row)
    ids = [s.job_id for s in b.steps if s.job_id <= MAX_ROW_ID]  # a step stored before ids were bounded
    jobs: list[models.Job] = (
        list(session.scalars(select(models.Job).where(models.Job.id.in_(ids)))) if ids else []
    )
    marks = _marks(b)
    return templates.TemplateResponse(
        request, "bisect.html", {"b": b, "marks": marks, "job_status": {j.id: j.status for j in jobs}}
    )


def _marks(b: Any) -> dict[str, str]:
    """Per commit sha: ``good``/``bad``/``undecided`` from the steps (the last word on it), ``first-bad``."""
    marks: dict[str, str] = {}
    for s in b.steps:
        marks[s.commit] = s.outcome
    if b.first_bad:
        marks[b.first_bad] = "first-bad"
    return marks
