"""kernelab.service.judge.stats on synthetic sample streams with known effects and fixed seeds."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import get_args

import numpy as np
import pytest
from scipy.stats import false_discovery_control

from kernelab.service.contract.schemas import (
    CellResult,
    CopyBandwidthReading,
    CorrectnessResult,
    Flag,
    GpuTelemetry,
    JobResult,
    JobSpec,
    NodeInfo,
    ProbeReport,
    Sample,
    SampleColumns,
    SideStats,
    Work,
)
from kernelab.service.judge import estimators, stats, verdicts

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def make_samples(
    *,
    rounds: int,
    base_ns: float = 10_000.0,
    ratio: float = 1.0,
    noise: float = 0.01,
    seed: int = 0,
    per_round: int = 1,
    round_noise: float = 0.0,
) -> list[Sample]:
    """ABBA-ordered samples: lognormal-ish noise ``noise`` per sample, plus an optional offset
    ``round_noise`` shared by the samples of one variant within one round (correlated samples)."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rounds):
        order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        pos = 0
        for variant in order:
            centre = base_ns * (ratio if variant == "candidate" else 1.0)
            offset = 1.0 + round_noise * rng.standard_normal()
            for _ in range(per_round):
                d = centre * offset * (1.0 + noise * rng.standard_normal())
                out.append(Sample(variant=variant, round=r, position=pos, duration_ns=d))
                pos += 1
    return out


def make_cell(index: int = 0, samples: list[Sample] | None = None, **kw) -> CellResult:
    params = kw.pop("params", {"M": 256, "N": 1000 + index})
    return CellResult(index=index, params=params, samples=samples or [], **kw)


def make_result(
    cells: list[CellResult],
    *,
    threshold_pct: float = 1.0,
    exclude_throttled: bool = True,
    probes: list[ProbeReport] | None = None,
    device_type: str = "cpu",
    spec: dict | None = None,
    error: str | None = None,
) -> JobResult:
    spec_fields = dict(
        benchmark="softmax",
        baseline={"variant": "torch"},
        candidate={"variant": "triton"},
        sweep={"N": [1000]},
        params={"M": 256},
        measurement={"threshold_pct": threshold_pct, "exclude_throttled": exclude_throttled},
    )
    spec_fields.update(spec or {})
    return JobResult(
        idempotency_key="test-key-0001",
        spec=JobSpec.model_validate(spec_fields),
        node=NodeInfo(hostname="node-a", device_type=device_type),
        timer="perf_counter",
        started_at=NOW,
        finished_at=NOW,
        cells=cells,
        probes=probes or [],
        error=error,
    )


def one_cell(samples: list[Sample], **kw):
    result = make_result([make_cell(0, samples)], **kw)
    return stats.compare(result).cells[0]


# ------------------------------------------------------------------------------------------------
# verdicts on known effects
# ------------------------------------------------------------------------------------------------


def test_a_a_is_same_and_ci_covers_one():
    c = one_cell(make_samples(rounds=200, ratio=1.0, noise=0.01, seed=1))
    assert c.verdict == "same"
    assert c.ci_low <= 1.0 <= c.ci_high
    assert abs(c.delta_pct) < 0.5


def test_a_a_with_few_rounds_is_inconclusive():
    c = one_cell(make_samples(rounds=4, ratio=1.0, noise=0.03, seed=2))
    assert c.ratio is not None
    assert c.verdict == "inconclusive"


def test_one_sample_per_side_has_no_ratio():
    c = one_cell(make_samples(rounds=1))
    assert c.ratio is None and c.ci_low is None
    assert c.verdict == "inconclusive"


def test_five_percent_slowdown_is_slower_with_ci_covering_true_ratio():
    c = one_cell(make_samples(rounds=100, ratio=1.05, noise=0.01, seed=3))
    assert c.verdict == "slower"
    assert c.ci_low <= 1.05 <= c.ci_high
    assert c.delta_pct == pytest.approx(5.0, abs=0.5)
    assert c.hl_shift_ns == pytest.approx(500.0, rel=0.15)
    assert c.p_value < 1e-6


def test_five_percent_speedup_is_faster():
    c = one_cell(make_samples(rounds=100, ratio=0.95, noise=0.01, seed=4))
    assert c.verdict == "faster"
    assert c.ci_high < 1.0
    assert c.ci_low <= 0.95 <= c.ci_high


