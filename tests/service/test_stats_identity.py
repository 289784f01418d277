"""``kernelab.service.stats`` gives the same numbers as its implementation before the speed-up.

The statistical core of ``service/stats.py`` as last committed (04db575, before the vectorised
Hodges-Lehmann, the cached bootstrap draws and the batched Mann-Whitney U) is kept below, renamed
``ref_*``, as the reference; the helpers it calls that did not change (flags, labels, throughput,
MDE) come from ``kernelab.service.stats``, ``estimators`` and ``verdicts``. ~200 generated cells
(failed, one-sided, tiny, tied, throttled, zero and constant durations, rounds missing a variant,
few and many rounds, uneven counts) are compared statistic by statistic, exactly, for several seeds
and resample counts; verdicts and reasons are ``kernelab.service.verdicts``' and tested with it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from itertools import compress
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest

from kernelab.service import estimators, stats
from kernelab.service.estimators import _VARIANTS, min_detectable_effect_pct, throughput
from kernelab.service.schemas import (
    CellComparison,
    CellResult,
    Comparison,
    ContentionReading,
    CorrectnessResult,
    Flag,
    JobResult,
    JobSpec,
    NodeInfo,
    SampleColumns,
    Variant,
    VariantStats,
    Work,
)
from kernelab.service.stats import cell_label, variant_labels
from kernelab.service.verdicts import NOISY_IQR_FRACTION as _NOISY_IQR_FRACTION
from kernelab.service.verdicts import contention_seen, implausible, node_peaks, probe_flags
from kernelab.service.verdicts import sorted_flags as _sorted_flags

pytestmark = pytest.mark.timeout(300)

NOW = datetime(2026, 12, 1, tzinfo=UTC)

# --------------------------------------------------------------------------------------------------
# Reference: service/stats.py at 04db575, verbatim but for the ref_ names (and ruff format) and
# the sample access of ref_kept_samples/ref_is_candidate (rows of the array columns)
# --------------------------------------------------------------------------------------------------


def ref_kept_samples(samples: SampleColumns, *, exclude_throttled: bool) -> SampleColumns:
    """The samples the statistics use: all of them, or those not taken while throttled.

    nvbench discards samples whose SM clock fell below 75% of the default clock; the runner marks
    such samples ``throttled=True`` and ``MeasurementSpec.exclude_throttled`` (default True)
    drops them here. Returns ``samples`` itself when nothing is dropped (do not mutate it).
    """
    if not (exclude_throttled and any(samples.throttled)):
        return samples
    keep = [not t for t in samples.throttled]
    return SampleColumns.from_rows(compress(samples.rows(), keep))  # rows: the columns are arrays now


def ref_is_candidate(samples: SampleColumns) -> np.ndarray:
    """``(n,)`` bool: True where the sample is the candidate's, False for the baseline's."""
    names = (s.variant for s in samples.rows())  # rows: the columns are arrays now
    return np.fromiter(map("candidate".__eq__, names), dtype=bool, count=len(samples))


def _ref_round_matrix(sample_rounds: np.ndarray, durations: np.ndarray, rounds: np.ndarray) -> np.ndarray:
    """``(len(rounds), k_max)`` float64 durations (ns) per round, NaN-padded, each row in sample order.

    ``sample_rounds``/``durations``: (n,) int64 round and float64 ns of one variant's samples;
    ``rounds``: the sorted distinct rounds of the cell (rows of the matrix).
    """
    row = np.searchsorted(rounds, sample_rounds)
    counts = np.bincount(row, minlength=rounds.size)
    out = np.full((rounds.size, int(counts.max(initial=0))), np.nan)
    order = np.argsort(row, kind="stable")
    starts = np.cumsum(counts) - counts
    column = np.arange(row.size) - np.repeat(starts, counts)
    out[row[order], column] = durations[order]
    return out


def _ref_resampled_medians(matrix: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Median of each bootstrap resample of rounds; NaN where a resample holds no sample.

    ``matrix``: (R, k) ns, NaN-padded; ``idx``: (B, R) int round indices. Returns (B,) float64.
    """
    # A row-wise sort is ~5x faster than np.median's partition on (2000, 200) and handles the NaN
    # padding in the same pass: NaN sorts last, so each row's valid values come first.
    flat = np.sort(matrix[idx].reshape(idx.shape[0], -1), axis=1)
    count = np.count_nonzero(~np.isnan(flat), axis=1)
    rows = np.arange(flat.shape[0])
    lower = flat[rows, np.maximum(count - 1, 0) // 2]
    upper = flat[rows, np.minimum(count // 2, flat.shape[1] - 1)]
    return np.where(count > 0, (lower + upper) / 2, np.nan)


def ref_ratio_ci(
    samples: SampleColumns, *, confidence: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """Ratio of medians candidate/baseline and its bootstrap CI over whole rounds.

    ``samples``: the kept samples of one cell (both variants; filter with ``kept_samples`` first),
    durations in ns. Returns ``(ratio, ci_low, ci_high)``, dimensionless, ratio < 1 meaning the
    candidate is faster; or None when either variant has fewer than 2 samples or samples in fewer
    than 2 rounds (one round carries no between-round variability), or a baseline median of 0.

    The CI is the percentile interval (Efron & Tibshirani 1993, ch. 13) of the ratio over
    ``n_resamples`` resamples that draw round numbers with replacement and take every sample of
    each drawn round, both variants together (cluster bootstrap). Percentile, not BCa: BCa's
    jackknife acceleration is unreliable for the non-smooth median (Efron & Tibshirani 1993,
    section 11.6). Resamples in which a variant has no sample (possible when its samples sit in
    few rounds) are left out, so the interval is conditional on both sides being observed.
    Resampling is numpy-vectorised and seeded (``numpy.random.default_rng(seed)``): ~15 ms for
    200 rounds and 2000 resamples on a 2-core CI machine (``benchmarks/stats_speed.py``).
    Raises ValueError for ``confidence`` outside (0, 1) or ``n_resamples`` < 1.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    candidate = ref_is_candidate(samples)
    sample_rounds = np.asarray(samples.round, dtype=np.int64)
    durations = np.asarray(samples.duration_ns, dtype=np.float64)
    for own in (~candidate, candidate):
        if np.count_nonzero(own) < 2 or np.unique(sample_rounds[own]).size < 2:
            return None
    rounds = np.unique(sample_rounds)
    base = _ref_round_matrix(sample_rounds[~candidate], durations[~candidate], rounds)
    cand = _ref_round_matrix(sample_rounds[candidate], durations[candidate], rounds)
    base_median = float(np.nanmedian(base))
    if base_median <= 0.0:
        return None
    ratio = float(np.nanmedian(cand)) / base_median
    idx = np.random.default_rng(seed).integers(0, rounds.size, size=(n_resamples, rounds.size))
    # A resample's median depends only on which rounds it drew (a multiset), not on their order. With
    # few rounds most of the n_resamples draws repeat a multiset (3 rounds: 10 distinct ones), so the
    # medians are computed once per distinct multiset and mapped back: identical numbers, far less sorting.
    if math.comb(2 * rounds.size - 1, rounds.size) < n_resamples:
        uniq, inverse = np.unique(np.sort(idx, axis=1), axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        cand_med, base_med = (
            _ref_resampled_medians(cand, uniq)[inverse],
            _ref_resampled_medians(base, uniq)[inverse],
        )
    else:
        cand_med, base_med = _ref_resampled_medians(cand, idx), _ref_resampled_medians(base, idx)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = cand_med / base_med
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return None
    alpha = 1.0 - confidence
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return ratio, float(low), float(high)


def _ref_kth_difference(base_sorted: np.ndarray, cand: np.ndarray, k: int) -> float:
    """k-th smallest (1-based) of the m*n differences cand[j] - base[i], without forming them.

    Bisection on the value d with the pair count #{c_j - b_i <= d} from ``searchsorted``:
    O((m + n) log m) per step, so 10^4 x 10^4 samples cost ~50 vector steps, not 10^8 floats.
    Converges to 1e-12 of the differences' range.
    """
    m, n = base_sorted.size, cand.size

    def count_le(d: float) -> int:
        return m * n - int(np.searchsorted(base_sorted, cand - d, side="left").sum())

    lo = float(cand.min() - base_sorted[-1])
    hi = float(cand.max() - base_sorted[0])
    if count_le(lo) >= k:
        return lo
    tol = 1e-12 * max(hi - lo, abs(hi), abs(lo), 1e-300)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if count_le(mid) >= k:
            hi = mid
        else:
            lo = mid
    return hi


def ref_hodges_lehmann(
    baseline_ns: np.ndarray, candidate_ns: np.ndarray, *, confidence: float = 0.95
) -> tuple[float, float | None, float | None]:
    """Hodges-Lehmann shift candidate - baseline (ns) and its distribution-free CI.

    ``baseline_ns``: (m,), ``candidate_ns``: (n,) float durations, m, n >= 1. The estimate is the
    median of the m*n pairwise differences; the CI is (D_(C), D_(mn+1-C)) with the order statistics
    D of those differences and C = floor(mn/2 - z(1-alpha/2) * sqrt(mn(m+n+1)/12)), the
    large-sample Mann-Whitney critical value (Hollander & Wolfe, *Nonparametric Statistical
    Methods*, 2nd ed. 1999, section 4.3). The CI bounds are None when C < 1 (too few samples
    for the confidence level). Assumes independent samples; it is a companion to the round
    bootstrap, not the verdict. Raises ValueError on an empty input.
    """
    base = np.sort(np.asarray(baseline_ns, dtype=np.float64))
    cand = np.asarray(candidate_ns, dtype=np.float64)
    if base.size == 0 or cand.size == 0:
        raise ValueError("hodges_lehmann needs at least one sample on each side")
    m, n = base.size, cand.size
    total = m * n
    if total % 2:
        shift = _ref_kth_difference(base, cand, (total + 1) // 2)
    else:
        shift = 0.5 * (
            _ref_kth_difference(base, cand, total // 2) + _ref_kth_difference(base, cand, total // 2 + 1)
        )
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    c_alpha = math.floor(total / 2 - z * math.sqrt(total * (m + n + 1) / 12))
    if c_alpha < 1:
        return shift, None, None
    return (
        shift,
        _ref_kth_difference(base, cand, c_alpha),
        _ref_kth_difference(base, cand, total + 1 - c_alpha),
    )


def ref_variant_stats(durations_ns: np.ndarray, *, dropped_throttled: int = 0) -> VariantStats:
    """Median, min, quartiles (numpy's linear interpolation), IQR and mean of (n,) ns durations."""
    x = np.asarray(durations_ns, dtype=np.float64)
    if x.size == 0:
        return VariantStats(n=0, dropped_throttled=dropped_throttled)
    q1, median, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))
    return VariantStats(
        n=int(x.size),
        dropped_throttled=dropped_throttled,
        median_ns=median,
        min_ns=float(x.min()),
        q1_ns=q1,
        q3_ns=q3,
        iqr_ns=q3 - q1,
        mean_ns=float(x.mean()),
    )


def ref_compare_cell(
    result: JobResult,
    cell: CellResult,
    peaks: Mapping[str, float],
    *,
    n_resamples: int = 2000,
    seed: int = 0,
) -> CellComparison:
    """Statistics, verdict and flags of one cell; ``p_adjusted`` is left for ``compare``.

    Flags: ``failed`` (cell.error; verdict inconclusive, empty stats), ``throttled`` (any sample
    throttled, dropped or not), ``noisy`` (IQR/median > 10% on either side), ``incorrect`` (a
    variant failed its correctness check: the timing verdict stands, the flag tells the reader the
    speed is of a wrong result), ``contended`` (a process other than ours was on the GPU during the
    cell's measurement, ``CellResult.contention``), ``implausible`` (a rate above 1.1x the node's
    peak; such a cell is never ``faster``: its verdict becomes ``inconclusive``).
    """
    from scipy.stats import mannwhitneyu

    m = result.spec.measurement
    label = cell_label(result, cell)
    if cell.error is not None:
        return CellComparison(
            index=cell.index,
            params=cell.params,
            label=label,
            baseline=VariantStats(n=0),
            candidate=VariantStats(n=0),
            verdict="inconclusive",
            flags=["failed"],
            correctness=cell.correctness,
            error=cell.error,
            static=cell.static,
        )
    kept = ref_kept_samples(cell.samples, exclude_throttled=m.exclude_throttled)
    kept_candidate, durations = ref_is_candidate(kept), np.asarray(kept.duration_ns, dtype=np.float64)
    times = {"baseline": durations[~kept_candidate], "candidate": durations[kept_candidate]}
    taken_candidate = int(np.count_nonzero(ref_is_candidate(cell.samples)))
    taken = {"baseline": len(cell.samples) - taken_candidate, "candidate": taken_candidate}
    stats = {v: ref_variant_stats(times[v], dropped_throttled=taken[v] - times[v].size) for v in _VARIANTS}
    flags: list[Flag] = []
    if any(cell.samples.throttled):
        flags.append("throttled")
    if any(
        s.median_ns and s.iqr_ns is not None and s.iqr_ns / s.median_ns > _NOISY_IQR_FRACTION
        for s in stats.values()
    ):
        flags.append("noisy")
    if contention_seen(cell.contention):
        flags.append("contended")
    rates = throughput(cell.work, stats)
    bound_bytes = m.l2_flush and result.node.device_type == "cuda"
    if implausible(rates, peaks, bound_bytes=bound_bytes):
        flags.append("implausible")

    ratio = ci_low = ci_high = None
    rc = ref_ratio_ci(kept, n_resamples=n_resamples, seed=seed)
    if rc is not None:
        ratio, ci_low, ci_high = rc
    hl = p = None
    if times["baseline"].size >= 1 and times["candidate"].size >= 1:
        hl = ref_hodges_lehmann(times["baseline"], times["candidate"])
        p_raw = float(mannwhitneyu(times["candidate"], times["baseline"], alternative="two-sided").pvalue)
        p = p_raw if math.isfinite(p_raw) else None
    v: Any = "inconclusive"  # verdicts are kernelab.service.verdicts': only the numbers are compared
    return CellComparison(
        index=cell.index,
        params=cell.params,
        label=label,
        baseline=stats["baseline"],
        candidate=stats["candidate"],
        ratio=ratio,
        ci_low=ci_low,
        ci_high=ci_high,
        delta_pct=None if ratio is None else (ratio - 1) * 100,
        hl_shift_ns=None if hl is None else hl[0],
        hl_ci_low_ns=None if hl is None else hl[1],
        hl_ci_high_ns=None if hl is None else hl[2],
        p_value=p,
        mde_pct=min_detectable_effect_pct(stats["baseline"], stats["candidate"]),
        verdict=v,
        flags=_sorted_flags(flags),
        correctness=cell.correctness,
        throughput=rates,
        timers=cell.timers,
        static=cell.static,
    )


def ref_compare(
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
    sweep's cells that have one (``scipy.stats.false_discovery_control``). Job flags are the union
    of the cells' flags, ``contended`` from the probes, and ``failed`` when the job has an error.
    Deterministic for a given ``seed``. Raises nothing for well-formed results: cells that cannot
    be compared are ``inconclusive`` with the reason in their flags.

    ``health_flags`` (``contended``/``degraded-node``, from ``kernelab.service.node_health``: the node's
    probes left its healthy band) are added to every cell and to the job; ``notes`` are sentences the
    comparison carries (e.g. that such a result is excluded from history views).
    """
    from scipy.stats import false_discovery_control

    bounds = node_peaks(result, peaks)
    cells = [ref_compare_cell(result, c, bounds, n_resamples=n_resamples, seed=seed) for c in result.cells]
    tested = [c for c in cells if c.p_value is not None]
    if tested:
        adjusted = false_discovery_control([c.p_value for c in tested], method="bh")
        for c, p_adj in zip(tested, np.atleast_1d(adjusted).tolist(), strict=True):
            c.p_adjusted = float(p_adj)
    node_flags = list(health_flags)
    if node_flags:
        for c in cells:
            c.flags = _sorted_flags([*c.flags, *node_flags])
    flags: list[Flag] = [f for c in cells for f in c.flags] + probe_flags(result.probes) + node_flags
    if result.error:
        flags.append("failed")
    summary: dict[str, int] = {}
    for c in cells:
        summary[c.verdict] = summary.get(c.verdict, 0) + 1
    baseline_label, candidate_label = variant_labels(result)
    return Comparison(
        job_id=result.job_id if job_id is None else job_id,
        name=result.spec.name,
        benchmark=result.spec.benchmark,
        baseline_label=baseline_label,
        candidate_label=candidate_label,
        threshold_pct=result.spec.measurement.threshold_pct,
        timer=result.timer,
        node=result.node,
        cells=cells,
        probes=result.probes,
        flags=_sorted_flags(flags),
        summary=summary,
        notes=list(notes),
    )


# --------------------------------------------------------------------------------------------------
# Generated results
# --------------------------------------------------------------------------------------------------

_OK = CorrectnessResult(
    passed=True, rel_error=1e-7, max_abs_error=1e-8, cosine_similarity=1.0, rtol=1e-5, atol=1e-6
)
_BAD = _OK.model_copy(update={"passed": False})
_FOREIGN: list[dict[str, Any]] = [{"pid": 1, "own": True}, {"pid": 4242, "own": False, "sm_util_pct": 35.0}]
_PEAKS = {"copy_gbps": 4000.0, "matmul_tflops": 900.0}


def _columns(rows: list[tuple[Variant, int, float, bool]]) -> SampleColumns:
    """Samples from ``(variant, round, duration_ns, throttled)`` rows, positions numbered per round."""
    position: dict[int, int] = {}
    pos = []
    for _, r, _, _ in rows:
        pos.append(position.get(r, 0))
        position[r] = pos[-1] + 1
    return SampleColumns(
        variant=[v for v, _, _, _ in rows],
        round=[r for _, r, _, _ in rows],
        position=pos,
        duration_ns=[d for _, _, d, _ in rows],
        throttled=[t for _, _, _, t in rows],
    )


def _rows(
    rng: np.random.Generator,
    rounds: int,
    per_round: tuple[int, int],
    *,
    ratio: float = 1.0,
    noise: float = 0.02,
    grain: float = 0.0,
    throttled: float = 0.0,
    uneven: bool = False,
) -> list[tuple[Variant, int, float, bool]]:
    """ABBA rounds of ``per_round`` (baseline, candidate) samples; ``uneven`` draws 0..2x per round,
    ``grain`` rounds durations (ties), ``throttled`` marks that fraction of samples throttled."""
    base = float(rng.uniform(1e3, 1e6))
    rows: list[tuple[Variant, int, float, bool]] = []
    for r in range(rounds):
        drift = 1 + 0.01 * rng.standard_normal()
        order: tuple[Variant, Variant] = (
            ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        )
        for v in order:
            k = per_round[v == "candidate"]
            if uneven:
                k = int(rng.integers(0, 2 * k + 1))
            centre = base * (ratio if v == "candidate" else 1.0) * drift
            for _ in range(k):
                d = centre * (1 + noise * rng.standard_normal())
                if grain:
                    d = round(d / (grain * base)) * grain * base
                rows.append((v, r, max(d, 0.0), bool(rng.random() < throttled)))
    return rows


def _cell(rng: np.random.Generator, index: int) -> CellResult:
    kind = index % 12
    extra: dict = {}
    ratio = float(rng.choice([0.85, 0.97, 1.0, 1.003, 1.05, 1.3]))
    if kind == 0:
        return CellResult(index=index, params={"N": index}, error="CUDA error: out of memory")
    if kind == 1:  # a sweep cell of fixed shape (many share it: one Mann-Whitney batch)
        rows = _rows(rng, 3, (30, 30), ratio=ratio)
    elif kind == 2:  # uneven counts over a few rounds
        rows = _rows(
            rng,
            int(rng.integers(2, 8)),
            (int(rng.integers(1, 30)), int(rng.integers(1, 30))),
            ratio=ratio,
            uneven=True,
        )
    elif kind == 3:  # heavy ties
        rows = _rows(
            rng, int(rng.integers(2, 6)), (20, 15), ratio=ratio, grain=float(rng.choice([0.01, 0.05]))
        )
    elif kind == 4:  # throttled samples, dropped or kept by the spec
        rows = _rows(rng, int(rng.integers(2, 7)), (10, 10), ratio=ratio, throttled=0.3)
    elif kind == 5:  # one variant only
        rows = [r for r in _rows(rng, 4, (5, 5)) if r[0] == ("baseline", "candidate")[index % 2]]
    elif kind == 6:  # tiny: exact Mann-Whitney, no or some ties, one round
        rows = _rows(
            rng,
            int(rng.integers(1, 4)),
            (int(rng.integers(1, 4)), int(rng.integers(1, 4))),
            ratio=ratio,
            grain=float(rng.choice([0.0, 0.05])),
        )
    elif kind == 7:  # many rounds: the bootstrap draws every resample
        rows = _rows(
            rng,
            int(rng.choice([8, 25, 60])),
            (int(rng.integers(1, 4)), int(rng.integers(1, 4))),
            ratio=ratio,
            uneven=bool(rng.integers(2)),
        )
    elif kind == 8:  # a variant absent from most rounds
        rows = [r for r in _rows(rng, 12, (4, 4), ratio=ratio) if r[0] == "candidate" or r[1] % 5 == 0]
    elif kind == 9:  # a zero baseline median or constant durations
        rows = _rows(rng, 3, (6, 6), ratio=ratio)
        if index % 2:
            rows = [(v, r, 0.0 if v == "baseline" else d, t) for v, r, d, t in rows]
        else:
            rows = [(v, r, 5000.0, t) for v, r, _, t in rows]
    elif kind == 10:  # integer durations (differences land on bisection midpoints)
        rows = [(v, r, float(int(d) % 7), t) for v, r, d, t in _rows(rng, 4, (9, 11), ratio=ratio)]
    else:  # the server-load sweep's shape, throttled rows and contention
        rows = _rows(rng, 3, (100, 100), ratio=ratio, noise=0.01, throttled=0.02)
        extra["contention"] = [ContentionReading(round=0, processes=_FOREIGN)]
    work = Work(flops=1e9, bytes_read=float(rng.choice([1e8, 1e14])), bytes_written=1e8)
    return CellResult(
        index=index,
        params={"M": 8, "N": 16 + index},
        samples=_columns(rows),
        work={"baseline": work, "candidate": work},
        correctness={"baseline": _OK, "candidate": _BAD if index % 17 == 0 else _OK},
        **extra,
    )


def _result(seed: int, cells: int) -> JobResult:
    rng = np.random.default_rng(seed)
    spec = JobSpec.model_validate(
        {
            "benchmark": "softmax",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"},
            "sweep": {"N": [16]},
            "params": {"M": 8},
            "measurement": {
                "threshold_pct": [1.0, 0.5, 5.0][seed % 3],
                "exclude_throttled": seed % 2 == 0,
                "l2_flush": True,
            },
        }
    )
    return JobResult(
        idempotency_key=f"identity-{seed}",
        spec=spec,
        node=NodeInfo(hostname="n", device_type="cuda"),
        timer="perf_counter",
        started_at=NOW,
        finished_at=NOW,
        cells=[_cell(rng, i) for i in range(cells)],
    )


# (result seed, compare seed, n_resamples): 8 x 25 = 200 cells; 37 and 500 resamples switch the
# bootstrap between its distinct-multiset and every-resample paths at other round counts.
CASES = [
    (1, 0, 2000),
    (2, 0, 2000),
    (3, 7, 2000),
    (4, 12345, 2000),
    (5, 3, 500),
    (6, 3, 500),
    (7, 11, 37),
    (8, 0, 37),
]


_NUMBERS = (
    "ratio", "ci_low", "ci_high", "delta_pct", "hl_shift_ns", "hl_ci_low_ns", "hl_ci_high_ns", "p_value",
    "p_adjusted", "mde_pct", "throughput", "error",
)  # fmt: skip


def _numbers(cells: Iterable[CellComparison]) -> list[dict[str, Any]]:
    """Every statistic of each cell (per-side summaries included), without verdicts and flags."""
    return [{"index": c.index, "baseline": c.baseline.model_dump(), "candidate": c.candidate.model_dump(),
             **{k: getattr(c, k) for k in _NUMBERS}} for c in cells]  # fmt: skip


@pytest.mark.parametrize(("result_seed", "seed", "n_resamples"), CASES)
def test_compare_matches_reference(result_seed: int, seed: int, n_resamples: int) -> None:
    result = _result(result_seed, 25)
    kw: dict[str, Any] = {
        "n_resamples": n_resamples,
        "seed": seed,
        "peaks": _PEAKS,
        "health_flags": ["degraded-node"],
    }
    ref, got = ref_compare(result, **kw), stats.compare(result, **kw)
    assert _numbers(got.cells) == _numbers(ref.cells)
    bounds = node_peaks(result, _PEAKS)
    for cell, want in zip(result.cells, ref.cells, strict=True):
        one = stats.compare_cell(result, cell, bounds, n_resamples=n_resamples, seed=seed)
        mine = ref_compare_cell(result, cell, bounds, n_resamples=n_resamples, seed=seed)
        assert _numbers([one]) == [{**_numbers([mine])[0], "p_adjusted": None}]
        assert one.p_value == want.p_value


def test_generated_cells_cover_the_cases() -> None:
    cells = [c for s, _, _ in CASES
             for c in stats.compare(_result(s, 25), n_resamples=37, peaks=_PEAKS).cells]  # fmt: skip
    assert len(cells) == 200
    assert {"faster", "slower", "inconclusive", "failed", "incorrect"} <= {c.verdict for c in cells}
    assert {"failed", "throttled", "noisy", "incorrect", "contended", "implausible"} <= {
        f for c in cells for f in c.flags
    }
    assert any(c.ratio is None and c.p_value is not None for c in cells)  # one round or zero median
    assert any(c.hl_shift_ns is not None and c.hl_ci_low_ns is None for c in cells)  # tiny samples
    assert any(c.p_value is None and not c.error for c in cells)  # one variant only


def _hl_inputs() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(2024)
    out = []
    for i in range(300):
        m, n = (int(v) for v in rng.integers(1, [12, 12] if i % 3 == 0 else [400, 400]))
        scale = float(rng.choice([1.0, 1e-6, 1e4, 1e9]))
        base = rng.normal(1.0, 0.05, m) * scale
        cand = rng.normal(float(rng.choice([0.9, 1.0, 1.1])), 0.05, n) * scale
        if i % 4 == 1:  # ties: coarse grid
            base, cand = np.round(base / scale, 2) * scale, np.round(cand / scale, 2) * scale
        elif i % 4 == 2:  # small integers, negatives, all-equal sides
            base = rng.integers(-3, 4, m).astype(float)
            cand = np.full(n, 2.0) if i % 8 == 2 else rng.integers(-3, 4, n).astype(float)
        elif i % 8 == 3:  # spread near the rounding of the values: the bisection counts pairs often
            base, cand = 1e12 + rng.normal(0, 1, m), 1e12 + rng.normal(0.5, 1, n)
        elif i % 16 == 7:  # dyadic values: bisection midpoints land on differences
            base, cand = rng.integers(0, 4, m) / 8.0, rng.integers(0, 4, n) / 8.0 + 0.125
        out.append((base, cand))
    out.append((np.full(50, 7.0), np.full(60, 7.0)))
    out.append((np.array([0.0]), np.array([0.0])))
    out.append((rng.normal(0, 1, 30) * 1e-310, rng.normal(0, 1, 20) * 1e-310))  # subnormal
    out.append((np.array([1.0, 2.0]), np.array([4.0, 6.0])))
    return out


@pytest.mark.parametrize("confidence", [0.95, 0.5, 0.99])
def test_hodges_lehmann_matches_reference(confidence: float) -> None:
    for base, cand in _hl_inputs():
        assert estimators.hodges_lehmann(base, cand, confidence=confidence) == ref_hodges_lehmann(
            base, cand, confidence=confidence
        ), (base.size, cand.size)


def test_hodges_lehmann_beyond_the_pairwise_limit_matches_reference() -> None:
    rng = np.random.default_rng(3)
    base, cand = rng.normal(1e4, 100, 1500), rng.normal(9e3, 100, 1500)  # 2.25e6 pairs
    assert base.size * cand.size > estimators._HL_PAIRWISE_MAX
    assert estimators.hodges_lehmann(base, cand) == ref_hodges_lehmann(base, cand)


def test_ratio_ci_matches_reference() -> None:
    rng = np.random.default_rng(11)
    for i in range(120):
        rows = _rows(
            rng,
            int(rng.choice([2, 3, 4, 5, 6, 7, 9, 30])),
            (int(rng.integers(1, 20)), int(rng.integers(1, 20))),
            ratio=float(rng.uniform(0.8, 1.2)),
            uneven=i % 2 == 1,
            grain=0.02 if i % 5 == 0 else 0.0,
        )
        samples = _columns(rows)
        kw: dict[str, Any] = {
            "seed": int(rng.integers(0, 4)),
            "n_resamples": int(rng.choice([1, 37, 500, 2000])),
            "confidence": float(rng.choice([0.95, 0.9, 0.5])),
        }
        for _ in range(2):  # the second call finds the cached draws
            assert estimators.ratio_ci(samples, **kw) == ref_ratio_ci(samples, **kw), (i, kw)


def test_variant_stats_matches_reference() -> None:
    rng = np.random.default_rng(5)
    for n in [0, 1, 2, 3, 4, 5, 7, 8, 100, 301]:
        x = np.round(rng.lognormal(9, 0.3, n), int(rng.integers(0, 3)))
        assert estimators.variant_stats(x, dropped_throttled=n % 3) == ref_variant_stats(
            x, dropped_throttled=n % 3
        )


def test_mann_whitney_batches_match_one_call_per_pair() -> None:
    """Pairs of one shape share a scipy call only where each row's p equals its own call's."""
    from scipy.stats import mannwhitneyu

    rng = np.random.default_rng(8)
    pairs: list[tuple[np.ndarray, np.ndarray] | None] = [None, (np.array([]), np.array([1.0]))]
    for i in range(40):
        m, n = [(5, 6), (5, 6), (30, 20), (30, 20), (9, 9), (9, 9), (8, 40)][i % 7]
        base, cand = rng.normal(100, 5, m), rng.normal(103, 5, n)
        if i % 3 == 0:  # ties in some rows of a shape but not in others
            base, cand = np.round(base, -1), np.round(cand, -1)
        if i % 11 == 0:
            base, cand = np.full(m, 7.0), np.full(n, 7.0)
        pairs.append((base, cand))
    want = []
    for pair in pairs:
        p = None if pair is None or not pair[0].size else float(mannwhitneyu(pair[1], pair[0]).pvalue)
        want.append(p if p is not None and math.isfinite(p) else None)
    assert estimators.mann_whitney_p(pairs) == want
