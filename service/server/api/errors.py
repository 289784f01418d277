"""Exception handlers: every error is JSON ``{"detail": ...}``, and bad input never becomes a 500.

* ``RequestValidationError`` -> FastAPI's 422, with NaN/Infinity inputs written as strings,
  every echoed input bounded to ``MAX_ECHO_CHARS`` (``bounded_errors``), at most ``MAX_ERRORS``,
  and every text in it encodable (``encodable``: a lone surrogate an input carried is written as
  its ``\\udXXX`` escape), so the answer to any input can be sent;
* ``HTTPException`` -> its status and ``{"detail": ...}`` as FastAPI answers it, the detail made
  ``encodable`` too;
* ``crud.SpecInvalidError`` (a spec its benchmark rejects) and ``crud.ResultInvalidError`` (a result
  that does not fit its job: cells outside the sweep, missing or repeated, another spec) -> 422 in
  FastAPI's validation format ``{"detail": [{"loc": ["body", ...field], "msg": ..., "type": ...}]}``;
* ``queue.JobNotFoundError`` -> 404; ``queue.LeaseLostError`` and ``InvalidTransitionError`` -> 409;
* ``crud.ResultConflictError`` and ``sqlalchemy.exc.IntegrityError`` (a unique or check
  constraint the request broke, e.g. a concurrent duplicate) -> 409 with the reason;
* a number the database cannot hold (``OverflowError`` from sqlite3 past 64-bit integers,
  ``sqlalchemy.exc.DataError`` from PostgreSQL, e.g. ``numeric value out of range``) -> 422;
* the database unavailable (``sqlalchemy.exc.OperationalError``: refused or dropped connections,
  a server shutting down, SQLite's ``database is locked``; ``InterfaceError``; any DBAPI error
  that invalidated its connection; ``sqlalchemy.exc.TimeoutError``: no pooled connection within
  the pool's timeout) -> 503 with ``Retry-After: DB_RETRY_AFTER_S``, never a 500. The request's
  transaction was rolled back (or, for a connection lost during ``COMMIT``, may have committed),
  so the client repeats the same request: result posts carry an idempotency key, and a claim
  whose answer was lost holds a lease that expires.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException

from kernelab.service.server.crud import ResultConflictError, ResultInvalidError, SpecInvalidError
from kernelab.service.server.queue import InvalidTransitionError, JobNotFoundError, LeaseLostError

log = logging.getLogger(__name__)

DB_RETRY_AFTER_S = 5  # Retry-After of a 503 while the database is unavailable, seconds
MAX_ECHO_CHARS = 256  # a 422's echoed `input` / `ctx` value: larger ones are summarised
MAX_LOC_CHARS = 100  # one part of a 422's `loc` (a dict key of the body can be any length)
MAX_MSG_CHARS = 500  # a 422's `msg` (custom validators may quote the input)
MAX_ERRORS = 50  # errors listed in one 422; the rest are counted in one more line
M = TypeVar("M", bound=BaseModel)


def encodable(value: Any) -> Any:
    """``value`` (a str, or dicts/lists/tuples of them, keys included) with every str that UTF-8
    cannot encode (a lone surrogate, from a JSON ``\\ud800`` escape or bytes that are not UTF-8)
    written with backslash escapes (``'\\ud800'``), and bytes as such text: a 422 echoing such an
    input can be sent, and shows which character it was. Everything else is returned as it is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encodable(v) for v in value]
    return value