def test_ci_straddling_threshold_is_inconclusive():
    # true change 1% against a 1% threshold, 3% noise, 20 rounds: the CI spans 1 and 1 + t
    c = one_cell(make_samples(rounds=20, ratio=1.01, noise=0.03, seed=5), threshold_pct=1.0)
    assert c.ci_low < 1.0 and 1.01 < c.ci_high
    assert c.verdict == "inconclusive"


@pytest.mark.parametrize(
    ("ratio", "low", "high", "expected", "code"),
    [
        (0.95, 0.94, 0.96, "faster", None),
        (0.985, 0.978, 0.992, "faster", None),  # the decision interval excludes 1, beyond 1 - t
        # the 95% CI excludes 1 and the estimate is beyond 1 - t, but widened to 99.8% it reaches 1
        (0.985, 0.975, 0.995, "inconclusive", "not-decisive"),
        (0.995, 0.992, 0.998, "same", None),  # real but smaller than the threshold
        (0.985, 0.97, 1.002, "inconclusive", "ci-straddles"),  # straddles 1
        (1.05, 1.04, 1.06, "slower", None),
        (1.012, 1.007, 1.017, "slower", None),  # straddles 1 + t, the decision interval excludes 1
        (1.012, 1.004, 1.02, "inconclusive", "not-decisive"),
        (1.005, 0.995, 1.012, "inconclusive", "ci-straddles"),  # straddles 1 + t
        (None, None, None, "inconclusive", "no-interval"),
    ],
)
def test_verdict_rule(ratio, low, high, expected, code):
    timing, why = verdicts.timing_verdict(ratio, low, high, threshold_pct=1.0)
    assert timing == expected
    # an inconclusive timing always says why; a decided one needs no reason
    assert (why is None and code is None) or (why is not None and why.code == code)


def test_decision_interval_is_the_ci_widened_to_99_8_percent_in_log_space() -> None:
    """Oracle: a normal ln(ratio) with standard error s has the 95% interval exp(+-1.96 s) and the
    99.8% one exp(+-3.09 s) (``scipy.stats.norm``)."""
    from scipy.stats import norm

    s = 0.01
    lo95, hi95 = (math.exp(norm.ppf(q) * s) for q in (0.025, 0.975))
    lo, hi = verdicts.decision_interval(1.0, lo95, hi95)
    assert (lo, hi) == pytest.approx((math.exp(norm.ppf(0.001) * s), math.exp(norm.ppf(0.999) * s)), rel=1e-9)
    # a lopsided interval: the wider half decides both sides (the narrow one rests on few resamples)
    lo, hi = verdicts.decision_interval(2.0, 1.9, 2.0)
    scale = norm.ppf(0.999) / norm.ppf(0.975)
    assert lo == pytest.approx(2.0 * (1.9 / 2.0) ** scale) and hi == pytest.approx(2.0 * (2.0 / 1.9) ** scale)
    assert verdicts.timing_verdict(1.0156, 1.0058, 1.0291, 1.0)[0] == "inconclusive"  # CPU revision A/A
    with pytest.raises(ValueError, match="positive"):
        verdicts.decision_interval(1.0, 0.0, 1.1)


@pytest.mark.parametrize("width_pct", [0.5, 1.0, 2.0, 5.0])
def test_a_change_is_claimed_by_chance_in_at_most_the_decision_level(width_pct: float) -> None:
    """A/A with a calibrated 95% interval of half-width w around a normal ln(ratio) (w/1.96 its
    standard error), at a 1% threshold: over 20,000 draws the share read ``faster`` or ``slower``
    stays within the two-sided 0.2% of ``DECISION_CONFIDENCE``, whatever w; the 95% rule alone
    read up to 5% once w reaches the threshold."""
    rng = np.random.default_rng(3)
    se = math.log(1 + width_pct / 100) / 1.96
    centre = rng.normal(0.0, se, 20_000)
    changed = old_rule = 0
    for c in centre:
        ratio, lo, hi = math.exp(c), math.exp(c - 1.96 * se), math.exp(c + 1.96 * se)
        timing, _ = verdicts.timing_verdict(ratio, lo, hi, threshold_pct=1.0)
        changed += timing in ("faster", "slower")
        old_rule += (hi < 1 and ratio < 0.99) or (lo > 1 and ratio > 1.01)
    assert changed / 20_000 <= 0.003
    if width_pct >= 2.0:
        assert old_rule / 20_000 > 0.03  # the 95% rule: ~5% once the CI is wider than the threshold


