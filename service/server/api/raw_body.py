"""Bodies validated straight from their bytes, in a worker thread: ``RawJSONRoute`` and the body
parameter type ``RawJSONBody[M]`` (results, workload results).

A body of tens of MiB (a large sweep's result) is validated by pydantic-core from its bytes
(``errors.validate_json_body``: ``M.model_validate_json``, the door's decoding for a field that is
not UTF-8) instead of FastAPI's ``json.loads`` followed by validation of the Python objects: a
1,000-cell, 600,000-sample result parses in ~0.4 s instead of ~1 s on a 2-core machine, and no 6
million Python objects are built. The validation runs in a worker thread, not on the event loop,
so the process keeps answering heartbeats and claims while a large body is parsed; the request
schema, the OpenAPI document and the 422 errors (``loc`` from ``body``) are FastAPI's.

The cyclic garbage collector is paused while such a request runs (``gc_paused``): the parsed
result holds millions of Python numbers in lists, and one full collection that traverses them
costs 0.2-0.4 s on a 2-core machine (measured with ``gc.callbacks``); the allocations of the
ingest itself usually trigger one. Reference counting still frees everything; collection
resumes right after.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from fastapi import Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ValidationError, ValidatorFunctionWrapHandler

from kernelab.service.server.api.door import DoorRequest, DoorRoute
from kernelab.service.server.api.errors import validate_json_body


class RawJSON:
    """A JSON request body: its bytes, the model it is validated as, and the outcome of validating
    it in a worker thread (the model, or the ``ValidationError`` to raise)."""

    __slots__ = ("data", "error", "model", "parsed")

    def __init__(self, data: bytes, model: type[BaseModel]):
        self.data = data
        self.model = model
        self.parsed: BaseModel | None = None
        self.error: ValidationError | None = None

    def validate(self) -> None:
        try:
            self.parsed = validate_json_body(self.model, self.data)
        except ValidationError as exc:
            self.error = exc


class _RawJSONRequest(DoorRequest):
    model: type[BaseModel]

    async def json(self) -> Any:
        """The body's bytes, validated in a worker thread (seconds of CPU for a large sweep must
        not stop the event loop: every other request of this process waits while it runs), then
        wrapped for ``from_raw_json``."""
        raw = RawJSON(await self.body(), self.model)
        await run_in_threadpool(raw.validate)
        return raw


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while any caller is inside (nestable, thread-safe)."""
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


class RawJSONRoute(DoorRoute):
    """A ``DoorRoute`` whose JSON body, of model ``model`` (set by a subclass per model), reaches
    validation as bytes (FastAPI's documented custom ``Request``/``APIRoute`` pattern), with the
    garbage collector paused for the request. Its body parameter is annotated
    ``Annotated[M, WrapValidator(from_raw_json)]``."""

    model: ClassVar[type[BaseModel]]

    def make_request(self, request: Request) -> Request:
        raw = _RawJSONRequest(request.scope, request.receive)
        raw.model = self.model
        return raw

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def raw_json_handler(request: Request) -> Response:
            with gc_paused():
                return await handler(request)

        return raw_json_handler


def from_raw_json(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """The body parameter's validator: the model a ``RawJSONRoute`` validated in its thread (or its
    ``ValidationError``, raised to FastAPI's 422), else plain validation of ``value``."""
    if not isinstance(value, RawJSON):
        return handler(value)
    if value.error is not None:
        raise value.error
    if value.parsed is None:
        value.validate()
        return from_raw_json(value, handler)
    return value.parsed
