"""``kernelab.service.judge.stats`` against brute-force oracles and golden files.

Each statistic is computed a second way that is slow but obviously right: Hodges-Lehmann as the
median (and order statistics) of all m*n pairwise differences, the round bootstrap as a plain loop
over the resamples and as ``scipy.stats.bootstrap(method="percentile")`` over round indices, the
per-side summary with Python's ``statistics``, Mann-Whitney's exact p by enumerating every
assignment of ranks and its normal approximation with tie and continuity correction written out,
Benjamini-Hochberg by its definition. The golden files (``golden/compare_input.json``, a
``JobResult``; ``golden/compare_expected.json``, its ``Comparison``), as nvbench_compare keeps
``test_ref.json``/``test_cmp.json``, pin the whole comparison: numbers, verdicts, reasons and flags
(``golden/regenerate.py`` rewrites the expected file after an intended change).
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy.stats import bootstrap, norm, rankdata
from stats_cases import PEAKS, columns, result, round_rows

from kernelab.service.contract.schemas import JobResult, SampleColumns
from kernelab.service.judge import estimators, stats

GOLDEN = Path(__file__).parent / "golden"


def _close(got: float | None, want: float | None, scale: float, rel: float = 1e-12) -> bool:
    """Equal within ``rel`` of ``scale`` (the bisection's 1e-12 of the differences' range), plus
    at least 1e-300; None only with None."""
    if got is None or want is None:
        return got is want
    return abs(got - want) <= rel * max(scale, 1e-300)  # the bisection's floor, for subnormals


# --------------------------------------------------------------------------------------------------
# Hodges-Lehmann: the median of all pairwise differences
# --------------------------------------------------------------------------------------------------


def brute_hodges_lehmann(base: np.ndarray, cand: np.ndarray, confidence: float) -> tuple[float, Any, Any]:
    """Every difference cand[j] - base[i], sorted; the median and the order statistics
    (D_(C), D_(mn+1-C)), C = floor(mn/2 - z sqrt(mn(m+n+1)/12)) (Hollander & Wolfe 1999, 4.3)."""
    d = np.sort(np.subtract.outer(cand, base).ravel())
    m, n = base.size, cand.size
    c = math.floor(m * n / 2 - norm.ppf(1 - (1 - confidence) / 2) * math.sqrt(m * n * (m + n + 1) / 12))
    shift = float(np.median(d))
    return (shift, None, None) if c < 1 else (shift, float(d[c - 1]), float(d[m * n - c]))


def _hl_inputs() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(2024)
    out = []
    for i in range(120):
        m, n = (int(v) for v in rng.integers(1, [12, 12] if i % 3 == 0 else [300, 300]))
        scale = float(rng.choice([1.0, 1e-6, 1e4, 1e9]))
        base = rng.normal(1.0, 0.05, m) * scale
        cand = rng.normal(float(rng.choice([0.9, 1.0, 1.1])), 0.05, n) * scale
        if i % 4 == 1:  # ties: coarse grid
            base, cand = np.round(base / scale, 2) * scale, np.round(cand / scale, 2) * scale
        elif i % 4 == 2:  # small integers, negatives, all-equal sides
            base = rng.integers(-3, 4, m).astype(float)
            cand = np.full(n, 2.0) if i % 8 == 2 else rng.integers(-3, 4, n).astype(float)
        elif i % 8 == 3:  # spread near the rounding of the values
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
def test_hodges_lehmann_is_the_median_of_all_pairwise_differences(confidence: float) -> None:
    for base, cand in _hl_inputs():
        got, want = (
            estimators.hodges_lehmann(base, cand, confidence=confidence),
            brute_hodges_lehmann(base, cand, confidence),
        )
        spread = float(np.ptp(np.subtract.outer(cand, base))) + float(np.abs(cand).max() + np.abs(base).max())
        assert all(_close(g, w, spread) for g, w in zip(got, want, strict=True)), (
            base.size,
            cand.size,
            got,
            want,
        )


def test_hodges_lehmann_beyond_the_pairwise_limit_is_still_the_median_of_differences() -> None:
    rng = np.random.default_rng(3)
    base, cand = rng.normal(1e4, 100, 1500), rng.normal(9e3, 100, 1500)  # 2.25e6 pairs: bisection only
    assert base.size * cand.size > estimators._HL_PAIRWISE_MAX
    got, want = estimators.hodges_lehmann(base, cand), brute_hodges_lehmann(base, cand, 0.95)
    assert all(_close(g, w, 2e4) for g, w in zip(got, want, strict=True)), (got, want)


def test_hodges_lehmann_of_a_known_shift() -> None:
    base = np.array([1.0, 2.0, 3.0])
    assert estimators.hodges_lehmann(base, base + 10.0)[0] == pytest.approx(10.0, rel=1e-12)  # of 8..12
    assert estimators.hodges_lehmann(np.array([1.0, 2.0]), np.array([4.0, 6.0]))[0] == pytest.approx(
        3.5, rel=1e-12
    )


# --------------------------------------------------------------------------------------------------
# Ratio of medians with its bootstrap over whole rounds
# --------------------------------------------------------------------------------------------------


def brute_ratio_ci(samples: SampleColumns, confidence: float, n_resamples: int, seed: int) -> Any:
    """The cluster bootstrap written as a loop: draw round numbers with replacement (the same
    ``default_rng(seed).integers`` draws), take every sample of each drawn round, ratio of the
    medians; the percentile interval of the ratios of resamples that hold both sides."""
    rounds_of = np.asarray(samples.round)
    is_cand = np.asarray(samples.variant) == 1  # 0 baseline, 1 candidate
    ns = np.asarray(samples.duration_ns, dtype=float)
    for own in (~is_cand, is_cand):
        if own.sum() < 2 or len(set(rounds_of[own])) < 2:
            return None
    if np.median(ns[~is_cand]) <= 0:
        return None
    ratio = float(np.median(ns[is_cand]) / np.median(ns[~is_cand]))
    rounds = np.unique(rounds_of)
    draws = np.random.default_rng(seed).integers(0, rounds.size, size=(n_resamples, rounds.size))
    boot = []
    for draw in draws:
        picked = np.concatenate([np.flatnonzero(rounds_of == rounds[k]) for k in draw])
        b, c = ns[picked][~is_cand[picked]], ns[picked][is_cand[picked]]
        if b.size and c.size and np.median(b) != 0:
            boot.append(np.median(c) / np.median(b))
    if not boot:
        return None
    alpha = 1 - confidence
    low, high = np.quantile(np.array(boot), [alpha / 2, 1 - alpha / 2])
    return ratio, float(low), float(high)


def test_ratio_ci_is_the_cluster_bootstrap_written_as_a_loop() -> None:
    rng = np.random.default_rng(11)
    for i in range(60):
        rows = round_rows(
            rng,
            int(rng.choice([2, 3, 4, 5, 7, 9, 30])),
            (int(rng.integers(1, 12)), int(rng.integers(1, 12))),
            ratio=float(rng.uniform(0.8, 1.2)),
            uneven=i % 2 == 1,
            grain=0.02 if i % 5 == 0 else 0.0,
        )
        samples = columns(rows)
        kw = {
            "seed": int(rng.integers(0, 4)),
            "n_resamples": int(rng.choice([1, 37, 400])),
            "confidence": float(rng.choice([0.95, 0.9, 0.5])),
        }
        got, want = estimators.ratio_ci(samples, **kw), brute_ratio_ci(samples, **kw)
        assert estimators.ratio_ci(samples, **kw) == got  # the second call finds the cached draws
        if want is None:
            assert got is None, (i, kw)
        else:
            assert got is not None and all(_close(g, w, 1.0) for g, w in zip(got, want, strict=True)), (i, kw)


@pytest.mark.parametrize(
    ("rounds", "n_resamples", "confidence"), [(3, 2000, 0.95), (12, 999, 0.9), (40, 500, 0.99)]
)
def test_ratio_ci_is_scipys_percentile_bootstrap_over_rounds(
    rounds: int, n_resamples: int, confidence: float
) -> None:
    """``scipy.stats.bootstrap(method="percentile")`` resampling round indices, with the same seeded
    generator, gives the same interval (every round holds both sides, so no resample is left out)."""
    samples = columns(round_rows(np.random.default_rng(rounds), rounds, (5, 7), ratio=0.95, noise=0.05))
    ns, is_cand = np.asarray(samples.duration_ns), np.asarray(samples.variant) == 1  # 0 baseline, 1 candidate
    by_round = [np.flatnonzero(np.asarray(samples.round) == r) for r in range(rounds)]

    def ratio(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        out = []
        for draw in np.atleast_2d(idx).astype(int):
            picked = np.concatenate([by_round[k] for k in draw])
            out.append(np.median(ns[picked][is_cand[picked]]) / np.median(ns[picked][~is_cand[picked]]))
        return np.array(out) if np.ndim(idx) > 1 else np.array(out[0])

    ci = bootstrap(
        (np.arange(rounds, dtype=float),),
        ratio,
        n_resamples=n_resamples,
        confidence_level=confidence,
        method="percentile",
        vectorized=True,
        rng=np.random.default_rng(5),
    ).confidence_interval
    _, low, high = estimators.ratio_ci(samples, confidence=confidence, n_resamples=n_resamples, seed=5)
    assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Per-side summary, Mann-Whitney U, Benjamini-Hochberg
# --------------------------------------------------------------------------------------------------


def test_variant_stats_agree_with_the_statistics_module() -> None:
    rng = np.random.default_rng(5)
    for n in [2, 3, 4, 5, 7, 8, 100, 301]:
        x = np.round(rng.lognormal(9, 0.3, n), int(rng.integers(0, 3)))
        got = estimators.variant_stats(x, dropped_throttled=1)
        q1, med, q3 = statistics.quantiles(x.tolist(), n=4, method="inclusive")  # numpy's "linear"
        assert (got.n, got.dropped_throttled, got.min_ns) == (n, 1, min(x))
        want = (statistics.median(x.tolist()), q1, q3, q3 - q1, statistics.fmean(x.tolist()))
        assert (got.median_ns, got.q1_ns, got.q3_ns, got.iqr_ns, got.mean_ns) == pytest.approx(
            want, rel=1e-12
        )
        assert med == pytest.approx(got.median_ns, rel=1e-12)
    assert estimators.variant_stats(np.array([])).median_ns is None


def exact_mann_whitney_p(base: np.ndarray, cand: np.ndarray) -> float:
    """Two-sided exact p of U (pairs cand > base) without ties: every way of choosing which of the
    m+n ranks are the candidate's, equally likely under the null; p = 2 min(P(U <= u), P(U >= u))."""
    m, n = base.size, cand.size
    u = sum(int(c > b) for c in cand for b in base)
    counts = [0] * (m * n + 1)
    for chosen in itertools.combinations(range(m + n), n):
        counts[sum(chosen) - n * (n - 1) // 2] += 1  # U = rank sum of the candidate - n(n-1)/2 (ranks from 0)
    total = math.comb(m + n, n)
    return min(1.0, 2 * min(sum(counts[: u + 1]), sum(counts[u:])) / total)


def normal_mann_whitney_p(base: np.ndarray, cand: np.ndarray) -> float:
    """The large-sample p: U against mn/2 with the tie-corrected variance and a continuity
    correction of 1/2 (Hollander & Wolfe 1999, section 4.1)."""
    m, n = base.size, cand.size
    ranks = rankdata(np.concatenate([cand, base]))
    u = ranks[:n].sum() - n * (n + 1) / 2
    ties = np.unique(ranks, return_counts=True)[1]
    big_n = m + n
    var = m * n / 12 * ((big_n + 1) - (ties**3 - ties).sum() / (big_n * (big_n - 1)))
    z = (max(u, m * n - u) - m * n / 2 - 0.5) / math.sqrt(var)
    return min(1.0, 2 * float(norm.sf(z)))


def test_mann_whitney_p_is_the_exact_or_the_normal_test() -> None:
    rng = np.random.default_rng(8)
    pairs: list[tuple[np.ndarray, np.ndarray] | None] = [None, (np.array([]), np.array([1.0]))]
    want: list[float | None] = [None, None]
    for m, n in [(1, 1), (2, 3), (5, 6), (8, 8), (3, 7), (7, 2)]:  # "auto": exact, no ties
        base, cand = rng.normal(100, 5, m), rng.normal(103, 5, n)
        pairs.append((base, cand))
        want.append(exact_mann_whitney_p(base, cand))
    for i in range(30):  # > 8 a side (batched per shape) or tied: the normal approximation
        m, n = [(30, 20), (30, 20), (9, 9), (9, 9), (9, 40), (5, 6)][i % 6]
        base, cand = rng.normal(100, 5, m), rng.normal(103, 5, n)
        if i % 3 == 0 or (m, n) == (5, 6):  # ties in some rows of a shape, and in every small one
            base, cand = np.round(base, -1), np.round(cand, -1)
        pairs.append((base, cand))
        want.append(normal_mann_whitney_p(base, cand))
    got = estimators.mann_whitney_p(pairs)
    assert [g is None for g in got] == [w is None for w in want]
    assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None], rel=1e-9)


