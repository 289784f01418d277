"""A job's comparison: turns a runner's ``JobResult`` into a ``Comparison``, cell by cell.

For each cell: the kept samples (``estimators.kept_arrays``), the estimators of
``kernelab.service.judge.estimators`` (ratio of medians with a bootstrap CI over rounds, Hodges-Lehmann,
Mann-Whitney U, Benjamini-Hochberg adjusted across the sweep, minimum detectable effect), the
timing verdict ``faster``/``slower``/``same``/``inconclusive`` against the spec's threshold, then
the cell's verdict by the precedence of ``kernelab.service.judge.verdicts`` (a wrong or failed side, an
implausible time outrank any speed); flags that make a number untrustworthy travel with it.

Pure functions over numpy/scipy; no database, no web framework (``scipy.special`` is imported
inside ``compare``; ``scipy.stats`` only for an energy interval or a small sample's exact
Mann-Whitney test).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from kernelab.service.contract.schemas import (
    CellComparison,
    CellResult,
    Comparison,
    EnergyMeasurement,
    EnergySummary,
    Flag,
    JobResult,
    ParamValue,
    Placement,
    Reason,
    Side,
    SideStats,
)
from kernelab.service.judge import verdicts
from kernelab.service.judge.estimators import (
    BETWEEN_STRATA_MIN_SETS,
    KeptSamples,
    bh_adjusted,
    cluster_cis,
    hodges_lehmann,
    is_candidate,
    kept_arrays,
    mann_whitney_p,
    min_detectable_effect_pct,
    placement_strata,
    ratio_ci_arrays,
    throughput,
    variant_stats,
)
from kernelab.service.judge.node_change import node_change_reasons

_SIDES: tuple[Side, Side] = ("baseline", "candidate")


def _fmt_value(v: ParamValue) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _fmt_params(params: Mapping[str, ParamValue], keys: Iterable[str]) -> str:
    return ", ".join(f"{k}={_fmt_value(params[k])}" for k in keys if k in params)


def cell_label(result: JobResult, cell: CellResult) -> str:
    """``"M=256, N=1000, dtype=float32"``: the cell's swept parameters (all if none are swept)."""
    swept = list(result.spec.sweep)
    for grid in result.spec.sweep_by_device.values():
        swept += [k for k in grid if k not in swept]
    keys = [k for k in swept if k in cell.params] or list(cell.params)
    return _fmt_params(cell.params, keys) or "default"


def variant_labels(result: JobResult) -> tuple[str, str]:
    """``("torch", "triton")`` or ``("triton (BLOCK_M=64)", "triton (BLOCK_M=128)")``.

    A side's parameters are shown only where they differ from the other side's. A side measured
    from a source revision gets ``" @ branch sha[:8]"`` (``"torch @ main 1a2b3c4d"``).
    """
    b, c = result.spec.baseline, result.spec.candidate
    labels = []
    for own, other in ((b, c), (c, b)):
        diff = [k for k in own.params if other.params.get(k) != own.params[k]]
        labels.append(f"{own.variant} ({_fmt_params(own.params, diff)})" if diff else own.variant)
    revisions = result.node.revisions
    if revisions is not None:
        for i, rev in enumerate((revisions.baseline, revisions.candidate)):
            if rev.sha:
                labels[i] += f" @ {rev.branch or rev.ref} {rev.sha[:8]}"
    return labels[0], labels[1]


def _failed_cell(result: JobResult, cell: CellResult) -> CellComparison:
    """A cell whose measurement failed: verdict ``failed`` with the error as its reason; whatever
    correctness data it got is kept (and told), no statistics."""
    found = [verdicts.reason("side-failed", cell.error or "the cell could not be measured")]
    found += verdicts.correctness_reasons(result, cell)
    decision = verdicts.decide("inconclusive", found)
    return CellComparison(
        index=cell.index,
        params=cell.params,
        label=cell_label(result, cell),
        baseline=SideStats(n=0),
        candidate=SideStats(n=0),
        verdict=decision.verdict,
        reasons=decision.reasons,
        flags=verdicts.sorted_flags(decision.flags),
        correctness=cell.correctness,
        timed_checks=cell.timed_checks,
        error=cell.error,
        static=cell.static,
        timers=cell.timers,
    )


