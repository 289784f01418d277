"""Repository functions over the ORM: jobs as ``JobPublic``, result ingestion and rebuilding,
raw samples, runners and probe reports.

Every function takes ``*, session`` and never commits: the request (or the CLI command) commits
once, so a result is stored whole or not at all. Queue state changes live in ``kernelab.service.queue``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from pydantic import TypeAdapter
from sqlalchemy import func, insert, select, union, update
from sqlalchemy.orm import Session

from kernelab.service import bulk, compare_queue, models, offers, queue, sample_blocks, verdicts
from kernelab.service.auth import create_token
from kernelab.service.compare_queue import ComparisonStatus
from kernelab.service.core.clock import db_now
from kernelab.service.models import Cell, Job, JobAttempt, ProbeReading, Result, Runner, SampleBlock
from kernelab.service.schemas import (
    SAMPLE_FIELDS,
    STORED,
    AttemptPublic,
    AttemptsPage,
    CellResult,
    Comparison,
    CorrectnessResult,
    JobPublic,
    JobResult,
    JobsPage,
    JobSpec,
    NodeInfo,
    ProbeReport,
    SampleColumns,
    Side,
    StaticComparison,
    Work,
)

log = logging.getLogger(__name__)

# A cell's stored per-variant JSON, validated back (keys included: each must be a ``Side``).
_WORK_BY_VARIANT = TypeAdapter(dict[Side, Work])
_CORRECTNESS_BY_VARIANT = TypeAdapter(dict[Side, CorrectnessResult])

SAMPLE_COLUMNS = (
    "cell_index", "params", "variant", "round", "position", "duration_ns", "launches",
    "sm_clock_mhz", "clock_event_reasons", "temperature_c", "power_w", "throttled",
)  # fmt: skip
"""Columns of ``iter_sample_rows`` and of ``GET /jobs/{id}/samples`` (CSV header order)."""
_BLOCK_COLUMNS = [SampleBlock.n, *(getattr(SampleBlock, name) for name in SAMPLE_FIELDS)]


class ResultConflictError(Exception):
    """A result cannot be stored: its idempotency key belongs to another job or was stored with a
    different result, or ids disagree (HTTP 409)."""


class ResultInvalidError(Exception):
    """A well-formed result that does not fit its job (HTTP 422): ``errors`` are dicts with
    ``loc`` (inside the body), ``msg`` and ``type``, as pydantic reports them."""

    def __init__(self, errors: Sequence[dict[str, Any]]):
        super().__init__("; ".join(str(e["msg"]) for e in errors))
        self.errors = list(errors)


_MAX_REPORTED = 10  # mismatching cells named in one 422


def check_result_fits_job(result: JobResult, spec: JobSpec, job_id: int) -> None:
    """Raise ``ResultInvalidError`` unless ``result`` is a result of the job whose spec is ``spec``.

    * ``spec``: the result's spec must equal the job's (a runner echoes the spec it claimed);
    * ``node.device_type``: the job's ``device`` unless that is ``auto``;
    * ``cells[i].index``: in ``range(n)`` and not repeated, ``n`` the number of cells of the job's
      sweep on the result's device type (``JobSpec.cells(node.device_type)``);
    * ``cells[i].params``: the sweep's parameters of that index;
    * ``cells``: every cell of the sweep is there, unless the result carries a job-level ``error``
      (a job that failed part-way stores what it measured).
    """
    errors: list[dict[str, Any]] = []
    if result.spec != spec:
        mine, theirs = result.spec.model_dump(mode="json"), spec.model_dump(mode="json")
        fields = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        msg = f"the result's spec is not job {job_id}'s spec (differs in: {', '.join(fields)})"
        errors.append({"loc": ["spec"], "type": "value_error", "msg": msg})
    if spec.device != "auto" and result.node.device_type != spec.device:
        msg = f"job {job_id} runs on {spec.device}; the result was measured on {result.node.device_type}"
        errors.append({"loc": ["node", "device_type"], "type": "value_error", "msg": msg})
    expected = spec.cells(result.node.device_type)
    seen: dict[int, int] = {}
    for i, cell in enumerate(result.cells):
        if not 0 <= cell.index < len(expected):
            msg = (f"cell index {cell.index} is not in the job's sweep of {len(expected)} cells "
                   f"on {result.node.device_type}")  # fmt: skip
            errors.append({"loc": ["cells", i, "index"], "type": "value_error", "msg": msg})
        elif cell.index in seen:
            errors.append({"loc": ["cells", i, "index"], "type": "value_error",
                           "msg": f"cell index {cell.index} also at cells[{seen[cell.index]}]"})  # fmt: skip
        elif cell.params != expected[cell.index]:
            errors.append({"loc": ["cells", i, "params"], "type": "value_error",
                           "msg": f"cell {cell.index}'s params {cell.params} are not the sweep's "
                                  f"{expected[cell.index]}"})  # fmt: skip
        seen.setdefault(cell.index, i)
    missing = [k for k in range(len(expected)) if k not in seen]
    if missing and result.error is None:
        listed = ", ".join(map(str, missing[:_MAX_REPORTED]))
        listed += ", ..." if len(missing) > _MAX_REPORTED else ""
        errors.append({"loc": ["cells"], "type": "value_error",
                       "msg": f"the result holds {len(seen)} of the job's {len(expected)} cells (missing: "
                              f"{listed}); only a result with an error may leave cells out"})  # fmt: skip
    if len(errors) > _MAX_REPORTED + 1:  # the first few and the last (the missing cells, if any)
        errors = errors[:_MAX_REPORTED] + errors[-1:]
    if errors:
        raise ResultInvalidError(errors)


def _stored_under_key(session: Session, job_id: int, result: JobResult) -> int | None:
    """The id of the result already stored under ``result.idempotency_key`` (a repeat of the same
    post), None when there is none. Raises ``ResultConflictError`` when the key was stored for
    another job or with a different result."""
    existing = session.execute(
        select(Result.id, Result.job_id).where(Result.idempotency_key == result.idempotency_key)
    ).first()
    if existing is None:
        return None
    if existing.job_id != job_id:
        raise ResultConflictError(
            f"idempotency key {result.idempotency_key!r} already stored for job {existing.job_id}"
        )
    differs = _same_result(session, existing.id, result)
    if differs:
        raise ResultConflictError(
            f"idempotency key {result.idempotency_key!r} was stored for job {job_id} with a different "
            f"result (differs in: {', '.join(differs)}); a retry must repeat the same result"
        )
    return int(existing.id)


def _same_result(session: Session, result_id: int, result: JobResult) -> list[str]:
    """Fields in which the stored result ``result_id`` differs from ``result`` (a repeat of its
    idempotency key): times, node, timer, error, and per cell its index, sample count and error."""
    row = session.get(Result, result_id)
    assert row is not None
    differs = [name for name, stored, posted in (
        ("started_at", row.started_at, result.started_at),
        ("finished_at", row.finished_at, result.finished_at),
        ("node", row.node_name, result.node.hostname), ("timer", row.timer, result.timer),
        ("error", row.error, result.error),
    ) if stored != posted]  # fmt: skip
    stored_cells = {index: (n, error) for index, n, error in session.execute(
        select(Cell.cell_index, func.coalesce(SampleBlock.n, 0), Cell.error)
        .outerjoin(SampleBlock, SampleBlock.cell_id == Cell.id).where(Cell.result_id == result_id)
    )}  # fmt: skip
    if stored_cells != {c.index: (len(c.samples), c.error) for c in result.cells}:
        differs.append("cells")
    return differs


# --------------------------------------------------------------------------------------------------
# Jobs
# --------------------------------------------------------------------------------------------------


def _runner_names(session: Session, job_ids: Sequence[int]) -> dict[int, str]:
    """Name of the runner of each job's latest attempt."""
    rows = session.execute(
        select(JobAttempt.job_id, Runner.name)
        .join(Runner, Runner.id == JobAttempt.runner_id)
        .where(JobAttempt.job_id.in_(job_ids))
        .order_by(JobAttempt.job_id, JobAttempt.attempt)
    )
    return {job_id: name for job_id, name in rows}


