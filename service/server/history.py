"""A benchmark's results over time, like with like: the history of revision and ordinary jobs.

Data model (``history_points``, ``models.HistoryPoint``): one point per side and sweep cell of a
stored result, holding

* *what code*: ``code``, the branch of a side measured from a source revision (with its ``sha``),
  else the side's variant and its parameters (``torch``, ``triton (BLOCK_M=64)``);
* *on what hardware*: ``gpu_model`` (``NodeInfo.device_name``, else the device type) and the
  node's ``fingerprint`` (the driver version);
* *timed how*: ``timer`` (the side's timer: ``cuda-graph``, ``cuda-event``, ``perf_counter``) and
  ``state`` (``cold``: L2 flushed before each sample, ``warm``: not);
* the side's median time per launch over its kept samples, the cell's verdict, when it was
  measured, and ``excluded``: why history views leave it out by default (None: shown).

A point is excluded by default when its node's stored health judgement has flags
(``node-flagged``: degraded or contended, as the comparison's note says) or when the cell's
deciding reasons make that side's time no time of the kernel (``problem-verdict``: failed,
incorrect, nondeterministic or implausible).

Each point carries the 95% CI of its median (the round bootstrap of the comparison,
``SideStats.median_ci_low_ns``; None for comparisons stored before it existed).

Lines (``Series``) are per (code, cell, GPU model, timer, state): an H200 at 100 us and an A100 at
51 us are two lines, never one line read as a 2x improvement. Each shown point's ``change_pct`` is
against the previous shown point of its line measured with the same fingerprint; a point after a
driver change, or the first of its line, has no change and says why (``change_reason``). So a
change of hardware or driver is never a regression or an improvement. Each line also carries
the change points detected in it (``kernelab.service.judge.changepoints``: PELT, its source there),
and ``regressions`` lists, across the fleet, the lines whose latest change point made them slower.

Points are built from the stored comparison and judgement (``build_points``), never from a
comparison computed here: by the compare worker once it stored the comparison
(``kernelab.service.server.compare_worker``), and by readers for results whose points are missing or were
built by older verdict rules (``results.history_version``). A result whose comparison is still
being computed has no points yet.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    STORED,
    CellComparison,
    Comparison,
    Excluded,
    HistoryPage,
    HistoryPoint,
    JobSpec,
    NodeInfo,
    Regression,
    RegressionsPage,
    Series,
    Side,
    SideSpec,
)
from kernelab.service.judge import changepoints, verdicts
from kernelab.service.server import crud, node_health
from kernelab.service.server.core.config import Settings
from kernelab.service.server.models import HistoryPoint as PointRow
from kernelab.service.server.models import Job, Result

log = logging.getLogger(__name__)

DEFAULT_JOBS = 50  # most recent results read per history
DEFAULT_REGRESSIONS = 100  # regressions listed, newest first
REGRESSION_BENCHMARKS = 50  # benchmarks (with the latest results) the regression list reads
EXCLUDED_MEANING: dict[str, str] = {
    "node-flagged": "measured on a node whose health probes were degraded or contended",
    "problem-verdict": "the cell's verdict makes this side's time no time of the kernel "
    "(failed, incorrect, nondeterministic or implausible)",
}
CHANGE_MEANING: dict[str, str] = {
    "first-point": "the first point of its line with this driver: nothing earlier to compare with",
    "fingerprint-changed": "the node's driver differs from the previous point's: a change of the "
    "platform is no change of the code",
    "excluded": "excluded from history views by default: no change is computed",
}


# --------------------------------------------------------------------------------------------------
# Building the points of a result
# --------------------------------------------------------------------------------------------------


def code_of(side: SideSpec) -> str:
    """``"torch"`` or ``"triton (BLOCK_M=64, num_warps=4)"``: a side's variant and all its
    parameters, sorted (stable across jobs, unlike a label that shows only what differs)."""
    if not side.params:
        return side.variant
    return f"{side.variant} ({', '.join(f'{k}={side.params[k]}' for k in sorted(side.params))})"


def gpu_model(node: NodeInfo) -> str:
    """The hardware a point was measured on: the device's name, else its type (``cpu``)."""
    return node.device_name or node.device_type


def _excluded(cell: CellComparison, side: Side, flagged: bool) -> Excluded | None:
    if flagged:
        return "node-flagged"
    for r in cell.reasons:
        kind = verdicts.REASONS.get(r.code)
        if kind is not None and kind.verdict in verdicts.PROBLEM_VERDICTS and r.side in (None, side):
            return "problem-verdict"
    return None