def compare_cell(
    result: JobResult,
    cell: CellResult,
    peaks: Mapping[str, float],
    *,
    n_resamples: int = 2000,
    seed: int = 0,
) -> CellComparison:
    """Statistics, verdict, reasons and flags of one cell; ``p_adjusted`` is left for ``compare``.

    The verdict follows ``kernelab.service.judge.verdicts`` (failed > incorrect > nondeterministic >
    implausible >
    inconclusive > faster/slower/same); ``timing_verdict`` keeps what the timing alone says.
    A cell with an error is ``failed`` with empty statistics. Flags besides those the reasons raise:
    ``throttled`` (any sample throttled, dropped or not), ``noisy`` (IQR/median > 10% on either
    side), ``contended`` (a process other than ours was on the GPU during the cell's measurement,
    ``CellResult.contention``).
    """
    if cell.error is not None:
        return _failed_cell(result, cell)
    kept = kept_arrays(cell, exclude_throttled=result.spec.measurement.exclude_throttled)
    (p,) = mann_whitney_p([(kept.times["baseline"], kept.times["candidate"])])
    return _compare_kept(
        result,
        cell,
        peaks,
        kept,
        p,
        n_resamples=n_resamples,
        seed=seed,
        extra=node_change_reasons(result.probes, device_type=result.node.device_type),
    )


def _finite_numbers(
    stats: dict[Side, SideStats], numbers: dict[str, float | None], rates: dict[str, float]
) -> tuple[dict[Side, SideStats], dict[str, float | None], dict[str, float], list[str]]:
    """``stats``, ``numbers`` and ``rates`` with every non-finite value made None (rates: left
    out), and the names of the values that were (``baseline.mean_ns``, ``ratio``, ...). Samples
    near float64's limit (stored before ``schemas.MAX_DURATION_NS`` bounded them, or built in
    Python) can overflow a mean, a median of two values or a ratio; JSON has no Infinity."""
    bad: list[str] = []
    out_stats = {}
    for side, st in stats.items():
        fields = {k: v for k, v in st.model_dump().items() if isinstance(v, float) and not math.isfinite(v)}
        bad += [f"{side}.{k}" for k in fields]
        out_stats[side] = st.model_copy(update=dict.fromkeys(fields)) if fields else st
    out_numbers = dict(numbers)
    for name, value in numbers.items():
        if value is not None and not math.isfinite(value):
            bad.append(name)
            out_numbers[name] = None
    bad += [k for k, v in rates.items() if not math.isfinite(v)]
    return out_stats, out_numbers, {k: v for k, v in rates.items() if math.isfinite(v)}, bad


