"""A workload job's results on the server: each node's raw ``WorkloadResult`` stored as posted
(``workload_results``), the nodes joined into one result (``merge``), its comparison queued for the
compare worker and read back (``comparison_state``).

* **Store** (``store``): the runner holding a seat of the running attempt posts its node's result
  (``POST /runners/jobs/{id}/workload-result``). A repeated ``idempotency_key`` answers
  ``duplicate`` and stores nothing; a result whose spec is not the job's, or whose ``node_rank``
  is not the seat's, is refused (``WorkloadRefused``, 422). When the last node of the attempt has
  posted, in the same transaction, the job finishes and a compare task of kind ``workload`` is
  queued (``compare_queue.enqueue_workload``). Results of earlier attempts are dropped then.
* **Merge** (``merge``): run ``i`` of the job is run ``i`` of every node: its records are the union
  of the nodes' (each node holds its own ranks'), its wall time the longest, its outcome ``ok`` only
  when every node's was (else the first node's failure), its probe node rank 0's.
* **Read** (``comparison_state``): the stored ``WorkloadComparison`` (the task's ``output``), or
  where its computation stands. Never computes it.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    STORED,
    WorkloadAccepted,
    WorkloadComparison,
    WorkloadResult,
    WorkloadRun,
    WorkloadSpec,
    read_stored,
)
from kernelab.service.server import compare_queue, gangs, queue
from kernelab.service.server.core.clock import db_now
from kernelab.service.server.models import CompareTask, GangMember, Job, WorkloadResultRow
from kernelab.service.server.queue import LeaseLostError


class WorkloadRefused(Exception):
    """A posted workload result does not fit its job (HTTP 422): ``loc`` names the field."""

    def __init__(self, message: str, loc: tuple[str, ...]):
        super().__init__(message)
        self.loc = loc


def store(
    session: Session, job_id: int, *, runner_id: int, result: WorkloadResult, max_attempts: int
) -> WorkloadAccepted:
    """Store node ``result.node_rank``'s result of job ``job_id`` posted by ``runner_id`` (see the
    module doc). Raises ``JobNotFoundError``, ``LeaseLostError`` (409: no seat of the running
    attempt, or the job is no workload), ``WorkloadRefused`` (422)."""
    key = result.idempotency_key
    if key is None:
        raise WorkloadRefused("a runner's workload result carries an idempotency_key", ("idempotency_key",))
    known = session.scalar(select(WorkloadResultRow).where(WorkloadResultRow.idempotency_key == key))
    if known is not None:
        if known.job_id != job_id:
            raise LeaseLostError(f"idempotency_key {key!r} is another job's result", job_id)
        job = queue.get_job(session, job_id)
        return WorkloadAccepted(job_id=job_id, node_rank=known.node_rank, duplicate=True,
                                complete=job.status in queue.TERMINAL)  # fmt: skip
    job = queue.get_job(session, job_id)
    session.refresh(job)
    if job.kind != "workload" or job.status != "running":
        raise LeaseLostError(f"job {job_id} is no running workload job (status {job.status})", job_id)
    seat = session.scalar(
        select(GangMember).where(GangMember.job_id == job_id, GangMember.attempt == job.attempts,
                                 GangMember.runner_id == runner_id, GangMember.posted_at.is_(None))
    )  # fmt: skip
    if seat is None:
        raise LeaseLostError(
            f"runner {runner_id} holds no seat of job {job_id}'s attempt {job.attempts}", job_id
        )
    if result.node_rank != seat.node_rank:
        raise WorkloadRefused(
            f"this runner is node rank {seat.node_rank}, not {result.node_rank}", ("node_rank",)
        )
    spec = WorkloadSpec.model_validate(job.spec, context=STORED)
    if result.spec != spec:
        raise WorkloadRefused("the result's spec is not the job's spec", ("spec",))
    if result.job_id not in (None, job_id):
        raise WorkloadRefused(f"the result names job {result.job_id}", ("job_id",))
    session.execute(delete(WorkloadResultRow).where(WorkloadResultRow.job_id == job_id,
                                                    WorkloadResultRow.attempt != job.attempts))  # fmt: skip
    session.add(WorkloadResultRow(
        job_id=job_id, attempt=job.attempts, node_rank=seat.node_rank, idempotency_key=key,
        runner_id=runner_id, node_name=result.node.hostname, result=result.model_dump(mode="json"),
    ))  # fmt: skip
    session.execute(update(GangMember).where(GangMember.id == seat.id).values(posted_at=db_now()))
    session.flush()
    of_attempt = (GangMember.job_id == job_id, GangMember.attempt == job.attempts)
    left = session.scalar(
        select(func.count(GangMember.id)).where(*of_attempt, GangMember.posted_at.is_(None))
    )
    if left:
        gangs._job_lease(session, job)
        return WorkloadAccepted(job_id=job_id, node_rank=seat.node_rank)
    error = None if any(r.outcome == "ok" for r in result.runs) else (result.error or "no run finished")
    gangs.finish(session, job, error=error)
    compare_queue.enqueue_workload(session, job_id=job_id, max_attempts=max_attempts)
    return WorkloadAccepted(job_id=job_id, node_rank=seat.node_rank, complete=True)


def load(session: Session, job_id: int) -> list[WorkloadResult]:
    """The stored node results of job ``job_id``'s latest posted attempt, by node rank."""
    rows = session.execute(
        select(WorkloadResultRow.attempt, WorkloadResultRow.result)
        .where(WorkloadResultRow.job_id == job_id)
        .order_by(WorkloadResultRow.attempt.desc(), WorkloadResultRow.node_rank)
    ).all()
    if not rows:
        return []
    latest = rows[0][0]
    return [read_stored(WorkloadResult, r) for a, r in rows if a == latest]


