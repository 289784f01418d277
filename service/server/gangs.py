"""Workload jobs in the queue: claimed by ``launch.nnodes`` runners together (a *gang*), under one lease.

A workload job (``jobs.kind = 'workload'``) is never handed out by the benchmark claim
(``kernelab.service.server.queue.claim``); a runner whose claim says ``workloads: true`` takes a *seat*
in it instead (``claim``):

* **Gathering.** The job stays ``queued`` while its seats fill: the first runner is node rank 0
  and its ``rdzv_endpoint`` (``host:port`` it offered) is the gang's c10d rendezvous endpoint;
  each seat has a lease of its own, kept by the runner's polls (``keep``). The job's
  ``waiting_for`` says how many seats are taken and until when (``waiting``). When the first seat
  is older than ``launch.rdzv_timeout_s``, or a seat's lease ran out (its runner died while it
  waited), the gathering is dropped: every seat is freed (the runners' next poll answers 409 and
  they claim again), the job stays queued.
* **Running.** When the last seat is taken the job becomes ``running`` under one lease for all:
  ``attempts`` counts up, one ``job_attempts`` row (its runner: rank 0's), ``jobs.lease_runner_id``
  NULL (no single runner holds it) and ``jobs.lease_expires_at`` the earliest lease of the seats
  whose node has not posted its result. Every member heartbeats its own seat (``heartbeat``), so
  when one runner dies its seat's lease, and so the job's, runs out: the queue's
  ``requeue_expired`` re-queues the job (or fails it, out of attempts) for the whole gang, and the
  other members' next heartbeat answers 409 (lease lost): they stop their runs.
* **Results.** Each node posts its own ``WorkloadResult`` (``kernelab.service.server.workload_store``);
  the job finishes when every seat of the attempt has posted.

A job of one node is a gang of one: ready at its first seat. Functions take ``session`` and never
commit; times are the database's clock (``db_now``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import GangPublic, GangSeat, WorkloadSpec
from kernelab.service.server import queue
from kernelab.service.server.core.clock import db_now
from kernelab.service.server.models import GangMember, Job, JobAttempt, Runner
from kernelab.service.server.queue import InvalidTransitionError, Lease, LeaseLostError

_CANDIDATES = 16  # queued workload jobs looked at per claim
WORKLOAD_BENCHMARK = "workload"  # jobs.benchmark of a workload job (what `kernelab jobs --benchmark` filters)


def submit(session: Session, spec: WorkloadSpec, *, max_attempts: int, submitted_by: int | None) -> Job:
    """Queue a validated workload spec (``kind = 'workload'``, ``nnodes = launch.nnodes``). Flushes."""
    job = Job(
        name=spec.name, benchmark=WORKLOAD_BENCHMARK, spec=spec.model_dump(mode="json"), device=spec.device,
        status="queued", attempts=0, max_attempts=max_attempts, submitted_by=submitted_by,
        kind="workload", nnodes=spec.launch.nnodes,
    )  # fmt: skip
    session.add(job)
    session.flush()
    return job


def _rdzv_timeout_s(spec: dict[str, Any]) -> float:
    return float((spec.get("launch") or {}).get("rdzv_timeout_s", 120.0))


def _now(session: Session) -> datetime:
    now = session.scalar(select(db_now()))
    assert now is not None
    return now


def _drop_gathering(session: Session, job_id: int | None = None) -> int:
    """Free the seats of every gathering (queued) workload job whose first seat is older than its
    ``rdzv_timeout_s`` or one of whose seats' lease has run out; ``job_id``: that job only.
    Returns how many gatherings were dropped."""
    query = (
        select(Job.id, Job.attempts, Job.spec, func.min(GangMember.joined_at),
               func.min(GangMember.lease_expires_at))
        .join(GangMember, GangMember.job_id == Job.id)
        .where(Job.kind == "workload", Job.status == "queued", GangMember.attempt == Job.attempts + 1)
        .group_by(Job.id, Job.attempts, Job.spec)
    )  # fmt: skip
    if job_id is not None:
        query = query.where(Job.id == job_id)
    rows = session.execute(query).all()
    if not rows:
        return 0
    now = _now(session)
    dropped = 0
    for jid, attempts, spec, first, earliest in rows:
        if earliest < now or first + timedelta(seconds=_rdzv_timeout_s(spec)) < now:
            session.execute(
                delete(GangMember).where(GangMember.job_id == jid, GangMember.attempt == attempts + 1)
            )
            dropped += 1
    return dropped


def _seats(session: Session, job_id: int, attempt: int) -> list[GangMember]:
    return list(
        session.scalars(
            select(GangMember)
            .where(GangMember.job_id == job_id, GangMember.attempt == attempt)
            .order_by(GangMember.node_rank)
        )
    )


def _seat_of(job: Job, attempt: int, seats: list[GangMember], runner_id: int) -> GangSeat:
    mine = next(s for s in seats if s.runner_id == runner_id)
    deadline = None
    if seats:
        deadline = min(s.joined_at for s in seats) + timedelta(seconds=_rdzv_timeout_s(job.spec))
    ready = job.status == "running" and job.attempts == attempt
    return GangSeat(
        job_id=job.id, attempt=attempt, node_rank=mine.node_rank, nnodes=job.nnodes, joined=len(seats),
        ready=ready, endpoint=seats[0].endpoint if seats and seats[0].node_rank == 0 else None,
        deadline=None if ready else deadline,
    )  # fmt: skip


def _start(session: Session, job: Job, attempt: int, seats: list[GangMember]) -> bool:
    """Every seat is taken: the job runs (attempt ``attempt``, its lease the earliest seat's)."""
    won = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == "queued", Job.attempts == attempt - 1)
        .values(status="running", attempts=attempt, lease_runner_id=None,
                lease_expires_at=min(s.lease_expires_at for s in seats),
                started_at=func.coalesce(Job.started_at, db_now()), progress=None, progress_at=None)
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    if queue._rowcount(won) != 1:
        return False
    session.add(JobAttempt(job_id=job.id, attempt=attempt, runner_id=seats[0].runner_id, outcome="running"))
    session.flush()
    session.refresh(job)
    return True