_NO_RESULT = compare_queue.TaskState("none")


def _public(
    job: Job, node: str | None, state: compare_queue.TaskState = _NO_RESULT, waiting_for: str | None = None
) -> JobPublic:
    return JobPublic(
        waiting_for=waiting_for,
        id=job.id,
        name=job.name,
        benchmark=job.benchmark,
        status=job.status,  # type: ignore[arg-type]
        spec=JobSpec.model_validate(job.spec, context=STORED),
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
    )


def job_public(*, session: Session, job: Job, alive_s: float | None = None) -> JobPublic:
    """The API view of one job row (``node`` is the runner of its latest attempt). With
    ``alive_s``, ``waiting_for`` says why a queued job waits when no runner seen within that many
    seconds advertises its benchmark (``kernelab.service.offers.waiting_for``)."""
    state = compare_queue.states(session, [job.id]).get(job.id, _NO_RESULT)
    waiting = {} if alive_s is None else offers.waiting_for(session, [job], alive_s=alive_s)
    return _public(job, _runner_names(session, [job.id]).get(job.id), state, waiting.get(job.id))


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
    waiting = {} if alive_s is None else offers.waiting_for(session, jobs, alive_s=alive_s)
    return JobsPage(
        data=[_public(j, names.get(j.id), states.get(j.id, _NO_RESULT), waiting.get(j.id)) for j in jobs],
        count=count,
    )


