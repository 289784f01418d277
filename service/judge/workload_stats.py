"""A workload result judged: per phase and metric a verdict across runs, per-rank times, the
consistency table between arms, the timeline of runs and probes, and the node flags.

* **Values.** A phase's value in one run is the slowest rank's seconds (a phase repeated in the
  run adds up per rank first): the step waits for its slowest rank. A metric's value in one run is
  the mean over all its records (ranks and repeats). Only runs that finished (``ok``) count.
* **Pairing.** Runs ``2k`` and ``2k + 1`` hold one run of each arm (``kernelab.runners.workload.
  run_order``): that pair is one round of ``kernelab.service.judge.estimators.ratio_ci_arrays``, the
  cluster bootstrap over rounds (percentile CI of the ratio of medians candidate/baseline,
  Efron & Tibshirani 1993, ch. 13). So the CI is *paired* by adjacent A/B runs, which cancels a
  drift of the node slower than one pair; a pair whose other run failed still counts its one run.
* **Verdict** (``kernelab.service.judge.verdicts.timing_verdict`` against ``threshold_pct``), with the
  house precedence: ``failed`` (no finished run of an arm holds the quantity) > ``inconclusive``
  (fewer than ``MIN_PAIRS`` pairs with both arms' value; a sick-node run or a probe that changed
  between runs; a CI across the threshold) > ``faster``/``slower``/``same`` for phases (lower is
  better), ``better``/``worse``/``same`` for metrics by the metric's ``better``.
* **Sick node** (``sick-node``): a finished run every one of whose phases took at least
  ``SICK_RATIO`` times the median of the other finished runs of its arm (needs 3 finished runs of
  the arm and 2 phases): the whole run slowed together, which is what a node does (the fourth
  seed: 69 s to 276 s per round, uniformly across phases), not what a kernel change does.
* **Probe changed** (``probe-changed``): the probe after a run against the probe before the first
  run, by ``kernelab.service.judge.node_change.node_change_reasons`` (copy bandwidth 10%, all-reduce
  busbw 15%, latency 50% and 2 us; a CPU node is not judged), and ``other-processes``: more
  processes of other tenants on the GPUs than before the first run (NVML's process list).

Pure functions over ``kernelab.service.contract.schemas``; the compare worker or the CLI calls them.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import numpy as np

from kernelab.service.contract.probes.all_reduce import PROBE as ALL_REDUCE
from kernelab.service.contract.probes.copy_bandwidth import PROBE as COPY
from kernelab.service.contract.probes.telemetry import PROBE as TELEMETRY
from kernelab.service.contract.schemas import (
    ConsistencyRow,
    DigestRecord,
    MetricRecord,
    PhaseRecord,
    ProbeReport,
    QuantityVerdict,
    RankTime,
    RunLine,
    Side,
    SideSummary,
    WorkloadComparison,
    WorkloadReason,
    WorkloadResult,
    WorkloadRun,
    WorkloadVerdict,
)
from kernelab.service.judge.estimators import ratio_ci_arrays
from kernelab.service.judge.node_change import node_change_reasons
from kernelab.service.judge.verdicts import MIN_ROUNDS, timing_verdict

MIN_PAIRS = MIN_ROUNDS
"""Pairs of runs holding both arms' value before a verdict: the kernel cells' minimum of rounds
(``kernelab.service.judge.verdicts.MIN_ROUNDS``); a bootstrap over fewer pairs has too few distinct
resamples (3 pairs: 10) for its percentiles to mean anything."""
SICK_RATIO = 1.25
"""A run whose every phase is at least this many times its arm's median of the other runs is the
sick-node signature (module docstring). The seed's degraded node was 4x; a 25% uniform slow-down
is beyond the run-to-run spread of a whole workload on a healthy node (a few %)."""
PAIRING = (
    "paired: runs 2k and 2k+1 (one of each arm) form one round of a cluster bootstrap of the ratio of "
    "medians (kernelab.service.judge.estimators.ratio_ci_arrays, 2000 resamples, 95%)"
)
Kind = Literal["phase", "metric"]
Better = Literal["higher", "lower"]
Severity = Literal["error", "warning", "info"]
_SIDES: tuple[Side, Side] = ("baseline", "candidate")


def _why(code: str, message: str, severity: Severity = "warning") -> WorkloadReason:
    return WorkloadReason(code=code, message=message[:2000], severity=severity)


def _phase_values(run: WorkloadRun) -> dict[str, dict[int, float]]:
    """phase -> rank -> seconds (repeats summed) of one run."""
    out: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for r in run.records:
        if isinstance(r, PhaseRecord):
            out[r.name][r.rank] += r.seconds
    return {k: dict(v) for k, v in out.items()}


def _metric_values(run: WorkloadRun) -> dict[str, tuple[float, str, Better]]:
    """metric -> (mean over records, unit, better) of one run."""
    acc: dict[str, list[MetricRecord]] = defaultdict(list)
    for r in run.records:
        if isinstance(r, MetricRecord):
            acc[r.name].append(r)
    return {k: (float(np.mean([m.value for m in v])), v[0].unit, v[0].better) for k, v in acc.items()}


def _sick_runs(runs: Sequence[WorkloadRun]) -> dict[int, str]:
    """run index -> why it carries the sick-node signature (module docstring)."""
    out: dict[int, str] = {}
    for side in _SIDES:
        mine = [
            (r.index, {p: max(v.values()) for p, v in _phase_values(r).items()})
            for r in runs
            if r.side == side and r.outcome == "ok"
        ]
        if len(mine) < 3:
            continue
        for index, phases in mine:
            if len(phases) < 2:
                continue
            ratios = {}
            for p, v in phases.items():
                others = [o[p] for i, o in mine if i != index and p in o]
                if len(others) >= 2 and np.median(others) > 0:
                    ratios[p] = v / float(np.median(others))
            if len(ratios) >= 2 and min(ratios.values()) >= SICK_RATIO:
                lo, hi = min(ratios.values()), max(ratios.values())
                out[index] = (
                    f"run {index} ({side}): every phase took {lo:.2f}x to {hi:.2f}x its arm's median of the "
                    f"other runs ({len(ratios)} phases): the whole run slowed together, the signature of a "
                    "sick node, not of a kernel change"
                )
    return out


def _others(report: ProbeReport | None) -> int | None:
    telemetry = TELEMETRY.readings(report) if report is not None else []
    if not telemetry:
        return None
    return sum(len(t.other_processes) for t in telemetry)


def _probe_changes(result: WorkloadResult) -> dict[int, list[str]]:
    """run index -> what the probe after it shows changed against the probe before the first run."""
    before = result.probe_before
    if before is None:
        return {}
    out: dict[int, list[str]] = {}
    base = before.model_copy(update={"phase": "before"})
    others_before = _others(before) or 0
    for run in result.runs:
        if run.probe_after is None:
            continue
        found = [
            r.message
            for r in node_change_reasons(
                [base, run.probe_after.model_copy(update={"phase": "after"})],
                device_type=result.node.device_type,
            )
        ]
        others = _others(run.probe_after)
        if others is not None and others > others_before:
            found.append(
                f"after run {run.index}: {others} process(es) of others on the GPUs, {others_before} before "
                "the first run (they hold GPU memory and time)"
            )
        if found:
            out[run.index] = found
    return out


def _verdict_of(
    kind: Kind, better: Better, ratio: float | None, lo: float | None, hi: float | None, threshold_pct: float
) -> tuple[WorkloadVerdict, WorkloadReason | None]:
    timing, why = timing_verdict(ratio, lo, hi, threshold_pct)
    reason = None if why is None else _why(why.code, why.message)
    if timing in ("same", "inconclusive") or kind == "phase" and better == "lower":
        return timing, reason
    lower_is_good = better == "lower"
    good = (timing == "faster") == lower_is_good
    return ("better" if good else "worse"), reason


def _quantity(
    kind: Kind,
    name: str,
    unit: str,
    better: Better,
    values: dict[int, float],
    runs: Sequence[WorkloadRun],
    threshold_pct: float,
    seed: int,
    node_reasons: list[WorkloadReason],
) -> QuantityVerdict:
    side_of = {r.index: r.side for r in runs}
    per_side = {s: [values[i] for i in sorted(values) if side_of[i] == s] for s in _SIDES}
    summaries = {
        s: SideSummary(runs=len(v), median=float(np.median(v)) if v else None, values=v)
        for s, v in per_side.items()
    }
    reasons: list[WorkloadReason] = []
    ratio = lo = hi = None
    verdict: WorkloadVerdict
    missing = [s for s in _SIDES if not per_side[s]]
    if missing:
        verdict = "failed"
        reasons.append(
            _why("absent", f"no finished run of the {' and '.join(missing)} holds {kind} {name!r}", "error")
        )
    else:
        idx = np.array(sorted(values), dtype=np.int64)
        cand = np.array([side_of[i] == "candidate" for i in idx])
        vals = np.array([values[i] for i in idx], dtype=np.float64)
        pairs = idx // 2
        both = len(set(pairs[cand]) & set(pairs[~cand]))
        got = ratio_ci_arrays(cand, pairs, vals, confidence=0.95, n_resamples=2000, seed=seed)
        if got is not None:
            ratio, lo, hi = got
        verdict, why = _verdict_of(kind, better, ratio, lo, hi, threshold_pct)
        if why is not None:
            reasons.append(why)
        if both < MIN_PAIRS:
            verdict = "inconclusive"
            reasons.insert(
                0,
                _why(
                    "too-few-runs",
                    f"{both} pair(s) of runs hold both arms' {name!r}: a verdict needs "
                    f"at least {MIN_PAIRS} (MIN_PAIRS)",
                    "error",
                ),
            )
        if node_reasons and verdict not in ("failed", "inconclusive"):
            verdict = "inconclusive"
        reasons.extend(node_reasons)
    return QuantityVerdict(
        kind=kind,
        name=name,
        unit=unit,
        better=better,
        baseline=summaries["baseline"],
        candidate=summaries["candidate"],
        ratio=ratio,
        ci_low=lo,
        ci_high=hi,
        delta_pct=None if ratio is None else 100 * (ratio - 1),
        verdict=verdict,
        reasons=reasons,
    )


def _rank_times(name: str, runs: Sequence[WorkloadRun]) -> list[RankTime]:
    out = []
    for side in _SIDES:
        per_rank: dict[int, list[float]] = defaultdict(list)
        for r in runs:
            if r.side == side and r.outcome == "ok":
                for rank, s in _phase_values(r).get(name, {}).items():
                    per_rank[rank].append(s)
        if per_rank:
            medians = {rank: float(np.median(v)) for rank, v in sorted(per_rank.items())}
            out.append(
                RankTime(side=side, medians_s=medians, slowest_rank=max(medians, key=medians.__getitem__))
            )
    return out


def _digests(run: WorkloadRun) -> dict[str, dict[int, DigestRecord]]:
    out: dict[str, dict[int, DigestRecord]] = defaultdict(dict)
    for r in run.records:
        if isinstance(r, DigestRecord):
            out[r.name][r.rank] = r  # the last digest of a name per rank
    return out


def _values(d: DigestRecord) -> np.ndarray | None:
    if d.values_b64 is None:
        return None
    return np.frombuffer(base64.b64decode(d.values_b64), dtype="<f8")


def _compare_digests(
    name: str, a: dict[int, DigestRecord], b: dict[int, DigestRecord]
) -> tuple[int | None, int | None, float | None, bool, str]:
    """(elements, mismatches, max |diff|, bitwise equal, note) of two runs' digests, rank by rank."""
    elements = mismatches = 0
    max_diff = 0.0
    exact, notes, counted = True, [], True
    for rank in sorted(set(a) | set(b)):
        da, db = a.get(rank), b.get(rank)
        if da is None or db is None:
            exact, counted = False, False
            notes.append(f"rank {rank} reported {name!r} in one run only")
            continue
        same_form = da.dtype == db.dtype and da.shape == db.shape
        exact = exact and same_form and da.sha256 == db.sha256
        va, vb = _values(da), _values(db)
        if va is None or vb is None or va.shape != vb.shape:
            counted = False
            notes.append(
                f"rank {rank}: values not kept (past digest_max_bytes) or shapes differ: bitwise only"
            )
            continue
        with np.errstate(invalid="ignore"):
            diff = np.abs(va - vb)
            both_nan = np.isnan(va) & np.isnan(vb)
        unequal = ~((va == vb) | both_nan)
        elements += int(va.size)
        mismatches += int(unequal.sum())
        finite = diff[np.isfinite(diff)]
        max_diff = max(max_diff, float(finite.max()) if finite.size else 0.0)
        if (~np.isfinite(diff) & ~both_nan).any():
            max_diff = float("inf")
            notes.append(f"rank {rank}: a non-finite difference (inf or NaN on one side)")
    if not counted:
        return None, None, None, exact, "; ".join(notes)
    return elements, mismatches, (max_diff if np.isfinite(max_diff) else None), exact, "; ".join(notes)


