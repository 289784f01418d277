"""Estimators of one cell's samples: which samples count, the ratio of medians with a bootstrap
over rounds, the Hodges-Lehmann shift, Mann-Whitney U, the minimum detectable effect, per-side
summaries and throughput.

Method: the centre per side is the median (robust;
delays only add time), with min, quartiles and mean; the effect is the ratio of medians
candidate/baseline (< 1 is faster) with a percentile bootstrap CI that resamples whole interleaved
*rounds*, because samples inside a round share clock and thermal state and are not independent (a
cluster bootstrap; Davison & Hinkley 1997, section 3.8); companions are the Hodges-Lehmann shift
with its distribution-free CI, the Mann-Whitney U p-value and the minimum detectable effect.

Pure functions over numpy; no database, no web framework. The runner imports this module for
``ratio_ci`` (the engine's adaptive stop), so only numpy is imported at module level:
``scipy.stats`` costs ~0.6 s to import and is imported inside the functions that need it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from kernelab.service.contract import clock_events
from kernelab.service.contract.schemas import (
    CellResult,
    PlacementSchedule,
    SampleColumns,
    Side,
    SideStats,
    Work,
)

_MDE_Z_SUM = 2.8  # z(1 - 0.05/2) + z(0.80) = 1.96 + 0.84: two-sided alpha 0.05, 80% power
_IQR_TO_SIGMA = 1.349  # IQR of a normal distribution in standard deviations (2 * 0.6745)
_SIDES: tuple[Side, Side] = ("baseline", "candidate")


def throttled_mask(samples: SampleColumns) -> np.ndarray:
    """``(n,)`` bool: True where a sample was taken while throttled: marked ``throttled`` by the
    runner (its clock below 75% of the expected one), or holding a throttle reason in its NVML
    clock-event mask other than the power cap alone (``kernelab.service.contract.clock_events.
    SAMPLE_THROTTLE_MASK``: thermal, hardware slowdown, power brake), whatever its clock. A DCGM
    blank placeholder mask is no data (``clock_events.is_placeholder``); a null mask (-1) is no
    data either."""
    marked = np.asarray(samples.throttled, dtype=bool)
    masks = np.asarray(samples.clock_event_reasons, dtype=np.int64)
    readable = (masks >= 0) & (masks < clock_events.DCGM_INT64_BLANK)
    if not readable.any():
        return marked
    return marked | (readable & ((masks & clock_events.SAMPLE_THROTTLE_MASK) != 0))


def kept_mask(
    samples: SampleColumns, *, exclude_throttled: bool, throttled: np.ndarray | None = None
) -> np.ndarray:
    """``(n,)`` bool: the samples the statistics use, the one rule for every reader of them
    (``kept_samples``, ``kept_arrays``, the dashboard's figures): all of them, or with
    ``exclude_throttled`` those not taken while throttled (``throttled_mask``; pass it as
    ``throttled`` when already computed).

    nvbench discards samples whose SM clock fell below 75% of the default clock; the runner marks
    such samples ``throttled=True``, and a sample whose clock-event mask holds a throttle reason is
    throttled too. ``MeasurementSpec.exclude_throttled`` (default True) says whether they go.
    """
    if not exclude_throttled:
        return np.ones(len(samples), dtype=bool)
    return ~(throttled_mask(samples) if throttled is None else throttled)


def kept_samples(samples: SampleColumns, *, exclude_throttled: bool) -> SampleColumns:
    """The samples the statistics use (``kept_mask``) as ``SampleColumns``. Returns ``samples``
    itself when nothing is dropped (do not mutate it)."""
    if not exclude_throttled:
        return samples
    keep = kept_mask(samples, exclude_throttled=True)
    if keep.all():
        return samples
    return samples.select(keep)


def is_candidate(samples: SampleColumns) -> np.ndarray:
    """``(n,)`` bool: True where the sample is the candidate's, False for the baseline's."""
    return np.asarray(samples.variant) == 1


def _round_matrix(sample_rounds: np.ndarray, durations: np.ndarray, rounds: np.ndarray) -> np.ndarray:
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


def _resampled_medians(matrix: np.ndarray, idx: np.ndarray) -> np.ndarray:
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
    with np.errstate(over="ignore"):
        mid = (lower + upper) / 2
    overflowed = np.isinf(mid) & np.isfinite(lower) & np.isfinite(upper)
    if overflowed.any():  # two values near 1.8e308: lower + (upper - lower) / 2 cannot overflow
        mid[overflowed] = lower[overflowed] + (upper[overflowed] - lower[overflowed]) / 2
    return np.where(count > 0, mid, np.nan)


def _median(x: np.ndarray) -> float:
    """``np.median`` of (n,) float64, n >= 1, computed without overflow: numpy averages the two
    middle values as (a + b) / 2, which overflows for values near 1.8e308; then the percentile's
    a + (b - a) / 2 (the same value, possibly one ulp apart) is taken."""
    with np.errstate(over="ignore"):
        m = float(np.median(x))
    return m if math.isfinite(m) or not np.isfinite(x).all() else float(np.percentile(x, 50))


@lru_cache(maxsize=256)
def _round_multisets(seed: int, n_rounds: int, n_resamples: int) -> tuple[np.ndarray, np.ndarray]:
    """The seeded bootstrap draws of ``ratio_ci`` as distinct multisets of rounds.

    Draws ``(n_resamples, n_rounds)`` round indices with ``numpy.random.default_rng(seed)`` and
    returns ``(uniq, inverse)``: ``uniq`` (U, n_rounds) int64, the distinct draws with each row
    sorted; ``inverse`` (n_resamples,) int64, the row of ``uniq`` that draw i is. A function of the
    arguments only, so cached: a sweep's cells share seed and round count and draw once. Read-only.
    """
    idx = np.random.default_rng(seed).integers(0, n_rounds, size=(n_resamples, n_rounds))
    uniq, inverse = np.unique(np.sort(idx, axis=1), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    uniq.flags.writeable = False
    inverse.flags.writeable = False
    return uniq, inverse


def ratio_ci(
    samples: SampleColumns,
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
    input_sets: int = 1,
    swap_every_rounds: int = 2,
    schedule: PlacementSchedule = "pairs",
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
    200 rounds and 2000 resamples on a 2-core CI machine (``benchmarks/stats_speed.py``); with few
    rounds (3: 10 distinct resamples) the draws are cached per ``(seed, rounds, n_resamples)`` and a
    cell of 600 samples costs well under 1 ms (``benchmarks/compare_speed.py``).
    With ``input_sets`` >= 2 (the cell's ``Placement``, its ``schedule`` too) the estimator is
    stratified by input-set assignment (``ratio_ci_arrays``'s ``strata``, from
    ``placement_strata``), and with 3 or more the CI also spans the spread of the sides'
    differences per set (``cluster_cis``' ``between_sets``).
    Raises ValueError for ``confidence`` outside (0, 1) or ``n_resamples`` < 1.
    """
    rounds = np.asarray(samples.round, dtype=np.int64)
    return ratio_ci_arrays(
        is_candidate(samples),
        rounds,
        np.asarray(samples.duration_ns, dtype=np.float64),
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
        strata=placement_strata(rounds, input_sets, swap_every_rounds),
        between_sets=input_sets if input_sets >= BETWEEN_STRATA_MIN_SETS else 0,
        schedule=schedule,
    )


def ratio_ci_arrays(
    candidate: np.ndarray,
    sample_rounds: np.ndarray,
    durations: np.ndarray,
    *,
    confidence: float,
    n_resamples: int,
    seed: int,
    strata: np.ndarray | None = None,
    between_sets: int = 0,
    schedule: PlacementSchedule = "pairs",
) -> tuple[float, float, float] | None:
    """``ratio_ci`` on arrays: (n,) bool ``is_candidate``, (n,) int64 rounds, (n,) float64 ns;
    ``strata``, ``between_sets`` and ``schedule`` as in ``cluster_cis``."""
    cis = cluster_cis(
        candidate, sample_rounds, durations, confidence=confidence, n_resamples=n_resamples, seed=seed,
        strata=strata, between_sets=between_sets, schedule=schedule,
    )  # fmt: skip
    return None if cis is None else cis.ratio


class ClusterCIs(NamedTuple):
    """``cluster_cis``' answer: ``ratio``: (ratio, low, high) or None; ``medians``: per side, the
    percentile CI (low_ns, high_ns) of that side's median over the same resamples of rounds, or
    None where the side has no finite resampled median; ``points``: per side, the median (ns) the
    ratio is formed from (``ratio == points["candidate"] / points["baseline"]``): the plain median,
    or with strata the geometric mean of the per-stratum medians."""

    ratio: tuple[float, float, float] | None
    medians: dict[Side, tuple[float, float] | None]
    points: dict[Side, float]
    strata: tuple[float, ...] = ()
    """With strata: each stratum's own ratio of medians, in stratum order (empty without strata)."""
    placement_covered: bool = False
    """True when the CI holds ``paired_sets_ci`` (``between_sets``), so it spans the sides' own
    buffer placements; False without it (two sets, or too few sets observed on both sides)."""
    per_set: tuple[float, ...] = ()
    """With ``between_sets``: each input set's own ratio, candidate on the set over baseline on the
    set, for the sets observed on both sides (``paired_set_ratios``); a set's shared effect cancels
    in it, which the assignments' ratios of a cut-short rotation do not cancel."""


def cluster_cis(
    candidate: np.ndarray,
    sample_rounds: np.ndarray,
    durations: np.ndarray,
    *,
    confidence: float,
    n_resamples: int,
    seed: int,
    strata: np.ndarray | None = None,
    between_sets: int = 0,
    schedule: PlacementSchedule = "pairs",
) -> ClusterCIs | None:
    """The ratio of medians candidate/baseline with its round-bootstrap CI and, from the very same
    resamples of whole rounds, each side's median CI in ns (percentile intervals; Efron &
    Tibshirani 1993, ch. 13; the cluster bootstrap of Davison & Hinkley 1997, section 3.8). The
    medians' CIs cost no extra resampling: they are the distributions the ratio is formed from.

    Arrays: (n,) bool ``candidate``, (n,) int64 ``sample_rounds``, (n,) float64 ``durations`` (ns).
    ``strata``: (n,) int per sample, the input-set assignment of its round (``placement_strata``),
    or None. With strata the ratio is the geometric mean over the strata of each stratum's ratio
    of medians (and a side's median the geometric mean of its per-stratum medians), and the
    bootstrap resamples rounds within each stratum (a stratified bootstrap, Davison & Hinkley
    1997, section 3.7): in a 2x2 crossover, where each side runs input set 0 in one stratum and
    set 1 in the other, a multiplicative effect of the set cancels from the geometric mean (Senn
    2002, "Cross-over Trials in Clinical Research", ch. 3), and so it does over a full cycle of
    the cyclic rotation of K sets. A set-by-side interaction (each side's own buffers, e.g. the
    outputs its ``prepare`` allocated, placed differently: each stratum's ratio different) is not
    in the stratified bootstrap's CI. ``strata`` gives the per-stratum ratios; with two strata
    ``kernelab.service.judge.verdicts.placement_reasons`` lets a claimed change stand only where they
    agree. With ``between_sets`` K >= 3 (the strata are the assignments of the rotation of K sets,
    ``placement_strata``: in assignment a the baseline runs set a, the candidate the set
    ``candidate_set(a, K, schedule)``) the CI is widened to cover that interaction: it is the hull
    of the bootstrap interval and ``paired_sets_ci``, the Student-t interval of the mean over the sets of each
    set's log difference between the sides (the candidate's median on the set over the
    baseline's). Pairing by set removes the set's own effect, which the cyclic design cancels from
    the ratio anyway (on an H200 a one-element kernel's time moved by up to 12% between sets that
    both sides shared), and leaves each side's own buffers, which sit at K places: a random draw
    per set that the interval includes (the layout randomisation of Curtsinger & Berger 2013,
    "STABILIZER: Statistically Sound Performance Evaluation", ASPLOS). A single stratum, or a
    stratum that cannot form a ratio (a side with < 2 samples or rounds in it: with a swap period
    of p rounds, fewer than p + 2 rounds in all), gives the plain estimator over all samples; with
    ``between_sets`` such a stratum is left out while another remains.

    Returns None where no ratio can be formed (a side with < 2 samples or rounds, a baseline
    median <= 0, no finite resample). Raises ValueError for a confidence outside (0, 1) or
    ``n_resamples`` < 1.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    labels = [] if strata is None else [int(s) for s in np.unique(strata)]
    groups = [None] if strata is None else [strata == s for s in labels]
    if len(groups) <= 1:  # one stratum, or no samples at all (e.g. every sample dropped as throttled)
        groups, labels = [None], []
    between = between_sets >= 2
    parts = []
    part_labels: list[int] = []
    for i, g in enumerate(groups):
        part = (
            _boot_ratios(candidate, sample_rounds, durations, n_resamples, seed)
            if g is None
            else _boot_ratios(candidate[g], sample_rounds[g], durations[g], n_resamples, seed + i)
        )
        if part is None and between and g is not None:
            continue  # a stratum too short to form a ratio (the last, cut one): the others still cover
        if part is None:
            if g is None:
                return None
            return cluster_cis(
                candidate, sample_rounds, durations, confidence=confidence, n_resamples=n_resamples, seed=seed
            )
        parts.append(part)
        if g is not None:
            part_labels.append(labels[i])
    if not parts:
        return cluster_cis(
            candidate, sample_rounds, durations, confidence=confidence, n_resamples=n_resamples, seed=seed
        )
    if len(parts) == 1:
        ratio, boot, base_med, cand_med, base_point, cand_point = parts[0]
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            base_point = float(np.exp(np.mean(np.log(np.array([p[4] for p in parts], dtype=np.float64)))))
            cand_point = float(np.exp(np.mean(np.log(np.array([p[5] for p in parts], dtype=np.float64)))))
            ratio = cand_point / base_point  # = the geometric mean of the strata's ratios
            boot, base_med, cand_med = (
                np.exp(np.mean(np.log(np.vstack([p[k] for p in parts])), axis=0)) for k in (1, 2, 3)
            )
    boot = boot[np.isfinite(boot)]
    if boot.size == 0:
        return None
    alpha = 1.0 - confidence
    low, high = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    covered = False
    per_set: tuple[float, ...] = ()
    if between and part_labels:
        per_set = tuple(
            paired_set_ratios(
                {k: p[4] for k, p in zip(part_labels, parts, strict=True)},
                {k: p[5] for k, p in zip(part_labels, parts, strict=True)},
                between_sets,
                schedule,
            )
        )
    if between and len(parts) >= 2:
        spread = paired_sets_ci(
            {k: p[4] for k, p in zip(part_labels, parts, strict=True)},
            {k: p[5] for k, p in zip(part_labels, parts, strict=True)},
            between_sets,
            confidence,
            schedule,
        )
        if spread is not None:
            low, high = min(float(low), spread[0]), max(float(high), spread[1])
            covered = True
    medians: dict[Side, tuple[float, float] | None] = {}
    by_side: tuple[tuple[Side, np.ndarray], ...] = (("baseline", base_med), ("candidate", cand_med))
    for side, med in by_side:
        finite = med[np.isfinite(med)]
        bounds = np.quantile(finite, [alpha / 2, 1 - alpha / 2]) if finite.size else None
        medians[side] = None if bounds is None else (float(bounds[0]), float(bounds[1]))
    points: dict[Side, float] = {"baseline": float(base_point), "candidate": float(cand_point)}
    per_stratum = tuple(float(p[0]) for p in parts) if len(parts) > 1 else ()
    return ClusterCIs(
        ratio=(ratio, float(low), float(high)),
        medians=medians,
        points=points,
        strata=per_stratum,
        placement_covered=covered,
        per_set=per_set,
    )


def _boot_ratios(
    candidate: np.ndarray, sample_rounds: np.ndarray, durations: np.ndarray, n_resamples: int, seed: int
) -> tuple[float, np.ndarray, np.ndarray, np.ndarray, float, float] | None:
    """The ratio of medians and its ``n_resamples`` round-bootstrap replicates, with the resampled
    baseline and candidate medians they are formed from (each (B,) float64, NaN or inf where a
    resample lacks a side) and the two medians themselves (ns), or None (a side with < 2 samples or
    rounds, or a baseline median <= 0)."""
    sides = []
    for own in (~candidate, candidate):
        own_rounds = sample_rounds[own]
        if own_rounds.size < 2 or own_rounds.min() == own_rounds.max():  # < 2 samples or rounds
            return None
        sides.append((own_rounds, durations[own]))
    (base_rounds, base_ns), (cand_rounds, cand_ns) = sides
    base_median = _median(base_ns)  # the median of the matrix below without its NaN padding
    if base_median <= 0.0:
        return None
    cand_median = _median(cand_ns)
    ratio = cand_median / base_median
    rounds = np.unique(sample_rounds)
    base = _round_matrix(base_rounds, base_ns, rounds)
    cand = _round_matrix(cand_rounds, cand_ns, rounds)
    # A resample's median depends only on which rounds it drew (a multiset), not on their order. With
    # few rounds most of the n_resamples draws repeat a multiset (3 rounds: 10 distinct ones), so the
    # medians are computed once per distinct multiset and mapped back: identical numbers, far less sorting.
    if math.comb(2 * rounds.size - 1, rounds.size) < n_resamples:
        # cached for integer seeds only: any other seed numpy accepts (None: fresh entropy) draws anew
        draw = _round_multisets if isinstance(seed, int | np.integer) else _round_multisets.__wrapped__
        uniq, inverse = draw(seed, int(rounds.size), int(n_resamples))
        cand_med, base_med = _resampled_medians(cand, uniq)[inverse], _resampled_medians(base, uniq)[inverse]
    else:
        idx = np.random.default_rng(seed).integers(0, rounds.size, size=(n_resamples, rounds.size))
        cand_med, base_med = _resampled_medians(cand, idx), _resampled_medians(base, idx)
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = cand_med / base_med
    return ratio, boot, base_med, cand_med, base_median, cand_median


BETWEEN_STRATA_MIN_SETS = 3
"""Input sets from which the ratio's CI spans the spread of the sides' differences per set
(``cluster_cis``' ``between_sets``, ``paired_sets_ci``). With two, one degree of freedom makes
that interval useless (Student-t 97.5% quantile 12.7), and a change must show in both
assignments instead
(``kernelab.service.judge.verdicts.placement_reasons``)."""


def candidate_set(assignment: int, sets: int, schedule: PlacementSchedule = "pairs") -> int:
    """The input set the candidate runs in ``assignment`` a of a rotation of ``sets`` (K) sets, in
    which the baseline runs set a (``kernelab.runners.engine.input_set``; the schedule is the
    cell's ``Placement.schedule``).

    ``pairs`` (K even): set ``a XOR 1``, a 2x2 crossover within each pair of sets (0, 1), (2, 3),
    ... Both sides meet each set once in K assignments, and at every change of assignment both
    sides move alike: within a pair each takes the set the other side ran last, between pairs
    both take sets neither ran for K - 2 assignments. ``cyclic``: set ``(a + 1) % K``, where at
    every change the baseline takes the set the candidate ran last (warm in a cache shared by the
    sides' inputs) and the candidate a set last run K - 1 assignments ago: a systematic carry-over
    against the candidate (CPU softmax A/A, 1 MB shared inputs: the first round after a change
    4-6% slower on the candidate's side, the cell's ratio 1.02-1.04, ``docs/results/``). A design
    balanced for first-order carry-over (Williams 1949, "Experimental designs balanced for the
    estimation of residual effects of treatments", Australian Journal of Scientific Research A 2:
    149-168; Senn 2002, "Cross-over Trials in Clinical Research", ch. 10) removes it: within a
    pair, the 2x2 crossover's AB/BA sequences. Raises ValueError for an odd K under ``pairs``."""
    if schedule == "cyclic":
        return (assignment + 1) % sets
    if sets % 2:
        raise ValueError(f"the 'pairs' schedule rotates an even number of sets, got {sets}")
    return (assignment % sets) ^ 1


def candidate_assignment(set_index: int, sets: int, schedule: PlacementSchedule = "pairs") -> int:
    """The assignment in which the candidate ran ``set_index`` (the inverse of ``candidate_set``)."""
    return (set_index - 1) % sets if schedule == "cyclic" else candidate_set(set_index, sets, schedule)


def _set_differences(
    baseline: Mapping[int, float], candidate: Mapping[int, float], sets: int, schedule: PlacementSchedule
) -> dict[int, float] | None:
    """d_s = log(candidate on s / baseline on s) for each set s observed on both sides (medians in
    ns per assignment, as ``paired_sets_ci`` takes them); None when such a median is not finite
    and positive."""
    out = {}
    for s in range(sets):
        base, cand = baseline.get(s), candidate.get(candidate_assignment(s, sets, schedule))
        if base is None or cand is None:
            continue
        if not (math.isfinite(base) and math.isfinite(cand) and base > 0 and cand > 0):
            return None
        out[s] = math.log(cand) - math.log(base)
    return out


def paired_set_ratios(
    baseline: Mapping[int, float], candidate: Mapping[int, float], sets: int,
    schedule: PlacementSchedule = "pairs",
) -> list[float]:  # fmt: skip
    """The ratios candidate / baseline of each placement unit the rotation ``schedule`` of ``sets``
    sets judges alone (``paired_sets_ci`` says how the assignments map to sets), in set order:
    under ``cyclic`` each input set observed on both sides; under ``pairs`` each pair of sets (0, 1),
    (2, 3), ... whose two sets were observed on both sides, the geometric mean of its two sets'
    ratios (within a pair each side ran each set once, once after the other side's set and once
    after a change of pair, so the carry-over of warm data between assignments cancels in it, as
    in a 2x2 crossover; a single set's ratio holds that carry-over)."""
    out = []
    for s in range(sets):
        base, cand = baseline.get(s), candidate.get(candidate_assignment(s, sets, schedule))
        if base is not None and cand is not None and math.isfinite(base) and math.isfinite(cand) and base > 0:
            out.append(cand / base)
        elif schedule == "pairs":
            out.append(math.nan)
    if schedule != "pairs":
        return out
    pairs = [math.sqrt(out[k] * out[k + 1]) for k in range(0, len(out) - 1, 2)]
    return [r for r in pairs if math.isfinite(r)]


MIN_PAIRED_SETS = 3
"""Fewest sets observed on both sides for ``paired_sets_ci`` under ``cyclic`` (2 degrees of
freedom, Student-t 97.5% quantile 4.30); under ``pairs`` the same 2 degrees of freedom need 4 sets
(2 of each sequence). With fewer, a claimed change must show in every placement unit instead
(``paired_set_ratios``, ``kernelab.service.judge.verdicts.placement_reasons``)."""


def paired_sets_ci(
    baseline: Mapping[int, float], candidate: Mapping[int, float], sets: int, confidence: float,
    schedule: PlacementSchedule = "pairs",
) -> tuple[float, float] | None:  # fmt: skip
    """The Student-t interval of the ratio from each input set's two sides, under the rotation
    ``schedule`` of ``sets`` (K) sets (``kernelab.runners.engine.input_set``): ``baseline[a]`` and
    ``candidate[a]`` are the sides' medians (ns) in assignment a, where the baseline ran set a and
    the candidate set ``candidate_set(a, K, schedule)``. For each set s with both sides observed,
    d_s = log(candidate on s / baseline on s) = ``log(candidate[candidate_assignment(s)] /
    baseline[s])``, each set one observation (the analysis of cluster means, Donner & Klar 2000,
    "Design and Analysis of Cluster Randomization Trials", ch. 6).

    ``cyclic``: ``exp(mean(d) -+ t * sd(d) / sqrt(n))`` with n - 1 degrees of freedom
    (``t_quantile``). ``pairs``: each set is a 2x2 crossover of its own, the even sets run
    baseline-then-candidate (the baseline in the first assignment of its pair), the odd sets
    candidate-then-baseline, and whatever the order adds (warm data carried over from the other
    side's set) falls on d with opposite signs in the two sequence groups. The interval is the
    two-period cross-over analysis of Hills & Armitage (1979, "The two-period cross-over clinical
    trial", British Journal of Clinical Pharmacology 8: 7-20; Senn 2002, "Cross-over Trials in
    Clinical Research", ch. 3): centre ``(mean(d_even) + mean(d_odd)) / 2``, standard error
    ``s_p / 2 * sqrt(1 / n_even + 1 / n_odd)`` from the pooled variance within the two groups, with
    n - 2 degrees of freedom, so the order effect is neither in the centre nor in the spread.

    None with fewer than 2 degrees of freedom (``MIN_PAIRED_SETS``: a budget that cut the rotation
    short; with one the Student-t quantile is 12.7 and the interval says nothing), an empty
    sequence group, or a median that is not finite and positive."""
    found = _set_differences(baseline, candidate, sets, schedule)
    if found is None:
        return None
    if schedule == "cyclic":
        if len(found) < MIN_PAIRED_SETS:
            return None
        d = np.asarray(list(found.values()))
        quantile = t_quantile(0.5 + confidence / 2, d.size - 1)
        half = quantile * float(np.std(d, ddof=1)) / math.sqrt(d.size)
        centre = float(np.mean(d))
        return math.exp(centre - half), math.exp(centre + half)
    groups = [np.asarray([v for k, v in found.items() if k % 2 == parity]) for parity in (0, 1)]
    dof = sum(g.size for g in groups) - 2
    if min(g.size for g in groups) == 0 or dof < MIN_PAIRED_SETS - 1:
        return None
    pooled = sum(float(np.sum((g - g.mean()) ** 2)) for g in groups) / dof
    se = math.sqrt(pooled) / 2 * math.sqrt(sum(1 / g.size for g in groups))
    centre = 0.5 * float(groups[0].mean() + groups[1].mean())
    half = t_quantile(0.5 + confidence / 2, dof) * se
    return math.exp(centre - half), math.exp(centre + half)


def placement_strata(sample_rounds: np.ndarray, input_sets: int, swap_every_rounds: int) -> np.ndarray | None:
    """(n,) int64 input-set assignment of each sample's round (``kernelab.runners.engine.input_set``):
    ``(round // swap_every_rounds) % input_sets`` with two or more input sets, None with one (no
    strata)."""
    if input_sets < 2:
        return None
    return (np.asarray(sample_rounds, dtype=np.int64) // swap_every_rounds) % input_sets


_HL_PAIRWISE_MAX = 1 << 21  # hodges_lehmann forms the m*n differences up to this many (16 MiB of float64)
_EPS = float(np.finfo(np.float64).eps)
_TINY = 4 * math.ulp(0.0)  # a few of the smallest subnormal: rounding is absolute down there


def _kth_difference(base_sorted: np.ndarray, cand: np.ndarray, k: int, value: float | None = None) -> float:
    """k-th smallest (1-based) of the m*n differences cand[j] - base[i], without forming them.

    Bisection on the value d with the pair count #{c_j - b_i <= d} from ``searchsorted``:
    O((m + n) log m) per step, so 10^4 x 10^4 samples cost ~50 vector steps, not 10^8 floats.
    Converges to 1e-12 of the differences' range.

    ``value``: the exact k-th difference, when the caller has it (``hodges_lehmann`` selects it with
    ``np.partition`` for up to ``_HL_PAIRWISE_MAX`` pairs). The bisection then takes the same steps
    and returns the same number, but decides "count(d) >= k" as "value <= d": the two agree
    wherever |d - value| exceeds the rounding of the differences and of ``cand - d`` (bounded by
    4 machine epsilons of max|c| + max|b| + |d|, plus a margin for subnormals); only within that
    band are pairs counted (a sweep of 1,000 cells: ~150 counts instead of ~160,000).
    """
    m, n = base_sorted.size, cand.size

    def count_le(d: float) -> int:
        return m * n - int(np.searchsorted(base_sorted, cand - d, side="left").sum())

    scale = float(np.abs(cand).max() + np.abs(base_sorted).max()) if value is not None else 0.0

    def reaches_k(d: float) -> bool:  # count_le(d) >= k
        if value is not None and abs(d - value) > 4 * _EPS * (scale + abs(d)) + _TINY:
            return value <= d
        return count_le(d) >= k

    lo = float(cand.min() - base_sorted[-1])
    hi = float(cand.max() - base_sorted[0])
    if reaches_k(lo):
        return lo
    tol = 1e-12 * max(hi - lo, abs(hi), abs(lo), 1e-300)
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if reaches_k(mid):
            hi = mid
        else:
            lo = mid
    return hi


def hodges_lehmann(
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

    Each order statistic is found by bisection to 1e-12 of the differences' range
    (``_kth_difference``). Up to ``_HL_PAIRWISE_MAX`` pairs of finite values, the differences are
    formed (``np.subtract.outer``) and the order statistics selected exactly with one
    ``np.partition``, which the bisection then follows instead of counting pairs: the same numbers,
    ~1 ms instead of ~4 ms for 300 x 300 samples on a 2-core CI machine.
    """
    base = np.sort(np.asarray(baseline_ns, dtype=np.float64))
    cand = np.asarray(candidate_ns, dtype=np.float64)
    if base.size == 0 or cand.size == 0:
        raise ValueError("hodges_lehmann needs at least one sample on each side")
    m, n = base.size, cand.size
    total = m * n
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    c_alpha = math.floor(total / 2 - z * math.sqrt(total * (m + n + 1) / 12))
    middle = [(total + 1) // 2] if total % 2 else [total // 2, total // 2 + 1]
    ranks = middle + ([c_alpha, total + 1 - c_alpha] if c_alpha >= 1 else [])
    exact: dict[int, float] = {}
    if total <= _HL_PAIRWISE_MAX and np.isfinite(base).all() and np.isfinite(cand).all():
        kth = sorted({k - 1 for k in ranks})
        diffs = np.subtract.outer(cand, base).ravel()  # (n*m,) float64, a fresh array: partitioned in place
        diffs.partition(kth)
        exact = dict(zip((k + 1 for k in kth), diffs[kth].tolist(), strict=True))
    kths = {k: _kth_difference(base, cand, k, exact.get(k)) for k in ranks}
    shift = kths[middle[0]] if total % 2 else 0.5 * (kths[middle[0]] + kths[middle[1]])
    if c_alpha < 1:
        return shift, None, None
    return shift, kths[c_alpha], kths[total + 1 - c_alpha]


def min_detectable_effect_pct(base: SideStats, cand: SideStats) -> float | None:
    """Minimum detectable effect in percent: 2.8 * CV * sqrt(2/n) * 100.

    2.8 = z(0.975) + z(0.80): two-sided alpha = 0.05 and 80% power in the normal-approximation
    power formula of a two-sample test (CV 1% and n = 30 give ~0.7%). CV is the pooled robust
    coefficient of variation sqrt((cv_b^2 + cv_c^2) / 2) with cv = (IQR / 1.349) / median; n is the smaller
    sample count. None when a side has < 2 samples or a zero median.
    """
    if base.n < 2 or cand.n < 2:
        return None
    cvs = []
    for s in (base, cand):
        if not s.median_ns or s.iqr_ns is None:
            return None
        cvs.append(s.iqr_ns / _IQR_TO_SIGMA / s.median_ns)
    cv = math.sqrt((cvs[0] ** 2 + cvs[1] ** 2) / 2)
    return _MDE_Z_SUM * cv * math.sqrt(2 / min(base.n, cand.n)) * 100


def variant_stats(durations_ns: np.ndarray, *, dropped_throttled: int = 0) -> SideStats:
    """Median, min, quartiles (numpy's linear interpolation), IQR and mean of (n,) ns durations."""
    x = np.asarray(durations_ns, dtype=np.float64)
    if x.size == 0:
        return SideStats(n=0, dropped_throttled=dropped_throttled)
    q1, median, q3 = (float(v) for v in np.percentile(x, [25, 50, 75]))  # a + (b - a) * t: no overflow
    with np.errstate(over="ignore"):
        mean = float(x.mean())
    if not math.isfinite(mean) and np.isfinite(x).all():
        mean = float(np.sum(x / x.size))  # the sum overflowed (values near 1.8e308); these terms cannot
    return SideStats(
        n=int(x.size),
        dropped_throttled=dropped_throttled,
        median_ns=median,
        pooled_median_ns=median,
        min_ns=float(x.min()),
        q1_ns=q1,
        q3_ns=q3,
        iqr_ns=q3 - q1,
        mean_ns=mean,
    )


def throughput(work: Mapping[Side, Work], stats: Mapping[Side, SideStats]) -> dict[str, float]:
    """Achieved rates at the median time: ``{variant}_gbps`` and ``{variant}_tflops``.

    GB/s = (bytes_read + bytes_written) / median_ns (bytes per ns = 1e9 B/s); TFLOP/s = flops /
    median_ns / 1e3. Only variants with declared, non-zero work and a positive median appear.
    """
    out: dict[str, float] = {}
    for variant in _SIDES:
        w, s = work.get(variant), stats.get(variant)
        if w is None or s is None or not s.median_ns:
            continue
        moved = w.bytes_read + w.bytes_written
        if moved > 0:
            out[f"{variant}_gbps"] = moved / s.median_ns
        if w.flops > 0:
            out[f"{variant}_tflops"] = w.flops / s.median_ns / 1e3
    return out


class KeptSamples(NamedTuple):
    """A cell's kept samples (``kept_samples``) as arrays, and what was taken before dropping."""

    candidate: np.ndarray  # (n,) bool, ``is_candidate``
    rounds: np.ndarray  # (n,) int64
    durations: np.ndarray  # (n,) float64 ns
    times: dict[Side, np.ndarray]  # per variant, (n_v,) float64 ns in sample order
    taken: dict[Side, int]  # samples taken per variant, throttled ones included
    throttled: bool  # any sample throttled, dropped or not


def kept_arrays(cell: CellResult, *, exclude_throttled: bool) -> KeptSamples:
    """``kept_samples`` of ``cell`` as arrays: the same rows, without building a ``SampleColumns``."""
    samples = cell.samples
    taken_candidate = is_candidate(samples)
    throttled = throttled_mask(samples)
    rounds = np.asarray(samples.round, dtype=np.int64)
    durations = np.asarray(samples.duration_ns, dtype=np.float64)
    candidate = taken_candidate
    keep = kept_mask(samples, exclude_throttled=exclude_throttled, throttled=throttled)
    if not keep.all():
        candidate, rounds, durations = taken_candidate[keep], rounds[keep], durations[keep]
    n_candidate = int(np.count_nonzero(taken_candidate))
    return KeptSamples(
        candidate=candidate,
        rounds=rounds,
        durations=durations,
        times={"baseline": durations[~candidate], "candidate": durations[candidate]},
        taken={"baseline": len(samples) - n_candidate, "candidate": n_candidate},
        throttled=bool(throttled.any()),
    )


def _has_tie(a: np.ndarray, b: np.ndarray) -> bool:
    both = np.concatenate([np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)])
    return bool(np.unique(both).size < both.size)


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom: ``scipy.special.stdtrit(df,
    q)``, the function ``scipy.stats.t.ppf`` evaluates (``scipy/stats/_continuous_distns.py``,
    ``t_gen._ppf``). ``scipy.special`` imports in about a third of ``scipy.stats``'s time (0.3 s
    against 0.9 s on a loaded 2-core machine), which the runner's stop check and ``kernelab.compare``
    wait for."""
    from scipy.special import stdtrit  # noqa: PLC0415

    return float(stdtrit(df, q))


def bh_adjusted(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (the false discovery rate of each test: Benjamini &
    Hochberg 1995, "Controlling the false discovery rate", JRSS B 57: 289-300), in the input's
    order: sorted ascending, p_(i) * (m / i), then the running minimum from the largest down, clipped
    to [0, 1]. The computation of ``scipy.stats.false_discovery_control(ps, method="bh")``
    (``scipy/stats/_morestats.py``) without its 0.9 s import. Raises ValueError for a p outside
    [0, 1] or not finite, as scipy does."""
    ps = np.asarray(p_values, dtype=np.float64)
    if ps.size == 0:
        return []
    if not np.isfinite(ps).all() or (ps < 0).any() or (ps > 1).any():
        raise ValueError("p-values must be finite and within [0, 1]")
    order = np.argsort(ps, kind="stable")
    m = ps.size
    adjusted = ps[order] * (m / np.arange(1, m + 1, dtype=np.float64))
    adjusted = np.minimum.accumulate(adjusted[::-1])[::-1]
    out = np.empty(m)
    out[order] = np.clip(adjusted, 0.0, 1.0)
    return out.tolist()


def _mwu_asymptotic_p(candidate: np.ndarray, baseline: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value of ``candidate`` vs ``baseline`` (finite values) by the normal
    approximation with the tie correction and the continuity correction: the "asymptotic" method of
    ``scipy.stats.mannwhitneyu`` step by step (``scipy/stats/_mannwhitneyu.py``: U = max(U1, U2) of the
    average ranks, z = (U - n1 n2 / 2 - 0.5) / sqrt(n1 n2 / 12 ((n + 1) - sum(t^3 - t) / (n (n - 1)))),
    p = 2 ndtr(-z), clipped to [0, 1]; Mann & Whitney 1947, tie correction after Lehmann 1975,
    "Nonparametrics", ch. 1), so that ``scipy.stats`` need not be imported for it. The rank sums and
    tie counts are sums of integers and halves, exact in float64."""
    from scipy.special import ndtr  # noqa: PLC0415

    x, y = np.asarray(candidate, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    n1, n2 = x.size, y.size
    values, inverse, ties = np.unique(np.concatenate([x, y]), return_inverse=True, return_counts=True)
    del values
    upper = np.cumsum(ties)  # the highest rank of each group of equal values
    average = (upper - (ties - 1) / 2.0).astype(np.float64)  # ranks from 1, ties averaged
    r1 = float(np.sum(average[inverse[:n1]]))
    u1 = r1 - n1 * (n1 + 1) / 2
    u = max(u1, n1 * n2 - u1)
    n = n1 + n2
    t = ties.astype(np.float64)
    tie_term = float(np.sum(t**3 - t))
    s = math.sqrt(n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))))
    numerator = u - n1 * n2 / 2 - 0.5
    with np.errstate(divide="ignore", invalid="ignore"):  # every value equal: s = 0, z = -inf, p = 1
        z = np.float64(numerator) / np.float64(s)
    return float(np.clip(2.0 * ndtr(-z), 0.0, 1.0))


def mann_whitney_p(sides: Sequence[tuple[np.ndarray, np.ndarray] | None]) -> list[float | None]:
    """Two-sided Mann-Whitney U p-value, candidate vs baseline, per ``(baseline_ns, candidate_ns)``.

    ``scipy.stats.mannwhitneyu(candidate, baseline, alternative="two-sided")`` with its default
    ``method="auto"``; None for a pair that is None or has an empty side, or a non-finite p. Pairs
    of finite values with more than 8 samples on both sides, or with a tie, are where "auto" takes
    the normal approximation: computed here (``_mwu_asymptotic_p``, the same formula; agrees with
    scipy's p to within 1e-12 relative, ``tests/service/test_estimators.py``) without importing
    ``scipy.stats`` (0.9 s on a loaded 2-core machine: a third of a first ``kernelab.compare``).
    Smaller pairs without ties, where "auto" takes the exact distribution, and pairs with a
    non-finite value go to scipy one by one.
    """
    raw: dict[int, float] = {}
    for i, pair in enumerate(sides):
        if pair is None or pair[0].size == 0 or pair[1].size == 0:
            continue
        base, cand = pair
        finite = bool(np.isfinite(base).all() and np.isfinite(cand).all())
        if finite and ((base.size > 8 and cand.size > 8) or _has_tie(base, cand)):
            raw[i] = _mwu_asymptotic_p(cand, base)
        else:
            from scipy.stats import mannwhitneyu  # noqa: PLC0415

            raw[i] = float(mannwhitneyu(cand, base, alternative="two-sided").pvalue)
    return [None if (p := raw.get(i)) is None or not math.isfinite(p) else p for i in range(len(sides))]