# --------------------------------------------------------------------------------------------------
# Runners
# --------------------------------------------------------------------------------------------------


def register_runner(*, session: Session, name: str, node: NodeInfo | None) -> tuple[Runner, str]:
    """Create (or re-register) the runner ``name`` and issue its per-runner token (scope runner).

    Re-registering revokes the runner's earlier tokens. A ``node`` binds the runner (and so its
    token) to ``node.hostname``: probe reports and results for another node are refused
    (``kernelab.service.runner_identity``); a registration without a node keeps the earlier binding.
    Returns the row and the plain token.
    """
    runner = session.scalar(select(Runner).where(Runner.name == name))
    now = db_now()  # the queue's clock: kernelab_runners_alive compares last_seen_at with it
    if runner is None:
        runner = Runner(name=name)
        session.add(runner)
    else:
        session.execute(
            update(models.Token)
            .where(models.Token.runner_id == runner.id, models.Token.revoked_at.is_(None))
            .values(revoked_at=now)
        )
    if node is not None:
        runner.node = node.model_dump(mode="json")
        runner.node_name = node.hostname
    runner.last_seen_at = now
    session.flush()
    return runner, create_token(session, f"runner:{name}", ["runner"], runner_id=runner.id)


def runner_device_type(*, session: Session, runner_id: int) -> str | None:
    """The device type ("cpu"/"cuda") the runner registered with, None when unknown."""
    node = session.scalar(select(Runner.node).where(Runner.id == runner_id))
    return node.get("device_type") if node else None


# --------------------------------------------------------------------------------------------------
# Probe reports
# --------------------------------------------------------------------------------------------------


