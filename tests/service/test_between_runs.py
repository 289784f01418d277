"""``kernelab.service.judge.between_runs`` against its definitions (pooled within-group variance,
difference in differences, Student t) and, by simulation, the property it exists for: repeated
runs of unchanged code under drift give no confident change, and a real 2x one is still found."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from kernelab.service.judge import between_runs, verdicts


def test_run_to_run_noise_is_the_pooled_within_group_standard_deviation() -> None:
    """Oracle: the residual mean square of a one-way layout of ln(median) by code
    (``scipy.stats.f_oneway``'s within-group term, computed by hand here)."""
    groups = [[1000.0, 1010.0, 995.0, 1003.0], [500.0, 497.0, 505.0], [2000.0]]
    logs = [np.log(g) for g in groups if len(g) > 1]
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in logs)
    df = sum(g.size - 1 for g in logs)
    noise = between_runs.run_to_run_noise(groups, scope="node")
    assert noise is not None
    assert noise.sigma_ln == pytest.approx(math.sqrt(ss / df), rel=1e-12)
    assert (noise.df, noise.runs, noise.codes, noise.scope) == (5, 7, 2, "node")
    assert between_runs.run_to_run_noise([[1.0, 1.1], [2.0, 2.1]], scope="node") is None  # 2 df
    assert between_runs.run_to_run_noise([[1.0, math.nan, 1.0, 1.0]], scope="node") is None


def test_the_noise_interval_is_student_t_of_two_runs() -> None:
    noise = between_runs.RunNoise(sigma_ln=0.01, df=5, runs=7, codes=2, scope="gpu-model")
    low, high = between_runs.with_run_noise(1.2, noise)
    half = stats.t.ppf(0.975, 5) * math.sqrt(2) * 0.01
    assert (low, high) == pytest.approx((1.2 * math.exp(-half), 1.2 * math.exp(half)), rel=1e-12)
    assert between_runs.with_run_noise(1.2, noise, (1.0, 1.5)) == pytest.approx((1.0, 1.5))
    with pytest.raises(ValueError, match="positive"):
        between_runs.with_run_noise(0.0, noise)


def test_controlled_is_the_ratio_of_the_jobs_ratios_with_their_errors_in_quadrature() -> None:
    se_a, se_b = 0.004, 0.003
    a = (0.8, 0.8 * math.exp(-1.959963984540054 * se_a), 0.8 * math.exp(1.959963984540054 * se_a))
    b = (1.6, 1.6 * math.exp(-1.959963984540054 * se_b), 1.6 * math.exp(1.959963984540054 * se_b))
    ratio, low, high = between_runs.controlled(a, b, compared="candidate")
    se = math.hypot(se_a, se_b)
    assert ratio == pytest.approx(2.0)
    assert (low, high) == pytest.approx((2.0 * math.exp(-1.959963984540054 * se),
                                         2.0 * math.exp(1.959963984540054 * se)), rel=1e-9)  # fmt: skip
    ratio, _, _ = between_runs.controlled(a, b, compared="baseline")
    assert ratio == pytest.approx(0.5)  # the baseline's change relative to the candidate's
    with pytest.raises(ValueError, match="compared"):
        between_runs.controlled(a, b, compared="both")


def test_noise_groups_leave_out_the_compared_jobs_and_other_nodes_and_count_an_a_a_job_once() -> None:
    points = [
        {"job_id": 1, "code": "torch", "sha": "", "node": "n1", "median_ns": 100.0},
        {"job_id": 2, "code": "torch", "sha": "", "node": "n1", "median_ns": 102.0},
        {"job_id": 3, "code": "torch", "sha": "", "node": "n1", "median_ns": 98.0},
        {"job_id": 3, "code": "torch", "sha": "", "node": "n1", "median_ns": 100.0},  # its other side
        {"job_id": 4, "code": "torch", "sha": "", "node": "n2", "median_ns": 150.0},
        {"job_id": 5, "code": "triton", "sha": "", "node": "n1", "median_ns": 80.0},
    ]
    groups = between_runs.noise_groups(points, exclude_jobs=[1], node="n1")
    assert sorted(map(sorted, groups)) == [[80.0], pytest.approx([math.sqrt(98.0 * 100.0), 102.0])]
    assert len(between_runs.noise_groups(points, exclude_jobs=[], node=None)[0]) == 4


def _run(rng: np.random.Generator, level: float, drift_sd: float, within_sd: float) -> tuple[float, ...]:
    """One job of two sides (baseline at ``level``, the candidate equal): a drift common to both
    sides of the run, and each side's own within-run error; returns (baseline median, candidate
    median, paired ratio, its 95% CI low, high)."""
    drift = rng.normal(0.0, drift_sd)
    base = level * math.exp(drift + rng.normal(0.0, within_sd))
    cand = level * math.exp(drift + rng.normal(0.0, within_sd))
    half = 1.959963984540054 * math.sqrt(2) * within_sd
    return base, cand, cand / base, cand / base * math.exp(-half), cand / base * math.exp(half)


@pytest.mark.parametrize("drift_sd", [0.05, 0.2])
def test_repeated_runs_under_drift_give_no_change_and_a_real_one_is_found(drift_sd: float) -> None:
    """20 A/A jobs of unchanged code whose runs drift by 5% or 20% (a loaded node: the issue's
    jobs 1 and 2 read 'faster' -40.6%) and +-0.3% within each run, compared pairwise, at a 1%
    threshold: 0 ``faster``/``slower`` with the control (the baseline both ran) and 0 with the
    stored runs' noise (no control), where the within-run interval alone reads most pairs as a
    change. A 2x slower candidate against the shared baseline is ``slower``."""
    rng = np.random.default_rng(11)
    runs = [_run(rng, 1000.0, drift_sd, 0.003) for _ in range(20)]
    changed_control = changed_noise = changed_within = 0
    for i in range(0, 20, 2):
        a, b = runs[i], runs[i + 1]
        ratio, low, high = between_runs.controlled(a[2:], b[2:], compared="candidate")
        changed_control += verdicts.timing_verdict(ratio, low, high, 1.0)[0] in ("faster", "slower")
        others = [[r[1] for j, r in enumerate(runs) if j not in (i, i + 1)]]  # the candidate's other runs
        noise = between_runs.run_to_run_noise(others, scope="node")
        assert noise is not None
        raw = b[1] / a[1]
        within = (raw * math.exp(-0.0083), raw * math.exp(0.0083))  # the unpaired bootstrap's width
        low, high = between_runs.with_run_noise(raw, noise, within)
        changed_noise += verdicts.timing_verdict(raw, low, high, 1.0)[0] in ("faster", "slower")
        changed_within += verdicts.timing_verdict(raw, *within, 1.0)[0] in ("faster", "slower")
    assert changed_control == changed_noise == 0
    assert changed_within >= 6  # what job vs job read before: most pairs a confident change
    slow = _run(rng, 1000.0, drift_sd, 0.003)
    slow = (slow[0], 2 * slow[1], 2 * slow[2], 2 * slow[3], 2 * slow[4])
    ratio, low, high = between_runs.controlled(runs[0][2:], slow[2:], compared="candidate")
    assert verdicts.timing_verdict(ratio, low, high, 1.0)[0] == "slower" and ratio == pytest.approx(
        2, rel=0.03
    )