_WORST = {"crashed": 0, "timeout": 1, "not-started": 2, "ok": 3}


def merge(results: list[WorkloadResult]) -> WorkloadResult:
    """One result of the nodes' ``results`` (node rank 0 first; see the module doc). Raises
    ValueError for no results."""
    if not results:
        raise ValueError("no node results to merge")
    results = sorted(results, key=lambda r: r.node_rank)
    if len(results) == 1:
        return results[0]
    first = results[0]
    runs: list[WorkloadRun] = []
    for run in first.runs:
        same = [next((r for r in res.runs if r.index == run.index), None) for res in results]
        outcome, error = run.outcome, run.error
        for node, other in enumerate(same[1:], start=1):
            if other is None:
                outcome, error = "crashed", error or f"node rank {node} has no record of this run"
            elif other.outcome != "ok" and _WORST[other.outcome] < _WORST[outcome]:
                outcome, error = other.outcome, f"node rank {node}: {other.error}"
        present = [r for r in same if r is not None]
        runs.append(run.model_copy(update={
            "outcome": outcome, "error": error[:2000], "wall_s": max(r.wall_s for r in present),
            "records": [rec for r in present for rec in r.records],
        }))  # fmt: skip
    stopped = "budget" if any(r.stopped == "budget" for r in results) else "all-runs"
    return first.model_copy(update={"runs": runs, "stopped": stopped, "node_rank": 0})


class WorkloadState(NamedTuple):
    """A workload job's comparison as readers see it: ``status`` (``none``, ``comparing``, ``ready``,
    ``failed``), the comparison when ready, the error when failed."""

    status: compare_queue.ComparisonStatus
    comparison: WorkloadComparison | None = None
    error: str | None = None


def comparison_state(session: Session, job_id: int) -> WorkloadState:
    """Where job ``job_id``'s workload comparison stands (one read of its task)."""
    row = session.execute(
        select(CompareTask.status, CompareTask.output, CompareTask.error)
        .where(CompareTask.kind == "workload", CompareTask.job_id == job_id)
    ).one_or_none()  # fmt: skip
    if row is None:
        return WorkloadState("none")
    status, output, error = row
    if status in compare_queue.OPEN:
        return WorkloadState("comparing")
    if status == "failed" or output is None:
        return WorkloadState("failed", error=error)
    return WorkloadState("ready", read_stored(WorkloadComparison, output))


def is_workload_job(session: Session, job_id: int) -> bool:
    """Whether job ``job_id`` is a workload job (False for an unknown one)."""
    return session.scalar(select(Job.kind).where(Job.id == job_id)) == "workload"