def test_the_statistics_without_scipy_stats_give_scipys_numbers() -> None:
    """The asymptotic Mann-Whitney p, the Benjamini-Hochberg adjustment and the t quantile that the
    comparison computes without importing ``scipy.stats`` are scipy's own numbers, bit for bit:
    random pairs of 1-59 samples a side, with and without ties (integer nanoseconds too)."""
    from scipy.stats import false_discovery_control, mannwhitneyu, t

    rng = np.random.default_rng(36)
    for trial in range(600):
        m, n = (int(v) for v in rng.integers(1, 60, 2))
        kind = trial % 4  # continuous, small integers (ties), integer nanoseconds, all equal
        base = [
            rng.normal(100, 5, m),
            rng.integers(0, 6, m) * 1.0,
            rng.integers(1000, 1010, m),
            np.full(m, 7.0),
        ][kind]
        cand = [
            rng.normal(101, 5, n),
            rng.integers(0, 7, n) * 1.0,
            rng.integers(1000, 1012, n),
            np.full(n, 7.0),
        ][kind]
        (got,) = estimators.mann_whitney_p([(base, cand)])
        want = float(mannwhitneyu(cand, base, alternative="two-sided").pvalue)
        assert got == want or (got is None and math.isnan(want)), (trial, m, n, got, want)
    for m in (1, 2, 3, 17, 400):
        p = rng.uniform(size=m)
        p[::3] = p[0]  # ties
        assert (
            estimators.bh_adjusted(p.tolist())
            == np.atleast_1d(false_discovery_control(p, method="bh")).tolist()
        )
    for q in (0.9, 0.975, 0.999, 0.99995):
        for df in (1, 2, 5, 19, 1000):
            assert estimators.t_quantile(q, df) == float(t.ppf(q, df))


