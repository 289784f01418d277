"""Job vs job: two stored jobs of one benchmark (yesterday's main and today's branch, or one spec on
two nodes) compared cell by cell on their stored samples.

Cells are matched by their full parameters (a cell present in one job only is listed, never
compared). For each matched cell, the same side of both jobs (``side``, default the candidate) is
compared, B against A, with the house's statistics (``kernelab.service.judge.estimators``) in their
**unpaired** form: the two jobs' rounds were not interleaved with each other, so the ratio of
medians B/A gets a percentile bootstrap CI that resamples whole rounds of A and whole rounds of B
*independently* (a two-sample cluster bootstrap, Davison & Hinkley 1997, sections 3.8 and 3.2),
not the paired resampling of one job's rounds (``estimators.ratio_ci``). That interval holds only
what varied within each run, never what changed between the runs, so the verdict rests on
``kernelab.service.judge.between_runs`` instead: the other side both jobs ran unchanged as a control,
else the cell's between-run noise from stored runs, else ``inconclusive`` (``no-run-noise``); the
unpaired interval only bounds the noise interval from below. The Hodges-Lehmann shift
with its distribution-free CI and the Mann-Whitney U p-value are two-sample statistics already
(Hollander & Wolfe 1999, section 4.3), the p-values Benjamini-Hochberg adjusted over the matched
cells. Kept samples follow each job's own ``exclude_throttled`` (``estimators.kept_arrays``).

The verdict has the usual precedence (``kernelab.service.judge.verdicts.decide``): a cell that failed in
either job is ``failed``, a side that was incorrect (or nondeterministic, implausible) in either
job's stored comparison makes it so, outranking any speed; then ``timing_verdict`` against the
larger of the two jobs' thresholds. Two jobs whose side was timed differently (timer kind, or
cold vs warm L2) are no measurement of a change: every cell is ``inconclusive`` with
``timer-mismatch``. The two nodes' health judgements are shown beside it, as they are: a flagged
node flags every cell (``degraded-node``/``contended``).

Where it is computed: a pair of jobs holding at most ``Settings.job_vs_job_inline_samples`` raw
samples together (20,000 by default) is computed in the request; a larger pair is queued as a
``pair`` task for a compare worker (``kernelab.service.server.compare_queue``), whose answer is stored
on the task and served from there (``request`` answers ``Pending`` until then, HTTP 202). A stored
answer judged by older verdict rules (``verdicts.METHOD_VERSION``), or before a node's health was
judged again, is queued again; a failed task after ``PAIR_RETRY_S``; a pair above
``Settings.job_vs_job_max_samples`` is refused (HTTP 413). ``N_RESAMPLES``
= 1,000 (Efron & Tibshirani 1993, section 19.3: about 1,000 for a percentile interval). Measured
on the shared 2-core machine under load average ~16 (``docs/results/2026-12-01-job-vs-job-cost.md``):
1.2-1.8 s of statistics for 20,000 samples (50 cells of 100 samples per job and side, or one cell
of 5,000), 4.4 s for 100,000.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelab.service.contract.probes.copy_bandwidth import PROBE as COPY
from kernelab.service.contract.schemas import (
    CellComparison,
    CellResult,
    Comparison,
    Flag,
    JobResult,
    JobSide,
    JobVsJob,
    JobVsJobCell,
    Reason,
    RunNoisePublic,
    Side,
    SideSpec,
    read_stored,
)
from kernelab.service.judge import between_runs, verdicts
from kernelab.service.judge.estimators import (
    KeptSamples,
    _median,
    _resampled_medians,
    _round_matrix,
    bh_adjusted,
    hodges_lehmann,
    kept_arrays,
    mann_whitney_p,
    variant_stats,
)
from kernelab.service.server import compare_queue, crud, node_health
from kernelab.service.server.core.clock import db_now
from kernelab.service.server.core.config import Settings
from kernelab.service.server.models import HistoryPoint as PointRow
from kernelab.service.server.models import Job

N_RESAMPLES = 1000  # bootstrap resamples of the unpaired ratio CI (module docstring)
SEED = 0
METHOD = (
    "per matched cell, the same side of both jobs, B against A, on one of two footings "
    "(kernelab.service.judge.between_runs): where both jobs ran the other side unchanged, the ratio of "
    "the jobs' own paired ratios (the other side as control, the two intervals in quadrature); "
    "else B's median over A's with an interval that holds the cell's between-run noise, pooled from "
    "stored runs of unchanged code on the node or GPU model (Student t, at least "
    f"{between_runs.MIN_NOISE_DF} degrees of freedom); without either, inconclusive. Hodges-Lehmann "
    "shift and Mann-Whitney U (Benjamini-Hochberg over the cells) are within-run statistics, shown; "
    "a failed or incorrect side in either job outranks any speed"
)
NOISE_RESULTS = 200  # latest results of the benchmark whose stored runs give the between-run noise
RETRY_AFTER_S = 2  # a pending pair's Retry-After, s: a worker claims within compare_poll_s (1 s)


class JobVsJobError(Exception):
    """Two jobs that cannot be compared: ``status`` (404 unknown job, 409 no stored result or
    comparison yet, 422 different benchmarks) and a message naming the job and the field."""

    def __init__(self, status: int, field: str, message: str):
        super().__init__(message)
        self.status, self.field, self.message = status, field, message


class Pending(NamedTuple):
    """Job vs job queued for a compare worker (``request``): the ``pair`` task's id and status
    (``queued`` or ``running``); ask again later (HTTP 202)."""

    task_id: int
    status: str


def unpaired_ratio_ci(
    a_rounds: np.ndarray, a_ns: np.ndarray, b_rounds: np.ndarray, b_ns: np.ndarray, *,
    confidence: float = 0.95, n_resamples: int = N_RESAMPLES, seed: int = SEED,
) -> tuple[float, float, float] | None:  # fmt: skip
    """Ratio of medians B/A ((n,) int64 rounds and (n,) float64 ns per job) and its percentile
    bootstrap CI, resampling each job's rounds independently (module docstring). None when a job
    has fewer than 2 samples or 2 rounds, or A's median is 0."""
    for rounds, ns in ((a_rounds, a_ns), (b_rounds, b_ns)):
        if ns.size < 2 or rounds.min() == rounds.max():
            return None
    base = _median(a_ns)
    if base <= 0.0:
        return None
    ratio = _median(b_ns) / base
    rng = np.random.default_rng(seed)
    medians = []
    for rounds, ns in ((a_rounds, a_ns), (b_rounds, b_ns)):
        distinct = np.unique(rounds)
        matrix = _round_matrix(rounds, ns, distinct)
        idx = rng.integers(0, distinct.size, size=(n_resamples, distinct.size))
        medians.append(_resampled_medians(matrix, idx))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = medians[1] / medians[0]
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return None
    alpha = 1.0 - confidence
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return ratio, float(low), float(high)


