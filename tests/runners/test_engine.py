"""The interleaving engine on the CPU timer with busy-wait callables of known length."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
from pydantic import ValidationError

from kernelab.runners.engine import (
    ci_half_width,
    is_throttled,
    measure_interleaved,
    measure_pair,
    round_order,
)
from kernelab.runners.timing import CpuTimer
from kernelab.service.schemas import MeasurementSpec, Sample, SampleColumns


def busy_wait(duration_ns: float) -> None:
    end = time.perf_counter_ns() + duration_ns
    while time.perf_counter_ns() < end:
        pass


def fixed(duration_ns: float, log: list[str] | None = None, name: str = ""):
    """A callable that takes ``duration_ns``; appends ``name`` to ``log`` on each call."""

    def fn() -> None:
        if log is not None:
            log.append(name)
        busy_wait(duration_ns)

    return fn


def noisy(mean_ns: float, spread_ns: float, seed: int):
    """A callable whose durations are drawn uniformly from mean +- spread (seeded)."""
    rng = np.random.default_rng(seed)

    def fn() -> None:
        busy_wait(mean_ns + spread_ns * (2 * rng.random() - 1))

    return fn


def settings(**kw) -> MeasurementSpec:
    # min_time_ms 0: these tests are about the other stop rules (test_min_time.py covers min time)
    base = {"warmup_ms": 0.0, "budget_ms": 60_000.0, "target_ci_pct": 1e-6, "min_time_ms": 0.0}
    return MeasurementSpec(**{**base, **kw})


def rounds_of(samples: SampleColumns) -> int:
    return len(set(samples.round))


def sequence(samples: SampleColumns) -> list[str]:
    return [s.variant[0] for s in samples.rows()]


# --------------------------------------------------------------------------------------------------
# Interleaving
# --------------------------------------------------------------------------------------------------


def test_abba_order_round_and_position_recorded():
    samples = measure_pair(fixed(20_000), fixed(20_000), settings(min_rounds=6, max_rounds=6), CpuTimer())
    assert sequence(samples) == list("bccb" * 3)
    assert [s.round for s in samples.rows()] == [r for r in range(6) for _ in range(2)]
    assert [s.position for s in samples.rows()] == [0, 1] * 6


def test_abba_with_several_samples_per_round():
    samples = measure_pair(
        fixed(20_000), fixed(20_000), settings(min_rounds=2, max_rounds=2, samples_per_round=2), CpuTimer()
    )
    assert sequence(samples) == list("bcbc" + "cbcb")
    assert [s.position for s in samples.rows()] == [0, 1, 2, 3] * 2


def test_samples_are_in_execution_order():
    log: list[str] = []
    timer = CpuTimer(min_window_ns=200_000)
    samples = measure_pair(
        fixed(50_000, log, "b"),
        fixed(50_000, log, "c"),
        settings(min_rounds=8, max_rounds=8, order="random", seed=3),
        timer,
    )
    # The tail of the call log is the measured samples, each `launches` calls of one variant.
    measured = log[len(log) - sum(s.launches for s in samples.rows()) :]
    expected = [s.variant[0] for s in samples.rows() for _ in range(s.launches)]
    assert measured == expected


def test_random_order_is_seeded_and_reproducible():
    def run(seed: int) -> list[tuple[str, int, int]]:
        samples = measure_pair(
            fixed(5_000),
            fixed(5_000),
            settings(min_rounds=24, max_rounds=24, order="random", seed=seed),
            CpuTimer(min_window_ns=20_000),
        )
        return [(s.variant, s.round, s.position) for s in samples.rows()]

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    orders = [tuple(v for v, r, _ in first if r == k) for k in range(24)]
    assert all(sorted(o) == ["baseline", "candidate"] for o in orders)  # every round holds both
    assert len(set(orders)) == 2  # both orders occur: not blocked


def test_random_order_never_blocks_the_variants():
    rng = np.random.default_rng(0)
    spec = settings(order="random", samples_per_round=3)
    orders = [round_order(r, spec, rng) for r in range(200)]
    assert all(sorted(o) == ["baseline"] * 3 + ["candidate"] * 3 for o in orders)
    flat = list(itertools.chain.from_iterable(orders))
    half = len(flat) // 2
    assert set(flat[:half]) == set(flat[half:]) == {"baseline", "candidate"}


# --------------------------------------------------------------------------------------------------
# Stop rules
# --------------------------------------------------------------------------------------------------


def test_min_rounds_respected_even_past_the_budget():
    samples = measure_pair(
        fixed(300_000), fixed(300_000), settings(budget_ms=1.0, min_rounds=7, max_rounds=100), CpuTimer()
    )
    assert rounds_of(samples) == 7
    assert len(samples) == 14


def test_max_rounds_reached():
    samples = measure_pair(
        noisy(50_000, 40_000, 1),
        noisy(50_000, 40_000, 2),
        settings(min_rounds=2, max_rounds=4),
        CpuTimer(min_window_ns=50_000),
    )
    assert rounds_of(samples) == 4


def test_budget_respected_within_tolerance():
    budget_ms = 150.0
    spec = settings(budget_ms=budget_ms, min_rounds=2, max_rounds=100_000)
    t0 = time.perf_counter()
    samples = measure_pair(noisy(300_000, 100_000, 1), noisy(300_000, 100_000, 2), spec, CpuTimer())
    wall_ms = (time.perf_counter() - t0) * 1e3
    # Warm-up is 2 short passes (warmup_ms=0); one round is ~2.5 ms. The engine stops before a
    # round that would overrun, so the budget is used but not exceeded by more than noise.
    assert rounds_of(samples) > spec.min_rounds  # the budget, not min_rounds, ended it
    assert budget_ms * 0.5 < wall_ms < budget_ms * 1.3 + 30.0


def test_adaptive_stop_stops_earlier_for_a_quiet_pair():
    # Short samples (50 us, one launch each) so that a busy CI box rarely preempts the quiet pair.
    spec = settings(target_ci_pct=10.0, min_rounds=5, max_rounds=40)
    timer = CpuTimer(min_window_ns=50_000, max_launches=1)
    quiet = measure_pair(fixed(50_000), fixed(50_000), spec, timer)
    loud = measure_pair(noisy(50_000, 45_000, 1), noisy(50_000, 45_000, 2), spec, timer)
    assert rounds_of(quiet) < rounds_of(loud)
    # Uniform 5..95 us: the median's standard error is ~0.9/sqrt(n) of the centre, so the ratio's
    # 95% CI half-width after 40 rounds is still ~40%.
    assert rounds_of(loud) == 40
    ratio, half_width = ci_half_width(quiet, spec)
    assert half_width < 0.10
    assert ratio == pytest.approx(1.0, abs=0.15)


def test_progress_reports_the_ci_checks():
    messages: list[str] = []
    measure_pair(
        fixed(20_000),
        fixed(20_000),
        settings(min_rounds=4, max_rounds=12),
        CpuTimer(min_window_ns=100_000),
        progress=messages.append,
    )
    assert messages and all(m.startswith("round ") for m in messages)
    assert messages[0].startswith("round 4:")


def test_ci_half_width_needs_two_rounds():
    spec = settings()
    one_round = SampleColumns.from_rows(
        [
            Sample(variant="baseline", round=0, position=0, duration_ns=10.0),
            Sample(variant="candidate", round=0, position=1, duration_ns=11.0),
        ]
    )
    assert ci_half_width(one_round, spec) is None


# --------------------------------------------------------------------------------------------------
# Launches per sample
# --------------------------------------------------------------------------------------------------


def test_launches_cover_the_minimum_window():
    samples = measure_pair(fixed(250_000), fixed(2_500_000), settings(min_rounds=2, max_rounds=2), CpuTimer())
    base = {s.launches for s in samples.rows() if s.variant == "baseline"}
    cand = {s.launches for s in samples.rows() if s.variant == "candidate"}
    assert len(base) == 1 and len(cand) == 1  # fixed for the whole measurement
    (b,), (c,) = base, cand
    assert 3 <= b <= 4  # ceil(1 ms / ~250 us); 3 when a loaded box stretches the estimate
    assert c == 1  # one 2.5 ms launch already covers 1 ms
    assert all(s.duration_ns * s.launches >= 0.9e6 for s in samples.rows() if s.variant == "baseline")


def test_launches_capped_for_a_tiny_callable():
    timer = CpuTimer(max_launches=300)
    samples = measure_pair(lambda: None, lambda: None, settings(min_rounds=2, max_rounds=2), timer)
    assert set(samples.launches) == {300}


# --------------------------------------------------------------------------------------------------
# Per-sample context and throttling
# --------------------------------------------------------------------------------------------------


class ScriptedSampler:
    """Test double for ``kernelab.runners.probes.telemetry.ContextSampler``: replays a list of SM clocks."""

    def __init__(self, clocks_mhz: list[float | None], expected_sm_clock_mhz: float | None):
        self.expected_sm_clock_mhz = expected_sm_clock_mhz
        self._clocks = itertools.cycle(clocks_mhz)
        self.reads = 0

    def read(self) -> dict[str, float | int | None]:
        self.reads += 1
        return {
            "sm_clock_mhz": next(self._clocks),
            "clock_event_reasons": 0x4,
            "temperature_c": 61.0,
            "power_w": 512.5,
        }


def test_throttled_samples_marked_from_the_clock():
    clocks = [1980.0, 1000.0, 1900.0, 1484.0, 1485.0, None]
    sampler = ScriptedSampler(clocks, expected_sm_clock_mhz=1980.0)
    samples = measure_pair(
        fixed(10_000),
        fixed(10_000),
        settings(min_rounds=6, max_rounds=6),
        CpuTimer(min_window_ns=20_000),
        sampler=sampler,
    )
    assert sampler.reads == len(samples) == 12
    assert [s.sm_clock_mhz for s in samples.rows()] == clocks * 2
    # nvbench's rule: below 75% of the expected clock (1485 MHz of 1980) is throttled.
    assert [s.throttled for s in samples.rows()] == [False, True, False, True, False, False] * 2
    assert set(samples.temperature_c) == {61.0} and set(samples.power_w) == {512.5}
    assert set(samples.clock_event_reasons) == {4}


def test_no_throttling_without_an_expected_clock():
    sampler = ScriptedSampler([100.0], expected_sm_clock_mhz=None)
    samples = measure_pair(
        fixed(10_000),
        fixed(10_000),
        settings(min_rounds=2, max_rounds=2),
        CpuTimer(min_window_ns=20_000),
        sampler=sampler,
    )
    assert not any(s.throttled for s in samples.rows())
    assert all(s.sm_clock_mhz == 100.0 for s in samples.rows())


def test_no_sampler_leaves_context_empty():
    samples = measure_pair(fixed(10_000), fixed(10_000), settings(min_rounds=2, max_rounds=2), CpuTimer())
    assert all(s.sm_clock_mhz is None and s.power_w is None and not s.throttled for s in samples.rows())


@pytest.mark.parametrize(
    ("clock", "expected", "throttled"),
    [
        (1484.9, 1980.0, True),
        (1485.0, 1980.0, False),
        (None, 1980.0, False),
        (10.0, None, False),
        (10.0, 0.0, False),
    ],
)
def test_is_throttled(clock, expected, throttled):
    assert is_throttled(clock, expected) is throttled


def test_callable_errors_propagate():
    def broken() -> None:
        raise RuntimeError("kernel fault")

    with pytest.raises(RuntimeError, match="kernel fault"):
        measure_pair(fixed(1_000), broken, settings(min_rounds=2, max_rounds=2), CpuTimer())


class CountingPair:
    """A ``PairTimer`` fake: sample ``k`` (in the order taken) lasts ``1000 + k`` ns, or ``bad_ns``
    for the sample numbered ``bad_at``. Samples cover 7 launches of the baseline and 3 of the
    candidate; the warm-up's calls (1 and 2 launches) are not counted."""

    def __init__(self, bad_at: int | None = None, bad_ns: float = float("nan")):
        self.k = -1
        self.bad_at, self.bad_ns = bad_at, bad_ns

    def time_ns(self, variant: str, launches: int) -> float:
        if launches not in (3, 7):  # a warm-up call
            return 1000.0
        self.k += 1
        return self.bad_ns if self.k == self.bad_at else 1000.0 + self.k

    def launches_for(self, variant: str, per_launch_ns: float) -> int:
        return 3 if variant == "candidate" else 7

    def timer_kind(self, variant: str) -> str:
        return "perf_counter"

    def use_fallback(self, variant: str) -> bool:
        return False


