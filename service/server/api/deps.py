"""``Annotated`` dependency aliases so handlers read as plain signatures.

``SessionDep``: one session per request, committed once when the handler returns without an
error and rolled back otherwise; the commit happens before the response is sent, so a client
never sees a success whose data was not stored. ``SettingsDep``: the app's ``Settings``.
``ReadToken``/``SubmitToken``/``AdminToken``/``RunnerToken``: the caller's ``Principal``, checked
for the scope (401 with ``WWW-Authenticate: Bearer`` without a valid token, 403 without the
scope). ``RunnerCallDep``: the runner endpoints' hot path (claim, heartbeat, fail): the token is
checked in the transaction the handler's work runs and commits in, one pool checkout and one
worker-thread hop per request. ``DashboardAccess``: for web pages (cookie
``kernelab_token`` or bearer header; nothing needed when ``public_dashboard`` is set).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, HTTPException, Path, Query, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from kernelab.service.contract.schemas.types import Hostname
from kernelab.service.server.auth import Principal, Scope, authenticate
from kernelab.service.server.core.config import Settings

TOKEN_COOKIE = "kernelab_token"
_SAFE_METHODS = frozenset({"GET", "HEAD"})
MAX_ROW_ID = 2**31 - 1  # primary keys are INTEGER: int4 on PostgreSQL (SQLite's 64-bit fits too)
MAX_OFFSET = 2**31 - 1  # a page offset past any table this server holds; keeps SQL integers in range

JobId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="job id")]
"""A job id in the path: out of the database's integer range is a 422 naming it, not a 500."""
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="rows to skip")]
"""``?offset=`` of a paginated list."""
MAX_LIMIT = 500  # the largest ?limit= of a list
DEFAULT_LIMIT = 50
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="rows per page")]
"""``?limit=`` of a paginated list (default ``DEFAULT_LIMIT``), with ``Offset`` and ``page_headers``
the one way every list of the API and the dashboard pages."""
NodeName = Annotated[Hostname, Path(description="the node's hostname (NodeInfo.hostname)")]
"""A node's name in the path (``/nodes/{name}``, the API's and the dashboard's)."""
MinChangePct = Annotated[
    float, Query(ge=0.0, le=1000.0, description="smallest shift (percent) reported as a change point")
]
"""``?min_change_pct=`` of the regressions list (the API's and the dashboard's), in percent."""

_bearer = HTTPBearer(auto_error=False, description="kernelab token (scopes read, submit, admin, runner)")


def page_headers(request: Request, *, total: int, offset: int, limit: int | None) -> dict[str, str]:
    """Headers of one page of a list: ``X-Total-Count`` (items in the whole list) and, while
    items remain after this page, an RFC 8288 ``Link: <url>; rel="next"`` to the next page: the
    request's path and query with ``offset``/``limit`` replaced, as a relative reference (RFC 3986
    section 4.2, resolved against the request's URL), or under ``KERNELAB_PUBLIC_URL`` when that is
    set. Never the request's ``Host`` header, which the client chooses.
    ``limit=None``: the page runs to the end."""
    headers = {"X-Total-Count": str(total)}
    if limit is not None and offset + limit < total:
        next_url = request.url.include_query_params(offset=offset + limit, limit=limit)
        relative = f"{next_url.path}?{next_url.query}"
        base: str | None = getattr(request.app.state.settings, "public_url", None)
        headers["Link"] = f'<{base.rstrip("/") + relative if base else relative}>; rel="next"'
    return headers


def get_settings(request: Request) -> Settings:
    """The ``Settings`` the app was built with."""
    return request.app.state.settings


def get_session_factory(request: Request) -> sessionmaker[Session]:
    """The app's session factory (for work that outlives the request, e.g. streaming)."""
    return request.app.state.session_factory


def get_session(request: Request) -> Iterator[Session]:
    """One session per request: commit once after a successful handler, roll back on error."""
    session = request.app.state.session_factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]


_NO_TOKEN = "a bearer token is required (Authorization: Bearer <token>)"


def unauthorized(message: str = _NO_TOKEN) -> HTTPException:
    """The 401 of a request without a valid bearer token (``WWW-Authenticate: Bearer``)."""
    return HTTPException(status.HTTP_401_UNAUTHORIZED, message, headers={"WWW-Authenticate": "Bearer"})


_unauthorized = unauthorized


def authorize(session: Session, credentials: HTTPAuthorizationCredentials | None, scope: Scope) -> Principal:
    """The principal of ``credentials`` if it holds ``scope``, read in ``session`` (blocking I/O).

    Raises HTTP 401 (no or bad token) and 403 (token without ``scope``; for ``runner``, a token
    not bound to a runner row, so ``principal.runner_id`` is always set).
    """
    if credentials is None:
        raise _unauthorized(_NO_TOKEN)
    principal = authenticate(session, credentials.credentials)
    if principal is None:
        raise _unauthorized("invalid or revoked token")
    if not principal.has(scope):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {scope!r} scope")
    if scope == "runner" and principal.runner_id is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this runner token is not bound to a runner")
    return principal