def store_probe_report(
    *, session: Session, report: ProbeReport, node_name: str, runner_id: int | None,
    job_id: int | None = None, result_id: int | None = None,
) -> models.ProbeReport:  # fmt: skip
    """Store a probe report whole (JSON) and its readings flat (``probe_readings``)."""
    row = models.ProbeReport(
        runner_id=runner_id, node_name=node_name, job_id=job_id, result_id=result_id, phase=report.phase,
        taken_at=report.taken_at, wall_s=report.wall_s, nvml_status=report.nvml_status,
        report=report.model_dump(mode="json"),
    )  # fmt: skip
    session.add(row)
    session.flush()
    readings: list[dict[str, Any]] = [
        {"report_id": row.id, "kind": "copy_bandwidth", "device_index": r.device_index, "world_size": None,
         "size_bytes": r.size_bytes, "time_us": r.time_us, "value_gbps": r.bandwidth_gbps, "busbw_gbps": None}
        for r in report.copy_bandwidth
    ] + [
        {"report_id": row.id, "kind": "all_reduce", "device_index": None, "world_size": r.world_size,
         "size_bytes": r.size_bytes, "time_us": r.time_us, "value_gbps": r.algbw_gbps,
         "busbw_gbps": r.busbw_gbps}
        for r in report.all_reduce
    ]  # fmt: skip
    if readings:
        session.execute(insert(ProbeReading), readings)
    return row


def recent_probe_reports(*, session: Session, node_name: str, limit: int = 50) -> list[models.ProbeReport]:
    """The node's latest probe reports, newest first."""
    return list(
        session.scalars(
            select(models.ProbeReport)
            .where(models.ProbeReport.node_name == node_name)
            .order_by(models.ProbeReport.taken_at.desc(), models.ProbeReport.id.desc())
            .limit(limit)
        )
    )


def probe_readings(*, session: Session, node_name: str, kind: str) -> list[dict[str, Any]]:
    """Flat readings of one kind for a node over time (for history plots), oldest first.

    Each row: ``taken_at`` (UTC), ``phase``, ``job_id``, ``device_index``, ``world_size``,
    ``size_bytes``, ``time_us``, ``value_gbps`` (copy: read+written GB/s; all-reduce: algbw),
    ``busbw_gbps``.
    """
    rows = session.execute(
        select(
            models.ProbeReport.taken_at,
            models.ProbeReport.phase,
            models.ProbeReport.job_id,
            ProbeReading.device_index,
            ProbeReading.world_size,
            ProbeReading.size_bytes,
            ProbeReading.time_us,
            ProbeReading.value_gbps,
            ProbeReading.busbw_gbps,
        )  # fmt: skip
        .join(models.ProbeReport, models.ProbeReport.id == ProbeReading.report_id)
        .where(models.ProbeReport.node_name == node_name, ProbeReading.kind == kind)
        .order_by(models.ProbeReport.taken_at, ProbeReading.id)
    )
    return [dict(r._mapping) for r in rows]


@dataclass(frozen=True)
class NodeSummary:
    """What the server knows about one node (hostname): last probe, counts, fingerprint."""

    name: str
    node: dict[str, Any] | None
    last_probe_at: datetime | None
    probe_reports: int
    results: int


def _node_names(session: Session) -> Any:
    return union(select(models.ProbeReport.node_name.label("name")), select(Result.node_name.label("name")))


def count_nodes(*, session: Session) -> int:
    """How many distinct nodes sent a probe report or a result."""
    return session.scalar(select(func.count()).select_from(_node_names(session).subquery())) or 0


def node_summary(*, session: Session, name: str) -> NodeSummary | None:
    """One node's summary; None when no probe report or result names it."""
    reports, last = session.execute(
        select(func.count(models.ProbeReport.id), func.max(models.ProbeReport.taken_at)).where(
            models.ProbeReport.node_name == name
        )
    ).one()
    results = session.scalar(select(func.count(Result.id)).where(Result.node_name == name)) or 0
    if not reports and not results:
        return None
    node = session.scalar(
        select(Result.node).where(Result.node_name == name).order_by(Result.id.desc()).limit(1)
    )
    if node is None:
        node = session.scalar(
            select(Runner.node).join(models.ProbeReport, models.ProbeReport.runner_id == Runner.id)
            .where(models.ProbeReport.node_name == name).order_by(models.ProbeReport.id.desc()).limit(1)
        )  # fmt: skip
    return NodeSummary(name, node, last, reports, results)


