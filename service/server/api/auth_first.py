"""``AuthBeforeBodyMiddleware``: the bearer token of a request to a route that takes a body is
checked before a byte of that body is read.

FastAPI reads and decodes a request's body (``await request.json()`` in
``fastapi.routing.get_request_handler``) and validates it *before* it solves the route's
dependencies, so a token check written as a dependency (``deps.require``, ``deps.runner_call``)
runs after the body has been received, decoded and validated: an unauthenticated caller could
make the server read 64 MiB, build its Python objects and answer a 422 that echoed them. No
ordering of dependencies changes that (the body is not a dependency). This pure ASGI middleware
runs in front of the router: for a request that matches a route with a body parameter and a
token dependency (found once from ``app.routes``: dependencies carry ``kernelab_scope``), it
reads only the ``Authorization`` header and checks the token and its scope in a worker thread
(``deps.authorize``); a refused request is answered 401 / 403 without receiving its body, and a
database that cannot be reached gives 503 with ``Retry-After`` (as ``kernelab.service.server.api.errors``).

The route's own dependency checks the token again afterwards (one indexed read, the price of
keeping that check, and the runner calls' check in the handler's transaction, unchanged).
Cookies never authorise a request with a body (``deps.require``), so only the header is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from fastapi.security import HTTPAuthorizationCredentials
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelab.service.server.api.deps import authorize, unauthorized
from kernelab.service.server.api.errors import DB_RETRY_AFTER_S, database_unavailable


def _scope_of(dependant: Dependant) -> str | None:
    """The token scope a route's dependency tree requires (``kernelab_scope`` of a dependency)."""
    for dep in dependant.dependencies:
        scope = getattr(dep.call, "kernelab_scope", None) or _scope_of(dep)
        if scope:
            return scope
    return None


@dataclass(frozen=True)
class GuardedRoute:
    """A route that takes a body and a token: its route as mounted (``route.matches(scope)``,
    ``route.path`` with the router's prefix, ``route.methods``) and the scope it requires."""

    route: RouteContext
    scope: str


def guarded_routes(app: FastAPI) -> list[GuardedRoute]:
    """Every route of ``app`` with a body parameter and a token dependency (FastAPI keeps
    included routers nested: ``iter_route_contexts`` gives each route with its prefix)."""
    out = []
    for context in iter_route_contexts(app.routes):
        route = context.original_route
        if isinstance(route, APIRoute) and route.body_field is not None:
            scope = _scope_of(route.dependant)
            if scope is not None:
                out.append(GuardedRoute(context, scope))
    return out


def _bearer(scope: Scope) -> HTTPAuthorizationCredentials | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return HTTPAuthorizationCredentials(scheme="Bearer", credentials=token.strip())
            return None
    return None


async def _answer(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class AuthBeforeBodyMiddleware:
    """Answer 401/403 (or 503) before the body is read, for the routes of ``guarded_routes(fastapi_app)``
    (computed on the first request, when every router is included)."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI):
        self.app = app
        self.fastapi_app = fastapi_app
        self._routes: list[GuardedRoute] | None = None
        self._methods: frozenset[str] = frozenset()

    def _match(self, scope: Scope) -> GuardedRoute | None:
        if self._routes is None:
            self._routes = guarded_routes(self.fastapi_app)
            self._methods = frozenset(m for g in self._routes for m in g.route.methods or ())
        if scope["method"] not in self._methods:
            return None
        for guarded in self._routes:
            match, _ = guarded.route.matches(scope)
            if match == Match.FULL:
                return guarded
        return None

    def _check(self, credentials: HTTPAuthorizationCredentials, scope: Any) -> None:
        with self.fastapi_app.state.session_factory() as session:
            authorize(session, credentials, scope)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        guarded = self._match(scope) if scope["type"] == "http" else None
        if guarded is not None:
            credentials = _bearer(scope)
            try:
                if credentials is None:
                    raise unauthorized()
                await run_in_threadpool(self._check, credentials, guarded.scope)
            except HTTPException as exc:
                await _answer(send, exc.status_code, str(exc.detail), dict(exc.headers or {}))
                return
            except Exception as exc:
                if not database_unavailable(exc):
                    raise
                orig = getattr(exc, "orig", None) or exc
                detail = f"the database is unavailable ({type(orig).__name__}); retry in {DB_RETRY_AFTER_S} s"
                await _answer(send, 503, detail, {"Retry-After": str(DB_RETRY_AFTER_S)})
                return
        await self.app(scope, receive, send)
