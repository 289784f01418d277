"""How much a cell moves between runs of unchanged code, and a ratio across runs judged with it.

Only an interleaved job may judge a change from its within-run interval alone: its two sides ran
round by round on one node at one time, so load, clocks, heat and allocator state fall on both
alike. Two jobs at different times do not share those: the ratio of one side's medians across two
jobs moves with everything that changed between the runs, and the unpaired bootstrap of the two
jobs' rounds (``job_vs_job.unpaired_ratio_ci``) has no term for it (three A/A jobs of one spec on
a quiet 2-core machine compared pairwise read -17.2%, -19.7% and +3.0% with narrow intervals).
This module gives a comparison across runs one of two honest footings, in this order:

1. **An internal control** (``controlled``). Where both jobs ran the same code on the other side
   (the same variant and parameters, or the same source revision), each job's own paired ratio
   candidate/baseline is a within-run measurement, and the change of the compared side between
   the jobs, relative to the control's change, is the ratio of the two jobs' ratios (a
   difference in differences on the log scale: Angrist & Pischke 2009, "Mostly Harmless
   Econometrics", ch. 5). What moved both sides of a job alike cancels in it. Its interval treats
   the two jobs' ln ratios as independent normal errors, each with the standard error its 95%
   interval implies (the interval's half-width on the log scale over 1.96, the wider side).
2. **A between-run noise estimate** (``run_to_run_noise``, ``with_run_noise``). From stored runs
   of unchanged code of the same cell (history points: the same code and source revision, cell,
   GPU model, timer and cold/warm state; one node where both jobs ran on it, else the GPU model),
   the pooled standard deviation s of ln(median) within each code's runs, with its degrees of
   freedom (the pooled within-group variance of a one-way layout: Montgomery 2017, "Design and
   Analysis of Experiments", 9th ed., section 3.3). One run's median then varies by s around its
   code's level, so the difference of two runs' ln medians by sqrt(2) s, and the interval of the
   ratio is ``exp(ln r -+ t(df) sqrt(2) s)`` (Student t), never narrower than the unpaired
   bootstrap's. This is the role of conbench's lookback z-score (a result against the
   distribution of the case's recent results on the same machine and context, a change when
   |z| > 5: ``conbench/entities/distribution.py`` and ``conbench/entities/_comparator.py`` in
   conbench/conbench) and of asv's step detection, whose noise is estimated from the measured
   series (``asv/step_detect.py`` in airspeed-velocity/asv).

Without either, a comparison across runs has no interval a verdict could rest on: the cell is
``inconclusive`` with ``no-run-noise``, and the reason says what would decide it (run the
baseline again on this node, or compare jobs that ran the same baseline). Pure functions; no
database (``kernelab.service.server.job_vs_job`` reads the stored runs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

_Z_95 = 1.959963984540054  # z(0.975)
MIN_NOISE_DF = 3
"""Fewest degrees of freedom of a between-run noise estimate that a verdict may rest on (e.g. four
runs of one code, or three and two of two codes): Student t's 97.5% quantile is 3.18 at 3, and
12.7 at 1, where the interval says nothing."""


class RunNoise(NamedTuple):
    """Between-run noise of one cell: ``sigma_ln`` the pooled standard deviation of ln(median)
    within each code's runs, ``df`` its degrees of freedom, ``runs`` the runs it came from,
    ``codes`` how many codes had two runs or more, ``scope`` ``node`` or ``gpu-model``."""

    sigma_ln: float
    df: int
    runs: int
    codes: int
    scope: str


def run_to_run_noise(groups: Iterable[Sequence[float]], *, scope: str) -> RunNoise | None:
    """The pooled between-run noise of ``groups``: each group the medians (ns, > 0) of the runs of
    one unchanged code of one cell. Groups of fewer than two runs add nothing; None where the
    pooled degrees of freedom stay below ``MIN_NOISE_DF`` or a median is not finite and positive.
    Source: the module docstring (pooled within-group variance)."""
    ss = 0.0
    df = runs = codes = 0
    for group in groups:
        values = [float(v) for v in group]
        if any(not (math.isfinite(v) and v > 0) for v in values):
            return None
        if len(values) < 2:
            continue
        logs = [math.log(v) for v in values]
        mean = sum(logs) / len(logs)
        ss += sum((x - mean) ** 2 for x in logs)
        df += len(logs) - 1
        runs += len(logs)
        codes += 1
    if df < MIN_NOISE_DF:
        return None
    return RunNoise(sigma_ln=math.sqrt(ss / df), df=df, runs=runs, codes=codes, scope=scope)


def with_run_noise(
    ratio: float, noise: RunNoise, unpaired: tuple[float, float] | None = None
) -> tuple[float, float]:
    """The 95% interval of a ratio of one side's medians across two runs (> 0): ``exp(ln ratio -+
    t(df, 0.975) * sqrt(2) * sigma_ln)``, widened to hold ``unpaired`` (the two jobs' rounds
    resampled independently) where given. Raises ValueError for a ratio that is not positive."""
    from kernelab.service.judge.estimators import t_quantile  # noqa: PLC0415

    if not ratio > 0:
        raise ValueError(f"a ratio must be positive, got {ratio}")
    half = t_quantile(0.975, noise.df) * math.sqrt(2.0) * noise.sigma_ln
    low, high = ratio * math.exp(-half), ratio * math.exp(half)
    if unpaired is not None:
        low, high = min(low, unpaired[0]), max(high, unpaired[1])
    return low, high


def _se_ln(ratio: float, low: float, high: float) -> float:
    return max(math.log(ratio) - math.log(low), math.log(high) - math.log(ratio)) / _Z_95


def controlled(
    a: tuple[float, float, float], b: tuple[float, float, float], *, compared: str
) -> tuple[float, float, float]:
    """The change of the compared side from job A to job B relative to the control side both jobs
    ran unchanged (module docstring, 1): ``a``/``b`` are each job's own (ratio, ci_low, ci_high) of
    candidate/baseline (all > 0). ``compared``: ``candidate`` (the baseline is the control: B's
    ratio over A's) or ``baseline`` (the candidate is: A's ratio over B's). Returns (ratio, low,
    high), the 95% interval from the two jobs' standard errors added in quadrature. Raises
    ValueError for a number that is not positive or another ``compared``."""
    if compared not in ("candidate", "baseline"):
        raise ValueError(f"compared must be 'candidate' or 'baseline', got {compared!r}")
    if min(*a, *b) <= 0:
        raise ValueError(f"ratios and their bounds must be positive, got {a} and {b}")
    ratio = b[0] / a[0] if compared == "candidate" else a[0] / b[0]
    se = math.hypot(_se_ln(*a), _se_ln(*b))
    return ratio, ratio * math.exp(-_Z_95 * se), ratio * math.exp(_Z_95 * se)


def noise_groups(
    points: Iterable[Mapping[str, object]], *, exclude_jobs: Iterable[int], node: str | None
) -> list[list[float]]:
    """Group stored run medians (dicts with ``job_id``, ``code``, ``sha``, ``node``, ``median_ns``)
    by code and source revision, leaving out the jobs being compared and, where ``node`` is given,
    the runs of other nodes: the input of ``run_to_run_noise``. A job is one run of a code: where
    both its sides ran the same code (an A/A job), that run's median is the geometric mean of the
    two sides' (they ran at one time, so they are not two runs)."""
    left_out = set(exclude_jobs)
    by_code: dict[tuple[object, object], dict[object, list[float]]] = {}
    for p in points:
        if p["job_id"] in left_out or (node is not None and p["node"] != node):
            continue
        runs = by_code.setdefault((p["code"], p["sha"]), {})
        runs.setdefault(p["job_id"], []).append(float(p["median_ns"]))  # type: ignore[arg-type]
    return [[_one_run(sides) for sides in runs.values()] for runs in by_code.values()]


def _one_run(sides: Sequence[float]) -> float:
    if len(sides) == 1:
        return sides[0]
    return math.exp(sum(math.log(v) for v in sides) / len(sides)) if min(sides) > 0 else math.nan