def list_nodes(*, session: Session, offset: int = 0, limit: int = 50) -> tuple[list[NodeSummary], int]:
    """A page of nodes by name, and the total count."""
    sub = _node_names(session).subquery()
    names = session.scalars(select(sub.c.name).order_by(sub.c.name).offset(offset).limit(limit))
    summaries = [node_summary(session=session, name=n) for n in names]
    return [s for s in summaries if s is not None], count_nodes(session=session)


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


def store_result(
    *, session: Session, job_id: int, result: JobResult, runner_id: int, compare_max_attempts: int = 3
) -> tuple[int, bool]:  # fmt: skip
    """Store a runner's ``JobResult`` for ``job_id`` and finish the job; returns ``(result_id,
    duplicate)``.

    A repeated ``idempotency_key`` for the same job stores nothing and returns the first result's
    id with ``duplicate=True``. Cells are bulk-inserted, then one ``sample_blocks`` row of
    columnar arrays per cell with samples (``kernelab.service.sample_blocks``); probe reports are stored
    linked to the job, the result and the node (``result.node.hostname``); the comparison is queued
    (``compare_queue.enqueue``, ``compare_max_attempts`` claims) for a compare worker. Raises
    ``ResultConflictError`` (key of another job or of a different result, or ``result.job_id`` not
    ``job_id``), ``ResultInvalidError`` (the result does not fit the job),
    ``queue.JobNotFoundError``, ``queue.LeaseLostError`` (caller does not hold the lease).
    """
    if result.job_id is not None and result.job_id != job_id:
        raise ResultConflictError(f"the result names job {result.job_id}, posted to job {job_id}")
    stored = _stored_under_key(session, job_id, result)
    if stored is not None:
        return stored, True
    # A job none of whose cells measured failed, whatever the runner says
    # (kernelab.service.verdicts.job_error).
    error = verdicts.job_error(result)
    try:
        job = queue.complete(session, job_id, runner_id=runner_id, error=error)  # 409 first: the lease
    except queue.LeaseLostError:
        # A concurrent post of the same key may have finished the job while this one waited for
        # the job's row: the statement below sees its commit (PostgreSQL's READ COMMITTED takes
        # a snapshot per statement; SQLite's write lock was only granted after that commit).
        stored = _stored_under_key(session, job_id, result)
        if stored is not None:
            return stored, True
        raise
    check_result_fits_job(result, JobSpec.model_validate(job.spec, context=STORED), job_id)
    row = Result(
        job_id=job_id, idempotency_key=result.idempotency_key, runner_id=runner_id,
        node_name=result.node.hostname, node=result.node.model_dump(mode="json"), timer=result.timer,
        started_at=result.started_at, finished_at=result.finished_at,
        spec=result.spec.model_dump(mode="json"), error=result.error,
    )  # fmt: skip
    session.add(row)
    session.flush()
    _insert_cells(session, row.id, result.cells)
    for report in result.probes:
        store_probe_report(
            session=session, report=report, node_name=result.node.hostname, runner_id=runner_id,
            job_id=job_id, result_id=row.id,
        )  # fmt: skip
    # The comparison is computed by a compare worker, queued in this transaction: nothing lost on a crash.
    compare_queue.enqueue(session, result_id=row.id, job_id=job_id, max_attempts=compare_max_attempts)
    return row.id, False


def save_comparison(*, session: Session, job_id: int, comparison: Comparison) -> None:
    """Store ``comparison`` (``stats.compare`` of ``job_id``'s result without node-health flags) in
    ``results.comparison`` and its verdict counts in ``jobs.summary``; the caller commits."""
    session.execute(
        update(Result).where(Result.job_id == job_id).values(comparison=comparison.model_dump(mode="json"))
    )
    session.execute(update(Job).where(Job.id == job_id).values(summary=dict(comparison.summary)))


