"""``POST /jobs/{id}/results``: a runner posts the whole ``JobResult`` of the job it leases."""

from __future__ import annotations

import logging
import time

from fastapi import APIRouter, BackgroundTasks, Response, status

from service import crud
from service.api.deps import JobId, RunnerToken, SessionDep, SessionFactoryDep
from service.schemas import JobResult, ResultAccepted

router = APIRouter(prefix="/jobs", tags=["results"])
log = logging.getLogger(__name__)


@router.post(
    "/{job_id}/results",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ResultAccepted, "description": "a repeat of an idempotency key"}},
)
def post_result(
    job_id: JobId, result: JobResult, principal: RunnerToken, session: SessionDep, response: Response,
    background: BackgroundTasks, factory: SessionFactoryDep,
) -> ResultAccepted:
    """Store the result whole (one transaction) and finish the job: 201, or 200 with
    ``duplicate: true`` when the idempotency key was already stored (nothing stored again).

    404 unknown job; 409 when the caller does not hold the lease or the key belongs to another
    job; 422 when the body is not a valid ``JobResult`` (nothing stored).

    The comparison (statistics of every cell) and the job's verdict summary are computed after
    the response, in a background task (``crud.store_comparison``); readers recompute on a miss.
    """
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
    else:
        background.add_task(crud.store_comparison, factory=factory, job_id=job_id)
    return ResultAccepted(job_id=job_id, result_id=result_id, duplicate=duplicate)