def _json(status_code: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": encodable(detail)}, status_code=status_code, headers=headers)


async def _http_error(_request: Request, exc: Exception) -> Response:
    """FastAPI's answer to an ``HTTPException`` (``{"detail": ...}``, its headers; none for a
    status without a body), with the detail ``encodable``."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code in (204, 304) or exc.status_code < 200:
        return Response(status_code=exc.status_code, headers=exc.headers)
    return _json(exc.status_code, exc.detail, dict(exc.headers or {}))


async def _spec_invalid(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, SpecInvalidError | ResultInvalidError)
    detail = [
        {
            "loc": ["body", *e.get("loc", ())],
            "msg": str(e.get("msg", "")),
            "type": str(e.get("type", "value_error")),
        }
        for e in exc.errors
    ]
    return _json(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)


async def _not_found(_request: Request, exc: Exception) -> JSONResponse:
    return _json(status.HTTP_404_NOT_FOUND, str(exc))


async def _conflict(_request: Request, exc: Exception) -> JSONResponse:
    return _json(status.HTTP_409_CONFLICT, str(exc))


async def _integrity(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, IntegrityError)
    reason = str(exc.orig).splitlines()[0] if exc.orig is not None else "constraint violated"
    log.info("%s %s: integrity error: %s", request.method, request.url.path, reason)
    return _json(status.HTTP_409_CONFLICT, f"the request conflicts with stored data: {reason}")


async def _out_of_range(request: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, DataError) and exc.orig is not None:
        reason = str(exc.orig).splitlines()[0]
    else:
        reason = str(exc) or type(exc).__name__
    log.info("%s %s: value out of the database's range: %s", request.method, request.url.path, reason)
    return _json(
        status.HTTP_422_UNPROCESSABLE_CONTENT,
        f"a value in the request is outside what the database can store: {reason}",
    )


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be used right now (see the module docstring),
    as opposed to a fault of the request."""
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeoutError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    if not database_unavailable(exc):
        raise exc  # another DBAPIError: a fault of ours, answered 500 by Starlette
    orig = getattr(exc, "orig", None) or exc
    reason = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
    log.warning(
        "%s %s: database unavailable: %s", request.method, request.url.path, reason,
        extra={"event": "database unavailable", "method": request.method, "path": request.url.path},
    )  # fmt: skip
    return JSONResponse(
        {"detail": f"the database is unavailable ({type(orig).__name__}); retry in {DB_RETRY_AFTER_S} s"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(DB_RETRY_AFTER_S)},
    )


def _json_safe(value: Any) -> Any:
    """``value`` with non-finite floats as strings: JSON has no NaN/Infinity, and a request body
    may carry them (Python's json module reads ``NaN`` and ``1e999``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def _left(value: Any, budget: int) -> int:
    """``budget`` less the JSON size of ``value`` (roughly), stopping as soon as it is below 0:
    the walk visits at most ``budget`` characters' worth of a value however large it is."""
    if isinstance(value, str | bytes):
        return budget - len(value) - 2
    if isinstance(value, dict):
        budget -= 2
        for key, item in value.items():
            budget = _left(item, _left(key, budget - 2)) if budget >= 0 else budget
            if budget < 0:
                break
        return budget
    if isinstance(value, list | tuple | set | frozenset):
        budget -= 2
        for item in value:
            budget = _left(item, budget - 1)
            if budget < 0:
                break
        return budget
    return budget - len(repr(value)) if isinstance(value, int | float | bool | None) else budget - 64


def bounded(value: Any, limit: int = MAX_ECHO_CHARS) -> Any:
    """``value`` if its JSON form is at most ``limit`` characters; else a string of at most about
    ``limit`` characters that says what was left out (a long string: its start)."""
    if _left(value, limit) >= 0:
        return value
    if isinstance(value, str):
        return f"{value[:limit]}... ({len(value)} characters)"
    if isinstance(value, dict | list | tuple):
        return f"<{type(value).__name__} of {len(value)} items, not echoed>"
    return f"<{type(value).__name__}, not echoed>"


def bounded_errors(errors: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Validation errors safe to send back to anyone: at most ``MAX_ERRORS`` (then one line that
    counts the others), each ``input``, ``ctx`` value, ``loc`` part and ``msg`` bounded by
    ``bounded`` (unbounded, a 20 MB body would come back as a 41 MB 422)."""
    out = []
    for error in errors[:MAX_ERRORS]:
        item = dict(error)
        loc = error.get("loc", ())
        item["loc"] = [p if isinstance(p, int) else bounded(str(p), MAX_LOC_CHARS) for p in loc]
        item["msg"] = bounded(str(error.get("msg", "")), MAX_MSG_CHARS)
        if "input" in item:
            item["input"] = bounded(item["input"])
        if isinstance(item.get("ctx"), dict):
            item["ctx"] = {str(k)[:MAX_LOC_CHARS]: bounded(v) for k, v in list(item["ctx"].items())[:8]}
        item.pop("url", None)
        out.append(item)
    if len(errors) > MAX_ERRORS:
        more = len(errors) - MAX_ERRORS
        out.append({"loc": ["body"], "msg": f"{more} more errors not shown", "type": "too_many_errors"})
    return out


async def _request_invalid(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422, bounded (``bounded_errors``) and safe to encode when the rejected input was
    NaN or infinite."""
    assert isinstance(exc, RequestValidationError)
    errors = bounded_errors(exc.errors())
    return _json(status.HTTP_422_UNPROCESSABLE_CONTENT, _json_safe(jsonable_encoder(encodable(errors))))


def install_error_handlers(app: FastAPI) -> None:
    """Register kernelab's exception handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(SpecInvalidError, _spec_invalid)
    app.add_exception_handler(ResultInvalidError, _spec_invalid)
    app.add_exception_handler(JobNotFoundError, _not_found)
    app.add_exception_handler(LeaseLostError, _conflict)
    app.add_exception_handler(InvalidTransitionError, _conflict)
    app.add_exception_handler(ResultConflictError, _conflict)
    app.add_exception_handler(IntegrityError, _integrity)
    app.add_exception_handler(DataError, _out_of_range)
    app.add_exception_handler(OverflowError, _out_of_range)
    app.add_exception_handler(DBAPIError, _unavailable)  # OperationalError, InterfaceError, ...
    app.add_exception_handler(PoolTimeoutError, _unavailable)


def validate_json_body(model: type[M], data: bytes) -> M:
    """``model.model_validate_json(data)`` for a request body. Raises ``pydantic.ValidationError``;
    errors keep their ``loc`` (``("cells", 3, ...)``).

    pydantic-core's JSON parser refuses a whole body for one string that is not UTF-8 (bytes that
    are not UTF-8, a ``\\ud800`` escape of half a surrogate pair) with ``json_invalid`` at a line
    and column. Such a body is parsed again as the door parses every other body
    (``kernelab.service.server.api.door.decode_json``: bytes that are not UTF-8 become lone surrogates)
    and validated, so the error names the field that holds it (``storable_text``). A body that
    is not JSON at all raises one ``json_invalid`` error that does not echo the body back."""
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if any(e["type"] != "json_invalid" for e in errors):
            raise
        ctx = errors[0].get("ctx", {})
    try:
        decoded = decode_json(data)
    except ValueError:
        decoded = None
    if decoded is not None:
        model.model_validate(decoded)  # raises, naming the field, when the field is what was wrong
    line = InitErrorDetails(type="json_invalid", loc=(), input="", ctx={"error": ctx.get("error", "")})
    raise ValidationError.from_exception_data(model.__name__, [line]) from None


def decode_json(data: bytes) -> Any:
    """The JSON value of a request body, read as the door reads every body: UTF-8, with bytes that
    are not UTF-8 decoded to lone surrogates (``surrogateescape``, PEP 383) and ``\\ud800``
    escapes kept as they are (Python's ``json``), so validation refuses them naming the field
    (``kernelab.service.contract.schemas.storable_text``) instead of a decode error naming none. Raises
    ``ValueError`` (``json.JSONDecodeError``) for a body that is not JSON."""
    return json.loads(data.decode("utf-8", "surrogateescape"))