@dataclass(frozen=True)
class StoredComparison:
    """What readers know of a job's comparison: ``status`` (``compare_queue.ComparisonStatus``),
    the stored ``comparison`` when ``ready``, the failed task's ``error``."""

    status: ComparisonStatus
    comparison: Comparison | None = None
    error: str | None = None


def stored_comparison(*, session: Session, job_id: int) -> StoredComparison:
    """The stored comparison of ``job_id``'s result (``stats.compare`` without node-health flags,
    computed by a compare worker: ``kernelab.service.compare_queue``), never computed here.

    ``none`` without a result; ``comparing`` while its task is open, and for a comparison judged
    by older verdict rules (``method_version`` below ``verdicts.METHOD_VERSION``: a compare worker
    re-queues those when it starts); ``failed`` with the task's error; else ``ready``."""
    stored = session.execute(select(Result.id, Result.comparison).where(Result.job_id == job_id)).first()
    if stored is None:
        return StoredComparison("none")
    state = compare_queue.states(session, [job_id]).get(job_id, compare_queue.TaskState("comparing"))
    if state.status == "failed":
        return StoredComparison("failed", error=state.error)
    if state.status == "comparing" or stored.comparison is None:
        return StoredComparison("comparing")
    comparison = Comparison.model_validate(stored.comparison)
    if comparison.method_version < verdicts.METHOD_VERSION:  # older rules: re-queued, shown as such
        return StoredComparison("comparing")
    return StoredComparison("ready", comparison)


def base_comparison(*, session: Session, job_id: int) -> Comparison | None:
    """The stored comparison of ``job_id``'s result when it is ready (``stored_comparison``), else
    None (no result, or still comparing, or failed)."""
    return stored_comparison(session=session, job_id=job_id).comparison


def _cell_context(cell: CellResult) -> dict[str, Any]:
    """``cells.context``: how the cell was measured: the timer kind per variant, the contention
    readings, the checked samples through the timer and the runner's findings (JSON)."""
    return {
        "timers": dict(cell.timers),
        "contention": [r.model_dump(mode="json") for r in cell.contention],
        "timed_checks": {v: [t.model_dump(mode="json") for t in ts] for v, ts in cell.timed_checks.items()},
        "findings": [f.model_dump(mode="json") for f in cell.findings],
        "phase_s": dict(cell.phase_s),
    }


def _insert_cells(session: Session, result_id: int, cells: Sequence[CellResult]) -> None:
    if not cells:
        return
    cell_rows = [
        {
            "result_id": result_id,
            "cell_index": c.index,
            "params": c.params,
            "baseline_params": c.baseline_params,
            "candidate_params": c.candidate_params,
            "work": {k: w.model_dump(mode="json") for k, w in c.work.items()},
            "correctness": {k: r.model_dump(mode="json") for k, r in c.correctness.items()},
            "error": c.error,
            "context": _cell_context(c),
            "static": None if c.static is None else c.static.model_dump(mode="json"),
        }  # fmt: skip
        for c in cells
    ]
    cell_ids = bulk.insert_rows_returning_ids(session, Cell, cell_rows)
    blocks = [
        {"cell_id": cell_id, **sample_blocks.encode(cell.samples)}
        for cell_id, cell in zip(cell_ids, cells, strict=True)
        if len(cell.samples)
    ]
    bulk.insert_rows(session, SampleBlock, blocks)


