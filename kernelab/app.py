"""The FastAPI app factory: ``create_app(settings=None)``; no engine exists at import time.

The app is the API (``kernelab.service.server``) and the dashboard's pages (``kernelab.web``) put
together. It lives in the root package, above both rooms, so the server never imports the pages
and the pages import the server's crud and queries only (``tests/test_house.py``).

``create_app`` does not migrate (``kernelab serve`` runs ``kernelab.service.server.core.db.upgrade``
first) but refuses to start on a database that is not at the migrations' head, with the fix in the
message. Run with ``uvicorn --factory kernelab.app:create_app``, and at least one
compare worker on the same database (``kernelab compare-worker``; ``kernelab serve`` starts one):
the app never computes a comparison, so without one every result reads "comparing".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from importlib.resources import files

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy.exc import IntegrityError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

import kernelab.web.login
import kernelab.web.manage
import kernelab.web.routes
from kernelab.service.server.api import api_router
from kernelab.service.server.api.auth_first import AuthBeforeBodyMiddleware
from kernelab.service.server.api.door import InboundTextMiddleware
from kernelab.service.server.api.errors import install_error_handlers
from kernelab.service.server.api.routes import health
from kernelab.service.server.auth import ensure_token
from kernelab.service.server.core.config import Settings
from kernelab.service.server.core.db import check_at_head, make_engine, make_session_factory
from kernelab.service.server.downloads import DownloadSlots
from kernelab.service.server.observability import RequestLogMiddleware, configure_logging, metrics_registry

log = logging.getLogger(__name__)


class BodyTooLargeError(Exception):
    """Raised inside ``receive`` when a chunked body passes the limit."""


class MaxBodySizeMiddleware:
    """Refuse request bodies larger than ``max_bytes`` with 413, whether the client declares a
    ``Content-Length`` or streams a chunked body (counted as it arrives)."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def _reject(self, send: Send) -> None:
        body = f'{{"detail":"request body larger than {self.max_bytes} bytes"}}'.encode()
        await send({
            "type": "http.response.start", "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        })  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await self._reject(send)
                return
        seen = 0
        rejected = False

        async def counting_receive() -> Message:
            nonlocal seen, rejected
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes and not rejected:
                    rejected = True
                    await self._reject(send)  # the app is still reading the body: nothing sent yet
                    raise BodyTooLargeError
            return message

        async def guarded_send(message: Message) -> None:
            if not rejected:  # after a 413 the app's own error answer is dropped
                await send(message)

        try:
            await self.app(scope, counting_receive, guarded_send)
        except BodyTooLargeError:
            pass


def _bootstrap_admin(settings: Settings, factory) -> None:  # type: ignore[no-untyped-def]
    """Store ``KERNELAB_ADMIN_TOKEN`` (hashed); a revoked one stays revoked (logged as a warning).
    Several uvicorn workers start at once: when another
    worker inserted the row first (unique digest), run again, which now finds and updates it."""
    if settings.admin_token is None:
        return
    token = settings.admin_token.get_secret_value()
    for attempt in range(2):
        try:
            with factory.begin() as session:
                row = ensure_token(session, token, "admin (KERNELAB_ADMIN_TOKEN)", ["admin"])
                if row.revoked_at is not None:
                    log.warning(
                        "KERNELAB_ADMIN_TOKEN is token %d, revoked at %s: it stays revoked; set a new "
                        "KERNELAB_ADMIN_TOKEN (or use another admin token)",
                        row.id, row.revoked_at.isoformat(),
                        extra={"event": "bootstrap token revoked", "token_id": row.id},
                    )  # fmt: skip
            return
        except IntegrityError:
            if attempt:
                raise
            log.info("the admin token was stored by another worker at the same time; reading it again")


def _version() -> str:
    try:
        return version("kernelab")
    except PackageNotFoundError:
        return "0+unknown"


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app: REST API at ``/api/v1``, dashboard pages at ``/``, static files at
    ``/static``, ``/login``, ``/healthz``, ``/readyz``, ``/metrics``. No CORS middleware: browsers
    refuse cross-origin API calls (the dashboard is same-origin).

    ``settings`` defaults to ``Settings()`` read from the environment now. Raises
    ``kernelab.service.server.core.db.SchemaNotCurrentError`` when the database is not at the migrations' head
    and ``sqlalchemy.exc.OperationalError`` when it cannot be reached.
    """
    settings = settings or Settings()
    configure_logging(settings.log_format, settings.log_level)
    engine = make_engine(settings.database_url)
    try:
        check_at_head(engine)
        factory = make_session_factory(engine)
        _bootstrap_admin(settings, factory)
    except Exception:
        engine.dispose()
        raise

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(title="kernelab", version=_version(), lifespan=lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.session_factory = factory
    app.state.metrics_registry = metrics_registry(factory, alive_s=settings.runner_alive_s)
    app.state.download_slots = DownloadSlots(settings.downloads_per_client)
    install_error_handlers(app)
    app.include_router(api_router, prefix="/api/v1")
    app.include_router(health.router)
    app.include_router(kernelab.web.login.router)
    app.include_router(kernelab.web.routes.router)
    kernelab.web.routes.install(app)
    app.include_router(kernelab.web.manage.router)
    app.mount("/static", StaticFiles(directory=str(files("kernelab.web") / "static")), name="static")
    app.add_middleware(InboundTextMiddleware, fastapi_app=app)  # path and query bytes, before routing
    app.add_middleware(AuthBeforeBodyMiddleware, fastapi_app=app)  # inside the 413 check: no body read yet
    app.add_middleware(MaxBodySizeMiddleware, max_bytes=settings.max_request_bytes)
    app.add_middleware(RequestLogMiddleware)  # outermost: sees the 413s too
    return app
