"""``POST /jobs/{id}/results``: a runner posts the whole ``JobResult`` of the job it leases."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from service import crud
from service.api.deps import RunnerToken, SessionDep
from service.schemas import JobResult, ResultAccepted

router = APIRouter(prefix="/jobs", tags=["results"])


@router.post(
    "/{job_id}/results",
    status_code=status.HTTP_201_CREATED,
    responses={200: {"model": ResultAccepted, "description": "a repeat of an idempotency key"}},
)
def post_result(
    job_id: int, result: JobResult, principal: RunnerToken, session: SessionDep, response: Response
) -> ResultAccepted:
    """Store the result whole (one transaction) and finish the job: 201, or 200 with
    ``duplicate: true`` when the idempotency key was already stored (nothing stored again).

    404 unknown job; 409 when the caller does not hold the lease or the key belongs to another
    job; 422 when the body is not a valid ``JobResult`` (nothing stored).
    """
    result_id, duplicate = crud.store_result(
        session=session,
        job_id=job_id,
        result=result,
        runner_id=principal.runner_id,  # type: ignore[arg-type]
    )
    if duplicate:
        response.status_code = status.HTTP_200_OK
    return ResultAccepted(job_id=job_id, result_id=result_id, duplicate=duplicate)
