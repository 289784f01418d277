"""Exception handlers: every error is JSON ``{"detail": ...}``, and bad input never becomes a 500.

* ``RequestValidationError`` -> FastAPI's 422, with NaN/Infinity inputs written as strings;
* ``SpecInvalidError`` (a spec its benchmark rejects) and ``crud.ResultInvalidError`` (a result
  that does not fit its job: cells outside the sweep, missing or repeated, another spec) -> 422 in
  FastAPI's validation format ``{"detail": [{"loc": ["body", ...field], "msg": ..., "type": ...}]}``;
* ``queue.JobNotFoundError`` -> 404; ``queue.LeaseLostError`` and ``InvalidTransitionError`` -> 409;
* ``crud.ResultConflictError`` and ``sqlalchemy.exc.IntegrityError`` (a unique or check
  constraint the request broke, e.g. a concurrent duplicate) -> 409 with the reason;
* a number the database cannot hold (``OverflowError`` from sqlite3 past 64-bit integers,
  ``sqlalchemy.exc.DataError`` from PostgreSQL, e.g. ``numeric value out of range``) -> 422.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError, IntegrityError

from service.crud import ResultConflictError, ResultInvalidError
from service.queue import InvalidTransitionError, JobNotFoundError, LeaseLostError

log = logging.getLogger(__name__)


class SpecInvalidError(Exception):
    """A job spec that parsed but that its benchmark rejects (``kernels.validate_spec`` errors)."""

    def __init__(self, errors: Sequence[dict[str, Any]]):
        super().__init__("; ".join(str(e.get("msg", "")) for e in errors))
        self.errors = list(errors)


def _json(status_code: int, detail: Any) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status_code)


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


async def _request_invalid(_request: Request, exc: Exception) -> JSONResponse:
    """FastAPI's 422, but safe to encode when the rejected input was NaN or infinite."""
    assert isinstance(exc, RequestValidationError)
    return _json(status.HTTP_422_UNPROCESSABLE_CONTENT, _json_safe(jsonable_encoder(exc.errors())))


def install_error_handlers(app: FastAPI) -> None:
    """Register kernelab's exception handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, _request_invalid)
    app.add_exception_handler(SpecInvalidError, _spec_invalid)
    app.add_exception_handler(ResultInvalidError, _spec_invalid)
    app.add_exception_handler(JobNotFoundError, _not_found)
    app.add_exception_handler(LeaseLostError, _conflict)
    app.add_exception_handler(InvalidTransitionError, _conflict)
    app.add_exception_handler(ResultConflictError, _conflict)
    app.add_exception_handler(IntegrityError, _integrity)
    app.add_exception_handler(DataError, _out_of_range)
    app.add_exception_handler(OverflowError, _out_of_range)
