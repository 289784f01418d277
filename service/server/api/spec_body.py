"""The body of ``POST /api/v1/jobs``: at most ``KERNELAB_MAX_SPEC_BYTES`` (1 MiB), decoded and
validated in a worker thread.

The attack this answers: a 44 MB JSON body of 2,000,000 keys (``{"k0":[0],...}``) posted with any
submit token, decoded by FastAPI's ``json.loads`` and validated on the event loop, holds a
concurrent ``/healthz`` for 10.4 s, and every other request of the process as long. So:

* **Size.** A spec is a few KB (its sweep is at most ``MAX_CELLS`` cells), so the route refuses a
  body over ``max_spec_bytes`` with 413, from its ``Content-Length`` or as it streams, before
  decoding anything; the server-wide ``KERNELAB_MAX_REQUEST_BYTES`` (64 MiB) is for results.
  pydantic-core holds the GIL while it validates, so even in a worker thread the event loop waits
  for it: the cap bounds that wait. A 1 MiB key bomb (75,000 keys) costs ~0.5 s of validation
  on a 2-core machine; 3.7 MB cost 1.7 s, the attack's 44 MB about 10 s.
* **Off the loop.** The bytes are validated by ``JobSpec.model_validate_json`` (pydantic-core, no
  intermediate Python objects) in the thread pool (``run_in_threadpool``), as
  ``kernelab.service.server.api.routes.results`` does for results; the 422's ``loc`` still starts at ``body``.
  A body with more than ``MAX_ERRORS`` errors has its 422 list built there too (``_compact``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import InitErrorDetails, PydanticCustomError

from kernelab.service.contract.schemas import JobSpec, WorkloadSpec, is_workload
from kernelab.service.server.api.door import DoorRequest, DoorRoute
from kernelab.service.server.api.errors import MAX_ERRORS, bounded_errors, decode_json, validate_json_body

DEFAULT_MAX_SPEC_BYTES = 1024 * 1024  # KERNELAB_MAX_SPEC_BYTES's default (see the module doc)


class _RawSpec:
    """A spec body's bytes and the outcome of validating them in a worker thread."""

    __slots__ = ("data", "error", "parsed")

    def __init__(self, data: bytes):
        self.data = data
        self.parsed: JobSpec | WorkloadSpec | None = None
        self.error: ValidationError | RequestValidationError | None = None


def _compact(exc: ValidationError) -> ValidationError | RequestValidationError:
    """``exc``, or when it holds more than ``MAX_ERRORS`` errors (a key bomb: one per key) the 422's
    final, bounded list of them, built here in the worker thread: listing 270,000 errors takes
    ~0.5 s, which must not run on the event loop (raised from the body's validator, a
    ``RequestValidationError`` reaches the 422 handler as it is)."""
    count = exc.error_count()
    if count <= MAX_ERRORS:
        return exc
    shown = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)[: MAX_ERRORS - 1]]
    more = {"loc": ["body"], "msg": f"{count - len(shown)} more errors not shown", "type": "too_many_errors"}
    return RequestValidationError([*bounded_errors(shown), more])


_WORKLOAD_KIND = re.compile(rb'"kind"\s*:\s*"workload"')


def _asks_workload(data: bytes) -> bool:
    try:
        return is_workload(decode_json(data))
    except ValueError:
        return False


def _validate_bytes(data: bytes) -> JobSpec | WorkloadSpec:
    """``JobSpec`` of ``data``, or ``WorkloadSpec`` when it asks for a workload (``"kind":
    "workload"``): its errors are a workload spec's, never a benchmark spec's missing fields. Any
    other ``kind`` is one error on ``kind``."""
    if _WORKLOAD_KIND.search(data) and _asks_workload(data):
        spec: JobSpec | WorkloadSpec = validate_json_body(WorkloadSpec, data)
        return spec
    try:
        return validate_json_body(JobSpec, data)
    except ValidationError as exc:
        kinds = [
            e
            for e in exc.errors(include_url=False)
            if e["type"] == "extra_forbidden" and e["loc"] == ("kind",)
        ]
        if not kinds:
            raise
        error = PydanticCustomError(
            "kind_unknown", "kind is 'workload' for a workload spec; a benchmark spec has no 'kind'"
        )
        line = InitErrorDetails(type=error, loc=("kind",), input=kinds[0].get("input"))
        raise ValidationError.from_exception_data("JobSpec", [line]) from None


def _validate_into(raw: _RawSpec) -> None:
    try:
        raw.parsed = _validate_bytes(raw.data)
    except ValidationError as exc:
        raw.error = _compact(exc)


def _too_large(limit: int) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        f"a job spec is at most {limit} bytes of JSON (KERNELAB_MAX_SPEC_BYTES)",
    )


class _SpecRequest(DoorRequest):
    async def body(self) -> bytes:
        """The body, read up to ``max_spec_bytes``. Raises ``HTTPException`` 413 past it (a declared
        ``Content-Length`` is refused before anything is read)."""
        if not hasattr(self, "_body"):
            limit: int = self.app.state.settings.max_spec_bytes
            declared = self.headers.get("content-length", "")
            if declared.isdigit() and int(declared) > limit:
                raise _too_large(limit)
            chunks: list[bytes] = []
            seen = 0
            async for chunk in self.stream():
                seen += len(chunk)
                if seen > limit:
                    raise _too_large(limit)
                chunks.append(chunk)
            self._body = b"".join(chunks)
        return self._body

    async def json(self) -> Any:
        """The body validated as a ``JobSpec`` in a worker thread, wrapped for ``_from_raw``."""
        raw = _RawSpec(await self.body())
        await run_in_threadpool(_validate_into, raw)
        return raw


class SpecBodyRoute(DoorRoute):
    """A ``DoorRoute`` whose JSON body is bounded and validated off the event loop."""

    def make_request(self, request: Request) -> Request:
        return _SpecRequest(request.scope, request.receive)


def _from_raw(value: Any, handler: ValidatorFunctionWrapHandler) -> JobSpec | WorkloadSpec:
    if not isinstance(value, _RawSpec):
        spec: JobSpec | WorkloadSpec = handler(value)
        return spec
    if value.error is not None:
        raise value.error  # a RequestValidationError passes through pydantic to the 422 handler
    assert value.parsed is not None
    return value.parsed


JobSpecBody = Annotated[JobSpec | WorkloadSpec, WrapValidator(_from_raw)]
"""A ``JobSpec`` (or ``WorkloadSpec``) body parameter for a ``SpecBodyRoute`` (plain validation elsewhere)."""
