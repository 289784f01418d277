"""``/runners``: register (admin), long-poll claim, lease heartbeat, failure report (runner).

The runner endpoints are the hot path of a fleet (hundreds of runners heartbeating and
long-polling): each is an ``async`` handler whose token check and work run in one session, one
transaction, in one worker-thread hop (``deps.RunnerCallDep``); a waiting claim holds no
connection and no thread (``kernelab.service.server.queue_watch``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import APIRouter, FastAPI, HTTPException, Request, Response, status
from pydantic import ValidationError, WrapValidator
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    STORED,
    ClaimRequest,
    GangSeat,
    Heartbeat,
    JobClaim,
    JobFailure,
    JobPublic,
    JobSpec,
    LeasePublic,
    RunnerIdentity,
    RunnerRegister,
    RunnerRegistered,
    WorkloadAccepted,
    WorkloadResult,
    WorkloadSpec,
)
from kernelab.service.server import crud, gangs, offers, queue, workload_store
from kernelab.service.server.api.deps import AdminToken, JobId, RunnerCallDep, SessionDep
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.api.raw_body import RawJSONRoute, from_raw_json
from kernelab.service.server.auth import Principal
from kernelab.service.server.core.config import Settings
from kernelab.service.server.models import Runner
from kernelab.service.server.queue_watch import QueueWatch, WatchKey
from kernelab.service.server.runner_identity import check_node


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """At shutdown, stop this process's ``QueueWatch`` before the app disposes its engine."""
    yield
    watch: QueueWatch | None = getattr(app.state, "queue_watch", None)
    if watch is not None and watch.loop is asyncio.get_running_loop():
        await watch.aclose()


router = APIRouter(prefix="/runners", tags=["runners"], lifespan=_lifespan, route_class=DoorRoute)


@router.post("/register")
def register(body: RunnerRegister, _: AdminToken, session: SessionDep) -> RunnerRegistered:
    """Create or re-register a runner and return its per-runner token (shown once); a ``node``
    binds the runner's tokens to ``node.hostname`` (``kernelab.service.server.runner_identity``)."""
    runner, token = crud.register_runner(session=session, name=body.name, node=body.node)
    return RunnerRegistered(runner_id=runner.id, name=runner.name, token=token)


@router.get("/me")
async def me(call: RunnerCallDep) -> RunnerIdentity:
    """The runner this runner token belongs to: 401 for a refused token, 403 for a token that is
    not a runner token. Changes nothing (a daemon checks a token it was given with it)."""

    def work(session: Session, principal: Principal) -> RunnerIdentity:
        runner_id = _runner_id(principal)
        name = session.scalar(select(Runner.name).where(Runner.id == runner_id))
        return RunnerIdentity(runner_id=runner_id, name=name or "", node_name=principal.node_name)

    return await call.run(work)


def _claim_public(job: queue.LeasedJob) -> JobClaim:
    spec = JobSpec.model_validate(job.spec, context=STORED)  # as stored: never a 500 on an older spec
    return JobClaim(job_id=job.id, attempt=job.attempts, spec=spec, lease_expires_at=job.lease_expires_at)


def _runner_id(principal: Principal) -> int:
    assert principal.runner_id is not None  # deps.authorize checks it for the runner scope
    return principal.runner_id


_MAX_REFUSED_PER_CLAIM = 16  # jobs failed for an outdated spec in one claim attempt, at most


def _try_claim(
    session: Session, runner_id: int, device_type: str | None, lease_s: float, routed: offers.Offers | None
) -> JobClaim | None:
    """One claim attempt in ``session`` (expired leases are re-queued too); the caller commits.

    A job whose stored spec (from an older version) breaks a bound the door applies today
    (``kernelab.service.contract.schemas.at_door``: a seed past 2**62, an integer past int64, ...) is not
    handed
    out: every cell would fail on the runner, or the runner could not read it. It is ``failed``
    at once with the reason, and the next job is tried."""
    for _ in range(_MAX_REFUSED_PER_CLAIM):
        job = queue.claim(
            session, runner_id=runner_id, lease_s=lease_s, device_type=device_type, offers=routed
        )
        if job is None:
            return None
        try:
            JobSpec.model_validate(job.spec)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "spec"
            queue.fail(session, job.id, runner_id=runner_id, retry=False,
                       error=f"the job's stored spec breaks a bound of this version at {where}: "
                             f"{str(first['msg'])[:300]}; resubmit it with a valid spec")  # fmt: skip
            continue
        return _claim_public(job)
    return None