def claim(
    session: Session, *, runner_id: int, lease_s: float, device_type: str | None, endpoint: str | None
) -> tuple[Job, GangSeat] | None:
    """Take a seat in the oldest queued workload job this runner's device can run (a job of several
    nodes only with an ``endpoint``, should the seat be node rank 0's): the job and the seat, or
    None. A runner that holds a seat of a job's gathering attempt gets that seat back. The seat
    that fills the gang starts the job (``GangSeat.ready``). Expired leases and stale gatherings
    are dealt with first."""
    queue.requeue_expired(session)
    _drop_gathering(session)
    query = (
        select(Job).where(Job.kind == "workload", Job.status == "queued").order_by(Job.id).limit(_CANDIDATES)
    )
    if device_type is not None:
        query = query.where(Job.device.in_(("auto", device_type)))
    until = db_now(float(lease_s))
    for job in session.scalars(query).all():
        attempt = job.attempts + 1
        seats = _seats(session, job.id, attempt)
        if any(s.runner_id == runner_id for s in seats):
            return job, _seat_of(job, attempt, seats, runner_id)
        if len(seats) >= job.nnodes or (not seats and job.nnodes > 1 and endpoint is None):
            continue
        try:
            with session.begin_nested():
                seat = GangMember(job_id=job.id, attempt=attempt, node_rank=len(seats), runner_id=runner_id,
                                  endpoint=endpoint, joined_at=db_now(), lease_expires_at=until)  # fmt: skip
                session.add(seat)
        except IntegrityError:  # another runner took that rank first
            continue
        seats = _seats(session, job.id, attempt)
        if len(seats) == job.nnodes:
            _start(session, job, attempt, seats)
        queue._seen(session, runner_id)
        return job, _seat_of(job, attempt, seats, runner_id)
    return None


def _attempt_of(job: Job) -> int:
    if job.status == "running":
        return job.attempts
    if job.status == "queued":
        return job.attempts + 1
    raise LeaseLostError(f"job {job.id} is {job.status}", job.id)