# ------------------------------------------------------------------------------------------------
# ratio_ci
# ------------------------------------------------------------------------------------------------


def test_round_bootstrap_is_wider_than_sample_bootstrap_under_round_drift():
    samples = make_samples(rounds=40, per_round=10, noise=0.005, round_noise=0.03, seed=6)
    # the same values, each sample pretending to be its own round (what an i.i.d. bootstrap assumes)
    iid = [s.model_copy(update={"round": i}) for i, s in enumerate(samples)]
    _, lo_r, hi_r = estimators.ratio_ci(SampleColumns.from_rows(samples))
    _, lo_s, hi_s = estimators.ratio_ci(SampleColumns.from_rows(iid))
    assert (hi_r - lo_r) > 2.0 * (hi_s - lo_s)


def test_ratio_ci_is_deterministic_per_seed_and_needs_two_rounds():
    rows = make_samples(rounds=30, seed=7)
    samples = SampleColumns.from_rows(rows)
    assert estimators.ratio_ci(samples, seed=3) == estimators.ratio_ci(samples, seed=3)
    assert estimators.ratio_ci(samples, seed=3) != estimators.ratio_ci(samples, seed=4)
    one_round = SampleColumns.from_rows(make_samples(rounds=1, per_round=5))
    assert estimators.ratio_ci(one_round) is None
    assert estimators.ratio_ci(SampleColumns.from_rows(s for s in rows if s.variant == "baseline")) is None
    with pytest.raises(ValueError, match="confidence"):
        estimators.ratio_ci(samples, confidence=1.0)


def test_round_matrix_keeps_each_round_in_sample_order():
    """Row r holds round ``rounds[r]``'s durations in the order taken, NaN-padded to the longest."""
    rng = np.random.default_rng(5)
    sample_rounds = rng.integers(0, 9, size=200) * 3  # some rounds absent, uneven counts
    durations = rng.uniform(1.0, 2.0, size=200)
    rounds = np.unique(np.append(sample_rounds, [100]))  # a round of the cell without samples here
    matrix = estimators._round_matrix(sample_rounds, durations, rounds)
    for row, r in enumerate(rounds):
        own = durations[sample_rounds == r].tolist()
        assert matrix[row, : len(own)].tolist() == own and np.isnan(matrix[row, len(own) :]).all()
    assert matrix.shape[1] == np.bincount(sample_rounds).max()


def test_kept_samples_drops_throttled_rows_of_every_column():
    rows = make_samples(rounds=4)
    rows[1] = rows[1].model_copy(update={"throttled": True})
    cols = SampleColumns.from_rows(rows)
    assert estimators.kept_samples(cols, exclude_throttled=False) is cols
    kept = estimators.kept_samples(cols, exclude_throttled=True)
    assert kept.rows() == rows[:1] + rows[2:]


def test_ratio_ci_handles_rounds_missing_one_variant():
    samples = make_samples(rounds=50, ratio=1.05, seed=8)
    # a variant absent from most rounds (e.g. dropped as throttled) still gives a finite CI
    sparse = [s for s in samples if s.variant == "candidate" or s.round % 10 == 0]
    ratio, lo, hi = estimators.ratio_ci(SampleColumns.from_rows(sparse))
    assert np.isfinite([lo, hi]).all()
    assert lo <= ratio <= hi


# ------------------------------------------------------------------------------------------------
# Hodges-Lehmann, MDE, variant summaries
# ------------------------------------------------------------------------------------------------


def test_hodges_lehmann_recovers_shift_and_matches_brute_force():
    rng = np.random.default_rng(9)
    base = rng.normal(1000.0, 10.0, 301)
    cand = rng.normal(1000.0, 10.0, 250) + 50.0
    shift, lo, hi = estimators.hodges_lehmann(base, cand)
    assert lo < 50.0 < hi
    assert shift == pytest.approx(50.0, abs=3.0)
    diffs = np.sort(np.subtract.outer(cand, base).ravel())
    assert shift == pytest.approx(np.median(diffs), rel=1e-9)
    mn, m, n = diffs.size, base.size, cand.size
    c_alpha = int(np.floor(mn / 2 - 1.959963984540054 * np.sqrt(mn * (m + n + 1) / 12)))
    assert lo == pytest.approx(diffs[c_alpha - 1], rel=1e-9)
    assert hi == pytest.approx(diffs[mn - c_alpha], rel=1e-9)