def _claim_workload(
    session: Session, runner_id: int, device_type: str | None, lease_s: float, body: ClaimRequest
) -> JobClaim | None:
    """A seat in a workload job for a runner that runs them (``kernelab.service.server.gangs.claim``)."""
    session.execute(
        update(Runner).where(Runner.id == runner_id, Runner.workloads.is_not(True)).values(workloads=True)
    )
    taken = gangs.claim(session, runner_id=runner_id, lease_s=lease_s, device_type=device_type,
                        endpoint=body.rdzv_endpoint)  # fmt: skip
    if taken is None:
        return None
    job, seat = taken
    spec = WorkloadSpec.model_validate(job.spec, context=STORED)
    until = job.lease_expires_at if seat.ready and job.lease_expires_at is not None else seat.deadline
    assert until is not None
    return JobClaim(job_id=job.id, attempt=seat.attempt, spec=spec, lease_expires_at=until, gang=seat)


def queue_watch(request: Request) -> QueueWatch:
    """This process's ``QueueWatch`` (one per app and event loop, made on first use)."""
    watch: QueueWatch | None = getattr(request.app.state, "queue_watch", None)
    if watch is None or watch.loop is not asyncio.get_running_loop():
        settings = request.app.state.settings
        watch = QueueWatch(request.app.state.session_factory, poll_s=settings.claim_poll_s)
        request.app.state.queue_watch = watch
    return watch


@router.post(
    "/claim",
    response_model=JobClaim,
    responses={204: {"description": "no job became available within wait_s"}},
)
async def claim(body: ClaimRequest, call: RunnerCallDep, request: Request) -> JobClaim | Response:
    """Claim the oldest queued job this runner's device can run, waiting up to ``wait_s``
    seconds (capped by ``KERNELAB_CLAIM_WAIT_MAX_S``) for one. 200 ``JobClaim`` or 204.

    With ``benchmarks`` (or its digest) only jobs of advertised benchmarks whose spec fits the
    advertised schema, and jobs whose code comes from revisions, are routed here
    (``kernelab.service.server.offers``); a digest the server does not hold is a 409
    ``advert_required`` naming ``benchmarks``; an invalid advertisement a 422 naming the field.

    The lease is ``lease_s`` seconds (``KERNELAB_LEASE_S`` when the body does not set it). The
    first attempt runs at once; then the claim waits in this process's ``QueueWatch``, which is
    woken when a job becomes queued (PostgreSQL ``NOTIFY``, a SQLite trigger) and reads the queue
    at least every ``KERNELAB_CLAIM_POLL_S`` seconds for all waiting claims together, waking this
    one when a job for its device is there; a claim lost to another runner waits again.
    Every attempt checks the token again, in the attempt's transaction: a token revoked while
    the claim waited gets 401 and no job.
    """
    settings: Settings = request.app.state.settings  # not SettingsDep: a sync dependency costs a thread hop
    lease_s = body.lease_s if "lease_s" in body.model_fields_set else settings.lease_s
    deadline = time.monotonic() + min(body.wait_s, settings.claim_wait_max_s)

    def attempt(session: Session, principal: Principal) -> tuple[WatchKey, JobClaim | None]:
        runner_id = _runner_id(principal)
        try:
            routed = offers.record(
                session, runner_id=runner_id, stored_sha256=principal.benchmarks_sha256, body=body
            )
        except offers.AdvertRequiredError as exc:
            detail = [{"loc": ["body", "benchmarks"], "msg": str(exc), "type": "advert_required"}]
            raise HTTPException(status.HTTP_409_CONFLICT, detail) from None
        claimed = _try_claim(session, runner_id, principal.device_type, lease_s, routed)
        if claimed is None and body.workloads:
            claimed = _claim_workload(session, runner_id, principal.device_type, lease_s, body)
        pairs = None if routed is None else tuple(routed.pairs())
        if body.workloads:
            pairs = (*(pairs or ()), queue.WORKLOADS_OFFER)
        return (principal.device_type, pairs), claimed

    key, claimed = await call.run(attempt)
    watch = queue_watch(request)
    while claimed is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not await watch.wait(key, remaining):
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        if await request.is_disconnected():  # nobody would run the job: leave it queued
            return Response(status_code=status.HTTP_204_NO_CONTENT)
        key, claimed = await call.run(attempt)  # the token again: revoked meanwhile -> 401
    return claimed


