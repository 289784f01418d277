"""A posted result checked against its job, stored whole (cells, sample blocks), read back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelab.service.contract import sample_blocks
from kernelab.service.contract.schemas import (
    STORED,
    CellResult,
    JobResult,
    JobSpec,
    SampleColumns,
    read_stored,
)
from kernelab.service.judge import verdicts
from kernelab.service.server import bulk, compare_queue, models, queue
from kernelab.service.server.crud.nodes import store_probe_report
from kernelab.service.server.crud.samples import _BLOCK_COLUMNS
from kernelab.service.server.models import Cell, Result, SampleBlock

_MAX_REPORTED = 10  # mismatching cells named in one 422


class ResultConflictError(Exception):
    """A result cannot be stored: its idempotency key belongs to another job or was stored with a
    different result, or ids disagree (HTTP 409)."""


class ResultInvalidError(Exception):
    """A well-formed result that does not fit its job (HTTP 422): ``errors`` are dicts with
    ``loc`` (inside the body), ``msg`` and ``type``, as pydantic reports them."""

    def __init__(self, errors: Sequence[dict[str, Any]]):
        super().__init__("; ".join(str(e["msg"]) for e in errors))
        self.errors = list(errors)


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


def store_result(
    *, session: Session, job_id: int, result: JobResult, runner_id: int, compare_max_attempts: int = 3
) -> tuple[int, bool]:  # fmt: skip
    """Store a runner's ``JobResult`` for ``job_id`` and finish the job; returns ``(result_id,
    duplicate)``.

    A repeated ``idempotency_key`` for the same job stores nothing and returns the first result's
    id with ``duplicate=True``. Cells are bulk-inserted, then one ``sample_blocks`` row of
    columnar arrays per cell with samples (``kernelab.service.contract.sample_blocks``); probe reports are
    stored
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
    # (kernelab.service.judge.verdicts.job_error).
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


def _cell_context(cell: CellResult) -> dict[str, Any]:
    """``cells.context``: how the cell was measured: the timer kind per variant, the contention
    readings, the checked samples through the timer, the runner's findings, the timer cross-check, the
    input-set placement, the energy blocks and the sides timed in Triton's interpreter (JSON; a key a
    result stored before it lacks reads as its default)."""
    return {
        "cross_check": None if cell.cross_check is None else cell.cross_check.model_dump(mode="json"),
        "placement": cell.placement.model_dump(mode="json"),
        "energy": None if cell.energy is None else cell.energy.model_dump(mode="json"),
        "timers": dict(cell.timers),
        "contention": [r.model_dump(mode="json") for r in cell.contention],
        "timed_checks": {v: [t.model_dump(mode="json") for t in ts] for v, ts in cell.timed_checks.items()},
        "findings": [f.model_dump(mode="json") for f in cell.findings],
        "phase_s": dict(cell.phase_s),
        "interpreted": list(cell.interpreted),
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
    return read_stored(JobResult, dict(
        idempotency_key=row.idempotency_key, job_id=job_id,
        spec=JobSpec.model_validate(row.spec, context=STORED),
        node=row.node, timer=row.timer, started_at=row.started_at,
        finished_at=row.finished_at, error=row.error,
        probes=list(reports),
        cells=[
            dict(
                index=c.cell_index, params=c.params, baseline_params=c.baseline_params,
                candidate_params=c.candidate_params, work=c.work, correctness=c.correctness,
                samples=samples.get(c.id) or SampleColumns(), error=c.error,
                timers=(c.context or {}).get("timers", {}),
                contention=(c.context or {}).get("contention", []),
                timed_checks=(c.context or {}).get("timed_checks", {}),
                findings=(c.context or {}).get("findings", []),
                phase_s=(c.context or {}).get("phase_s", {}),
                interpreted=(c.context or {}).get("interpreted", []),
                cross_check=(c.context or {}).get("cross_check"),
                placement=(c.context or {}).get("placement") or {},
                energy=(c.context or {}).get("energy"),
                static=c.static,
            )
            for c in cells
        ],
    ))  # fmt: skip


def result_id(*, session: Session, job_id: int) -> int | None:
    """The id of ``job_id``'s stored result, None without one."""
    return session.scalar(select(Result.id).where(Result.job_id == job_id))


def has_result(*, session: Session, job_id: int) -> bool:
    """Whether a result is stored for ``job_id``."""
    return session.scalar(select(Result.id).where(Result.job_id == job_id)) is not None
