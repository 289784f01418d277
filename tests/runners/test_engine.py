"""The interleaving engine: order, stop rules and launch counts on a ``FakeTimer`` whose scripted
readings advance the engine's clock (``fake_timing``), so every stop is decided on known durations,
whatever the load of the machine; one test drives the real CPU timer with busy-wait callables."""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from fake_timing import FakeClock, FakeTimer, Script, constant, noop, uniform
from pydantic import ValidationError

from kernelab.runners.engine import (
    ci_half_width,
    is_throttled,
    measure_interleaved,
    measure_pair,
    round_order,
)
from kernelab.runners.timing import CpuTimer
from kernelab.service.contract.schemas import MeasurementSpec, Sample, SampleColumns


def busy_wait(duration_ns: float) -> None:
    end = time.perf_counter_ns() + duration_ns
    while time.perf_counter_ns() < end:
        pass


def logged(log: list[str], name: str):
    """A callable that appends ``name`` to ``log`` on each call (its time comes from a script)."""

    def fn() -> None:
        log.append(name)

    return fn


def fake_pair(
    baseline: Script,
    candidate: Script,
    spec: MeasurementSpec,
    *,
    fns: tuple[Callable[[], None], Callable[[], None]] | None = None,
    min_window_ns: float = 1e6,
    max_launches: int = 10_000,
    **engine_kw: Any,
) -> tuple[SampleColumns, FakeTimer]:
    """``measure_pair`` of two callables whose ns per launch come from ``baseline``/``candidate``,
    on a ``FakeTimer`` and the ``FakeClock`` it advances (the engine's warm-up and budget clock)."""
    b, c = fns or (noop(), noop())
    clock = FakeClock()
    timer = FakeTimer(
        clock, {b: baseline, c: candidate}, min_window_ns=min_window_ns, max_launches=max_launches
    )
    return measure_pair(b, c, spec, timer, clock=clock, **engine_kw), timer


def timed_ns(samples: SampleColumns) -> float:
    """Device time the samples cover (ns): what the budget and the minimum time count."""
    return sum(s.duration_ns * s.launches for s in samples.rows())


def settings(**kw) -> MeasurementSpec:
    # min_time_ms 0: these tests are about the other stop rules (test_timing_defaults.py covers min time);
    # stop_rule target-ci: a decided verdict would end these cells first (test_stop_when_decided_*)
    base = {"warmup_ms": 0.0, "budget_ms": 60_000.0, "target_ci_pct": 1e-6, "min_time_ms": 0.0,
            "stop_rule": "target-ci"}  # fmt: skip
    return MeasurementSpec(**{**base, **kw})


def rounds_of(samples: SampleColumns) -> int:
    return len(set(samples.round))


def sequence(samples: SampleColumns) -> list[str]:
    return [s.variant[0] for s in samples.rows()]


# --------------------------------------------------------------------------------------------------
# Interleaving
# --------------------------------------------------------------------------------------------------


def test_abba_order_round_and_position_recorded():
    samples, _ = fake_pair(constant(20_000), constant(20_000), settings(min_rounds=6, max_rounds=6))
    assert sequence(samples) == list("bccb" * 3)
    assert [s.round for s in samples.rows()] == [r for r in range(6) for _ in range(2)]
    assert [s.position for s in samples.rows()] == [0, 1] * 6


def test_abba_with_several_samples_per_round():
    spec = settings(min_rounds=2, max_rounds=2, samples_per_round=2)
    samples, _ = fake_pair(constant(20_000), constant(20_000), spec)
    assert sequence(samples) == list("bcbc" + "cbcb")
    assert [s.position for s in samples.rows()] == [0, 1, 2, 3] * 2


def test_samples_are_in_execution_order():
    log: list[str] = []
    samples, _ = fake_pair(
        constant(50_000),
        constant(50_000),
        settings(min_rounds=8, max_rounds=8, order="random", seed=3),
        fns=(logged(log, "b"), logged(log, "c")),
        min_window_ns=200_000,
    )
    # The tail of the call log is the measured samples, each `launches` calls of one variant.
    measured = log[len(log) - sum(s.launches for s in samples.rows()) :]
    expected = [s.variant[0] for s in samples.rows() for _ in range(s.launches)]
    assert measured == expected


def test_random_order_is_seeded_and_reproducible():
    def run(seed: int) -> list[tuple[str, int, int]]:
        spec = settings(min_rounds=24, max_rounds=24, order="random", seed=seed)
        samples, _ = fake_pair(constant(5_000), constant(5_000), spec, min_window_ns=20_000)
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


def test_the_cpu_timer_times_busy_waits_interleaved():
    """The real ``CpuTimer`` end to end: ABBA order, and no sample reads shorter than its busy wait."""

    def wait(ns: float) -> Callable[[], None]:
        return lambda: busy_wait(ns)

    samples = measure_pair(wait(20_000), wait(40_000), settings(min_rounds=4, max_rounds=4), CpuTimer())
    assert sequence(samples) == list("bccb" * 2)
    for s in samples.rows():
        assert s.duration_ns >= (20_000 if s.variant == "baseline" else 40_000)