@router.post("/jobs/{job_id}/heartbeat")
async def heartbeat(job_id: JobId, body: Heartbeat, call: RunnerCallDep) -> LeasePublic:
    """Extend the lease by ``lease_s`` seconds from now and store ``progress`` when sent (the job
    page shows it); 409 when the lease is no longer yours (expired, re-queued, cancelled): stop
    working on the job. The answer carries the lease, not
    the job's spec (the runner has it from the claim)."""

    def work(session: Session, principal: Principal) -> LeasePublic | queue.LeaseLostError:
        progress = None if body.progress is None else body.progress.model_dump(mode="json")
        try:
            lease = queue.heartbeat(
                session, job_id, runner_id=_runner_id(principal), lease_s=body.lease_s, durable=False,
                progress=progress,
            )  # fmt: skip
        except queue.LeaseLostError:  # a workload job: no single holder, each member keeps its seat
            if not workload_store.is_workload_job(session, job_id):
                raise
            try:
                lease = gangs.heartbeat(
                    session, job_id, runner_id=_runner_id(principal), lease_s=body.lease_s, progress=progress
                )
            except queue.LeaseLostError as exc:  # answered after the commit: the re-queue it made stays
                return exc
        return LeasePublic(job_id=lease.id, attempt=lease.attempts, lease_expires_at=lease.lease_expires_at)

    answer = await call.run(work)
    if isinstance(answer, queue.LeaseLostError):
        raise answer
    return answer


@router.post("/jobs/{job_id}/fail")
async def fail(job_id: JobId, body: JobFailure, call: RunnerCallDep) -> JobPublic:
    """Report that the leased job failed; with ``retry`` it is re-queued while attempts remain."""

    def work(session: Session, principal: Principal) -> JobPublic:
        runner_id = _runner_id(principal)
        if workload_store.is_workload_job(session, job_id):  # the whole gang's attempt fails
            job = gangs.fail(session, job_id, runner_id=runner_id, error=body.error, retry=body.retry)
        else:
            job = queue.fail(session, job_id, runner_id=runner_id, error=body.error, retry=body.retry)
        return crud.job_public(session=session, job=job)

    return await call.run(work)


@router.post("/jobs/{job_id}/gang")
async def keep_seat(job_id: JobId, body: Heartbeat, call: RunnerCallDep) -> GangSeat:
    """Keep this runner's seat in workload job ``job_id`` for ``lease_s`` more seconds and say where
    the gang stands: ``ready`` (every seat taken, the job running; ``endpoint`` is node rank 0's
    rendezvous) or still gathering until ``deadline``. 409 when the seat is gone (the gathering
    timed out or lost a member, the attempt was re-queued or cancelled): claim again."""

    def work(session: Session, principal: Principal) -> GangSeat | queue.LeaseLostError:
        try:
            return gangs.keep(session, job_id, runner_id=_runner_id(principal), lease_s=body.lease_s)
        except queue.LeaseLostError as exc:  # answered after the commit: the dropped gathering stays dropped
            return exc

    answer = await call.run(work)
    if isinstance(answer, queue.LeaseLostError):
        raise answer
    return answer


class _WorkloadResultRoute(RawJSONRoute):
    model = WorkloadResult


WorkloadResultBody = Annotated[WorkloadResult, WrapValidator(from_raw_json)]


async def post_workload_result(job_id: JobId, result: WorkloadResultBody, call: RunnerCallDep,
                               request: Request) -> WorkloadAccepted:  # fmt: skip
    """Store this node's ``WorkloadResult`` of the running workload job (``kernelab.service.
    workload_store.store``): 201, also for a repeated ``idempotency_key`` (``duplicate``: nothing
    stored again); ``complete`` when it was the last node's and the job has finished (its
    comparison then queued for a compare worker). 409 when this runner holds no seat of the
    running attempt (lease lost, re-queued, cancelled); 422 naming the field for a body that is
    no ``WorkloadResult`` or does not fit the job (spec, node rank). A database fault is a 503 the
    runner retries (its result stays spooled). The body is validated from its bytes in a worker
    thread (``kernelab.service.server.api.raw_body``)."""
    max_attempts = request.app.state.settings.compare_max_attempts

    def work(session: Session, principal: Principal) -> WorkloadAccepted:
        check_node(session, principal, result.node.hostname, loc=("body", "node", "hostname"))
        try:
            return workload_store.store(session, job_id, runner_id=_runner_id(principal), result=result,
                                        max_attempts=max_attempts)  # fmt: skip
        except workload_store.WorkloadRefused as exc:
            detail = [{"loc": ["body", *exc.loc], "msg": str(exc), "type": "value_error"}]
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail) from None

    return await call.run(work)


router.add_api_route(
    "/jobs/{job_id}/workload-result", post_workload_result, methods=["POST"],
    status_code=status.HTTP_201_CREATED, route_class_override=_WorkloadResultRoute,
)  # fmt: skip