def load_result(
    *, session: Session, job_id: int, sample_cells: Sequence[int] | None = None
) -> JobResult | None:
    """Rebuild the ``JobResult`` a runner posted for ``job_id`` from the tables; None if none.

    Cells come in ``index`` order, samples in the order they were posted, probe reports in the
    order they were stored. ``sample_cells``: load the samples of these cell indices only (the
    other cells come back with no samples); None loads all.
    """
    row = session.scalar(select(Result).where(Result.job_id == job_id))
    if row is None:
        return None
    cells = list(session.scalars(select(Cell).where(Cell.result_id == row.id).order_by(Cell.cell_index)))
    query = select(SampleBlock.cell_id, *_BLOCK_COLUMNS).join(Cell).where(Cell.result_id == row.id)
    if sample_cells is not None:
        query = query.where(Cell.cell_index.in_(list(sample_cells)))
    samples = {block.cell_id: sample_blocks.decode(block._mapping) for block in session.execute(query)}
    reports = session.scalars(
        select(models.ProbeReport.report)
        .where(models.ProbeReport.result_id == row.id)
        .order_by(models.ProbeReport.id)
    )
    return JobResult(
        idempotency_key=row.idempotency_key, job_id=job_id,
        spec=JobSpec.model_validate(row.spec, context=STORED),
        node=NodeInfo.model_validate(row.node), timer=row.timer, started_at=row.started_at,
        finished_at=row.finished_at, error=row.error,
        probes=[ProbeReport.model_validate(r) for r in reports],
        cells=[
            CellResult(
                index=c.cell_index, params=c.params, baseline_params=c.baseline_params,
                candidate_params=c.candidate_params,
                work=_WORK_BY_VARIANT.validate_python(c.work),
                correctness=_CORRECTNESS_BY_VARIANT.validate_python(c.correctness),
                samples=samples.get(c.id) or SampleColumns(), error=c.error,
                timers=(c.context or {}).get("timers", {}),
                contention=(c.context or {}).get("contention", []),
                timed_checks=(c.context or {}).get("timed_checks", {}),
                findings=(c.context or {}).get("findings", []),
                phase_s=(c.context or {}).get("phase_s", {}),
                static=None if c.static is None else StaticComparison.model_validate(c.static),
            )
            for c in cells
        ],
    )  # fmt: skip


def result_id(*, session: Session, job_id: int) -> int | None:
    """The id of ``job_id``'s stored result, None without one."""
    return session.scalar(select(Result.id).where(Result.job_id == job_id))


def has_result(*, session: Session, job_id: int) -> bool:
    """Whether a result is stored for ``job_id``."""
    return session.scalar(select(Result.id).where(Result.job_id == job_id)) is not None


def count_samples(*, session: Session, job_id: int) -> int:
    """How many raw samples the job's result holds (0 without a result)."""
    return session.scalar(
        select(func.coalesce(func.sum(SampleBlock.n), 0)).join(Cell, Cell.id == SampleBlock.cell_id)
        .join(Result, Result.id == Cell.result_id).where(Result.job_id == job_id)
    ) or 0  # fmt: skip


def _block_slices(
    session: Session, job_id: int, offset: int, limit: int | None
) -> list[tuple[int, int, int]]:
    """``(block id, first, end)``: the sample positions of each block (cell index order) that
    fall in rows ``[offset, offset + limit)`` of the job's samples."""
    sizes = session.execute(
        select(SampleBlock.id, SampleBlock.n).join(Cell, Cell.id == SampleBlock.cell_id)
        .join(Result, Result.id == Cell.result_id).where(Result.job_id == job_id)
        .order_by(Cell.cell_index)
    )  # fmt: skip
    stop = None if limit is None else offset + limit
    out, start = [], 0
    for block_id, n in sizes:
        first = max(offset - start, 0)
        end = n if stop is None else min(stop - start, n)
        if first < end:
            out.append((block_id, first, end))
        start += n
        if stop is not None and start >= stop:
            break
    return out


class BlockSlice(NamedTuple):
    """Samples ``[first, end)`` of one cell's stored block (``first < end <= block["n"]``)."""

    cell_index: int
    params: dict[str, Any]
    block: Mapping[Any, Any]
    """``n`` and every ``SAMPLE_FIELDS`` column as stored (``sample_blocks`` encoding)."""
    first: int
    end: int


SampleBatch = list[tuple[int, int, int]]
"""``(block id, first, end)`` of the sample blocks one query reads (``read_sample_batch``)."""