# --------------------------------------------------------------------------------------------------
# Stop rules
# --------------------------------------------------------------------------------------------------


def test_min_rounds_respected_even_past_the_budget():
    spec = settings(budget_ms=1.0, min_rounds=7, max_rounds=100)
    samples, _ = fake_pair(constant(300_000), constant(300_000), spec)
    assert rounds_of(samples) == 7
    assert len(samples) == 14
    assert timed_ns(samples) > 1e6  # 7 rounds of 2 x 4 x 0.3 ms: well past the 1 ms budget


def test_max_rounds_reached():
    spec = settings(min_rounds=2, max_rounds=4)
    samples, _ = fake_pair(uniform(50_000, 40_000, 1), uniform(50_000, 40_000, 2), spec, min_window_ns=50_000)
    assert rounds_of(samples) == 4


def test_budget_is_used_but_never_overrun():
    budget_ns = 150e6
    spec = settings(budget_ms=budget_ns / 1e6, min_rounds=2, max_rounds=100_000)
    samples, _ = fake_pair(uniform(300_000, 100_000, 1), uniform(300_000, 100_000, 2), spec)
    # The clock runs only while samples are timed (no overhead): the time since the warm-up is the
    # samples' time. The engine stops before a round that would overrun (a round here: 2 samples of
    # 4 launches of at most 0.4 ms, 3.2 ms), so the budget is used to within two rounds.
    rounds = rounds_of(samples)
    assert rounds > spec.min_rounds  # the budget, not min_rounds, ended it
    assert budget_ns - 2 * 3.2e6 < timed_ns(samples) <= budget_ns
    longest = max(
        timed_ns(SampleColumns.from_rows([s for s in samples.rows() if s.round == r])) for r in range(rounds)
    )
    assert timed_ns(samples) * (rounds + 1) / rounds > budget_ns - longest  # one more round would not fit


def test_budget_counts_the_time_between_launches_too():
    """The budget is the clock's time of the sampling loop, not only the launches it timed: an
    overhead per sample (a slow timer, a sampler read) ends the cell sooner."""
    spec = settings(budget_ms=100.0, min_rounds=2, max_rounds=100_000)
    b, c = noop(), noop()
    clock = FakeClock()
    scripts = {b: uniform(100_000, 1_000, 1), c: uniform(100_000, 1_000, 2)}
    timer = FakeTimer(clock, scripts, min_window_ns=1e6, overhead_ns=1e6)
    lean, _ = fake_pair(uniform(100_000, 1_000, 1), uniform(100_000, 1_000, 2), spec)
    slow = measure_pair(b, c, spec, timer, clock=clock)
    assert timed_ns(lean) <= 100e6
    assert timed_ns(slow) + 1e6 * len(slow) <= 100e6  # launches and overhead within the budget
    assert rounds_of(slow) < 0.7 * rounds_of(lean)  # ~2.2 ms of launches a round, 2 ms of overhead


def test_adaptive_stop_stops_earlier_for_a_quiet_pair():
    spec = settings(target_ci_pct=10.0, min_rounds=5, max_rounds=40)
    quiet, _ = fake_pair(constant(50_000), constant(50_000), spec, min_window_ns=50_000, max_launches=1)
    loud, _ = fake_pair(
        uniform(50_000, 45_000, 1), uniform(50_000, 45_000, 2), spec, min_window_ns=50_000, max_launches=1
    )
    assert rounds_of(quiet) == 5  # a zero-width CI at the first check, at min_rounds
    # Uniform 5..95 us: the median's standard error is ~0.9/sqrt(n) of the centre, so the ratio's
    # 95% CI half-width after 40 rounds is still ~40%.
    assert rounds_of(loud) == 40
    ratio, half_width = ci_half_width(quiet, spec)
    assert half_width == 0.0 and ratio == 1.0