def test_hodges_lehmann_ci_absent_for_tiny_samples():
    shift, lo, hi = estimators.hodges_lehmann(np.array([1.0, 2.0]), np.array([4.0, 6.0]))
    assert shift == pytest.approx(3.5)  # median of {3, 5, 2, 4}
    assert lo is None and hi is None
    with pytest.raises(ValueError):
        estimators.hodges_lehmann(np.array([]), np.array([1.0]))


def test_mde_matches_reference_figure():
    # reference: CV 1% and n = 30 give ~0.7%
    iqr = 0.01 * 1.349 * 1000.0
    s = SideStats(n=30, median_ns=1000.0, iqr_ns=iqr)
    assert estimators.min_detectable_effect_pct(s, s) == pytest.approx(2.8 * 0.01 * np.sqrt(2 / 30) * 100)
    assert estimators.min_detectable_effect_pct(s, SideStats(n=1, median_ns=1.0, iqr_ns=0.0)) is None


def test_variant_stats_values():
    s = estimators.variant_stats(np.array([4.0, 1.0, 3.0, 2.0, 100.0]))
    got = (s.n, s.median_ns, s.min_ns, s.q1_ns, s.q3_ns, s.iqr_ns, s.mean_ns)
    assert got == (5, 3.0, 1.0, 2.0, 4.0, 2.0, 22.0)


# ------------------------------------------------------------------------------------------------
# flags
# ------------------------------------------------------------------------------------------------


def test_throttled_samples_dropped_and_counted():
    samples = make_samples(rounds=40, seed=10)
    slow = {3, 11, 25}
    samples = [
        s.model_copy(update={"throttled": True, "duration_ns": s.duration_ns * 5})
        if s.variant == "candidate" and s.round in slow
        else s
        for s in samples
    ]
    c = one_cell(samples)
    assert c.candidate.dropped_throttled == 3 and c.candidate.n == 37
    assert c.baseline.dropped_throttled == 0 and c.baseline.n == 40
    assert "throttled" in c.flags
    assert c.verdict == "same"
    kept = one_cell(samples, exclude_throttled=False)
    assert kept.candidate.n == 40 and kept.candidate.dropped_throttled == 0
    assert kept.candidate.mean_ns > c.candidate.mean_ns * 1.2


def test_noisy_flag_from_iqr_over_median():
    noisy = one_cell(make_samples(rounds=60, noise=0.2, seed=11))
    quiet = one_cell(make_samples(rounds=60, noise=0.01, seed=11))
    assert "noisy" in noisy.flags
    assert noisy.candidate.iqr_ns / noisy.candidate.median_ns > 0.1
    assert "noisy" not in quiet.flags


def test_implausible_flops_is_never_faster():
    samples = make_samples(rounds=60, base_ns=3_000.0, ratio=0.9, seed=12)  # 3 us, 10% faster
    flops = 2 * 4096**3  # 137 GFLOP in 3 us: ~46 PFLOP/s
    work = {"baseline": Work(flops=flops), "candidate": Work(flops=flops)}
    result = make_result([make_cell(0, samples, work=work)])
    plain = stats.compare(result).cells[0]
    assert plain.verdict == "faster" and "implausible" not in plain.flags
    assert plain.throughput["candidate_tflops"] == pytest.approx(flops / plain.candidate.median_ns / 1e3)
    guarded = stats.compare(result, peaks={"matmul_tflops": 990.0}).cells[0]
    assert "implausible" in guarded.flags
    assert guarded.verdict == "implausible" and guarded.timing_verdict == "faster"
    assert [r.code for r in guarded.reasons][:2] == ["rate-above-peak", "rate-above-peak"]
    assert guarded.reasons[0].side == "baseline" and "TFLOP/s" in guarded.reasons[0].message


def test_a_tampered_clock_blames_no_side_by_the_times_it_read():
    """The candidate replaced the clock both sides are timed with: the baseline's times (5 ns, below
    any CPU launch) and the candidate's are the tampering's, so no reason read from them names a
    side; ``timer-tampered`` decides."""
    tampered = verdicts.reason("timer-tampered", "replaced while the job ran: time.perf_counter_ns")
    samples = make_samples(rounds=40, base_ns=5.0, ratio=0.5, seed=13)
    plain = stats.compare(make_result([make_cell(0, samples)])).cells[0]
    assert {(r.code, r.side) for r in plain.reasons} >= {("below-resolution", "baseline")}
    cell = stats.compare(make_result([make_cell(0, samples, findings=[tampered])])).cells[0]
    assert cell.verdict == "failed" and cell.reasons[0].code == "timer-tampered"
    assert not {r.code for r in cell.reasons} & verdicts.READ_FROM_TIMES
    assert not any(r.side == "baseline" for r in cell.reasons)