def _rows(row: Result, spec: JobSpec, comparison: Comparison, flagged: bool) -> list[dict[str, Any]]:
    node = comparison.node
    revisions = node.revisions
    state = "cold" if spec.measurement.l2_flush else "warm"
    out = []
    for side in ("baseline", "candidate"):
        rev = getattr(revisions, side) if revisions is not None else None
        from_revision = rev is not None and bool(rev.sha)
        code = (rev.branch or rev.ref) if from_revision and rev is not None else code_of(getattr(spec, side))
        for cell in comparison.cells:
            stats = cell.baseline if side == "baseline" else cell.candidate
            if stats.median_ns is None:
                continue
            out.append({
                "result_id": row.id, "job_id": row.job_id, "benchmark": spec.benchmark,
                "cell_index": cell.index, "cell": cell.label, "params": cell.params, "side": side,
                "code": code, "sha": rev.sha if from_revision and rev is not None else "",
                "gpu_model": gpu_model(node), "fingerprint": {"driver": node.driver_version},
                "timer": cell.timers.get(side) or row.timer, "state": state, "median_ns": stats.median_ns,
                "ci_low_ns": stats.median_ci_low_ns, "ci_high_ns": stats.median_ci_high_ns,
                "n": stats.n, "verdict": cell.verdict, "measured_at": row.finished_at,
                "node_name": row.node_name, "excluded": _excluded(cell, side, flagged),  # type: ignore[arg-type]
            })  # fmt: skip
    return out


def build_points(*, session: Session, job_id: int, settings: Settings) -> bool:
    """(Re)build the history points of ``job_id``'s stored result from its stored comparison and
    health judgement (the judgement made and stored on a miss); the caller commits. Returns False
    when the job has no result or no stored comparison yet, or another transaction built the
    points first."""
    row = session.scalar(select(Result).where(Result.job_id == job_id))
    if row is None:
        return False
    comparison = crud.base_comparison(session=session, job_id=job_id)
    judgement = node_health.job_judgement(session=session, job_id=job_id, settings=settings)
    if comparison is None or judgement is None:
        return False
    spec = JobSpec.model_validate(row.spec, context=STORED)
    rows = _rows(row, spec, comparison, flagged=bool(judgement.flags))
    try:
        with session.begin_nested():
            session.execute(delete(PointRow).where(PointRow.result_id == row.id))
            if rows:
                session.execute(insert(PointRow), rows)
            session.execute(
                update(Result).where(Result.id == row.id).values(history_version=verdicts.METHOD_VERSION)
            )
    except IntegrityError:  # a concurrent reader built the same points first
        log.info("history points of job %s were built concurrently", job_id)
        return False
    return True


# --------------------------------------------------------------------------------------------------
# The query
# --------------------------------------------------------------------------------------------------


def _latest_results(session: Session, benchmark: str, limit: int) -> list[tuple[int, int | None, int | None]]:
    """``(result id, job id, history_version)`` of the ``limit`` latest results of ``benchmark``."""
    rows = session.execute(
        select(Result.id, Result.job_id, Result.history_version).join(Job, Job.id == Result.job_id)
        .where(Job.benchmark == benchmark).order_by(Result.finished_at.desc(), Result.id.desc()).limit(limit)
    )  # fmt: skip
    return [(r.id, r.job_id, r.history_version) for r in rows]


def _point(row: PointRow) -> HistoryPoint:
    return HistoryPoint(
        job_id=row.job_id, measured_at=row.measured_at, side=row.side, code=row.code, sha=row.sha,  # type: ignore[arg-type]
        cell=row.cell, cell_index=row.cell_index, params=dict(row.params or {}), gpu_model=row.gpu_model,
        driver=(row.fingerprint or {}).get("driver"), timer=row.timer, state=row.state,  # type: ignore[arg-type]
        median_ns=row.median_ns, ci_low_ns=row.ci_low_ns, ci_high_ns=row.ci_high_ns, n=row.n,
        verdict=row.verdict, node=row.node_name, excluded=row.excluded,  # type: ignore[arg-type]
    )  # fmt: skip


def lines(
    points: Iterable[HistoryPoint],
    *,
    min_change_pct: float = changepoints.DEFAULT_MIN_CHANGE_PCT,
) -> list[Series]:
    """``points`` (oldest first) grouped into lines per (code, cell, GPU model, timer, state), with
    each point's change against the previous shown point of its line with the same driver, and
    the line's change points (``kernelab.service.judge.changepoints.detect_by_driver`` over its shown
    points; excluded points never take part). A cell is its full parameters, not its label (two
    jobs that sweep M alike but fix N apart label a cell "M=4" alike: two lines)."""
    by_key: dict[tuple[str, str, str, str, str], list[HistoryPoint]] = {}
    for p in points:
        cell_key = json.dumps(p.params, sort_keys=True, default=str) if p.params else p.cell
        by_key.setdefault((p.code, cell_key, p.gpu_model, p.timer, p.state), []).append(p)
    out = []
    for (code, _, model, timer, state), pts in sorted(by_key.items()):
        cell = pts[-1].cell
        previous: HistoryPoint | None = None
        for p in pts:
            if p.excluded is not None:
                p.change_reason = "excluded"
                continue
            if previous is None:
                p.change_reason = "first-point"
            elif previous.driver != p.driver:
                p.change_reason = "fingerprint-changed"
            else:
                p.change_pct = (p.median_ns / previous.median_ns - 1) * 100 if previous.median_ns else None
                p.change_reason = None if p.change_pct is not None else "first-point"
            previous = p
        shown = [p for p in pts if p.excluded is None]
        runs, first = _one_run_per_job(shown)
        found = [
            cp.model_copy(update={"index": first[cp.index]})
            for cp in changepoints.detect_by_driver(runs, min_change_pct=min_change_pct)
        ]
        out.append(Series(code=code, cell=cell, gpu_model=model, timer=timer, state=state, points=pts,  # type: ignore[arg-type]
                          params=pts[-1].params, change_points=found))  # fmt: skip
    return out