def test_progress_reports_the_ci_checks():
    messages: list[str] = []
    spec = settings(min_rounds=4, max_rounds=12)
    noisy = uniform(20_000, 1_000, 1), uniform(20_000, 1_000, 2)
    fake_pair(*noisy, spec, min_window_ns=100_000, progress=messages.append)
    # checks at 4, 8 (4 + max(4, 20% of 4)) and 12 rounds; the CI target 1e-6 % is never met
    assert [m.split(":")[0] for m in messages] == ["warm-up", "measuring", "round 4", "round 8", "round 12"]
    pattern = (
        r"round 4: ratio \d\.\d{4} ±\d+\.\d\d%; launches per sample: baseline \d, candidate \d; "
        r"timed 1 ms \(may stop from 0 ms\)"
    )
    assert re.fullmatch(pattern, messages[2]), messages[2]


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
    spec = settings(min_rounds=2, max_rounds=2)
    samples, _ = fake_pair(constant(250_000), constant(2_500_000), spec, min_window_ns=1e6)
    base = {s.launches for s in samples.rows() if s.variant == "baseline"}
    cand = {s.launches for s in samples.rows() if s.variant == "candidate"}
    assert base == {4}  # ceil(1 ms / 250 us), fixed for the whole measurement
    assert cand == {1}  # one 2.5 ms launch already covers 1 ms
    assert all(s.duration_ns * s.launches >= 1e6 for s in samples.rows())


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
    spec = settings(min_rounds=6, max_rounds=6)
    samples, _ = fake_pair(constant(10_000), constant(10_000), spec, min_window_ns=20_000, sampler=sampler)
    assert sampler.reads == len(samples) == 12
    assert [s.sm_clock_mhz for s in samples.rows()] == clocks * 2
    # nvbench's rule: below 75% of the expected clock (1485 MHz of 1980) is throttled.
    assert [s.throttled for s in samples.rows()] == [False, True, False, True, False, False] * 2
    assert set(samples.temperature_c) == {61.0} and set(samples.power_w) == {512.5}
    assert set(samples.clock_event_reasons) == {4}


def test_no_throttling_without_an_expected_clock():
    sampler = ScriptedSampler([100.0], expected_sm_clock_mhz=None)
    spec = settings(min_rounds=2, max_rounds=2)
    samples, _ = fake_pair(constant(10_000), constant(10_000), spec, min_window_ns=20_000, sampler=sampler)
    assert not any(s.throttled for s in samples.rows())
    assert all(s.sm_clock_mhz == 100.0 for s in samples.rows())


def test_no_sampler_leaves_context_empty():
    samples, _ = fake_pair(constant(10_000), constant(10_000), settings(min_rounds=2, max_rounds=2))
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
        fake_pair(
            constant(1_000), constant(1_000), settings(min_rounds=2, max_rounds=2), fns=(noop(), broken)
        )


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


@pytest.mark.parametrize(
    ("candidate_ns", "verdict"),
    [(200_000, "slower"), (50_000, "faster"), (100_000, "same")],
)
def test_stop_when_decided_ends_a_cell_whose_verdict_is_clear(candidate_ns: float, verdict: str) -> None:
    """``stop_rule: decided`` (the default): a clear change, and a clear absence of one, end the cell
    long before a target width nobody can reach (1e-6 %); the server's verdict of those samples is
    the one the stop read. ``target-ci`` runs the same pair to its budget."""
    from kernelab.runners.engine import DECIDED_MARGIN, decided
    from kernelab.service.judge.estimators import ratio_ci
    from kernelab.service.judge.verdicts import timing_verdict

    spread = 2_000  # +-2% of the baseline's 100 us
    spec = settings(budget_ms=20_000.0, stop_rule="decided", threshold_pct=5.0)
    quick, _ = fake_pair(
        uniform(100_000, spread, 1), uniform(candidate_ns, spread * candidate_ns / 1e5, 2), spec
    )
    full, _ = fake_pair(uniform(100_000, spread, 1), uniform(candidate_ns, spread * candidate_ns / 1e5, 2),
                        spec.model_copy(update={"stop_rule": "target-ci"}))  # fmt: skip
    assert timed_ns(full) > 0.9 * 20_000e6  # the budget ended it
    assert timed_ns(quick) < 0.05 * timed_ns(full)
    ratio, low, high = ratio_ci(quick, confidence=0.95, n_resamples=2000, seed=0)
    assert timing_verdict(ratio, low, high, 5.0)[0] == verdict
    assert decided((ratio, (high - low) / 2 / ratio / DECIDED_MARGIN), 5.0)


def test_stop_when_decided_waits_while_the_interval_straddles_the_threshold() -> None:
    """An interval across the threshold, or a change that excludes 1 but not the threshold, decides
    nothing: such a cell runs to its budget, as before."""
    from kernelab.runners.engine import decided

    assert not decided((1.05, 0.01), 5.0)  # 1.05 +- 1.25%: straddles 1 + 5%
    assert not decided((1.03, 0.03), 5.0)  # excludes 1 at 95%, not beyond the threshold
    assert decided((1.20, 0.01), 5.0) and decided((1.0, 0.01), 5.0) and decided((0.8, 0.01), 5.0)
    assert not decided((1.0, 0.045), 5.0)  # same needs the widened interval inside +-5%
    # noisy samples (+-90%, one launch each) at the threshold: the interval stays across 1.05
    spec = settings(budget_ms=200.0, stop_rule="decided", threshold_pct=5.0)
    samples, _ = fake_pair(uniform(1_000_000, 900_000, 1), uniform(1_050_000, 945_000, 2), spec,
                           min_window_ns=1.0, max_launches=1)  # fmt: skip
    assert timed_ns(samples) > 0.9 * 200e6