def test_samples_come_back_as_typed_arrays_in_the_order_taken():
    rounds = 4500  # more samples than the buffer's first allocation (it grows)
    samples = measure_interleaved(CountingPair(), settings(min_rounds=rounds, max_rounds=rounds))
    n = 2 * rounds
    assert len(samples) == n
    assert {name: getattr(samples, name).dtype.str for name in ("variant", "round", "duration_ns", "launches",
            "sm_clock_mhz", "clock_event_reasons", "throttled")} == {
        "variant": "|u1", "round": "<i4", "duration_ns": "<f8", "launches": "<i4", "sm_clock_mhz": "<f8",
        "clock_event_reasons": "<i8", "throttled": "|b1"}  # fmt: skip
    assert samples.duration_ns.tolist() == [1000.0 + k for k in range(n)]
    assert samples.round.tolist() == [k // 2 for k in range(n)]
    candidate = samples.variant == 1
    assert (samples.launches[candidate] == 3).all() and (samples.launches[~candidate] == 7).all()
    assert candidate.tolist() == [(k + k // 2) % 2 == 1 for k in range(n)]  # ABBA: A,B then B,A


def test_a_sample_the_schema_refuses_fails_the_cell_naming_column_and_index():
    with pytest.raises(ValidationError) as info:
        measure_interleaved(CountingPair(bad_at=5), settings(min_rounds=4, max_rounds=4))
    assert [e["loc"] for e in info.value.errors()] == [("duration_ns", 5)]
    with pytest.raises(ValidationError) as info:
        measure_interleaved(CountingPair(bad_at=2, bad_ns=-1.0), settings(min_rounds=4, max_rounds=4))
    assert [e["loc"] for e in info.value.errors()] == [("duration_ns", 2)]