def _cell_numbers(
    kept: KeptSamples,
    p: float | None,
    *,
    n_resamples: int,
    seed: int,
    placement: Placement | None = None,
) -> tuple[dict[Side, SideStats], dict[str, float | None], tuple[float, ...], bool]:
    """Per-side summaries and the cell's numbers (ratio and CI, Hodges-Lehmann shift and CI,
    p-value, MDE), computed with float overflow silenced: ``_finite_numbers`` nulls what overflowed;
    each input placement's own ratio (empty without strata), and whether the CI spans the sides'
    buffer placements (``estimators.ClusterCIs.placement_covered``). ``placement``: the cell's
    input-set rotation (its ratio is stratified by assignment, ``estimators.cluster_cis``)."""
    times = kept.times
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        stats = {v: variant_stats(times[v], dropped_throttled=kept.taken[v] - times[v].size)
                 for v in _SIDES}  # fmt: skip
        strata = (
            None
            if placement is None
            else placement_strata(kept.rounds, placement.input_sets, placement.swap_every_rounds)
        )
        cis = cluster_cis(
            kept.candidate, kept.rounds, kept.durations, confidence=0.95, n_resamples=n_resamples,
            seed=seed, strata=strata,
            between_sets=(
                placement.input_sets
                if placement is not None and placement.input_sets >= BETWEEN_STRATA_MIN_SETS
                else 0
            ),
            schedule="cyclic" if placement is None else placement.schedule,
        )  # fmt: skip
        rc = None if cis is None else cis.ratio
        for v in _SIDES:
            if cis is None:
                continue
            # the median the ratio is formed from, so the table's medians give its ratio (with
            # rotation: the placement-balanced median), and the CI that brackets that median
            update: dict[str, object] = {"median_ns": cis.points[v], "pooled_median_ns": stats[v].median_ns}
            if cis.strata:  # the ratio is the geometric mean over the assignments' ratios
                update["estimator"] = "set-balanced median"
            bounds = cis.medians[v]
            if bounds is not None:
                update |= {"median_ci_low_ns": bounds[0], "median_ci_high_ns": bounds[1]}
            stats[v] = stats[v].model_copy(update=update)
        hl = None
        if times["baseline"].size >= 1 and times["candidate"].size >= 1:
            hl = hodges_lehmann(times["baseline"], times["candidate"])
        ratio, ci_low, ci_high = rc if rc is not None else (None, None, None)
        decision: tuple[float | None, float | None] = (None, None)
        if rc is not None and min(rc) > 0 and math.isfinite(rc[2]):
            decision = verdicts.decision_interval(*rc)
        numbers: dict[str, float | None] = {
            "ratio": ratio, "ci_low": ci_low, "ci_high": ci_high,
            "decision_low": decision[0], "decision_high": decision[1],
            "delta_pct": None if ratio is None else (ratio - 1) * 100,
            "hl_shift_ns": None if hl is None else hl[0],
            "hl_ci_low_ns": None if hl is None else hl[1],
            "hl_ci_high_ns": None if hl is None else hl[2],
            "p_value": p, "mde_pct": min_detectable_effect_pct(stats["baseline"], stats["candidate"]),
        }  # fmt: skip
    if cis is not None and placement is not None and placement.input_sets >= BETWEEN_STRATA_MIN_SETS:
        # a rotation the budget cut short: each set's own ratio is judged, not each assignment's
        # (in an assignment the two sides ran different sets, whose shared effect a partial cycle
        # does not cancel)
        return stats, numbers, cis.per_set, cis.placement_covered
    return stats, numbers, (() if cis is None else cis.strata), cis is not None and cis.placement_covered


def _cross_ci(cell: CellResult, seed: int) -> tuple[float, float] | None:
    """The 95% round-bootstrap interval of the cross-check's ratio (``estimators.ratio_ci_arrays``
    over its rounds: cross sample i of each side is round i), None without one."""
    cc = cell.cross_check
    if cc is None or cc.error is not None:
        return None
    b, c = cc.samples_ns.get("baseline", []), cc.samples_ns.get("candidate", [])
    if len(b) < 2 or len(c) < 2:
        return None
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        rc = ratio_ci_arrays(
            np.r_[np.zeros(len(b), dtype=bool), np.ones(len(c), dtype=bool)],
            np.r_[np.arange(len(b)), np.arange(len(c))].astype(np.int64),
            np.asarray([*b, *c], dtype=np.float64),
            confidence=0.95,
            n_resamples=1000,
            seed=seed,
        )
    return None if rc is None or not all(map(math.isfinite, rc)) else (rc[1], rc[2])