def _principal(request: Request, credentials: HTTPAuthorizationCredentials | None, scope: Scope) -> Principal:
    """``authorize`` in a short session of its own (kept out of the request's)."""
    if credentials is None:
        raise _unauthorized(_NO_TOKEN)
    with request.app.state.session_factory() as session:
        return authorize(session, credentials, scope)


def require(scope: Scope) -> Callable[..., Principal]:
    """A dependency that returns the caller's ``Principal`` if it has ``scope``.

    For ``read`` on GET/HEAD the dashboard's ``kernelab_token`` cookie also counts, so the
    dashboard's export links (samples CSV, report.md) work for a signed-in browser; a cookie
    never authorises a write (no CSRF surface).

    Raises HTTP 401 (no or bad token) and 403 (token without ``scope``; for ``runner``, a token
    not bound to a runner row, so ``principal.runner_id`` is always set).
    """

    def dependency(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
    ) -> Principal:
        cookie = request.cookies.get(TOKEN_COOKIE)
        if credentials is None and cookie and scope == "read" and request.method in _SAFE_METHODS:
            credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=cookie)
        return _principal(request, credentials, scope)

    dependency.__name__ = f"require_{scope}"
    dependency.kernelab_scope = scope  # type: ignore[attr-defined]  # read by api.auth_first
    return dependency


def read_or_node_runner(
    request: Request,
    name: NodeName,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """``require("read")``, or a runner token of node ``name`` (the path's node: bound to it, or
    not bound yet), so a node's own runner token reads the band its probes are judged by
    (``kernelab probe --server URL --post``). Raises HTTP 401 (no or bad token) and 403 (neither).
    """
    try:
        return require("read")(request, credentials)
    except HTTPException as exc:
        if exc.status_code != status.HTTP_403_FORBIDDEN:
            raise
        refused = exc
    try:
        principal: Principal | None = _principal(request, credentials, "runner")
    except HTTPException:
        principal = None
    if principal is None or principal.node_name not in (None, name):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"{refused.detail} (nor is it a runner token of node {name!r})"
        )
    return principal


ReadToken = Annotated[Principal, Depends(require("read"))]
NodeReaderToken = Annotated[Principal, Depends(read_or_node_runner)]
SubmitToken = Annotated[Principal, Depends(require("submit"))]
AdminToken = Annotated[Principal, Depends(require("admin"))]
RunnerToken = Annotated[Principal, Depends(require("runner"))]

T = TypeVar("T")


@dataclass(frozen=True)
class RunnerCall:
    """A runner request's bearer token, checked (scope ``runner``) by ``run`` in the same session
    and transaction as the handler's work.

    Everything a request does with the database happens in one worker-thread hop: a thread never
    holds a pooled connection while it waits for another thread (with 40 threads and a pool of 15
    connections, holding one across hops deadlocks under load until the pool times out).
    """

    credentials: HTTPAuthorizationCredentials
    session_factory: sessionmaker[Session]

    def _in_transaction(self, work: Callable[[Session, Principal], T]) -> T:
        with self.session_factory.begin() as session:
            return work(session, authorize(session, self.credentials, "runner"))

    async def run(self, work: Callable[[Session, Principal], T]) -> T:
        """``work(session, principal)`` after the token check (``principal.runner_id`` is set),
        then commit; rolled back if it raises. Raises HTTP 401 (bad or revoked token) and 403 (not
        a runner token)."""
        return await run_in_threadpool(self._in_transaction, work)


async def runner_call(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> RunnerCall:
    """The runner endpoints' dependency: 401 at once without a bearer token; the token itself is
    checked by ``RunnerCall.run`` inside the handler's transaction (and, for a request with a body,
    once before the body is read by ``kernelab.service.server.api.auth_first``: a bad token is a 401 whatever
    the
    body)."""
    if credentials is None:
        raise _unauthorized(_NO_TOKEN)
    return RunnerCall(credentials, request.app.state.session_factory)


runner_call.kernelab_scope = "runner"  # type: ignore[attr-defined]  # read by api.auth_first


RunnerCallDep = Annotated[RunnerCall, Depends(runner_call)]


def dashboard_access(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal | None:
    """Access check for dashboard pages: None when the dashboard is public, else the principal
    of the ``kernelab_token`` cookie or the bearer header, which needs the ``read`` scope.

    Raises HTTP 401 (no or bad token; the message points at ``/login``) and 403.
    """
    settings: Settings = request.app.state.settings
    if settings.public_dashboard:
        return None
    cookie = request.cookies.get(TOKEN_COOKIE)
    if credentials is None and cookie:
        credentials = HTTPAuthorizationCredentials(scheme="Bearer", credentials=cookie)
    if credentials is None:
        raise _unauthorized("sign in at /login with a read token")
    return _principal(request, credentials, "read")


DashboardAccess = Annotated[Principal | None, Depends(dashboard_access)]
