"""``POST /jobs/{id}/results``: a runner posts the whole ``JobResult`` of the job it leases.

The body (tens of MiB for a large sweep) is validated straight from its bytes in a worker thread,
with the garbage collector paused (``kernelab.service.server.api.raw_body``: ~0.4 s instead of ~1 s for a
1,000-cell, 600,000-sample result on a 2-core machine); the request schema, the OpenAPI document
and the 422 errors (``loc`` from ``body``) are FastAPI's.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, Response, status
from pydantic import WrapValidator

from kernelab.service.contract.schemas import JobResult, ResultAccepted
from kernelab.service.server import crud
from kernelab.service.server.api.deps import JobId, RunnerToken, SessionDep, SettingsDep
from kernelab.service.server.api.raw_body import RawJSONRoute, from_raw_json
from kernelab.service.server.runner_identity import check_node

log = logging.getLogger(__name__)


class _ResultRoute(RawJSONRoute):
    model = JobResult


JobResultBody = Annotated[JobResult, WrapValidator(from_raw_json)]
router = APIRouter(prefix="/jobs", tags=["results"], route_class=_ResultRoute)


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
    (``kernelab.service.server.runner_identity``; nothing stored).

    The comparison (statistics of every cell), the job's verdict summary, the node-health
    judgement (against the bands as of the measurement) and the history points are computed by a
    compare worker process (``kernelab.service.server.compare_worker``) from the task queued in the
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
