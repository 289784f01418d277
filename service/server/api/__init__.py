"""The REST API: ``api_router`` (mounted at ``/api/v1``) joins the per-resource routers;
``login.router`` and ``health.router`` are mounted at the site root by ``create_app``."""

from fastapi import APIRouter

from kernelab.service.server.api.routes import (
    bisects,
    compare,
    history,
    jobs,
    nodes,
    results,
    runners,
    tokens,
)

api_router = APIRouter()
api_router.include_router(jobs.router)
api_router.include_router(results.router)
api_router.include_router(runners.router)
api_router.include_router(nodes.router)
api_router.include_router(tokens.router)
api_router.include_router(history.router)
api_router.include_router(compare.router)
api_router.include_router(bisects.router)

__all__ = ["api_router"]