def _consistency(runs: Sequence[WorkloadRun]) -> list[ConsistencyRow]:
    ok = {s: [r for r in runs if r.side == s and r.outcome == "ok"] for s in _SIDES}
    names = sorted({n for r in runs for n in _digests(r)})
    rows = []
    for name in names:
        firsts = {s: next((_digests(r)[name] for r in ok[s] if name in _digests(r)), None) for s in _SIDES}
        if firsts["baseline"] is not None and firsts["candidate"] is not None:
            n, m, d, eq, note = _compare_digests(name, firsts["baseline"], firsts["candidate"])
            rows.append(
                ConsistencyRow(
                    name=name,
                    against="arms",
                    elements=n,
                    mismatches=m,
                    max_abs_diff=d,
                    bitwise_equal=eq,
                    note=note,
                )
            )
        else:
            rows.append(ConsistencyRow(name=name, against="arms", note="no finished run of one arm holds it"))
        for side in _SIDES:
            held = [_digests(r)[name] for r in ok[side] if name in _digests(r)]
            if len(held) < 2:
                continue
            worst: tuple[int | None, int | None, float | None, bool, str] = (0, 0, 0.0, True, "")
            for other in held[1:]:
                n, m, d, eq, note = _compare_digests(name, held[0], other)
                worst = (
                    n,
                    None if m is None or worst[1] is None else max(m, worst[1]),
                    None if d is None or worst[2] is None else max(d, worst[2]),
                    eq and worst[3],
                    note or worst[4],
                )
            rows.append(
                ConsistencyRow(
                    name=name,
                    against="runs",
                    side=side,
                    elements=worst[0],
                    mismatches=worst[1],
                    max_abs_diff=worst[2],
                    bitwise_equal=worst[3],
                    note=f"{len(held)} runs against the first" + (f"; {worst[4]}" if worst[4] else ""),
                )
            )
    return rows