def test_a_change_the_input_placements_disagree_on_is_inconclusive():
    """Identical code whose candidate reads +8% on one input placement and -3% on the other: the
    pooled (crossover) ratio says slower beyond the 2% threshold, one placement says faster; a real
    +6% on both placements stays slower; a real -7% under a 6% set effect is not vouched for (the
    rule's cost); a balanced ±1.5% placement effect stays same."""
    from kernelab.service.contract.schemas import Placement

    def cell_of(by_stratum: tuple[float, float], seed: int) -> CellResult:
        samples = make_samples(rounds=200, ratio=1.0, noise=0.002, seed=seed)
        moved = [
            s.model_copy(update={"duration_ns": s.duration_ns * by_stratum[(s.round // 3) % 2]})
            if s.variant == "candidate" else s
            for s in samples
        ]  # fmt: skip
        return make_cell(0, moved, placement=Placement(input_sets=2, swap_every_rounds=3))

    wrong = stats.compare(make_result([cell_of((1.08, 0.97), 21)], threshold_pct=2.0)).cells[0]
    assert wrong.timing_verdict == "slower" and wrong.verdict == "inconclusive"
    assert wrong.reasons[0].code == "placement-disagreement"
    assert re.search(r"is 1\.08\d*, 0\.97\d*:", wrong.reasons[0].message)
    real = stats.compare(make_result([cell_of((1.07, 1.05), 22)], threshold_pct=2.0)).cells[0]
    assert real.verdict == "slower" and not any(r.code == "placement-disagreement" for r in real.reasons)
    set_effect = stats.compare(
        make_result([cell_of((0.93 * 1.06, 0.93 / 1.06), 24)], threshold_pct=2.0)
    ).cells[0]
    # the accepted cost: a real -7% under a 6% set effect (placements 0.986, 0.877) is not vouched for
    assert set_effect.timing_verdict == "faster" and set_effect.ratio == pytest.approx(0.93, rel=0.005)
    assert set_effect.verdict == "inconclusive" and set_effect.reasons[0].code == "placement-disagreement"
    balanced = stats.compare(make_result([cell_of((1.015, 0.985), 23)], threshold_pct=2.0)).cells[0]
    assert balanced.verdict == "same"
    assert verdicts.placement_reasons("slower", 1.05, [1.05], 2.0) == []  # one placement: nothing to compare


def _copy_probe(gbps: float) -> ProbeReport:
    reading = CopyBandwidthReading(device_index=0, size_bytes=1 << 30, time_us=1.0, bandwidth_gbps=gbps)
    return ProbeReport(phase="before", taken_at=NOW, copy_bandwidth=[reading], nvml_status="ok")


def test_copy_probe_bounds_bytes_in_cold_gpu_mode_only():
    samples = make_samples(rounds=40, base_ns=1_000.0, seed=13)  # 1 us
    work = {v: Work(bytes_read=5e6, bytes_written=5e6) for v in ("baseline", "candidate")}  # 10 TB/s
    probes = [_copy_probe(4000.0), _copy_probe(4200.0)]
    on_gpu = make_result([make_cell(0, samples, work=work)], probes=probes, device_type="cuda")
    c = stats.compare(on_gpu).cells[0]
    assert c.throughput["baseline_gbps"] == pytest.approx(1e7 / c.baseline.median_ns)
    assert "implausible" in c.flags
    assert verdicts.node_peaks(on_gpu) == {"copy_gbps": 4200.0}
    # a higher explicit peak overrides the probe
    assert "implausible" not in stats.compare(on_gpu, peaks={"copy_gbps": 20_000.0}).cells[0].flags
    on_cpu = make_result([make_cell(0, samples, work=work)], probes=probes, device_type="cpu")
    assert "implausible" not in stats.compare(on_cpu).cells[0].flags
    # Samples of many launches each (a CUDA graph replay after one flush) may run from L2: no
    # bytes bound, so a real speed-up of a cache-resident kernel keeps its verdict.
    replayed = [s.model_copy(update={"launches": 160}) for s in samples]
    warm = make_result([make_cell(0, replayed, work=work)], probes=probes, device_type="cuda")
    assert "implausible" not in stats.compare(warm).cells[0].flags


@pytest.mark.parametrize("side", ["baseline", "candidate"])
def test_a_wrong_side_is_incorrect_whatever_its_speed(side):
    bad = {side: CorrectnessResult(passed=False, rel_error=0.3, message="rows 0-63 wrong")}
    result = make_result([make_cell(0, make_samples(rounds=60, ratio=0.9, seed=14), correctness=bad)])
    c = stats.compare(result).cells[0]
    assert c.verdict == "incorrect"
    assert c.timing_verdict == "faster" and c.ratio is not None and c.ratio < 0.95  # numbers stay
    assert "incorrect" in c.flags
    assert c.reasons[0].code == "wrong-output" and c.reasons[0].side == side
    assert c.reasons[0].message == f"{side}: rows 0-63 wrong"
    assert c.correctness[side].message == "rows 0-63 wrong"


@pytest.mark.parametrize(
    ("codes", "expected"),
    [
        ([], "faster"),
        (["less-accurate"], "inconclusive"),
        (["rate-above-peak", "less-accurate"], "implausible"),
        (["nondeterministic", "rate-above-peak"], "nondeterministic"),
        (["rate-above-peak", "wrong-under-timing", "nondeterministic"], "incorrect"),
        (["wrong-output", "side-failed"], "failed"),
        (["correctness-off"], "faster"),  # told, never decisive
    ],
)
def test_verdict_precedence(codes, expected):
    found = [verdicts.reason(code, code) for code in codes]
    decision = verdicts.decide("faster", found)
    assert decision.verdict == expected
    if expected != "faster":  # the deciding reason comes first
        assert verdicts.deciding_class(decision.reasons[0]) == expected


def test_every_reason_code_is_explained_and_its_flag_exists():
    for code, kind in verdicts.REASONS.items():
        assert kind.meaning and code == code.lower()
        assert kind.verdict in (None, *verdicts.VERDICT_ORDER)
        assert kind.flag is None or kind.flag in verdicts.FLAG_NOTES
    assert set(verdicts.FLAG_NOTES) == set(get_args(Flag))


def test_failed_cell_and_job_flags():
    good = make_cell(0, make_samples(rounds=30, seed=15))
    failed = make_cell(1, error="CUDA error: out of memory")
    procs = [{"pid": 1, "own": True}, {"pid": 2, "own": False}]
    telemetry = GpuTelemetry(device_index=0, other_processes=procs)
    probe = ProbeReport(phase="before", taken_at=NOW, telemetry=[telemetry])
    comp = stats.compare(make_result([good, failed], probes=[probe], error="probe after timed out"), job_id=7)
    f = comp.cells[1]
    assert f.verdict == "failed" and f.flags == ["failed"]
    assert f.reasons[0].code == "side-failed" and f.reasons[0].message == "CUDA error: out of memory"
    assert f.baseline.n == 0 and f.ratio is None and f.error == "CUDA error: out of memory"
    assert comp.job_id == 7
    assert comp.flags == ["contended", "failed"]
    assert comp.summary == {"failed": 1, "same": 1}
    assert [r.code for r in comp.reasons] == ["job-failed"]


def test_contended_needs_a_foreign_process():
    own_only = GpuTelemetry(device_index=0, other_processes=[{"pid": 1, "own": True}])
    unmarked = GpuTelemetry(device_index=1, other_processes=[{"pid": 99, "own": False}])
    two = GpuTelemetry(device_index=2, other_processes=[{"pid": 98, "own": False}, {"pid": 99, "own": False}])
    assert verdicts.probe_flags([ProbeReport(taken_at=NOW, telemetry=[own_only, unmarked])]) == []
    assert verdicts.probe_flags([ProbeReport(taken_at=NOW, telemetry=[two])]) == ["contended"]


# ------------------------------------------------------------------------------------------------
# across the sweep, labels
# ------------------------------------------------------------------------------------------------


def test_benjamini_hochberg_across_sweep():
    cells = [
        make_cell(i, make_samples(rounds=30, ratio=r, noise=0.02, seed=20 + i))
        for i, r in enumerate([1.0, 1.003, 1.01, 1.05])
    ]
    comp = stats.compare(make_result(cells, spec={"sweep": {"N": [1000, 1001, 1002, 1003]}}))
    raw = [c.p_value for c in comp.cells]
    adjusted = [c.p_adjusted for c in comp.cells]
    assert all(a >= p for a, p in zip(adjusted, raw, strict=True))
    assert any(a > p for a, p in zip(adjusted, raw, strict=True))
    assert adjusted == pytest.approx(list(false_discovery_control(raw)))


def test_labels():
    spec = {
        "benchmark": "matmul",
        "baseline": {"variant": "triton", "params": {"BLOCK_M": 64}},
        "candidate": {"variant": "triton", "params": {"BLOCK_M": 128}},
        "sweep": {"M": [256], "dtype": ["float32"]},
        "params": {"K": 64},
    }
    cell = make_cell(0, make_samples(rounds=5), params={"K": 64, "M": 256, "dtype": "float32"})
    comp = stats.compare(make_result([cell], spec=spec))
    assert comp.cells[0].label == "M=256, dtype=float32"
    assert (comp.baseline_label, comp.candidate_label) == ("triton (BLOCK_M=64)", "triton (BLOCK_M=128)")
    plain = stats.compare(make_result([make_cell(0, make_samples(rounds=5))]))
    assert (plain.baseline_label, plain.candidate_label) == ("torch", "triton")
    assert plain.cells[0].label == "N=1000"


def test_compare_is_deterministic():
    result = make_result([make_cell(0, make_samples(rounds=50, ratio=1.02, seed=30))])
    assert stats.compare(result) == stats.compare(result)


def test_a_power_capped_sample_is_throttled_by_its_clock_alone() -> None:
    """``sw_power_cap`` (0x4) alone is the power limiter under the kernel's own load (an H200 bf16
    8192^3 matmul: 0x4 on every sample at 1650 MHz, 83% of 1980): kept; marked throttled by the
    runner's clock rule (below 75%) it is dropped; hw_thermal (0x40) drops a sample whatever its
    clock; a mask of 0x4 | 0x40 too."""
    from kernelab.service.contract.samples import SampleColumns

    n = 8
    base = {
        "variant": np.array([0, 1] * (n // 2), dtype=np.int8), "round": np.repeat(np.arange(n // 2), 2),
        "position": np.tile([0, 1], n // 2), "duration_ns": np.full(n, 1000.0),
        "launches": np.ones(n, dtype=np.int64),
        "sm_clock_mhz": np.full(n, 1650.0), "temperature_c": np.full(n, 60.0), "power_w": np.full(n, 700.0),
    }  # fmt: skip

    def columns(masks: list[int], marked: list[bool]) -> SampleColumns:
        return SampleColumns.from_arrays(**base, clock_event_reasons=np.array(masks, dtype=np.int64),
                                         throttled=np.array(marked, dtype=bool))  # fmt: skip

    capped = columns([0x4] * n, [False] * n)
    assert not estimators.throttled_mask(capped).any()
    clocked = columns([0x4] * n, [True] + [False] * (n - 1))
    assert estimators.throttled_mask(clocked).tolist() == [True] + [False] * (n - 1)
    hot = columns([0x40, 0x4 | 0x40] + [0x4] * (n - 2), [False] * n)
    assert estimators.throttled_mask(hot).tolist() == [True, True] + [False] * (n - 2)


def test_a_side_timed_in_the_triton_interpreter_gets_no_timing_verdict() -> None:
    """A cell whose candidate ran its Triton kernels in the interpreter (a CPU node) is
    ``inconclusive`` with reason ``interpreted`` however large the ratio, its timing marked void in
    every renderer; a wrong output still reads ``incorrect`` (correctness outranks it)."""
    from factories import job_result

    from kernelab.service.judge.report import void_timing

    result = job_result(1)
    plain = stats.compare(result, n_resamples=200)
    assert plain.cells[0].verdict == "faster" and not void_timing(plain.cells[0])
    for cell in result.cells:
        cell.interpreted = ["candidate"]
    judged = stats.compare(result, n_resamples=200)
    for cell in judged.cells:
        assert cell.verdict == "inconclusive" and cell.timing_verdict == "faster"
        assert [r.code for r in cell.reasons if r.code == "interpreted"] == ["interpreted"]
        assert void_timing(cell)
    result.cells[0].correctness["candidate"].passed = False
    result.cells[0].correctness["candidate"].message = "wrong"
    assert stats.compare(result, n_resamples=200).cells[0].verdict == "incorrect"
