"""Jobs and their attempts as API views (``JobPublic``, ``JobsPage``, ``AttemptsPage``); a spec
checked as a submission is (``accept_spec``), and a job's stored spec queued again (``rerun_job``:
``POST /api/v1/jobs/{id}/rerun`` and the job page's Re-run button)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelab.service.contract.repo_address import source_errors
from kernelab.service.contract.schemas import (
    STORED,
    AttemptPublic,
    AttemptsPage,
    GangPublic,
    JobProgress,
    JobPublic,
    JobsPage,
    JobSpec,
    WorkloadSpec,
    read_stored,
)
from kernelab.service.server import compare_queue, gangs, offers, queue
from kernelab.service.server.core.config import Settings
from kernelab.service.server.models import Job, JobAttempt, Result, Runner


class SpecInvalidError(Exception):
    """A job spec that parsed but that its benchmark rejects (``kernelab.service.server.offers.check_spec``
    errors, or a side's ``source.repo`` in a refused form): ``errors`` are pydantic-style dicts
    (``loc``, ``msg``, ``type``), answered as a 422 naming the field
    (``kernelab.service.server.api.errors``)."""

    def __init__(self, errors: Sequence[dict[str, Any]]):
        super().__init__("; ".join(str(e.get("msg", "")) for e in errors))
        self.errors = list(errors)


def _runner_names(session: Session, job_ids: Sequence[int]) -> dict[int, tuple[str, str | None]]:
    """``(runner name, node name)`` of each job's latest attempt: the node is the hostname its
    result is filed under, else the node the runner is bound to (None before its first probe)."""
    rows = session.execute(
        select(JobAttempt.job_id, Runner.name, func.coalesce(Result.node_name, Runner.node_name))
        .join(Runner, Runner.id == JobAttempt.runner_id)
        .outerjoin(Result, Result.job_id == JobAttempt.job_id)
        .where(JobAttempt.job_id.in_(job_ids))
        .order_by(JobAttempt.job_id, JobAttempt.attempt)
    )
    return {job_id: (name, node) for job_id, name, node in rows}


_NO_RESULT = compare_queue.TaskState("none")


def _progress(job: Job) -> JobProgress | None:
    """A running job's stored progress (a finished job's is history, not shown); one stored by an
    older version that no longer parses is left out, never a 500."""
    if job.status != "running" or job.progress is None:
        return None
    try:
        return read_stored(JobProgress, job.progress)
    except ValidationError:
        return None


def _public(
    job: Job,
    runner: tuple[str, str | None] | None,
    state: compare_queue.TaskState = _NO_RESULT,
    waiting_for: str | None = None,
    gang: GangPublic | None = None,
) -> JobPublic:
    node, node_name = runner if runner is not None else (None, None)
    workload = job.kind == "workload"
    return JobPublic(
        kind="workload" if workload else "benchmark",
        gang=gang,
        node_name=node_name,
        waiting_for=waiting_for,
        id=job.id,
        name=job.name,
        benchmark=job.benchmark,
        status=job.status,  # type: ignore[arg-type]
        spec=(WorkloadSpec if workload else JobSpec).model_validate(job.spec, context=STORED),
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        node=node,
        error=job.error,
        summary=job.summary or {},
        comparison_status=state.status,
        comparison_error=state.error,
        progress=_progress(job),
        progress_at=job.progress_at if job.status == "running" else None,
        rerun_of=job.rerun_of,
    )


def job_public(*, session: Session, job: Job, alive_s: float | None = None) -> JobPublic:
    """The API view of one job row (``node`` is the runner of its latest attempt). With
    ``alive_s``, ``waiting_for`` says why a queued job waits when no runner seen within that many
    seconds advertises its benchmark (``kernelab.service.server.offers.waiting_for``)."""
    state = compare_queue.states(session, [job.id]).get(job.id, _NO_RESULT)
    crews = gangs.public(session, [job])
    waiting = {} if alive_s is None else _waiting(session, [job], crews, alive_s)
    return _public(
        job, _runner_names(session, [job.id]).get(job.id), state, waiting.get(job.id), crews.get(job.id)
    )


def _waiting(
    session: Session, jobs: list[Job], crews: dict[int, GangPublic], alive_s: float
) -> dict[int, str]:
    """Why each queued job of ``jobs`` waits: benchmarks no live runner offers, workloads' gangs."""
    return {**offers.waiting_for(session, jobs, alive_s=alive_s),
            **gangs.waiting(session, jobs, crews, alive_s=alive_s)}  # fmt: skip


