"""``/runners``: register (admin), long-poll claim, lease heartbeat, failure report (runner)."""

from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker

from service import crud, queue
from service.api.deps import AdminToken, JobId, RunnerToken, SessionDep, SessionFactoryDep, SettingsDep
from service.models import Job
from service.schemas import (
    ClaimRequest,
    Heartbeat,
    JobClaim,
    JobFailure,
    JobPublic,
    JobSpec,
    RunnerRegister,
    RunnerRegistered,
)

router = APIRouter(prefix="/runners", tags=["runners"])


@router.post("/register")
def register(body: RunnerRegister, _: AdminToken, session: SessionDep) -> RunnerRegistered:
    """Create or re-register a runner and return its per-runner token (shown once)."""
    runner, token = crud.register_runner(session=session, name=body.name, node=body.node)
    return RunnerRegistered(runner_id=runner.id, name=runner.name, token=token)


def _claim_public(job: Job) -> JobClaim:
    assert job.lease_expires_at is not None
    return JobClaim(
        job_id=job.id, attempt=job.attempts, spec=JobSpec.model_validate(job.spec),
        lease_expires_at=job.lease_expires_at,
    )  # fmt: skip


def _try_claim(factory: sessionmaker[Session], runner_id: int, lease_s: float) -> JobClaim | None:
    """One claim attempt in its own committed transaction (expired leases are re-queued too)."""
    with factory.begin() as session:
        device_type = crud.runner_device_type(session=session, runner_id=runner_id)
        job = queue.claim(session, runner_id=runner_id, lease_s=lease_s, device_type=device_type)
        return None if job is None else _claim_public(job)


@router.post(
    "/claim",
    response_model=JobClaim,
    responses={204: {"description": "no job became available within wait_s"}},
)
async def claim(
    body: ClaimRequest,
    principal: RunnerToken,
    settings: SettingsDep,
    factory: SessionFactoryDep,
    request: Request,
) -> JobClaim | Response:
    """Claim the oldest queued job this runner's device can run, waiting up to ``wait_s``
    seconds (capped by ``KERNELAB_CLAIM_WAIT_MAX_S``) for one. 200 ``JobClaim`` or 204.

    The lease is ``lease_s`` seconds (``KERNELAB_LEASE_S`` when the body does not set it).
    Each attempt runs in the threadpool; the event loop only sleeps between attempts.
    """
    lease_s = body.lease_s if "lease_s" in body.model_fields_set else settings.lease_s
    deadline = time.monotonic() + min(body.wait_s, settings.claim_wait_max_s)
    runner_id = principal.runner_id
    assert runner_id is not None
    while True:
        claimed = await run_in_threadpool(_try_claim, factory, runner_id, lease_s)
        if claimed is not None:
            return claimed
        remaining = deadline - time.monotonic()
        if remaining <= 0 or await request.is_disconnected():
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        await asyncio.sleep(min(settings.claim_poll_s, remaining))


@router.post("/jobs/{job_id}/heartbeat")
def heartbeat(job_id: JobId, body: Heartbeat, principal: RunnerToken, session: SessionDep) -> JobClaim:
    """Extend the lease by ``lease_s`` seconds from now; 409 when the lease is no longer yours
    (expired, re-queued, cancelled): stop working on the job."""
    job = queue.heartbeat(session, job_id, runner_id=principal.runner_id, lease_s=body.lease_s)  # type: ignore[arg-type]
    return _claim_public(job)


@router.post("/jobs/{job_id}/fail")
def fail(job_id: JobId, body: JobFailure, principal: RunnerToken, session: SessionDep) -> JobPublic:
    """Report that the leased job failed; with ``retry`` it is re-queued while attempts remain."""
    job = queue.fail(session, job_id, runner_id=principal.runner_id, error=body.error, retry=body.retry)  # type: ignore[arg-type]
    return crud.job_public(session=session, job=job)