def _timeline(result: WorkloadResult, sick: dict[int, str], changed: dict[int, list[str]]) -> list[RunLine]:
    out = []
    for run in result.runs:
        p = run.probe_after
        copy = [c.bandwidth_gbps for c in COPY.readings(p)] if p is not None else []
        reduce = ALL_REDUCE.readings(p) if p is not None else []
        ar = [a for a in reduce if a.size_bytes == 1 << 20] or reduce[:1]
        flags = (["sick-node"] if run.index in sick else []) + (
            ["probe-changed"] if run.index in changed else []
        )
        out.append(
            RunLine(
                index=run.index,
                side=run.side,
                outcome=run.outcome,
                wall_s=run.wall_s,
                phases_s={k: max(v.values()) for k, v in _phase_values(run).items()},
                copy_gbps=float(np.mean(copy)) if copy else None,
                all_reduce_us=ar[0].time_us if ar else None,
                other_processes=_others(p),
                flags=flags,
            )
        )
    return out


def compare_workload(result: WorkloadResult) -> WorkloadComparison:
    """Judge ``result`` (module docstring): one ``QuantityVerdict`` per phase (seconds, lower is
    better) and per metric, the consistency rows, the timeline and the node flags. Never raises for
    a result's content (crashed runs, absent records, one arm missing: verdict ``failed`` with a
    reason)."""
    spec = result.spec
    runs = result.runs
    ok = [r for r in runs if r.outcome == "ok"]
    sick, changed = _sick_runs(runs), _probe_changes(result)
    notes = [_why("sick-node", m) for m in sick.values()]
    notes += [_why("probe-changed", m) for ms in changed.values() for m in ms]
    node_reasons = list(notes)
    failed = [r for r in runs if r.outcome != "ok"]
    if failed:
        notes.append(
            _why(
                "runs-failed",
                f"{len(failed)} of {len(runs)} runs did not finish: "
                + "; ".join(f"run {r.index} ({r.side}) {r.outcome}: {r.error}" for r in failed[:5]),
                "info",
            )
        )
    if result.stopped == "budget":
        notes.append(
            _why(
                "budget",
                f"the wall-time budget ({spec.budget_s:g} s) ended the job after {len(runs)} of "
                f"{2 * spec.runs} runs",
                "info",
            )
        )
    phases: dict[str, dict[int, float]] = defaultdict(dict)
    metrics: dict[str, dict[int, float]] = defaultdict(dict)
    meta: dict[str, tuple[str, Better]] = {}
    for r in ok:
        for p, per_rank in _phase_values(r).items():
            phases[p][r.index] = max(per_rank.values())
        for m, (v, unit, better) in _metric_values(r).items():
            metrics[m][r.index] = v
            meta.setdefault(m, (unit, better))
    quantities = []
    for p in _ordered(runs, PhaseRecord, phases):
        q = _quantity("phase", p, "s", "lower", phases[p], runs, spec.threshold_pct, spec.seed, node_reasons)
        quantities.append(q.model_copy(update={"ranks": _rank_times(p, runs)}))
    for m in _ordered(runs, MetricRecord, metrics):
        unit, better = meta[m]
        quantities.append(
            _quantity(
                "metric", m, unit, better, metrics[m], runs, spec.threshold_pct, spec.seed, node_reasons
            )
        )
    if not ok:
        notes.insert(0, _why("all-runs-failed", "no run finished: nothing to compare", "error"))
    summary: dict[str, int] = defaultdict(int)
    for q in quantities:
        summary[q.verdict] += 1
    flags = sorted({"sick-node"} if sick else set()) + (["probe-changed"] if changed else [])
    return WorkloadComparison(
        job_id=result.job_id,
        name=spec.name,
        pairing=PAIRING,
        quantities=quantities,
        consistency=_consistency(runs),
        timeline=_timeline(result, sick, changed),
        flags=flags,
        notes=notes,
        summary=dict(summary),
    )


def _ordered(runs: Sequence[WorkloadRun], kind: type, names: dict[str, dict[int, float]]) -> list[str]:
    """Names in the order the runs first reported them (the workload's own order of phases)."""
    seen: dict[str, None] = {}
    for r in runs:
        for rec in r.records:
            if isinstance(rec, kind) and rec.name not in seen:
                seen[rec.name] = None
    return [n for n in seen if n in names] + [n for n in names if n not in seen]