def test_a_comparison_imports_no_scipy_stats() -> None:
    """``stats.compare`` of a sweep whose cells have more than 8 samples a side imports
    ``scipy.special`` only (``scipy.stats`` is 0.9 s of a first ``kernelab.compare``): checked in a
    fresh interpreter."""
    import subprocess
    import sys

    code = (
        "import sys; sys.path.insert(0, 'tests/service'); from factories import job_result; "
        "from kernelab.service.judge import stats; c = stats.compare(job_result(1, rounds=12)); "
        "assert all(x.p_value is not None for x in c.cells); print('scipy.stats' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "False", "a comparison imported scipy.stats"


def brute_benjamini_hochberg(p: list[float]) -> list[float]:
    """p_(i) adjusted = min over j >= i (in ascending order) of p_(j) * N / j, at most 1."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out = [0.0] * len(p)
    for rank, i in enumerate(order, start=1):
        out[i] = min(1.0, min(p[order[j - 1]] * len(p) / j for j in range(rank, len(p) + 1)))
    return out


def test_p_adjusted_is_benjamini_hochberg_over_the_tested_cells() -> None:
    comparison = stats.compare(result(3, 25), n_resamples=37, peaks=PEAKS)
    tested = [c for c in comparison.cells if c.p_value is not None]
    assert len(tested) >= 15 and all(c.p_adjusted is None for c in comparison.cells if c.p_value is None)
    want = brute_benjamini_hochberg([c.p_value for c in tested])  # type: ignore[misc]
    assert [c.p_adjusted for c in tested] == pytest.approx(want, rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Golden files: a whole comparison
# --------------------------------------------------------------------------------------------------


def _match(got: Any, want: Any, where: str = "") -> None:
    """``got == want`` for JSON values, floats to 1e-9 relative (libraries may round differently)."""
    if isinstance(want, float) and isinstance(got, int | float) and not isinstance(got, bool):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-300), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), where
        for k in want:
            _match(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _match(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


def test_compare_of_the_golden_input_gives_the_golden_comparison() -> None:
    spec = json.loads((GOLDEN / "compare_input.json").read_text())
    expected = json.loads((GOLDEN / "compare_expected.json").read_text())
    got = stats.compare(JobResult.model_validate(spec["result"]), **spec["compare"]).model_dump(mode="json")
    _match(got, expected)


def test_the_golden_input_covers_the_cases() -> None:
    expected = json.loads((GOLDEN / "compare_expected.json").read_text())
    cells = expected["cells"]
    verdicts = {"faster", "slower", "same", "inconclusive", "implausible", "failed", "incorrect"}
    assert verdicts <= {c["verdict"] for c in cells}
    assert {"failed", "throttled", "noisy", "incorrect", "contended", "implausible"} <= {
        f for c in cells for f in c["flags"]
    }
    assert any(c["ratio"] is None and c["p_value"] is not None for c in cells)  # one round or zero median
    assert any(c["hl_shift_ns"] is not None and c["hl_ci_low_ns"] is None for c in cells)  # tiny samples
    assert any(c["p_value"] is None and not c["error"] for c in cells)  # one variant only