def attempts_page(*, session: Session, job_id: int, offset: int = 0, limit: int = 500) -> AttemptsPage:
    """A page of ``job_id``'s attempts in claim order, each with its runner's name (None once the
    runner row is gone); ``count`` is the job's number of attempts. The job is not checked here."""
    of_job = JobAttempt.job_id == job_id
    count = session.scalar(select(func.count()).select_from(JobAttempt).where(of_job)) or 0
    rows = session.execute(
        select(JobAttempt.attempt, Runner.name.label("runner"), JobAttempt.claimed_at, JobAttempt.ended_at,
               JobAttempt.outcome, JobAttempt.error)
        .outerjoin(Runner, Runner.id == JobAttempt.runner_id)
        .where(of_job)
        .order_by(JobAttempt.attempt, JobAttempt.id)
        .offset(offset)
        .limit(limit)
    )  # fmt: skip
    return AttemptsPage(data=[AttemptPublic.model_validate(dict(row._mapping)) for row in rows], count=count)


def list_jobs(
    *, session: Session, offset: int = 0, limit: int = 50, status: str | None = None,
    benchmark: str | None = None, alive_s: float | None = None,
) -> JobsPage:  # fmt: skip
    """A page of jobs, newest first; ``count`` is the total matching the filters; ``alive_s`` as
    in ``job_public``."""
    where = []
    if status is not None:
        where.append(Job.status == status)
    if benchmark is not None:
        where.append(Job.benchmark == benchmark)
    count = session.scalar(select(func.count()).select_from(Job).where(*where)) or 0
    jobs = list(
        session.scalars(select(Job).where(*where).order_by(Job.id.desc()).offset(offset).limit(limit))
    )
    names = _runner_names(session, [j.id for j in jobs])
    states = compare_queue.states(session, [j.id for j in jobs])
    crews = gangs.public(session, jobs)
    waiting = {} if alive_s is None else _waiting(session, jobs, crews, alive_s)
    return JobsPage(
        data=[
            _public(j, names.get(j.id), states.get(j.id, _NO_RESULT), waiting.get(j.id), crews.get(j.id))
            for j in jobs
        ],
        count=count,
    )


def job_benchmarks(*, session: Session, limit: int = 200) -> list[str]:
    """The distinct benchmarks of the stored jobs, sorted (at most ``limit``): the jobs list's filter."""
    rows = session.scalars(select(Job.benchmark).distinct().order_by(Job.benchmark).limit(limit))
    return list(rows)


def accept_spec(*, session: Session, spec: JobSpec, require_offered: bool) -> offers.Accepted:
    """``spec`` checked as ``POST /jobs`` checks it: each side's ``source.repo``
    (``kernelab.service.contract.repo_address.source_errors``), then the benchmark's advertised schemas
    (``kernelab.service.server.offers.check_spec``; ``require_offered``:
    ``Settings.require_offered_benchmark``).
    Returns the accepted ``offers.Accepted`` (no errors); raises ``SpecInvalidError`` naming the field."""
    errors = source_errors({"baseline": spec.baseline, "candidate": spec.candidate})
    accepted = None if errors else offers.check_spec(session, spec, require_offered=require_offered)
    if errors or (accepted is not None and accepted.errors):
        raise SpecInvalidError(errors or (accepted.errors if accepted is not None else []))
    assert accepted is not None
    return accepted


def rerun_job(*, session: Session, job_id: int, submitted_by: int | None, settings: Settings) -> JobPublic:
    """Queue job ``job_id``'s stored spec again as a new job whose ``rerun_of`` is ``job_id``, in
    whatever status the original is, and return its API view. A benchmark spec is checked again as
    a submission is (``accept_spec``, against today's advertised schemas), a workload spec queued
    for a gang (``kernelab.service.server.gangs.submit``). ``submitted_by``: the token id of the caller.
    Raises ``queue.JobNotFoundError`` (unknown job) and ``SpecInvalidError`` (the spec no longer
    fits). Flushes, never commits."""
    original = queue.get_job(session, job_id)
    if original.kind == "workload":
        job = gangs.submit(session, WorkloadSpec.model_validate(original.spec, context=STORED),
                           max_attempts=settings.max_attempts, submitted_by=submitted_by)  # fmt: skip
        job.rerun_of = job_id
        session.flush()
        return job_public(session=session, job=job, alive_s=settings.runner_alive_s)
    spec = JobSpec.model_validate(original.spec, context=STORED)
    accepted = accept_spec(session=session, spec=spec, require_offered=settings.require_offered_benchmark)
    job = queue.rerun(
        session, job_id, spec, max_attempts=settings.max_attempts, submitted_by=submitted_by,
        needs_benchmark=accepted.needs_benchmark, schema_sha256=accepted.schema_sha256,
    )  # fmt: skip
    return job_public(session=session, job=job, alive_s=settings.runner_alive_s)