def energy_summary(energy: EnergyMeasurement | None) -> EnergySummary | None:
    """Joules per launch per side and their ratio from a cell's energy blocks (``CellResult.energy``).

    Per side the median over its blocks of joules / launches, and of joules / seconds (watts). The
    ratio is candidate / baseline of those medians; its 95% interval is the Student t interval of
    the mean log ratio over paired blocks (block k of the baseline with block k of the candidate:
    ABBA-adjacent, so a slow drift of the board's power falls on both), exponentiated
    (``scipy.stats.ttest_1samp(...).confidence_interval``). None when no energy was asked for.
    """
    if energy is None:
        return None
    summary = EnergySummary(
        counter=energy.counter, step_mj=energy.step_mj, period_ms=energy.period_ms, error=energy.error
    )
    per: dict[Side, list[float]] = {v: [] for v in _SIDES}
    watts: dict[Side, list[float]] = {v: [] for v in _SIDES}
    for b in energy.blocks:
        per[b.side].append(b.joules / b.launches)
        watts[b.side].append(b.joules / b.seconds)
    for v in _SIDES:
        if per[v]:
            summary.joules_per_launch[v] = float(np.median(per[v]))
            summary.watts[v] = float(np.median(watts[v]))
    pairs = min(len(per["baseline"]), len(per["candidate"]))
    summary.blocks = pairs
    base, cand = summary.joules_per_launch.get("baseline"), summary.joules_per_launch.get("candidate")
    if base and cand is not None and base > 0:
        summary.ratio = cand / base
    b_arr, c_arr = np.asarray(per["baseline"][:pairs]), np.asarray(per["candidate"][:pairs])
    if pairs >= 2 and (b_arr > 0).all() and (c_arr > 0).all():
        from scipy.stats import ttest_1samp

        with np.errstate(invalid="ignore", divide="ignore"):
            ci = ttest_1samp(np.log(c_arr / b_arr), 0.0).confidence_interval(0.95)
        if math.isfinite(ci.low) and math.isfinite(ci.high):
            summary.ci_low, summary.ci_high = math.exp(ci.low), math.exp(ci.high)
    return summary


def _side_clocks(cell: CellResult, stats: dict[Side, SideStats]) -> dict[Side, SideStats]:
    """``stats`` with each side's median SM clock (MHz) over its samples that read one."""
    clocks = np.asarray(cell.samples.sm_clock_mhz, dtype=np.float64)
    if not clocks.size or not np.isfinite(clocks).any():
        return stats
    cand = is_candidate(cell.samples)
    out = dict(stats)
    masks: tuple[tuple[Side, np.ndarray], ...] = (("baseline", ~cand), ("candidate", cand))
    for v, own in masks:
        values = clocks[own]
        values = values[np.isfinite(values)]
        if values.size:
            out[v] = stats[v].model_copy(update={"sm_clock_mhz": float(np.median(values))})
    return out


def _rounds_with_both(kept: KeptSamples) -> int:
    """Rounds in which both sides have kept samples."""
    return int(np.intersect1d(kept.rounds[~kept.candidate], kept.rounds[kept.candidate]).size)


