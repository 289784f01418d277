"""The one door every request comes through: its text is read so that anything that is not UTF-8
becomes a 4xx naming the field, never a 500.

* **Bodies.** Every route is a ``DoorRoute``: its ``request.json()`` decodes the body as UTF-8
  with ``surrogateescape`` (``errors.decode_json``), so bytes that are not UTF-8 arrive in the
  field's string as lone surrogates, as a JSON ``"\\ud800"`` escape does, and the field's type
  refuses them (``kernelab.service.contract.schemas.storable_text``) with a 422 whose ``loc`` names it.
  FastAPI's own decoding answered bytes that are not UTF-8 with a 400 naming nothing, and a
  ``\\ud800`` escape got a 422 that echoed it, which UTF-8 cannot encode (a 500). Routes that
  validate their body's bytes themselves (results, specs, workload results) do the same through
  ``errors.validate_json_body``.
* **Path and query.** ``InboundTextMiddleware`` answers 422 before routing when the
  percent-decoded bytes of the path or of a query parameter are not UTF-8, naming the path
  parameter (``["path", "name"]``) or the query parameter (``["query", "benchmark"]``): Starlette
  and uvicorn decode them with ``errors="replace"``, which would quietly turn them into U+FFFD.
* **Headers.** An ``Authorization`` header that is not ASCII (a kernelab token is ASCII) is a 401
  that says so, with ``WWW-Authenticate: Bearer``.

Every error answer is encodable (``errors.encodable``), whatever the input held.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine, Sequence
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.routing import Match
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelab.service.server.api.errors import decode_json, encodable


class DoorRequest(Request):
    """A request whose JSON body is decoded by ``errors.decode_json`` (see the module docstring)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = decode_json(await self.body())
        return self._json


class DoorRoute(APIRoute):
    """An ``APIRoute`` whose handler gets the request ``make_request`` makes (FastAPI's documented
    custom ``Request``/``APIRoute`` pattern): a ``DoorRequest``, or a subclass of it for a route
    that reads its body its own way. Every router of the app uses it (``route_class=DoorRoute``;
    a test checks every route)."""

    def make_request(self, request: Request) -> Request:
        return DoorRequest(request.scope, request.receive)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def door_handler(request: Request) -> Response:
            return await handler(self.make_request(request))

        return door_handler


_UNICODE_MSG = "Input should be a valid string, unable to parse raw data as a unicode string"


def _utf8(raw: bytes) -> bool:
    """Whether the percent-decoded ``raw`` (``+`` read as a space, as in a query) is UTF-8."""
    try:
        unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _name(raw: bytes) -> str:
    return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8", "backslashreplace")[:100]


def query_problem(query: bytes) -> list[dict[str, Any]]:
    """Errors (FastAPI's 422 form) for each parameter of the raw query string ``query`` whose
    percent-decoded name or value is not UTF-8 (``&``-separated ``name=value`` pairs, as
    ``urllib.parse.parse_qsl`` reads them)."""
    if query.isascii() and b"%" not in query:
        return []
    out = []
    for part in query.split(b"&"):
        key, _, value = part.partition(b"=")
        if not _utf8(key):
            out.append({"loc": ["query", _name(key)], "msg": f"{_UNICODE_MSG} (the parameter's name)",
                        "type": "string_unicode"})  # fmt: skip
        elif not _utf8(value):
            out.append({"loc": ["query", _name(key)], "msg": _UNICODE_MSG, "type": "string_unicode"})
    return out


class InboundTextMiddleware:
    """Answer 422 (FastAPI's validation form) for a path or query whose percent-decoded bytes are
    not UTF-8, and 401 for an ``Authorization`` header that is not ASCII, before the app routes
    the request (see the module docstring). ``fastapi_app``: the app whose routes name a path's
    parameters."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI):
        self.app = app
        self.fastapi_app = fastapi_app

    def _path_problem(self, scope: Scope) -> list[dict[str, Any]]:
        raw: bytes = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogateescape")
        if (raw.isascii() and b"%" not in raw) or _utf8(raw):
            return []
        text = unquote_to_bytes(raw).decode("utf-8", "surrogateescape")
        probe = {**scope, "path": text, "root_path": ""}
        for context in iter_route_contexts(self.fastapi_app.routes):
            match, child = context.matches(probe)
            if match != Match.NONE:
                bad = [k for k, v in child.get("path_params", {}).items() if isinstance(v, str)
                       and not _utf8(v.encode("utf-8", "surrogateescape"))]  # fmt: skip
                if bad:
                    return [{"loc": ["path", k], "msg": _UNICODE_MSG, "type": "string_unicode"} for k in bad]
        return [{"loc": ["path"], "msg": _UNICODE_MSG, "type": "string_unicode"}]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"authorization" and not value.isascii():
                await _answer(send, 401, "the Authorization header is not ASCII (a kernelab token is)",
                              [(b"www-authenticate", b"Bearer")])  # fmt: skip
                return
        errors = self._path_problem(scope) + query_problem(scope.get("query_string", b""))
        if errors:
            await _answer(send, 422, errors)
            return
        await self.app(scope, receive, send)


async def _answer(send: Send, status: int, detail: Any, headers: Sequence[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps({"detail": encodable(detail)}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
