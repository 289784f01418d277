"""``measurement.state`` (cold vs sustained) and ``measurement.energy`` through the engine, with fake
sides on the engine's fake clock (``fake_timing``) and a fake energy counter that ticks on that
clock; judged by the real statistics (``kernelab.service.judge.stats``). No wall-clock bounds."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pytest
from fake_timing import FakeClock, FakeSide, Script, uniform

from kernelab.runners.engine import (
    SUSTAINED_WARMUP_MS,
    LocalPairTimer,
    ci_half_width,
    energy_check,
    measure_interleaved,
)
from kernelab.service.contract.samples import SAMPLE_FIELDS, SampleColumns
from kernelab.service.contract.schemas import (
    CellResult,
    EnergyBlock,
    EnergyMeasurement,
    JobResult,
    JobSpec,
    MeasurementSpec,
    NodeInfo,
    Placement,
)
from kernelab.service.judge.estimators import kept_samples, ratio_ci
from kernelab.service.judge.report import energy_line, format_table, side_time, to_markdown
from kernelab.service.judge.stats import compare, energy_summary

T0 = datetime(2026, 12, 2, tzinfo=UTC)


def settings(**kw: object) -> MeasurementSpec:
    base: dict[str, object] = dict(
        warmup_ms=1, budget_ms=5_000, min_rounds=10, max_rounds=30, target_ci_pct=0.01, min_time_ms=0,
        placement="fixed",
    )  # fmt: skip
    base.update(kw)
    return MeasurementSpec.model_validate(base)


class PowerStateSide(FakeSide):
    """A side whose launches run at ``cold_ns`` after an idle gap and at ``loaded_ns`` once the
    device has been loaded for ``load_ns`` without a gap (a fake power limiter), and which can heat
    itself (``heat``: back to back, no gap) or not. Every call is logged in ``calls``."""

    def __init__(
        self, clock: FakeClock, state: dict[str, float], *, cold_ns: float, loaded_ns: float,
        offers_heat: bool = True, gap_ns: float = 50_000.0, load_ns: float = 10e6,
    ) -> None:  # fmt: skip
        super().__init__(clock, ["set0"], {"set0": lambda: cold_ns})
        self.state, self.cold_ns, self.loaded_ns = state, cold_ns, loaded_ns
        self.offers_heat, self.gap_ns, self.load_ns = offers_heat, gap_ns, load_ns
        self.calls: list[str] = []

    def time_ns(self, launches: int) -> float:
        # a timed sample starts after the host's gap: the load streak survives only a gap shorter
        # than the gap a cold sample sees (the fake power limiter forgives one short gap per heat)
        self.clock.advance(self.gap_ns)
        ns = self.loaded_ns if self.state["streak_ns"] >= self.load_ns else self.cold_ns
        self.clock.advance(ns * launches)
        self.state["streak_ns"] = 0.0  # the gap after this sample ends the streak
        self.calls.append("sample")
        return ns

    def __getattr__(self, name: str) -> object:
        if name == "heat" and self.__dict__.get("offers_heat"):
            return self._heat
        raise AttributeError(name)

    def _heat(self, per_launch_ns: float, sustain_ns: float) -> int:
        self.clock.advance(sustain_ns)
        self.state["streak_ns"] = sustain_ns
        self.calls.append("heat")
        return max(1, math.ceil(sustain_ns / per_launch_ns))


def power_pair(
    clock: FakeClock, *, offers_heat: bool = True
) -> tuple[LocalPairTimer, dict[str, PowerStateSide]]:
    state = {"streak_ns": 0.0}
    sides = {
        v: PowerStateSide(clock, state, cold_ns=1_000.0, loaded_ns=1_150.0, offers_heat=offers_heat)
        for v in ("baseline", "candidate")
    }
    return LocalPairTimer(sides), sides


def test_cold_takes_no_heat_and_reads_the_idle_clock() -> None:
    clock = FakeClock()
    pair, sides = power_pair(clock)
    samples = measure_interleaved(pair, settings(state="cold"), clock=clock)
    assert all(c == "sample" for s in sides.values() for c in s.calls)
    assert set(np.asarray(samples.duration_ns).tolist()) == {1_000.0}


def test_sustained_heats_before_every_timed_sample_and_reads_the_loaded_clock() -> None:
    clock = FakeClock()
    pair, sides = power_pair(clock)
    spec = settings(state="sustained", sustain_ms=20)
    samples = measure_interleaved(pair, spec, clock=clock)
    durations = np.asarray(samples.duration_ns)
    rounds = int(np.asarray(samples.round).max()) + 1
    # every timed sample but each side's first (right after the warm-up) follows a heat of that side
    for side in sides.values():
        timed = [i for i, c in enumerate(side.calls) if c == "sample"]
        measured = timed[-rounds:]
        assert all(side.calls[i - 1] == "heat" for i in measured[1:])
    assert (durations[2:] == 1_150.0).all()
    # both sides in the same state: the ratio is 1 in both states
    assert float(np.median(durations[np.asarray(samples.variant) == 1])) == pytest.approx(1_150.0)


def test_sustained_warm_up_lasts_at_least_a_second_per_side() -> None:
    clock = FakeClock()
    pair, sides = power_pair(clock)
    spec = settings(state="sustained", warmup_ms=1, max_rounds=10, min_rounds=10)
    measure_interleaved(pair, spec, clock=clock)
    samples_per_side = len([c for c in sides["baseline"].calls if c == "sample"])
    # warm-up samples (cold, 1 us each, 1 ms windows) took >= SUSTAINED_WARMUP_MS of the fake clock
    assert samples_per_side * 1e6 >= SUSTAINED_WARMUP_MS * 1e6 * 0.9
    clock2 = FakeClock()
    pair2, sides2 = power_pair(clock2)
    measure_interleaved(
        pair2, settings(state="cold", warmup_ms=1, max_rounds=10, min_rounds=10), clock=clock2
    )
    assert len([c for c in sides2["baseline"].calls if c == "sample"]) < samples_per_side / 10


def test_a_side_without_heat_is_heated_by_untimed_samples() -> None:
    clock = FakeClock()
    pair, sides = power_pair(clock, offers_heat=False)
    spec = settings(state="sustained", sustain_ms=5, max_rounds=10, min_rounds=10)
    samples = measure_interleaved(pair, spec, clock=clock)
    timed_rounds = int(np.asarray(samples.round).max()) + 1
    cold_spec = settings(state="cold", max_rounds=10, min_rounds=10)
    clock2 = FakeClock()
    pair2, sides2 = power_pair(clock2, offers_heat=False)
    measure_interleaved(pair2, cold_spec, clock=clock2)
    assert timed_rounds == 10
    # each timed sample after the first is preceded by ~5 ms of 1 ms untimed samples
    extra = len(sides["baseline"].calls) - len(sides2["baseline"].calls)
    assert extra >= 9 * 4


class FakeMeter:
    """A board energy counter on the fake clock: the sides report the energy they draw
    (``draw``); the counter shows what was drawn up to its last update, every ``period_ns``."""

    def __init__(self, clock: FakeClock, period_ns: float = 100e6, *, frozen: bool = False) -> None:
        self.clock, self.period_ns, self.frozen = clock, period_ns, frozen
        self.history: list[tuple[int, float]] = [(0, 0.0)]  # (time ns, total mJ) after each draw

    def draw(self, joules: float) -> None:
        self.history.append((self.clock(), self.history[-1][1] + joules * 1e3))

    def energy_mj(self) -> float | None:
        if self.frozen:
            return 5.0
        last_update = math.floor(self.clock() / self.period_ns) * self.period_ns
        shown = 0.0
        for t, total in self.history:
            if t <= last_update:
                shown = total
        return shown


class WattSide(FakeSide):
    """A side that draws ``watts`` while it runs (reported to a ``FakeMeter``)."""

    def __init__(self, clock: FakeClock, meter: FakeMeter, ns: Script, watts: float) -> None:
        super().__init__(clock, ["set0"], {"set0": ns})
        self.meter, self.watts = meter, watts

    def time_ns(self, launches: int) -> float:
        ns = super().time_ns(launches)
        self.meter.draw(self.watts * ns * launches / 1e9)
        return ns


def energy_cell(watts_b: float, watts_c: float, **kw: object) -> tuple[CellResult, MeasurementSpec]:
    clock = FakeClock()
    meter = FakeMeter(clock)
    sides = {
        "baseline": WattSide(clock, meter, uniform(100_000.0, 50.0, 1), watts_b),
        "candidate": WattSide(clock, meter, uniform(100_000.0, 50.0, 2), watts_c),
    }
    pair = LocalPairTimer(sides)
    spec = settings(energy=True, energy_blocks=4, energy_block_ms=500, **kw)
    samples = measure_interleaved(pair, spec, clock=clock)
    energy = energy_check(pair, samples, spec, meter, clock=clock)
    cell = CellResult(index=0, params={"M": 4, "N": 64}, samples=samples, energy=energy)
    return cell, spec


def job(spec: MeasurementSpec, cell: CellResult) -> JobResult:
    job_spec = JobSpec.model_validate(
        {
            "benchmark": "softmax", "baseline": {"variant": "torch"}, "candidate": {"variant": "torch"},
            "sweep": {"M": [4], "N": [64]}, "device": "cpu", "measurement": spec.model_dump(),
            "correctness": {"enabled": False},
        }
    )  # fmt: skip
    return JobResult(
        idempotency_key="energy-test-0001", spec=job_spec,
        node=NodeInfo(hostname="node-a", device_type="cpu", device_name="cpu"),
        timer="fake", started_at=T0, finished_at=T0, cells=[cell],
    )  # fmt: skip


def test_energy_per_launch_is_power_times_time_and_the_ratio_finds_the_hungrier_side() -> None:
    cell, spec = energy_cell(500.0, 600.0)
    e = cell.energy
    assert e is not None and e.error is None
    assert [b.side for b in e.blocks[:4]] == ["baseline", "candidate", "candidate", "baseline"]
    assert all(b.ticks >= 5 for b in e.blocks)  # 500 ms blocks on a 100 ms counter
    assert e.period_ms == pytest.approx(100.0, rel=0.02)
    summary = energy_summary(e)
    assert summary is not None
    # 500 W x 100 us = 50 mJ per launch; one sample (10 launches) of error at each end of a block
    assert summary.joules_per_launch["baseline"] == pytest.approx(0.05, rel=0.03)
    assert summary.watts["candidate"] == pytest.approx(600.0, rel=0.03)
    assert summary.ratio == pytest.approx(1.2, rel=0.02)
    assert summary.ci_low is not None and summary.ci_high is not None
    assert summary.ci_low <= summary.ratio <= summary.ci_high and summary.ci_low > 1.1
    c = compare(job(spec, cell))
    line = energy_line(c.cells[0])
    assert line is not None and "50 mJ per launch" in line and "ratio 1.2" in line
    assert "energy: " in format_table(c) and "**Energy per launch**" in to_markdown(c)


def test_equal_power_reads_a_ratio_near_one_with_an_interval_around_it() -> None:
    cell, _ = energy_cell(550.0, 550.0)
    summary = energy_summary(cell.energy)
    assert summary is not None and summary.ratio == pytest.approx(1.0, abs=0.02)
    assert summary.ci_low is not None and summary.ci_high is not None
    assert summary.ci_low <= 1.0 <= summary.ci_high


class GappySide(WattSide):
    """A side as a GPU times it: every timed sample also costs ``overhead_ns`` of synchronisation,
    spin kernel and flush at ``idle_watts``; ``heat`` runs launches back to back at ``watts``."""

    def __init__(self, clock: FakeClock, meter: FakeMeter, watts: float, *, offers_heat: bool) -> None:
        super().__init__(clock, meter, uniform(100_000.0, 50.0, 4), watts)
        self.offers_heat = offers_heat
        self.overhead_ns, self.idle_watts = 400_000.0, 150.0

    def time_ns(self, launches: int) -> float:
        self.clock.advance(self.overhead_ns)
        self.meter.draw(self.idle_watts * self.overhead_ns / 1e9)
        return super().time_ns(launches)

    def __getattr__(self, name: str) -> object:
        if name == "heat" and self.__dict__.get("offers_heat"):
            return self._heat
        raise AttributeError(name)

    def _heat(self, per_launch_ns: float, sustain_ns: float) -> int:
        n = max(1, math.ceil(sustain_ns / 100_000.0))
        self.clock.advance(n * 100_000.0)
        self.meter.draw(self.watts * n * 100_000.0 / 1e9)
        return n


def test_energy_blocks_bill_the_kernel_not_the_gaps_between_timed_samples() -> None:
    # 500 W x 100 us = 50 mJ per launch. Timed samples alone (10 launches, then 0.4 ms at 150 W)
    # would read (50 + 6) / 10 + ... = 56 mJ per launch at a mean power far below 500 W.
    results = {}
    for offers_heat in (True, False):
        clock = FakeClock()
        meter = FakeMeter(clock)
        sides = {
            v: GappySide(clock, meter, 500.0, offers_heat=offers_heat) for v in ("baseline", "candidate")
        }
        pair = LocalPairTimer(sides)
        spec = settings(energy=True, energy_blocks=2, energy_block_ms=500, max_rounds=12)
        samples = measure_interleaved(pair, spec, clock=clock)
        summary = energy_summary(energy_check(pair, samples, spec, meter, clock=clock))
        assert summary is not None
        results[offers_heat] = summary
    heated = results[True]
    assert heated.joules_per_launch["baseline"] == pytest.approx(0.05, rel=0.02)
    assert heated.watts["candidate"] == pytest.approx(500.0, rel=0.05)  # a timed sample per 20 ms step
    # without heat (a revision worker's side) the gaps are in the figure: the test can tell
    assert results[False].joules_per_launch["baseline"] > 0.054


def test_no_counter_or_a_frozen_one_is_an_error_not_a_number() -> None:
    clock = FakeClock()
    spec = settings(energy=True)
    sides = {
        v: FakeSide(clock, ["set0"], {"set0": uniform(1000.0, 1.0, 3)}) for v in ("baseline", "candidate")
    }
    pair = LocalPairTimer(sides)
    samples = measure_interleaved(pair, spec, clock=clock)
    none = energy_check(pair, samples, spec, None, clock=clock)
    assert none is not None and none.error and "no energy counter" in none.error and not none.blocks
    frozen = energy_check(pair, samples, spec, FakeMeter(clock, frozen=True), clock=clock)
    assert frozen is not None and frozen.error and "did not change" in frozen.error
    assert energy_check(pair, samples, settings(energy=False), FakeMeter(clock), clock=clock) is None
    summary = energy_summary(frozen)
    assert summary is not None and summary.ratio is None and summary.error
    cell = CellResult(index=0, params={"M": 4, "N": 64}, samples=samples, energy=frozen)
    c = compare(job(spec, cell))
    assert "no energy (" in (energy_line(c.cells[0]) or "")


def test_the_side_median_carries_its_sm_clock_and_the_header_its_state() -> None:
    cell, spec = energy_cell(500.0, 500.0)
    clocks = np.where(np.asarray(cell.samples.variant) == 1, 1455.0, 1980.0)
    arrays = {name: np.asarray(getattr(cell.samples, name)).copy() for name in SAMPLE_FIELDS}
    arrays["sm_clock_mhz"] = clocks
    cell = cell.model_copy(update={"samples": type(cell.samples).from_arrays(**arrays)})
    c = compare(job(settings(state="sustained"), cell))
    assert c.state == "sustained"
    assert c.cells[0].baseline.sm_clock_mhz == 1980.0 and c.cells[0].candidate.sm_clock_mhz == 1455.0
    assert side_time(c.cells[0].candidate).endswith("@1455 MHz")
    text = format_table(c)
    assert "state sustained" in text and "@1980 MHz" in text
    assert "**state** sustained" in to_markdown(c)


def test_energy_blocks_round_trip_through_the_result_json() -> None:
    e = EnergyMeasurement(
        blocks=[EnergyBlock(side="baseline", joules=1.0, launches=10, seconds=0.5, ticks=5)],
        step_mj=25_000.0, period_ms=100.0,
    )  # fmt: skip
    assert EnergyMeasurement.model_validate_json(e.model_dump_json()) == e
    with pytest.raises(ValueError, match="joules"):
        EnergyBlock(side="baseline", joules=-1.0, launches=1, seconds=1.0, ticks=1)


def test_the_throttle_rule_follows_the_state_unless_the_spec_sets_it() -> None:
    assert MeasurementSpec().exclude_throttled is True
    assert MeasurementSpec(state="cold").exclude_throttled is True
    # sustained: the power-capped clock is the state asked for, so its samples are not dropped
    assert MeasurementSpec(state="sustained").exclude_throttled is False
    assert MeasurementSpec(state="sustained", exclude_throttled=True).exclude_throttled is True
    assert MeasurementSpec(state="cold", exclude_throttled=False).exclude_throttled is False
    # the value is written into the spec: a stored spec reads the same later
    dumped = MeasurementSpec(state="sustained").model_dump()
    assert dumped["exclude_throttled"] is False
    assert MeasurementSpec.model_validate(dumped).exclude_throttled is False


@pytest.mark.parametrize("placement", [Placement(input_sets=1), Placement(input_sets=2, swap_every_rounds=3)])
def test_every_sample_throttled_gives_no_interval_not_an_error(placement: Placement) -> None:
    # a cold-state cell on a GPU held at its power cap: every sample is throttled and dropped; the
    # stop rule has nothing to form an interval from (None), and the comparison says too few rounds
    n = 40
    samples = SampleColumns.from_arrays(
        variant=np.tile([0, 1], n // 2).astype(np.uint8),
        round=np.repeat(np.arange(n // 2), 2),
        position=np.tile([0, 1], n // 2),
        duration_ns=np.full(n, 1_000.0),
        throttled=np.ones(n, dtype=bool),
    )
    spec = settings(state="cold", placement="rotate" if placement.input_sets == 2 else "fixed")
    assert ci_half_width(samples, spec, placement) is None
    kept = kept_samples(samples, exclude_throttled=True)
    assert len(kept) == 0
    assert ratio_ci(kept, input_sets=placement.input_sets, swap_every_rounds=3) is None
