"""Change points of a history line (``kernelab.service.judge.changepoints``): a planted step is found at
its place, noise and shifts within the points' CIs are not, a driver change is never one."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from factories import T0

from kernelab.service.contract.schemas import HistoryPoint
from kernelab.service.judge import changepoints


def _points(
    medians: list[float], *, rel_ci: float = 0.005, drivers: list[str] | None = None
) -> list[HistoryPoint]:
    n = len(medians)
    return [
        HistoryPoint(job_id=i + 1, measured_at=T0 + timedelta(hours=i), side="candidate", code="triton",
                     cell="M=4", cell_index=0, gpu_model="H200", driver=(drivers or ["570"] * n)[i],
                     timer="cuda-event", state="cold", median_ns=m, ci_low_ns=m * (1 - rel_ci),
                     ci_high_ns=m * (1 + rel_ci), n=100, verdict="faster", node="h200-a")
        for i, m in enumerate(medians)
    ]  # fmt: skip


def _noisy(n: int, centre: float, seed: int, rel: float = 0.003) -> list[float]:
    return list(centre * np.exp(np.random.default_rng(seed).normal(0.0, rel, n)))


@pytest.mark.parametrize("step_pct", [5.0, 30.0, -12.0])
@pytest.mark.parametrize("at", [2, 5, 8])
def test_a_planted_step_is_found_where_it_was_planted(step_pct: float, at: int) -> None:
    n = 10
    medians = _noisy(at, 1000.0, seed=at) + _noisy(n - at, 1000.0 * (1 + step_pct / 100), seed=at + 1)
    (cp,) = changepoints.detect(_points(medians))
    assert cp.index == at and cp.job_before == at and cp.job_after == at + 1
    assert cp.direction == ("slower" if step_pct > 0 else "faster")
    assert cp.change_pct == pytest.approx(step_pct, abs=1.5)
    assert (cp.points_before, cp.points_after) == (at, n - at)


def test_noise_alone_has_no_change_point() -> None:
    for seed in range(20):
        assert changepoints.detect(_points(_noisy(12, 500.0, seed))) == []


def test_a_shift_within_the_points_cis_or_below_the_threshold_is_none() -> None:
    medians = [1000.0] * 5 + [1008.0] * 5  # +0.8 %
    assert changepoints.detect(_points(medians, rel_ci=0.0001)) == []  # below the 1 % threshold
    assert changepoints.detect(_points(medians, rel_ci=0.0001), min_change_pct=0.5) != []
    assert changepoints.detect(_points(medians, rel_ci=0.02), min_change_pct=0.5) == []  # inside the CIs


def test_one_odd_point_is_no_change_and_short_lines_have_none() -> None:
    assert changepoints.detect(_points([1000.0] * 5 + [2000.0] + [1000.0] * 5)) == []
    assert changepoints.detect(_points([1000.0, 1000.0, 2000.0])) == []


def test_a_driver_change_is_never_a_change_point() -> None:
    medians = [1000.0] * 5 + [1500.0] * 5
    drivers = ["570"] * 5 + ["575"] * 5
    assert changepoints.detect_by_driver(_points(medians, drivers=drivers)) == []
    (cp,) = changepoints.detect_by_driver(_points([1000.0] * 4 + medians, drivers=["560"] * 4 + ["570"] * 10))
    assert cp.index == 9 and cp.direction == "slower"


def test_a_non_positive_median_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        changepoints.detect(_points([1000.0] * 4 + [0.0]))


def test_a_drifting_line_of_unchanged_code_has_no_change_point() -> None:
    """Runs of unchanged code whose level drifts from run to run by 2% (a loaded node), each run's
    own CI ±0.2%: the CIs alone would pass a shift of a few percent, but the run-to-run noise does
    not (the segments must lie ``_t_scan(n)`` standard errors of it apart: Student's t at the 0.2%
    of a verdict over the n - 1 places a change could be). Over 400 lines of 20 runs at most 4
    have a change point (0 here, 1 in 1,000 for 8, 20 or 40 runs; with the points' CIs alone 14 of
    200); a 15% step is still found."""
    false = sum(bool(changepoints.detect(_points(_noisy(20, 1000.0, seed, rel=0.02), rel_ci=0.002)))
                for seed in range(400))  # fmt: skip
    assert false <= 4, false
    stepped = _noisy(10, 1000.0, 1, rel=0.02) + _noisy(10, 1150.0, 2, rel=0.02)
    (cp,) = changepoints.detect(_points(stepped, rel_ci=0.002))
    assert cp.index == 10 and cp.direction == "slower"


def test_an_a_a_jobs_two_points_are_one_run_of_its_line() -> None:
    """Both sides of an A/A job are points of one line, nearly equal (one run); 10 such jobs that
    drift by 2% between runs. Read as 20 points, half the first differences are within a run, the
    run-to-run noise looks half as large and drift reads as change points (4 on one line of a CPU
    A/A of 2026-12-04); as runs of their jobs (``history.lines``), none."""
    from kernelab.service.server.history import lines

    medians = _noisy(10, 1000.0, 3, rel=0.02)
    points = []
    for job, m in enumerate(medians):
        for side, wobble in (("baseline", 0.9995), ("candidate", 1.0005)):
            p = _points([m * wobble], rel_ci=0.002)[0]
            points.append(p.model_copy(update={"job_id": job + 1, "side": side,
                                               "measured_at": T0 + timedelta(hours=job)}))  # fmt: skip
    (line,) = lines(points)
    assert len(line.points) == 20 and line.change_points == []