def _job_lease(session: Session, job: Job) -> None:
    """The running job's lease: the earliest lease of the seats whose node has not posted."""
    earliest = (
        select(func.min(GangMember.lease_expires_at))
        .where(
            GangMember.job_id == job.id, GangMember.attempt == job.attempts, GangMember.posted_at.is_(None)
        )
        .scalar_subquery()
    )
    session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == "running", Job.kind == "workload")
        .values(lease_expires_at=func.coalesce(earliest, Job.lease_expires_at))
        .execution_options(synchronize_session=False)
    )


def keep(session: Session, job_id: int, *, runner_id: int, lease_s: float) -> GangSeat:
    """Keep ``runner_id``'s seat in job ``job_id``: its lease extended to ``lease_s`` seconds from
    now (and the job's, when running); returns the seat (``ready`` once the job runs). Raises
    ``JobNotFoundError``, or ``LeaseLostError`` when the seat is gone (the gathering was dropped,
    the attempt was re-queued, cancelled or finished, or this node already posted). A stale
    gathering dropped, or an expired attempt re-queued, on the way is a write the caller commits
    even when this raises (the routes answer the 409 after the commit)."""
    _drop_gathering(session, job_id)
    job = queue.get_job(session, job_id)
    if job.status == "running" and job.kind == "workload":
        # a member died: its seat's lease, and so the job's, ran out; re-queue it now (no claim may
        # come: the survivors are busy running it) so that their heartbeats learn of it
        queue.requeue_expired(session)
    session.refresh(job)
    attempt = _attempt_of(job)
    won = session.execute(
        update(GangMember)
        .where(GangMember.job_id == job_id, GangMember.attempt == attempt, GangMember.runner_id == runner_id,
               GangMember.posted_at.is_(None))
        .values(lease_expires_at=db_now(float(lease_s)))
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    if queue._rowcount(won) != 1:
        raise LeaseLostError(
            f"runner {runner_id} holds no seat of job {job_id} (status {job.status})", job_id
        )
    if job.status == "running":
        _job_lease(session, job)
    queue._seen(session, runner_id)
    return _seat_of(job, attempt, _seats(session, job_id, attempt), runner_id)


def heartbeat(
    session: Session, job_id: int, *, runner_id: int, lease_s: float, progress: dict[str, Any] | None = None
) -> Lease:
    """``keep`` for a running workload job, as ``queue.heartbeat`` answers: the job's lease;
    ``progress`` (``schemas.JobProgress`` JSON: runs done of all) is stored with the database's
    time, as a benchmark job's. Raises ``JobNotFoundError`` or ``LeaseLostError`` (also while the
    job only gathers)."""
    seat = keep(session, job_id, runner_id=runner_id, lease_s=lease_s)
    if progress is not None and seat.ready:
        session.execute(
            update(Job).where(Job.id == job_id, Job.status == "running")
            .values(progress=progress, progress_at=db_now()).execution_options(synchronize_session=False)
        )  # fmt: skip
    job = queue.get_job(session, job_id)
    session.refresh(job)
    if not seat.ready or job.lease_expires_at is None:
        raise LeaseLostError(f"job {job_id} is not running (status {job.status})", job_id)
    return Lease(job.id, job.attempts, job.lease_expires_at)


def fail(session: Session, job_id: int, *, runner_id: int, error: str, retry: bool) -> Job:
    """A member reports that its node cannot go on: the whole attempt fails (re-queued with
    ``retry`` while attempts remain, else ``failed``); during the gathering its seat is freed
    only. Raises ``JobNotFoundError`` or ``LeaseLostError`` (no seat)."""
    job = queue.get_job(session, job_id)
    session.refresh(job)
    attempt = _attempt_of(job)
    seat = session.scalar(
        select(GangMember.id).where(GangMember.job_id == job_id, GangMember.attempt == attempt,
                                    GangMember.runner_id == runner_id)
    )  # fmt: skip
    if seat is None:
        raise LeaseLostError(
            f"runner {runner_id} holds no seat of job {job_id} (status {job.status})", job_id
        )
    if job.status == "queued":
        session.execute(delete(GangMember).where(GangMember.job_id == job_id, GangMember.attempt == attempt))
        return job
    requeue = retry and job.attempts < job.max_attempts
    values: dict[str, object] = {"status": "queued" if requeue else "failed", "error": error,
                                 "lease_runner_id": None, "lease_expires_at": None}  # fmt: skip
    if not requeue:
        values["finished_at"] = db_now()
    won = session.execute(
        update(Job).where(Job.id == job_id, Job.status == "running", Job.attempts == attempt).values(**values)
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    if queue._rowcount(won) != 1:
        raise LeaseLostError(f"runner {runner_id} lost the lease of job {job_id}", job_id)
    queue._end_attempt(session, job_id, attempt, "failed", error)
    session.refresh(job)
    return job


def finish(session: Session, job: Job, *, error: str | None) -> None:
    """Every node of the running attempt has posted: the job is ``succeeded`` (``failed`` with
    ``error``). Raises ``InvalidTransitionError`` when it no longer runs."""
    outcome = "failed" if error else "succeeded"
    won = session.execute(
        update(Job).where(Job.id == job.id, Job.status == "running", Job.attempts == job.attempts)
        .values(status=outcome, error=error, finished_at=db_now(), lease_runner_id=None,
                lease_expires_at=None)
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    if queue._rowcount(won) != 1:
        raise InvalidTransitionError(f"job {job.id} no longer runs", job.id)
    queue._end_attempt(session, job.id, job.attempts, outcome, error)
    session.refresh(job)


def public(session: Session, jobs: list[Job]) -> dict[int, GangPublic]:
    """The gang of each workload job of ``jobs`` that has seats in its current attempt (running) or
    its gathering one (queued): job id -> ``GangPublic`` (two queries)."""
    wanted = {
        j.id: _attempt_of(j) for j in jobs if j.kind == "workload" and j.status in ("queued", "running")
    }
    if not wanted:
        return {}
    rows = session.execute(
        select(GangMember.job_id, GangMember.attempt, GangMember.node_rank, GangMember.endpoint,
               GangMember.joined_at, Runner.name)
        .join(Runner, Runner.id == GangMember.runner_id)
        .where(GangMember.job_id.in_(sorted(wanted)))
        .order_by(GangMember.job_id, GangMember.node_rank)
    ).all()  # fmt: skip
    by_id = {j.id: j for j in jobs}
    out: dict[int, GangPublic] = {}
    for job_id, attempt, rank, endpoint, joined_at, name in rows:
        if wanted.get(job_id) != attempt:
            continue
        job = by_id[job_id]
        gang = out.get(job_id)
        if gang is None:
            gathering = job.status == "queued"
            deadline = joined_at + timedelta(seconds=_rdzv_timeout_s(job.spec)) if gathering else None
            gang = GangPublic(attempt=attempt, nnodes=job.nnodes, gathering=gathering, deadline=deadline,
                              endpoint=endpoint if rank == 0 else None)  # fmt: skip
            out[job_id] = gang
        gang.members[rank] = name
    return out


def waiting(
    session: Session, jobs: list[Job], gangs: dict[int, GangPublic], *, alive_s: float
) -> dict[int, str]:
    """Why each queued workload job of ``jobs`` waits: its gathering (seats taken of ``nnodes``,
    until when), or too few live runners (seen within ``alive_s``) that run workloads."""
    queued = [j for j in jobs if j.kind == "workload" and j.status == "queued"]
    if not queued:
        return {}
    alive = Runner.last_seen_at >= db_now(-alive_s)
    live = session.scalar(select(func.count(Runner.id)).where(Runner.workloads.is_(True), alive)) or 0
    out: dict[int, str] = {}
    for job in queued:
        gang = gangs.get(job.id)
        if gang is not None and gang.members:
            until = gang.deadline.strftime("%Y-%m-%d %H:%M:%SZ") if gang.deadline else "?"
            seats = ", ".join(f"rank {r}: {n}" for r, n in sorted(gang.members.items()))
            out[job.id] = (
                f"gathering: {len(gang.members)} of {job.nnodes} runners joined attempt {gang.attempt} "
                f"({seats}); waits until {until} (launch.rdzv_timeout_s = {_rdzv_timeout_s(job.spec):g} s) "
                f"for {job.nnodes - len(gang.members)} more"
            )
        elif live < job.nnodes:
            out[job.id] = (
                f"waiting for {job.nnodes} runner(s) that run workloads (kernelab runner --workloads): "
                f"{live} live"
            )
    return out