def _one_run_per_job(points: Sequence[HistoryPoint]) -> tuple[list[HistoryPoint], list[int]]:
    """``points`` with each job's points merged into one (a job whose two sides ran the same code,
    an A/A job, gives its line two points of one run: their medians' geometric mean, the hull of
    their CIs), and for each run the position of its first point in ``points``. Change points are
    detected over runs: two points of one run would halve the first differences the run-to-run
    noise is estimated from (``changepoints.noise_sigma``)."""
    runs: list[HistoryPoint] = []
    first: list[int] = []
    by_job: dict[int, int] = {}
    for i, p in enumerate(points):
        k = by_job.get(p.job_id) if p.job_id is not None else None
        if k is None:
            if p.job_id is not None:
                by_job[p.job_id] = len(runs)
            runs.append(p)
            first.append(i)
            continue
        run = runs[k]
        lows = [x for x in (run.ci_low_ns, p.ci_low_ns) if x is not None]
        highs = [x for x in (run.ci_high_ns, p.ci_high_ns) if x is not None]
        runs[k] = run.model_copy(update={
            "median_ns": math.sqrt(run.median_ns * p.median_ns), "n": run.n + p.n,
            "ci_low_ns": min(lows) if len(lows) == 2 else None,
            "ci_high_ns": max(highs) if len(highs) == 2 else None,
        })  # fmt: skip
    return runs, first


def history(
    *,
    session: Session,
    benchmark: str,
    settings: Settings,
    include_excluded: bool = False,
    limit: int = DEFAULT_JOBS,
    min_change_pct: float = changepoints.DEFAULT_MIN_CHANGE_PCT,
) -> HistoryPage:
    """The history of ``benchmark`` over its ``limit`` latest results (revision and ordinary jobs
    alike): points built where missing or stale (the caller commits), grouped into ``lines`` with
    their change points (a shift of at least ``min_change_pct``). Points with an ``excluded``
    reason are left out (counted per reason) unless ``include_excluded``."""
    results = _latest_results(session, benchmark, limit)
    for _, job_id, version in results:
        if job_id is not None and (version is None or version < verdicts.METHOD_VERSION):
            build_points(session=session, job_id=job_id, settings=settings)
    ids = [result_id for result_id, _, _ in results]
    rows: Sequence[PointRow] = session.scalars(
        select(PointRow).where(PointRow.result_id.in_(ids)).order_by(PointRow.measured_at, PointRow.id)
    ).all() if ids else []  # fmt: skip
    points = [_point(r) for r in rows]
    excluded: dict[str, int] = {}
    for p in points:
        if p.excluded is not None:
            excluded[p.excluded] = excluded.get(p.excluded, 0) + 1
    shown = points if include_excluded else [p for p in points if p.excluded is None]
    return HistoryPage(benchmark=benchmark, include_excluded=include_excluded, results=len(results),
                       excluded=excluded, series=lines(shown, min_change_pct=min_change_pct),
                       method=changepoints.METHOD)  # fmt: skip


def regressions(
    *,
    session: Session,
    settings: Settings,
    limit: int = DEFAULT_REGRESSIONS,
    benchmarks: int = REGRESSION_BENCHMARKS,
    min_change_pct: float = changepoints.DEFAULT_MIN_CHANGE_PCT,
) -> RegressionsPage:
    """The fleet's regressions, newest first: every line (of the ``benchmarks`` benchmarks with the
    latest results, each over its ``DEFAULT_JOBS`` latest results) whose **latest** change point
    made it slower; a line that got slower and then recovered has a later ``faster`` change and is
    not listed. At most ``limit``. Builds missing points as ``history`` does (the caller commits)."""
    latest = func.max(Result.finished_at)
    names = session.scalars(
        select(Job.benchmark).join(Result, Result.job_id == Job.id).group_by(Job.benchmark)
        .order_by(latest.desc()).limit(benchmarks)
    ).all()  # fmt: skip
    found: list[Regression] = []
    for name in names:
        page = history(session=session, benchmark=name, settings=settings, min_change_pct=min_change_pct)
        for line in page.series:
            if line.change_points and line.change_points[-1].direction == "slower":
                found.append(Regression(benchmark=name, code=line.code, cell=line.cell, params=line.params,
                                        gpu_model=line.gpu_model, timer=line.timer, state=line.state,
                                        change=line.change_points[-1]))  # fmt: skip
    found.sort(key=lambda r: r.change.at, reverse=True)
    return RegressionsPage(method=changepoints.METHOD, benchmarks=len(names), data=found[:limit])


def all_points(page: HistoryPage) -> Sequence[HistoryPoint]:
    """Every point of ``page``'s lines, newest first (the table of the history page)."""
    return sorted((p for s in page.series for p in s.points), key=lambda p: p.measured_at, reverse=True)
