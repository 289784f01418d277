"""``/healthz`` (the process answers) and ``/readyz`` (the database answers), unauthenticated;
``/metrics`` (Prometheus text format; a ``read`` token unless ``KERNELAB_PUBLIC_METRICS``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from kernelab.service.server.api.deps import _bearer, require
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.observability import render_metrics

router = APIRouter(tags=["health"], route_class=DoorRoute)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: 200 while the process serves requests."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request) -> JSONResponse:
    """Readiness: 200 when ``SELECT 1`` succeeds on the database, else 503 with the error class."""
    try:
        with request.app.state.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SQLAlchemyError as exc:
        return JSONResponse({"status": "unavailable", "detail": type(exc).__name__}, status_code=503)
    return JSONResponse({"status": "ok"}, status_code=status.HTTP_200_OK)


def _metrics_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """No check when ``public_metrics`` is set; else a token with ``read`` (401/403 otherwise)."""
    if not request.app.state.settings.public_metrics:
        require("read")(request, credentials)


@router.get(
    "/metrics",
    response_class=Response,
    dependencies=[Depends(_metrics_access)],
    responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format 0.0.4"}},
)
async def metrics(request: Request) -> Response:
    """Queue depth, jobs per status, runners alive, attempts by outcome, job-duration histogram,
    read from the database now (the same answer from every worker)."""
    body, content_type = await run_in_threadpool(render_metrics, request.app.state.metrics_registry)
    return Response(body, media_type=content_type)
