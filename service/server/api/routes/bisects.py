"""``/bisects``: the record of a ``kernelab bisect`` (create, append a step, finish: submit scope;
list and read: read scope). The client runs the revision jobs and decides each step
(``kernelab.runners.bisect``); the server stores what it did for the dashboard's page."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from kernelab.service.contract.schemas import (
    BisectCreate,
    BisectFinish,
    BisectPublic,
    BisectsPage,
    BisectStep,
)
from kernelab.service.server import bisects
from kernelab.service.server.api.deps import (
    DEFAULT_LIMIT,
    JobId,
    Limit,
    Offset,
    ReadToken,
    SessionDep,
    SubmitToken,
    page_headers,
)
from kernelab.service.server.api.door import DoorRoute

router = APIRouter(prefix="/bisects", tags=["bisects"], route_class=DoorRoute)


@router.post("", status_code=status.HTTP_201_CREATED)
def create_bisect(body: BisectCreate, principal: SubmitToken, session: SessionDep) -> BisectPublic:
    """Record a new bisect (``running``) before its first step; 422 naming the field for a bad body."""
    return bisects.public(bisects.create(session, body, submitted_by=principal.token_id))


@router.get("")
def list_bisects(
    request: Request, response: Response, _: ReadToken, session: SessionDep,
    offset: Offset = 0, limit: Limit = DEFAULT_LIMIT,
) -> BisectsPage:  # fmt: skip
    """Bisects, newest first (``X-Total-Count``, ``Link: rel=next``)."""
    page = bisects.page(session, offset=offset, limit=limit)
    response.headers.update(page_headers(request, total=page.count, offset=offset, limit=limit))
    return page


@router.get("/{bisect_id}")
def get_bisect(bisect_id: JobId, _: ReadToken, session: SessionDep) -> BisectPublic:
    """One bisect with its steps (404 if unknown)."""
    return bisects.public(bisects.get(session, bisect_id))


@router.post("/{bisect_id}/steps")
def add_step(bisect_id: JobId, body: BisectStep, _: SubmitToken, session: SessionDep) -> BisectPublic:
    """Append a judged step (409 once the bisect has finished, or for a commit outside its range)."""
    return bisects.public(bisects.add_step(session, bisect_id, body))


@router.post("/{bisect_id}/finish")
def finish_bisect(bisect_id: JobId, body: BisectFinish, _: SubmitToken, session: SessionDep) -> BisectPublic:
    """End the bisect: ``found`` with ``first_bad``, or ``stopped`` with the reason (409 once finished)."""
    return bisects.public(bisects.finish(session, bisect_id, body))
