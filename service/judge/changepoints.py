"""Change points of a history line: where a benchmark cell's median time per launch moved for good.

Method: **PELT** (Pruned Exact Linear Time; Killick, Fearnhead & Eckley, "Optimal detection of
changepoints with a linear computational cost", JASA 107(500):1590-1598, 2012), as implemented by
the ``ruptures`` library (Truong, Oudre & Vayatis, "Selective review of offline change point
detection methods", Signal Processing 167, 2020; ``ruptures.Pelt``), with the ``l2`` cost (a change
of the mean) on the **logarithm** of the points' medians, so a step is a relative change whatever
the kernel's scale.

Penalty: the Schwarz (BIC) penalty for a mean change of a Gaussian series, ``2 * sigma^2 * ln(n)``
per change in units of the l2 cost (Yao, "Estimating the number of change-points via Schwarz'
criterion", Statistics & Probability Letters 6, 1988; the "SIC" penalty of Killick et al. 2012,
section 4). ``sigma`` (the point-to-point noise in log units) is estimated robustly from the first
differences, ``MAD(diff(y)) / (0.6745 * sqrt(2))`` (a step moves one difference only, so a few steps
do not inflate it; Fryzlewicz, "Wild binary segmentation", Ann. Statist. 42(6), 2014, section 3),
and is never taken below the points' own measurement error: the median half-width of their 95%
CIs in log units over 1.96, nor below ``MIN_SIGMA_LOG`` (a line of identical numbers is no line
of changes).

A change is reported only when (i) each side of it has at least ``MIN_SEGMENT`` points (``min_size``
of PELT: one odd point is an outlier, not a change), (ii) the segment medians differ by at least
``min_change_pct`` (the measurement's threshold, default 1%), (iii) the two segments' points do
not overlap in their CIs' consensus: the median of the later segment lies outside the range of the
earlier segment's CIs and vice versa where the points have CIs (a shift within the points' own
uncertainty is no change), and (iv) the segments' mean ln medians differ by more than
``_t_scan(n)`` standard errors of the run-to-run noise, ``sigma * sqrt(1/n_before + 1/n_after)``
(``sigma`` the larger of the first differences' robust estimate and the pooled spread within the
segments; ``_t_scan``: Student's t at the two-sided 0.2% of every verdict, ``DECISION_ALPHA``,
split over the n - 1 places a change could be): the points' CIs hold
only what varied within each run, ``sigma`` what varies between runs (a shift of a loaded node's
own drift is no change of the code). Each point is one run: a job whose two sides ran the same
code is one point of its line (``kernelab.service.server.history.lines``).
A cut of PELT that fails (ii), (iii) or (iv) is dropped, the weakest first,
and its neighbours are judged again over the merged segments. Change points are looked for within
runs of one driver only (the history's rule: a change of the platform is no change of the code).

Pure functions over numpy and ruptures (imported inside ``detect``); no database.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from kernelab.service.contract.schemas import ChangePoint, HistoryPoint

MIN_SEGMENT = 2  # points on each side of a change (PELT's min_size)
MIN_POINTS = 2 * MIN_SEGMENT  # a line with fewer points has no change point
DEFAULT_MIN_CHANGE_PCT = 1.0  # measurement.threshold_pct's default
MIN_SIGMA_LOG = 1e-3  # 0.1 %: the smallest point-to-point noise assumed, in ln units
_MAD_TO_SIGMA = 0.6745  # MAD of a standard normal
_Z95 = 1.959963984540054  # z(0.975)
DECISION_ALPHA = 0.002
"""Two-sided level at which a change is claimed (``kernelab.service.judge.verdicts.DECISION_CONFIDENCE``)."""


def _t_scan(n: int) -> float:
    """The quantile a shift between two segments of a line of ``n`` runs must exceed, in standard
    errors of the run-to-run noise: ``DECISION_ALPHA`` split over the n - 1 places a change could
    be (Bonferroni: PELT chose the place that fits best, so the shift found is the largest of n - 1
    chances), of Student's t with n - 2 degrees of freedom (the noise is estimated from the same
    n runs; 20 runs: 5.0, 8 runs: 10.6)."""
    from kernelab.service.judge.estimators import t_quantile  # noqa: PLC0415

    return t_quantile(1 - DECISION_ALPHA / 2 / max(n - 1, 1), max(n - 2, 1))


METHOD = (
    "PELT (Killick, Fearnhead & Eckley 2012, JASA 107:1590) from the ruptures library, l2 cost on "
    "ln(median), BIC penalty 2·σ²·ln n (Yao 1988) with σ from the MAD of first differences, at least "
    f"{MIN_SEGMENT} points on each side, a shift of at least the measurement's threshold outside "
    "the points' CIs and beyond the line's run-to-run noise (Student t at 0.2% over the places a "
    "change could be), one point per job; per line and driver"
)


def noise_sigma(y: np.ndarray, half_widths: np.ndarray) -> float:
    """Point-to-point noise of ``y`` ((n,) float64, ln of medians): the robust estimate from first
    differences, floored by the points' own CIs (``half_widths``, (m,) ln units, m >= 0) and by
    ``MIN_SIGMA_LOG``. Sources in the module docstring."""
    diffs = np.diff(y)
    mad = float(np.median(np.abs(diffs - np.median(diffs)))) if diffs.size else 0.0
    sigma = mad / (_MAD_TO_SIGMA * math.sqrt(2))
    own = float(np.median(half_widths)) / _Z95 if half_widths.size else 0.0
    return max(sigma, own, MIN_SIGMA_LOG)


def _within_segments_sigma(y: np.ndarray, cuts: Sequence[int]) -> float:
    """The pooled standard deviation of ``y`` within the segments ``cuts`` leave (n - segments
    degrees of freedom; 0 with none left): the run-to-run noise once the steps are taken out, a
    floor under the first differences' estimate, which a few runs can put far too low."""
    bounds = [0, *cuts, y.size]
    ss = sum(
        float(np.sum((y[a:b] - np.mean(y[a:b])) ** 2))
        for a, b in zip(bounds, bounds[1:], strict=False)
        if b > a
    )
    dof = y.size - (len(bounds) - 1)
    return math.sqrt(ss / dof) if dof > 0 else 0.0