def sample_batches(
    *, session: Session, job_id: int, batch: int = 5000, offset: int = 0, limit: int | None = None
) -> list[SampleBatch]:
    """Where the rows ``[offset, offset + limit)`` of a job's samples (``limit=None``: to the end;
    the order of ``iter_sample_rows``) are: one ``SampleBatch`` per query of about ``batch``
    samples (a block's samples at least), in order. Reads block sizes only, not samples."""
    slices = _block_slices(session, job_id, offset, limit)
    batches: list[SampleBatch] = []
    while slices:
        chunk: SampleBatch = []
        taken = 0
        while slices and (not chunk or taken + slices[0][2] - slices[0][1] <= batch):
            chunk.append(slices.pop(0))
            taken += chunk[-1][2] - chunk[-1][1]
        batches.append(chunk)
    return batches


def read_sample_batch(*, session: Session, batch: SampleBatch) -> list[BlockSlice]:
    """The ``BlockSlice`` of every block of ``batch`` (one query), in the batch's order."""
    rows = session.execute(
        select(SampleBlock.id, Cell.cell_index, Cell.params, *_BLOCK_COLUMNS)
        .join(Cell, Cell.id == SampleBlock.cell_id)
        .where(SampleBlock.id.in_([block_id for block_id, _, _ in batch]))
    )
    by_id = {r.id: r for r in rows}
    return [
        BlockSlice(by_id[block_id].cell_index, by_id[block_id].params, by_id[block_id]._mapping, first, end)
        for block_id, first, end in batch
    ]


def iter_sample_blocks(
    *, session: Session, job_id: int, batch: int = 5000, offset: int = 0, limit: int | None = None
) -> Iterator[BlockSlice]:
    """The raw samples of a job's result as ``BlockSlice``s, streamed in cell index order: the
    rows ``[offset, offset + limit)`` of the order of ``iter_sample_rows`` (``limit=None``: to the
    end), reading blocks of about ``batch`` samples per query."""
    for part in sample_batches(session=session, job_id=job_id, batch=batch, offset=offset, limit=limit):
        yield from read_sample_batch(session=session, batch=part)


def iter_sample_rows(
    *, session: Session, job_id: int, batch: int = 5000, offset: int = 0, limit: int | None = None
) -> Iterator[dict[str, Any]]:
    """Raw samples of a job's result as flat dicts with ``SAMPLE_COLUMNS`` keys, streamed (cell
    index order, then posting order), reading blocks of about ``batch`` samples per query.
    ``params`` is the cell's parameter dict; ``duration_ns`` is nanoseconds per launch.
    ``offset``/``limit`` select a page of that order (``limit=None``: to the end). One dict per
    sample: ``kernelab.service.sample_export`` writes the download's text per block instead (this is its
    row-by-row reference in the tests)."""
    for part in iter_sample_blocks(session=session, job_id=job_id, batch=batch, offset=offset, limit=limit):
        rows = sample_blocks.decode(part.block).rows()[part.first : part.end]
        cell = {"cell_index": part.cell_index, "params": part.params}
        for sample in rows:
            yield {**cell, **{name: getattr(sample, name) for name in SAMPLE_FIELDS}}


def load_cell_samples(*, session: Session, job_id: int, cell_index: int) -> SampleColumns | None:
    """The raw samples of one cell of the job's stored result (posting order), reading that cell's
    block alone; an empty ``SampleColumns`` for a cell without samples, None when the job has no
    result or the result no cell ``cell_index``. (For pages that draw one cell of a large sweep:
    ``load_result(sample_cells=...)`` rebuilds every cell.)"""
    found = session.execute(
        select(Cell.id, SampleBlock.id.label("block_id"), *_BLOCK_COLUMNS).select_from(Cell)
        .join(Result, Result.id == Cell.result_id)
        .join(SampleBlock, SampleBlock.cell_id == Cell.id, isouter=True)
        .where(Result.job_id == job_id, Cell.cell_index == cell_index)
    ).first()  # fmt: skip
    if found is None:
        return None
    return SampleColumns() if found.block_id is None else sample_blocks.decode(found._mapping)