def _key(params: Mapping[str, object]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def _load(session: Session, job_id: int, field: str, settings: Settings) -> tuple[Job, Comparison]:
    job = session.get(Job, job_id)
    if job is None:
        raise JobVsJobError(404, field, f"{field}: there is no job #{job_id}")
    comparison = crud.base_comparison(session=session, job_id=job_id)
    if comparison is None:
        raise JobVsJobError(409, field, f"{field}: job #{job_id} has no stored comparison yet (no result, "
                                        "or still being compared)")  # fmt: skip
    return job, comparison


def _side(job_id: int, result: JobResult, comparison: Comparison, side: Side, health: object) -> JobSide:
    spec = result.spec
    copies: dict[str, list[float]] = {}
    for report in comparison.probes:
        copies.setdefault(report.phase, []).extend(c.bandwidth_gbps for c in COPY.readings(report))
    return JobSide(
        job_id=job_id, name=spec.name, node_name=result.node.hostname, node=result.node, timer=result.timer,
        label=comparison.baseline_label if side == "baseline" else comparison.candidate_label,
        state="cold" if spec.measurement.l2_flush else "warm", threshold_pct=spec.measurement.threshold_pct,
        copy_gbps={k: sum(v) / len(v) for k, v in copies.items() if v}, health=health,  # type: ignore[arg-type]
    )  # fmt: skip


def _problems(cell: CellComparison | None, side: Side, job: str) -> list[Reason]:
    """The deciding problem reasons of ``side`` in one job's stored cell, told as that job's."""
    if cell is None:
        return []
    out = []
    for r in cell.reasons:
        kind = verdicts.REASONS.get(r.code)
        if kind is not None and kind.verdict in verdicts.PROBLEM_VERDICTS and r.side in (None, side):
            out.append(r.model_copy(update={"message": f"job {job}: {r.message}"}))
    return out


def _timer(cell: CellResult, side: Side, result: JobResult) -> str:
    return cell.timers.get(side) or result.timer


def _pair(session: Session, a: int, b: int, settings: Settings) -> tuple[Job, Comparison, Job, Comparison]:
    """Both jobs and their stored comparisons; raises ``JobVsJobError`` (404, 409, 422)."""
    job_a, comp_a = _load(session, a, "a", settings)
    job_b, comp_b = _load(session, b, "b", settings)
    if job_a.benchmark != job_b.benchmark:
        message = f"b: job #{b} measured {job_b.benchmark!r}, job #{a} {job_a.benchmark!r}"
        raise JobVsJobError(422, "b", f"{message}: only jobs of one benchmark compare")
    return job_a, comp_a, job_b, comp_b


def request(
    *, session: Session, a: int, b: int, settings: Settings, side: Side = "candidate"
) -> JobVsJob | Pending:
    """Job ``b`` against job ``a`` as a reader asks for it (module docstring, "Where it is
    computed"): the answer, computed now for a pair within ``Settings.job_vs_job_inline_samples``
    or read from its stored ``pair`` task, else ``Pending`` (the task queued, or still open).
    Raises ``JobVsJobError`` (404, 409, 422; 409 too when the compare worker failed on the pair,
    with its error); the caller commits (the queued task, the jobs' first health judgements)."""
    loaded = _pair(session, a, b, settings)
    total = crud.count_samples(session=session, job_id=a) + crud.count_samples(session=session, job_id=b)
    if total <= settings.job_vs_job_inline_samples:
        return _compare(session, a, b, settings, side, loaded)
    del loaded
    if total > settings.job_vs_job_max_samples:
        raise JobVsJobError(413, "b", f"b: jobs #{a} and #{b} hold {total} samples together, more than the "
                                      f"{settings.job_vs_job_max_samples} a compare worker compares "
                                      "(KERNELAB_JOB_VS_JOB_MAX_SAMPLES); compare sub-sweeps")  # fmt: skip
    state = compare_queue.pair_state(session, a=a, b=b, side=side)
    if state is not None and state.status in compare_queue.OPEN:
        return Pending(state.id, state.status)
    if state is not None and state.status == "done":
        answer = _stored_answer(session, state.output, a, b, settings)
        if answer is not None:
            return answer
    elif state is not None and state.status == "failed" and not _retry_due(session, state):
        raise JobVsJobError(409, "b", f"b: comparing job #{b} against job #{a} failed on the compare "
                                      f"worker: {state.error} (asked again after {PAIR_RETRY_S:.0f} s, it "
                                      "is queued again)")  # fmt: skip
    compare_queue.enqueue_pair(session, a=a, b=b, side=side, max_attempts=settings.compare_max_attempts)
    queued = compare_queue.pair_state(session, a=a, b=b, side=side)
    if queued is None:  # the insert failed on a foreign key: a job went while this request ran
        raise JobVsJobError(404, "b", f"b: job #{a} or #{b} is gone")
    return Pending(queued.id, queued.status)


PAIR_RETRY_S = 600.0
"""A failed ``pair`` task is queued again by a request this long after it failed (the database's
clock): a worker killed on it (out of memory) or a job's comparison recomputed meanwhile is not a
failure for ever, and a statistics error is not retried on every poll."""


def _retry_due(session: Session, state: compare_queue.PairState) -> bool:
    if state.finished_at is None:
        return True
    now = session.scalar(select(db_now()))
    assert now is not None
    return (now - state.finished_at).total_seconds() >= PAIR_RETRY_S


def _stored_answer(
    session: Session, output: Mapping[str, object] | None, a: int, b: int, settings: Settings
) -> JobVsJob | None:
    """The answer a ``pair`` task stored, or None when it must be computed again: none stored, one
    judged by older verdict rules, one that no longer parses, or one whose nodes' health judgements
    were re-judged since (the answer's flags and health came from the older ones)."""
    if output is None:
        return None
    version = output.get("method_version")
    if not isinstance(version, int) or version < verdicts.METHOD_VERSION:
        return None
    try:
        answer = read_stored(JobVsJob, output["answer"])
    except (KeyError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
    current = [node_health.job_judgement(session=session, job_id=j, settings=settings) for j in (a, b)]
    if [answer.a.health, answer.b.health] != current:
        return None
    return answer


def stored_output(answer: JobVsJob) -> dict[str, object]:
    """What a ``pair`` task keeps (``CompareTask.output``): the answer's JSON and the verdict rules'
    ``method_version`` it was judged by."""
    return {"method_version": verdicts.METHOD_VERSION, "answer": answer.model_dump(mode="json")}


def compare_jobs(
    *, session: Session, a: int, b: int, settings: Settings, side: Side = "candidate"
) -> JobVsJob:
    """Job ``b`` against job ``a``, cell by cell (module docstring), computed now whatever its size
    (``request`` decides where). Raises ``JobVsJobError`` (404, 409, 422) naming the query field
    ``a`` or ``b``; the caller commits (a first read stores the jobs' health judgements)."""
    return _compare(session, a, b, settings, side, _pair(session, a, b, settings))


def _compare(
    session: Session, a: int, b: int, settings: Settings, side: Side,
    loaded: tuple[Job, Comparison, Job, Comparison],
) -> JobVsJob:  # fmt: skip
    job_a, comp_a, job_b, comp_b = loaded
    res_a = crud.load_result(session=session, job_id=a)
    res_b = crud.load_result(session=session, job_id=b)
    assert res_a is not None and res_b is not None  # a stored comparison has a result
    health = [node_health.job_judgement(session=session, job_id=j, settings=settings) for j in (a, b)]
    cells_b = {_key(c.params): c for c in res_b.cells}
    stored_a = {c.index: c for c in comp_a.cells}
    stored_b = {c.index: c for c in comp_b.cells}
    pairs = [(ca, cells_b[_key(ca.params)]) for ca in res_a.cells if _key(ca.params) in cells_b]
    matched = {_key(ca.params) for ca, _ in pairs}
    threshold = max(res_a.spec.measurement.threshold_pct, res_b.spec.measurement.threshold_pct)
    side_a, side_b = _side(a, res_a, comp_a, side, health[0]), _side(b, res_b, comp_b, side, health[1])
    node_flags: list[Flag] = sorted({f for h in health if h is not None for f in h.flags})  # type: ignore[misc]
    control: Side = "baseline" if side == "candidate" else "candidate"
    shared = _code(res_a, control) == _code(res_b, control)
    points = _noise_points(session, job_a.benchmark, side_a.node, side_b.node, exclude=(a, b))
    same_node = side_a.node_name == side_b.node_name
    kept = []
    for ca, cb in pairs:
        ka = None if ca.error else kept_arrays(ca, exclude_throttled=res_a.spec.measurement.exclude_throttled)
        kb = None if cb.error else kept_arrays(cb, exclude_throttled=res_b.spec.measurement.exclude_throttled)
        kept.append((ka, kb))
    p_values = mann_whitney_p([None if ka is None or kb is None else (ka.times[side], kb.times[side])
                               for ka, kb in kept])  # fmt: skip
    cells = [
        _cell(ca, cb, ka, kb, p, side, threshold, stored_a.get(ca.index), stored_b.get(cb.index),
              res_a, res_b, side_a, side_b, node_flags, shared,
              _noise(points, ca, res_a, side, side_a, same_node, exclude=(a, b)))
        for (ca, cb), (ka, kb), p in zip(pairs, kept, p_values, strict=True)
    ]  # fmt: skip
    tested = [c for c in cells if c.p_value is not None]
    if tested:
        adjusted = bh_adjusted([p for c in tested if (p := c.p_value) is not None])
        for c, p_adj in zip(tested, adjusted, strict=True):
            c.p_adjusted = float(p_adj)
    notes = []
    if side_a.node.device_name != side_b.node.device_name:
        models = [s.node.device_name or s.node.device_type for s in (side_a, side_b)]
        notes.append(f"the jobs ran on different GPU models ({models[0]} vs {models[1]}): "
                     "a difference may be the hardware's")  # fmt: skip
    if side_a.node.driver_version != side_b.node.driver_version:
        notes.append(f"the drivers differ ({side_a.node.driver_version} vs {side_b.node.driver_version})")
    return JobVsJob(
        benchmark=job_a.benchmark, side=side, method=METHOD, a=side_a, b=side_b, threshold_pct=threshold,
        cells=cells, only_in_a=[comp_a.cells[i].label for i, c in enumerate(res_a.cells)
                                if _key(c.params) not in matched and i < len(comp_a.cells)],
        only_in_b=[comp_b.cells[i].label for i, c in enumerate(res_b.cells)
                   if _key(c.params) not in matched and i < len(comp_b.cells)],
        summary=verdicts.summary([c.verdict for c in cells]), notes=notes,
    )  # fmt: skip


def _code(result: JobResult, side: Side) -> tuple[str, str]:
    """What code ``side`` of a job ran: (the history's code, the source revision's sha or "")."""
    from kernelab.service.server.history import code_of

    revisions = result.node.revisions
    rev = getattr(revisions, side) if revisions is not None else None
    if rev is not None and rev.sha:
        return ("", rev.sha)
    spec_side: SideSpec = getattr(result.spec, side)
    return (code_of(spec_side), "")


def _noise_points(
    session: Session, benchmark: str, node_a: object, node_b: object, *, exclude: tuple[int, int]
) -> list[dict[str, object]]:
    """Stored run medians (history points shown by default) of ``benchmark`` on the GPU model
    both jobs ran on (none where they differ), from its ``NOISE_RESULTS`` latest results."""
    from kernelab.service.server.history import gpu_model

    model_a, model_b = gpu_model(node_a), gpu_model(node_b)  # type: ignore[arg-type]
    if model_a != model_b:
        return []
    latest = (
        select(Job.id).where(Job.benchmark == benchmark, Job.id.not_in(exclude))
        .order_by(Job.id.desc()).limit(NOISE_RESULTS).scalar_subquery()
    )  # fmt: skip
    rows = session.execute(
        select(PointRow.job_id, PointRow.code, PointRow.sha, PointRow.node_name, PointRow.median_ns,
               PointRow.params, PointRow.timer, PointRow.state)
        .where(PointRow.benchmark == benchmark, PointRow.gpu_model == model_a, PointRow.excluded.is_(None),
               PointRow.job_id.in_(latest))
    )  # fmt: skip
    return [
        {"job_id": r.job_id, "code": r.code, "sha": r.sha, "node": r.node_name, "median_ns": r.median_ns,
         "key": _key(r.params or {}), "timer": r.timer, "state": r.state}
        for r in rows
    ]  # fmt: skip


def _noise(
    points: Sequence[dict[str, object]], cell: CellResult, result: JobResult, side: Side, job_side: JobSide,
    same_node: bool, *, exclude: tuple[int, int],
) -> between_runs.RunNoise | None:  # fmt: skip
    """The cell's between-run noise (``between_runs.run_to_run_noise``) from ``points`` of its
    parameters, timer and state: on the jobs' node where both ran on one and it has enough runs,
    else on the GPU model."""
    key, timer = _key(cell.params), _timer(cell, side, result)
    mine = [p for p in points if p["key"] == key and p["timer"] == timer and p["state"] == job_side.state]
    scopes: list[tuple[str | None, str]] = [(job_side.node_name, "node")] if same_node else []
    for node, scope in [*scopes, (None, "gpu-model")]:
        groups = between_runs.noise_groups(mine, exclude_jobs=exclude, node=node)
        found = between_runs.run_to_run_noise(groups, scope=scope)
        if found is not None:
            return found
    return None


def _controlled_numbers(
    stored_a: CellComparison | None, stored_b: CellComparison | None, side: Side
) -> tuple[float, float, float] | None:
    """Each job's own paired ratio of the cell, combined (``between_runs.controlled``), where both
    jobs stored one with its interval and the control side (the other one) has no deciding problem
    in either (a wrong control's time is no time of the kernel; the compared side's problems
    decide the verdict anyway)."""
    control: Side = "baseline" if side == "candidate" else "candidate"
    triples = []
    for cell in (stored_a, stored_b):
        if cell is None or cell.ratio is None or cell.ci_low is None or cell.ci_high is None:
            return None
        if _problems(cell, control, "") or min(cell.ratio, cell.ci_low, cell.ci_high) <= 0:
            return None
        triples.append((cell.ratio, cell.ci_low, cell.ci_high))
    return between_runs.controlled(triples[0], triples[1], compared=side)


def _no_footing(side: Side, job_side: JobSide, shared: bool) -> Reason:
    control = "baseline" if side == "candidate" else "candidate"
    where = job_side.node_name
    if shared:
        message = (f"the jobs ran the same {control}, but a job's own ratio of this cell has no interval "
                   "or has a problem verdict (no control), and the stored runs")  # fmt: skip
    else:
        message = f"the jobs ran different {control}s (no control), and the stored runs"
    message += (f" of unchanged code of this cell on {where}'s GPU model give fewer than "
                f"{between_runs.MIN_NOISE_DF} degrees of freedom of between-run noise: job vs job cannot "
                f"tell a change from drift; run the {control} of job A again on this node (a job of the "
                f"same {control}, or an A/A job), or compare jobs that ran the same {control}")  # fmt: skip
    return verdicts.reason("no-run-noise", message)


def _cell(
    ca: CellResult, cb: CellResult, ka: KeptSamples | None, kb: KeptSamples | None, p: float | None,
    side: Side, threshold: float,
    stored_a: CellComparison | None, stored_b: CellComparison | None, res_a: JobResult, res_b: JobResult,
    side_a: JobSide, side_b: JobSide, node_flags: Sequence[Flag], shared: bool,
    noise: between_runs.RunNoise | None,
) -> JobVsJobCell:  # fmt: skip
    found: list[Reason] = []
    for cell, job in ((ca, "A"), (cb, "B")):
        if cell.error:
            found.append(verdicts.reason("side-failed", f"job {job}: {cell.error}"))
    found += _problems(stored_a, side, "A") + _problems(stored_b, side, "B")
    ta, tb = _timer(ca, side, res_a), _timer(cb, side, res_b)
    if (ta, side_a.state) != (tb, side_b.state):
        found.append(
            verdicts.reason(
                "timer-mismatch", f"job A timed it {ta}/{side_a.state}, job B {tb}/{side_b.state}"
            )
        )
    stats_a = stats_b = variant_stats(np.empty(0))
    numbers: dict[str, float | None] = {}
    basis: Literal["control", "run-noise", "none"] = "none"
    if ka is not None and kb is not None:
        xa, xb = ka.times[side], kb.times[side]
        ra = ka.rounds[ka.candidate == (side == "candidate")]
        rb = kb.rounds[kb.candidate == (side == "candidate")]
        stats_a, stats_b = variant_stats(xa), variant_stats(xb)
        rc = unpaired_ratio_ci(ra, xa, rb, xb)
        if rc is not None:
            numbers["medians_ratio"] = rc[0]
        if xa.size and xb.size:
            hl = hodges_lehmann(xa, xb)
            numbers.update(hl_shift_ns=hl[0], hl_ci_low_ns=hl[1], hl_ci_high_ns=hl[2])
        footing = _controlled_numbers(stored_a, stored_b, side) if shared else None
        if footing is not None:
            basis = "control"
        elif noise is not None and rc is not None and rc[0] > 0:
            footing = (rc[0], *between_runs.with_run_noise(rc[0], noise, (rc[1], rc[2])))
            basis = "run-noise"
        if footing is not None:
            numbers.update(ratio=footing[0], ci_low=footing[1], ci_high=footing[2],
                           delta_pct=(footing[0] - 1) * 100)  # fmt: skip
        elif not found:
            found.append(_no_footing(side, side_a, shared))
    timing, why = verdicts.timing_verdict(numbers.get("ratio"), numbers.get("ci_low"), numbers.get("ci_high"),
                                          threshold)  # fmt: skip
    if why is not None and not any(r.code == "no-run-noise" for r in found):
        found.append(why)
    decision = verdicts.decide(timing, found)
    label = stored_b.label if stored_b is not None else ", ".join(f"{k}={v}" for k, v in cb.params.items())
    return JobVsJobCell(
        params=ca.params, label=label, index_a=ca.index, index_b=cb.index, a=stats_a, b=stats_b,
        p_value=p, verdict=decision.verdict, timing_verdict=timing, reasons=decision.reasons,
        flags=verdicts.sorted_flags([*decision.flags, *node_flags]),
        verdict_a=stored_a.verdict if stored_a else None, verdict_b=stored_b.verdict if stored_b else None,
        basis=basis, noise=None if noise is None else RunNoisePublic(
            sigma_pct=100 * noise.sigma_ln, df=noise.df, runs=noise.runs, codes=noise.codes,
            scope=noise.scope,  # type: ignore[arg-type]
        ),
        **numbers,  # type: ignore[arg-type]
    )  # fmt: skip
