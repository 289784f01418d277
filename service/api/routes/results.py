"""``POST /jobs/{id}/results``: a runner posts the whole ``JobResult`` of the job it leases.

The body (tens of MiB for a large sweep) is validated straight from its bytes by pydantic-core
(``JobResult.model_validate_json``) instead of FastAPI's ``json.loads`` followed by validation of
the Python objects: a 1,000-cell, 600,000-sample result parses in ~0.4 s instead of ~1 s on a
2-core machine, and no 6 million Python objects are built. ``_RawJSONRoute`` hands the bytes on;
the request schema, the OpenAPI document and the 422 errors (``loc`` from ``body``) are unchanged.
The validation runs in a worker thread (``_RawJSONRequest.json``), not on the event loop, so the
process keeps answering heartbeats and claims while a large result is parsed.

The cyclic garbage collector is paused while such a request runs (``_gc_paused``): the parsed result
holds millions of Python numbers in lists, and one full collection that traverses them costs
0.2-0.4 s on a 2-core machine (measured with ``gc.callbacks``); the allocations of the ingest itself
usually trigger one. Reference counting still frees everything; collection resumes right after.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from kernelab.service import crud
from kernelab.service.api.deps import JobId, RunnerToken, SessionDep, SettingsDep
from kernelab.service.api.door import DoorRequest, DoorRoute
from kernelab.service.api.errors import validate_json_body
from kernelab.service.runner_identity import check_node
from kernelab.service.schemas import JobResult, ResultAccepted

log = logging.getLogger(__name__)


class _RawJSON:
    """A JSON request body: its bytes, and the outcome of validating them in a worker thread (the
    ``JobResult``, or the ``ValidationError`` to raise)."""

    __slots__ = ("data", "error", "parsed")

    def __init__(self, data: bytes):
        self.data = data
        self.parsed: JobResult | None = None
        self.error: ValidationError | None = None


def _validate_bytes(data: bytes) -> JobResult:
    return validate_json_body(JobResult, data)


def _validate_into(raw: _RawJSON) -> None:
    try:
        raw.parsed = _validate_bytes(raw.data)
    except ValidationError as exc:
        raw.error = exc


class _RawJSONRequest(DoorRequest):
    async def json(self) -> Any:
        """The body's bytes, validated in a worker thread (seconds of CPU for a large sweep must
        not stop the event loop: every other request of this process waits while it runs), then
        wrapped for ``_from_raw_json``."""
        raw = _RawJSON(await self.body())
        await run_in_threadpool(_validate_into, raw)
        return raw


_gc_lock = threading.Lock()
_gc_pausers = 0
_gc_was_enabled = False


@contextmanager
def _gc_paused() -> Iterator[None]:
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


class _RawJSONRoute(DoorRoute):
    """A ``DoorRoute`` whose JSON body reaches validation as bytes (``_RawJSONRequest``), with the
    garbage collector paused for the request."""

    request_class = _RawJSONRequest

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def raw_json_handler(request: Request) -> Response:
            with _gc_paused():
                return await handler(request)

        return raw_json_handler


def _from_raw_json(value: Any, handler: ValidatorFunctionWrapHandler) -> JobResult:
    if not isinstance(value, _RawJSON):
        result: JobResult = handler(value)
        return result
    if value.error is not None:
        raise value.error
    return value.parsed if value.parsed is not None else _validate_bytes(value.data)


JobResultBody = Annotated[JobResult, WrapValidator(_from_raw_json)]
router = APIRouter(prefix="/jobs", tags=["results"], route_class=_RawJSONRoute)


@router.post(
    "/{job_id}/results",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ResultAccepted, "description": "a repeat of an idempotency key"}},
)
def post_result(
    job_id: JobId,
    result: JobResultBody,
    principal: RunnerToken,
    session: SessionDep,
    response: Response,
    settings: SettingsDep,
) -> ResultAccepted:
    """Store the result whole (one transaction) and finish the job: 201, or 200 with
    ``duplicate: true`` when the idempotency key was already stored (nothing stored again).

    404 unknown job; 409 when the caller does not hold the lease or the key belongs to another
    job; 422 when the body is not a valid ``JobResult`` (nothing stored); 403 (``loc``
    body/node/hostname) when ``node.hostname`` is not the node the runner token is bound to
    (``kernelab.service.runner_identity``; nothing stored).

    The comparison (statistics of every cell), the job's verdict summary, the node-health
    judgement (against the bands as of the measurement) and the history points are computed by a
    compare worker process (``kernelab.service.compare_worker``) from the task queued in the
    ingest's transaction, never in this process; until then readers say "comparing".
    """
    check_node(session, principal, result.node.hostname, loc=("body", "node", "hostname"))
    n_samples = sum(len(c.samples) for c in result.cells)
    started = time.perf_counter()
    log.info(
        "job %s: ingest started: %d cells, %d samples", job_id, len(result.cells), n_samples,
        extra={"event": "ingest started", "job_id": job_id, "cells": len(result.cells), "samples": n_samples},
    )  # fmt: skip
    result_id, duplicate = crud.store_result(
        session=session,
        job_id=job_id,
        result=result,
        runner_id=principal.runner_id,  # type: ignore[arg-type]
        compare_max_attempts=settings.compare_max_attempts,
    )
    session.commit()  # the commit is part of the ingest: log only once the result is durable
    log.info(
        "job %s: ingest stored (result %s, duplicate=%s) in %.3f s", job_id, result_id, duplicate,
        time.perf_counter() - started,
        extra={"event": "ingest stored", "job_id": job_id, "result_id": result_id, "duplicate": duplicate,
               "duration_ms": round((time.perf_counter() - started) * 1e3, 3)},
    )  # fmt: skip
    if duplicate:
        response.status_code = status.HTTP_200_OK
    return ResultAccepted(job_id=job_id, result_id=result_id, duplicate=duplicate)