def _half_widths(points: Sequence[HistoryPoint]) -> np.ndarray:
    out = [
        (math.log(p.ci_high_ns) - math.log(p.ci_low_ns)) / 2
        for p in points
        if p.ci_low_ns is not None and p.ci_high_ns is not None and 0 < p.ci_low_ns <= p.ci_high_ns
    ]
    return np.asarray(out, dtype=np.float64)


def _outside_cis(before: Sequence[HistoryPoint], after: Sequence[HistoryPoint], b: float, a: float) -> bool:
    """True unless the points' CIs say the shift is within their uncertainty: the later median
    inside the hull of the earlier points' CIs, or the earlier median inside the later ones'."""
    for segment, other in ((before, a), (after, b)):
        lows = [p.ci_low_ns for p in segment if p.ci_low_ns is not None]
        highs = [p.ci_high_ns for p in segment if p.ci_high_ns is not None]
        if lows and highs and min(lows) <= other <= max(highs):
            return False
    return True


def _segments(cuts: Sequence[int], i: int, n: int) -> tuple[int, int, int]:
    return (cuts[i - 1] if i > 0 else 0), cuts[i], (cuts[i + 1] if i + 1 < len(cuts) else n)


def _shift_pct(medians: np.ndarray, cuts: Sequence[int], i: int) -> float:
    start, cut, stop = _segments(cuts, i, medians.size)
    return (float(np.median(medians[cut:stop])) / float(np.median(medians[start:cut])) - 1) * 100


def _judge(
    points: Sequence[HistoryPoint], medians: np.ndarray, cuts: Sequence[int], i: int, min_change_pct: float,
    sigma: float = 0.0,
) -> ChangePoint | None:  # fmt: skip
    """The ``i``-th cut as a ``ChangePoint`` between its neighbouring cuts, or None when its shift
    is below ``min_change_pct``, within the points' CIs, or within the line's run-to-run noise
    (``sigma``, ln units: the segments' mean ln medians less than ``_t_scan`` standard errors
    apart)."""
    start, cut, stop = _segments(cuts, i, medians.size)
    before, after = points[start:cut], points[cut:stop]
    b, a = float(np.median(medians[start:cut])), float(np.median(medians[cut:stop]))
    pct = (a / b - 1) * 100
    if abs(pct) < min_change_pct or not _outside_cis(before, after, b, a):
        return None
    y = np.log(medians)
    gap = abs(float(np.mean(y[cut:stop])) - float(np.mean(y[start:cut])))
    if gap <= _t_scan(medians.size) * sigma * math.sqrt(1 / len(before) + 1 / len(after)):
        return None
    return ChangePoint(
        at=points[cut].measured_at, index=cut, before_ns=b, after_ns=a, change_pct=pct,
        direction="slower" if a > b else "faster", job_before=points[cut - 1].job_id,
        job_after=points[cut].job_id, points_before=len(before), points_after=len(after),
    )  # fmt: skip


def detect(
    points: Sequence[HistoryPoint], *, min_change_pct: float = DEFAULT_MIN_CHANGE_PCT
) -> list[ChangePoint]:
    """Change points of one line's ``points`` (oldest first, all of one driver; positive
    ``median_ns``), by the method of the module docstring. Returns them oldest first; empty for
    fewer than ``MIN_POINTS`` points. ``ChangePoint.index`` is the position in ``points`` of the
    first point after the change. Raises ValueError for a median <= 0."""
    if len(points) < MIN_POINTS:
        return []
    import ruptures  # type: ignore[import-untyped]

    medians = np.asarray([p.median_ns for p in points], dtype=np.float64)
    if not (medians > 0).all() or not np.isfinite(medians).all():
        raise ValueError("change points need finite, positive medians")
    y = np.log(medians)
    sigma = noise_sigma(y, _half_widths(points))
    penalty = 2 * sigma**2 * math.log(y.size)
    ends = ruptures.Pelt(model="l2", min_size=MIN_SEGMENT, jump=1).fit(y.reshape(-1, 1)).predict(pen=penalty)
    cuts = list(ends[:-1])  # ruptures returns segment ends, the last one len(y)
    while True:  # drop the weakest failing cut and judge the merged segments again
        noise = max(sigma, _within_segments_sigma(y, cuts))
        judged = [_judge(points, medians, cuts, i, min_change_pct, noise) for i in range(len(cuts))]
        failing = [i for i, cp in enumerate(judged) if cp is None]
        if not failing:
            break
        weakest = min(failing, key=lambda i: abs(_shift_pct(medians, cuts, i)))
        del cuts[weakest]
    out = [cp for cp in judged if cp is not None]
    return out


def detect_by_driver(
    points: Sequence[HistoryPoint], *, min_change_pct: float = DEFAULT_MIN_CHANGE_PCT
) -> list[ChangePoint]:
    """``detect`` within each run of consecutive points of one driver (``points``: one line's
    shown points, oldest first); indices are positions in ``points``. Oldest first."""
    out: list[ChangePoint] = []
    start = 0
    for i in range(1, len(points) + 1):
        if i == len(points) or points[i].driver != points[start].driver:
            for cp in detect(points[start:i], min_change_pct=min_change_pct):
                out.append(cp.model_copy(update={"index": cp.index + start}))
            start = i
    return out