def _fewest_per_assignment(kept: KeptSamples, placement: Placement) -> tuple[int, int] | None:
    """Under a rotation of two or more input sets: the fewest rounds holding both sides' kept
    samples in any input-set assignment the rounds reached, and how many assignments they reached;
    None without rotation."""
    strata = placement_strata(kept.rounds, placement.input_sets, placement.swap_every_rounds)
    if strata is None or kept.rounds.size == 0:
        return None
    both = np.intersect1d(kept.rounds[~kept.candidate], kept.rounds[kept.candidate])
    assignment = (both // placement.swap_every_rounds) % placement.input_sets
    counts = np.bincount(assignment, minlength=placement.input_sets)
    reached = counts[: int(assignment.max()) + 1] if assignment.size else counts[:0]
    return (int(reached.min()) if reached.size else 0), int(reached.size)


def _compare_kept(
    result: JobResult,
    cell: CellResult,
    peaks: Mapping[str, float],
    kept: KeptSamples,
    p: float | None,
    *,
    n_resamples: int,
    seed: int,
    extra: Sequence[Reason] = (),
) -> CellComparison:
    """``compare_cell`` of a cell without error, its kept samples and Mann-Whitney p given;
    ``extra``: reasons that hold for every cell of the job (the node changed during it)."""
    m = result.spec.measurement
    raw_stats, raw_numbers, stratum_ratios, covered = _cell_numbers(
        kept, p, n_resamples=n_resamples, seed=seed, placement=cell.placement
    )
    with np.errstate(over="ignore"):
        raw_rates = throughput(cell.work, raw_stats)
    stats, numbers, rates, nonfinite = _finite_numbers(raw_stats, raw_numbers, raw_rates)
    stats = _side_clocks(cell, stats)
    flags: list[Flag] = []
    if kept.throttled:
        flags.append("throttled")
    if verdicts.noisy(stats.values()):
        flags.append("noisy")
    if verdicts.contention_seen(cell.contention):
        flags.append("contended")
    found = [*extra, *verdicts.correctness_reasons(result, cell), *verdicts.timer_reasons(cell),
             *verdicts.interpreted_reasons(cell)]  # fmt: skip
    cross = verdicts.cross_check_summary(
        cell, stats, raw_numbers["ratio"], m.cross_check_pct, m.threshold_pct, _cross_ci(cell, seed)
    )
    found += verdicts.resolution_reasons(result.node.device_type, {v: stats[v].median_ns for v in _SIDES})
    # The copy-bandwidth bound holds only where every launch was timed cold: one launch per sample
    # after an L2 flush. A sample of n > 1 launches (a CUDA graph replay, a batch of short kernels)
    # flushes before the first only; the others may run from L2, faster than DRAM allows.
    launches = cell.samples.launches
    one_launch = bool(len(launches)) and int(launches.max()) == 1
    bound_bytes = m.l2_flush and result.node.device_type == "cuda" and one_launch
    too_fast = verdicts.implausible(raw_rates, peaks, bound_bytes=bound_bytes)
    found += verdicts.implausible_reasons(raw_rates, peaks, too_fast)
    found += verdicts.sample_size_reasons(
        _rounds_with_both(kept), {v: stats[v].n for v in _SIDES},
        _fewest_per_assignment(kept, cell.placement), cell.placement.input_sets,
    )  # fmt: skip
    found += verdicts.duration_reasons({v: float(kept.times[v].max(initial=0.0)) for v in _SIDES})
    if nonfinite:
        found.append(verdicts.nonfinite_reason(nonfinite, float(kept.durations.max(initial=0.0))))
    ratio, ci_low, ci_high = numbers["ratio"], numbers["ci_low"], numbers["ci_high"]
    low, high = numbers.get("decision_low"), numbers.get("decision_high")
    timing, why = verdicts.timing_verdict(
        ratio, ci_low, ci_high, m.threshold_pct, None if low is None or high is None else (low, high)
    )
    if why is not None:
        if stats["baseline"].median_ns == 0.0:
            why = verdicts.reason("zero-baseline", "the baseline's median time is 0 ns: no ratio")
        found.append(why)
    found += verdicts.placement_reasons(
        timing,
        ratio,
        [r for r in stratum_ratios if math.isfinite(r)],
        m.threshold_pct,
        covered=covered,
        per_set=cell.placement.input_sets >= BETWEEN_STRATA_MIN_SETS,
    )
    if cross is not None:
        found += verdicts.cross_check_reasons(cross, ratio, m.threshold_pct, m.cross_check_pct)
    decision = verdicts.decide(timing, verdicts.tampered_times_reasons(found))
    return CellComparison(
        index=cell.index,
        params=cell.params,
        label=cell_label(result, cell),
        baseline=stats["baseline"],
        candidate=stats["candidate"],
        ratio=ratio,
        ci_low=ci_low,
        ci_high=ci_high,
        decision_low=low,
        decision_high=high,
        delta_pct=numbers["delta_pct"],
        hl_shift_ns=numbers["hl_shift_ns"],
        hl_ci_low_ns=numbers["hl_ci_low_ns"],
        hl_ci_high_ns=numbers["hl_ci_high_ns"],
        p_value=numbers["p_value"],
        mde_pct=numbers["mde_pct"],
        verdict=decision.verdict,
        timing_verdict=timing,
        reasons=decision.reasons,
        flags=verdicts.sorted_flags([*flags, *decision.flags]),
        correctness=cell.correctness,
        timed_checks=cell.timed_checks,
        throughput=rates,
        timers=cell.timers,
        static=cell.static,
        cross_check=cross,
        energy=energy_summary(cell.energy),
    )


def compare(
    result: JobResult,
    *,
    job_id: int | None = None,
    peaks: Mapping[str, float] | None = None,
    n_resamples: int = 2000,
    seed: int = 0,
    health_flags: Iterable[Flag] = (),
    notes: Iterable[str] = (),
) -> Comparison:
    """A job's before/after comparison: every cell's statistics, verdict and flags.

    ``peaks``: optional ``{"copy_gbps": GB/s, "matmul_tflops": TFLOP/s}`` for the plausibility
    guard (see ``node_peaks``; by default the probes' best copy and bf16 matmul readings).
    ``job_id`` overrides ``result.job_id``. p-values are Benjamini-Hochberg adjusted across the
    sweep's cells that have one (``estimators.bh_adjusted``). Job flags are the union
    of the cells' flags, ``contended`` from the probes, and ``failed`` when the job has an error.
    Deterministic for a given ``seed``. Raises nothing for well-formed results: cells that cannot
    be compared are ``inconclusive`` with the reason in their flags.

    ``health_flags`` (``contended``/``degraded-node``, from ``kernelab.service.server.node_health``: the
    node's
    probes left its healthy band) are added to every cell and to the job; ``notes`` are sentences the
    comparison carries (e.g. that history views exclude such a result).
    """
    bounds = verdicts.node_peaks(result, peaks)
    changed = node_change_reasons(result.probes, device_type=result.node.device_type)
    exclude_throttled = result.spec.measurement.exclude_throttled
    kept = [
        None if c.error is not None else kept_arrays(c, exclude_throttled=exclude_throttled)
        for c in result.cells
    ]
    p_values = mann_whitney_p(
        [None if k is None else (k.times["baseline"], k.times["candidate"]) for k in kept]
    )
    cells = [
        _failed_cell(result, c)
        if k is None
        else _compare_kept(result, c, bounds, k, p, n_resamples=n_resamples, seed=seed, extra=changed)
        for c, k, p in zip(result.cells, kept, p_values, strict=True)
    ]
    tested = [c for c in cells if c.p_value is not None]
    if tested:
        adjusted = bh_adjusted([p for c in tested if (p := c.p_value) is not None])
        for c, p_adj in zip(tested, adjusted, strict=True):
            c.p_adjusted = float(p_adj)
    node_flags = list(health_flags)
    if node_flags:
        for c in cells:
            c.flags = verdicts.sorted_flags([*c.flags, *node_flags])
    flags: list[Flag] = [f for c in cells for f in c.flags] + verdicts.probe_flags(result.probes) + node_flags
    job_reasons = list(changed)
    if changed:
        flags.append("node-changed")
    error = verdicts.job_error(result)
    if error:
        flags.append("failed")
        job_reasons.append(verdicts.reason("job-failed", error))
    baseline_label, candidate_label = variant_labels(result)
    return Comparison(
        job_id=result.job_id if job_id is None else job_id,
        name=result.spec.name,
        benchmark=result.spec.benchmark,
        baseline_label=baseline_label,
        candidate_label=candidate_label,
        threshold_pct=result.spec.measurement.threshold_pct,
        timer=result.timer,
        state=result.spec.measurement.state,
        node=result.node,
        cells=cells,
        probes=result.probes,
        flags=verdicts.sorted_flags(flags),
        summary=verdicts.summary([c.verdict for c in cells]),
        notes=list(notes),
        reasons=job_reasons,
        method_version=verdicts.METHOD_VERSION,
    )
