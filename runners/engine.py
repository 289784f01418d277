"""Interleaved measurement of a baseline and a candidate: warm-up, rounds, adaptive stop.

One call of ``measure_pair`` measures one sweep cell. The two variants are never timed as "all A
then all B": each round times both, in ABBA order (round r is A,B when r is even, B,A when odd,
so every pair of rounds cancels a linear drift) or in an order drawn per round from a seeded
``numpy.random.default_rng``. Every raw sample is kept, with its round, its position inside the
round, the launches it covered and the GPU context (SM clock, clock-event reasons, temperature,
power) read right after it.

Stop rule: never before ``min_rounds``; then stop as soon as the ratio's confidence interval
(``kernelab.service.stats.ratio_ci``, bootstrap over whole rounds) has a half-width below
``target_ci_pct`` of the ratio *and* the samples cover at least ``min_time_ms`` of timed device
time (both variants, ``duration_ns * launches`` summed: nvbench's ``--min-time``, 0.5 s by
default, which lets the GPU reach its sustained clock and power state before the CI may end the
cell; H200 figures: 32 launches right after an idle spin read 9% faster than sustained), or
another round would overrun ``budget_ms`` (measured from the end of the warm-up; the budget caps
the minimum time), or ``max_rounds`` is reached. The CI is checked on a geometric schedule
(at ``min_rounds``, then each time the round count has grown by 20%, at least 4 rounds), so its
cost stays a small fraction of the budget.

Sources: ABBA interleaving and round-level bootstrap from ``/work/shared/reference/
gpu-measurement-method.md``; the 75% clock rule from nvbench (a sample whose SM clock is below
75% of the default clock is throttled).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from kernelab.runners.timing import Timer
from kernelab.service.schemas import MeasurementSpec, Sample, SampleColumns, Variant
from kernelab.service.stats import kept_samples, ratio_ci

THROTTLE_CLOCK_FRACTION = 0.75  # nvbench: below 75% of the expected SM clock is throttled
_MIN_WARMUP_PASSES = 2  # the first pass pays one-time costs (compilation, allocation)
_CHECK_GROWTH = 0.2  # re-check the CI when the round count has grown by 20% ...
_MIN_CHECK_INTERVAL_ROUNDS = 4  # ... but at least 4 rounds later
_STOP_CHECK_RESAMPLES = 500  # bootstrap resamples for the stop check (the report uses more)
_STOP_CHECK_CONFIDENCE = 0.95
_NS_PER_MS = 1e6

VARIANTS: tuple[Variant, Variant] = ("baseline", "candidate")
ProgressFn = Callable[[str], None]
Clock = Callable[[], int]
"""A monotonic clock in integer ns (``time.perf_counter_ns``): what the warm-up and the budget are
measured with. Tests pass a fake one that their fake timer advances by the time it reports."""


class ClockSampler(Protocol):
    """Per-sample GPU context (``kernelab.runners.probes.telemetry.ContextSampler`` implements it).

    ``read()`` returns ``sm_clock_mhz``, ``clock_event_reasons``, ``temperature_c`` and
    ``power_w``, each None where unreadable. ``expected_sm_clock_mhz`` is the unthrottled clock
    (MHz) or None when unknown (then no sample is marked throttled).
    """

    expected_sm_clock_mhz: float | None

    def read(self) -> Mapping[str, Any]: ...


class ContentionMonitor(Protocol):
    """Who else uses the GPU, read at each CI check (``kernelab.runners.probes.contention`` implements it).

    ``check(rounds)`` records one reading tagged with the rounds completed so far; the caller
    collects the readings after the cell. It must be cheap (a few NVML calls) and never raise.
    """

    def check(self, rounds: int) -> None: ...


def round_order(round_index: int, settings: MeasurementSpec, rng: np.random.Generator) -> list[Variant]:
    """Variants in the order round ``round_index`` times them (``2 * samples_per_round`` entries).

    ``abba``: ``[baseline, candidate]`` for an even round, reversed for an odd one, repeated
    ``samples_per_round`` times. ``random``: a permutation of that multiset drawn from ``rng``
    (call once per round, in round order, for a reproducible sequence).
    """
    pair: list[Variant] = list(VARIANTS) if round_index % 2 == 0 else list(reversed(VARIANTS))
    order = pair * settings.samples_per_round
    if settings.order == "random":
        order = [order[i] for i in rng.permutation(len(order))]
    return order


def is_throttled(sm_clock_mhz: float | None, expected_sm_clock_mhz: float | None) -> bool:
    """True when the SM clock is below ``THROTTLE_CLOCK_FRACTION`` of the expected clock (MHz).

    Either value None (not readable) gives False: an unknown clock is not evidence of throttling.
    """
    if sm_clock_mhz is None or not expected_sm_clock_mhz:
        return False
    return sm_clock_mhz < THROTTLE_CLOCK_FRACTION * expected_sm_clock_mhz


def ci_half_width(samples: SampleColumns, settings: MeasurementSpec) -> tuple[float, float] | None:
    """``(ratio, relative CI half-width)`` of candidate/baseline over ``samples``, or None.

    Uses ``kernelab.service.stats.ratio_ci`` (bootstrap resampling whole rounds, 95%, seeded with
    ``settings.seed``); throttled samples are left out when ``settings.exclude_throttled``. None
    when ``ratio_ci`` cannot form an interval or the ratio is not positive.
    """
    kept = kept_samples(samples, exclude_throttled=settings.exclude_throttled)
    ci = ratio_ci(
        kept, confidence=_STOP_CHECK_CONFIDENCE, n_resamples=_STOP_CHECK_RESAMPLES, seed=settings.seed
    )
    if ci is None:
        return None
    ratio, low, high = ci
    if not (ratio > 0 and math.isfinite(low) and math.isfinite(high)):
        return None
    return ratio, (high - low) / 2.0 / ratio


class PairTimer(Protocol):
    """The step of the engine that may run elsewhere: time one sample of one variant.

    ``kernelab.runners.engine`` decides the order and the launch counts; a ``PairTimer`` only executes.
    ``LocalPairTimer`` calls the two sides in this process; ``kernelab.runners.revision_job`` sends each
    request to the worker process of that variant's source revision.
    """

    def time_ns(self, variant: Variant, launches: int) -> float:
        """One sample of ``variant``: ``launches`` back-to-back launches; ns per launch."""
        ...

    def launches_for(self, variant: Variant, per_launch_ns: float) -> int:
        """Launches per sample for ``variant`` whose launch is estimated at ``per_launch_ns``."""
        ...

    def timer_kind(self, variant: Variant) -> str:
        """The timer kind that times ``variant`` now (a CUDA-graph capture may have fallen back)."""
        ...

    def use_fallback(self, variant: Variant) -> bool:
        """Time ``variant`` with its timer's fallback from now on; False when there is none."""
        ...


class Side(Protocol):
    """One side as ``LocalPairTimer`` drives it (``kernelab.runners.sides.LocalSide`` implements it)."""

    @property
    def timer_kind(self) -> str: ...

    def time_ns(self, launches: int) -> float: ...

    def launches_for(self, per_launch_ns: float) -> int: ...

    def use_fallback(self) -> bool: ...


class CallableSide:
    """A ``Side`` of one zero-argument callable timed by a ``kernelab.runners.timing.Timer``."""

    def __init__(self, fn: Callable[[], Any], timer: Timer):
        self.fn, self.timer = fn, timer

    @property
    def timer_kind(self) -> str:
        return self.timer.kind_for(self.fn)

    def time_ns(self, launches: int) -> float:
        """``timer.time_ns`` of the callable; whatever it raises propagates."""
        return self.timer.time_ns(self.fn, launches)

    def launches_for(self, per_launch_ns: float) -> int:
        """``timer.launches_for`` for the callable (a ``FallbackTimer`` sizes each callable's
        window for the timer that times it)."""
        return self.timer.launches_for(per_launch_ns, self.fn)

    def use_fallback(self) -> bool:
        use = getattr(self.timer, "use_fallback", None)
        if use is None:
            return False
        use(self.fn)
        return True


class LocalPairTimer:
    """``PairTimer`` over two ``Side`` objects in this process."""

    def __init__(self, sides: Mapping[Variant, Side]):
        self.sides = dict(sides)

    def time_ns(self, variant: Variant, launches: int) -> float:
        return self.sides[variant].time_ns(launches)

    def launches_for(self, variant: Variant, per_launch_ns: float) -> int:
        return self.sides[variant].launches_for(per_launch_ns)

    def timer_kind(self, variant: Variant) -> str:
        return self.sides[variant].timer_kind

    def use_fallback(self, variant: Variant) -> bool:
        return self.sides[variant].use_fallback()


Checkpoint = Callable[[int, Mapping[Variant, int]], None]
"""Called by ``measure_interleaved`` after the first round and after the last one with the rounds
completed and each side's launches per sample (``kernelab.runners.job`` takes its checked samples there)."""


def _align_timers(pair: PairTimer) -> bool:
    """When the two sides are timed by different methods (one fell back from a CUDA-graph
    capture), move the other one to its fallback too, so both are timed alike; True when a side
    moved. Sides whose methods still differ are recorded by the caller (``timer-mismatch``)."""
    kinds = {v: pair.timer_kind(v) for v in VARIANTS}
    if kinds["baseline"] == kinds["candidate"]:
        return False
    moved = False
    for variant in VARIANTS:
        if pair.use_fallback(variant):
            moved = True
    return moved and pair.timer_kind("baseline") == pair.timer_kind("candidate")


def _warm_up(pair: PairTimer, warmup_ms: float, clock: Clock) -> dict[Variant, int]:
    """Alternate the variants through ``pair`` until each has run ``warmup_ms``; launches per sample.

    Each variant's launches per call double from 1 up to what its fastest reading so far asks for
    (``pair.launches_for``), so later readings come from full-size windows. At least
    ``_MIN_WARMUP_PASSES`` passes run. Returns each variant's launches per sample.
    """
    spent_ns: dict[Variant, float] = dict.fromkeys(VARIANTS, 0.0)
    best_ns: dict[Variant, float] = dict.fromkeys(VARIANTS, math.inf)
    launches: dict[Variant, int] = dict.fromkeys(VARIANTS, 1)
    passes = 0
    while passes < _MIN_WARMUP_PASSES or min(spent_ns.values()) < warmup_ms * 1e6:
        for variant in VARIANTS if passes % 2 == 0 else tuple(reversed(VARIANTS)):
            t0 = clock()
            estimate_ns = pair.time_ns(variant, launches[variant])
            spent_ns[variant] += clock() - t0
            # Delays only add time: the fastest reading is the robust estimate (first-call
            # compilation, preemption and small-window overhead all inflate the others).
            best_ns[variant] = min(best_ns[variant], estimate_ns)
            launches[variant] = min(2 * launches[variant], pair.launches_for(variant, best_ns[variant]))
        passes += 1
    return {v: pair.launches_for(v, best_ns[v]) for v in VARIANTS}


def _sample(
    variant: Variant,
    round_index: int,
    position: int,
    duration_ns: float,
    launches: int,
    sampler: ClockSampler | None,
) -> Sample:
    context: Mapping[str, Any] = sampler.read() if sampler is not None else {}
    clock = context.get("sm_clock_mhz")
    expected = sampler.expected_sm_clock_mhz if sampler is not None else None
    return Sample(
        variant=variant,
        round=round_index,
        position=position,
        duration_ns=duration_ns,
        launches=launches,
        sm_clock_mhz=clock,
        clock_event_reasons=context.get("clock_event_reasons"),
        temperature_c=context.get("temperature_c"),
        power_w=context.get("power_w"),
        throttled=is_throttled(clock, expected),
    )


def measure_pair(
    fn_baseline: Callable[[], Any],
    fn_candidate: Callable[[], Any],
    settings: MeasurementSpec,
    timer: Timer,
    *,
    sampler: ClockSampler | None = None,
    progress: ProgressFn | None = None,
    monitor: ContentionMonitor | None = None,
    clock: Clock = time.perf_counter_ns,
) -> SampleColumns:
    """Measure two zero-argument callables interleaved; every raw sample, in the order taken
    (columnar: ``SampleColumns``, what ``CellResult.samples`` holds and the server stores).

    ``fn_baseline``/``fn_candidate`` launch one run each (on the timer's device and stream).
    Warm-up: both alternate for ``settings.warmup_ms`` each; it also estimates each variant's ns
    per launch, from which ``timer.launches_for`` picks that variant's launches per sample (each
    sample then covers at least ``timer.min_window_ns``; a variant 1000x slower than the other
    does not get the other's launch count). Then rounds run until the stop rule of the module
    docstring. Each sample carries ``round``, ``position``, ``launches``, ``duration_ns`` (ns
    per launch) and, with a ``sampler``, the context read after it; ``throttled`` is set when its
    SM clock is below 75% of ``sampler.expected_sm_clock_mhz``.

    ``progress(message)`` is called at each CI check; ``monitor.check(rounds)`` before the first
    round, at each CI check and after the last round. ``clock`` (ns, ``time.perf_counter_ns``)
    measures the warm-up and the budget. Whatever the callables or the timer raise propagates (the
    caller records it against the cell).
    """
    pair = LocalPairTimer(
        {"baseline": CallableSide(fn_baseline, timer), "candidate": CallableSide(fn_candidate, timer)}
    )
    return measure_interleaved(
        pair, settings, sampler=sampler, progress=progress, monitor=monitor, clock=clock
    )


def measure_interleaved(
    pair: PairTimer,
    settings: MeasurementSpec,
    *,
    sampler: ClockSampler | None = None,
    progress: ProgressFn | None = None,
    monitor: ContentionMonitor | None = None,
    checkpoint: Checkpoint | None = None,
    clock: Clock = time.perf_counter_ns,
) -> SampleColumns:
    """``measure_pair`` over any ``PairTimer``: warm-up, interleaved rounds, stop rule, samples.

    The round order, launch counts, per-sample context and stop rule are decided here, in the
    calling process, whatever process times the samples (see ``measure_pair`` for the contract).
    When the warm-up leaves the two sides on different timing methods (a CUDA-graph capture that
    failed for one side), both move to the fallback and the warm-up runs again (``_align_timers``).
    ``checkpoint(rounds, launches)`` runs after the first and after the last round (its time is
    not sampled). ``clock``: see ``measure_pair``. Whatever ``pair`` or ``checkpoint`` raises
    propagates.
    """
    launches = _warm_up(pair, settings.warmup_ms, clock)
    if _align_timers(pair):
        launches = _warm_up(pair, settings.warmup_ms, clock)
    rng = np.random.default_rng(settings.seed)
    budget_ns = settings.budget_ms * 1e6
    target = settings.target_ci_pct / 100.0
    samples = SampleColumns()
    next_check = settings.min_rounds
    rounds = 0
    min_time_ns = settings.min_time_ms * _NS_PER_MS
    timed_ns = 0.0  # device time the samples cover: nvbench's accumulated "total cuda time"
    if monitor is not None:
        monitor.check(rounds)
    t_start = clock()
    while rounds < settings.max_rounds:
        for position, variant in enumerate(round_order(rounds, settings, rng)):
            duration_ns = pair.time_ns(variant, launches[variant])
            timed_ns += duration_ns * launches[variant]
            samples.append(_sample(variant, rounds, position, duration_ns, launches[variant], sampler))
        rounds += 1
        if rounds == 1 and checkpoint is not None:
            t_check = clock()
            checkpoint(rounds, launches)
            t_start += clock() - t_check  # the budget is for sampling, not checking
        if rounds < settings.min_rounds:
            continue
        elapsed_ns = clock() - t_start
        if elapsed_ns + elapsed_ns / rounds > budget_ns:  # the next round would overrun the budget
            break
        if rounds >= next_check:
            if monitor is not None:
                monitor.check(rounds)
            ci = ci_half_width(samples, settings)
            if progress is not None:
                text = "no CI yet" if ci is None else f"ratio {ci[0]:.4f} ±{100 * ci[1]:.2f}%"
                per_sample = f"{launches['baseline']}/{launches['candidate']} launches per sample"
                timed = f"{timed_ns / _NS_PER_MS:.0f}/{settings.min_time_ms:g} ms min time"
                progress(f"round {rounds}: {text} ({per_sample}, {timed})")
            if ci is not None and ci[1] < target and timed_ns >= min_time_ns:
                break
            next_check = rounds + max(_MIN_CHECK_INTERVAL_ROUNDS, math.ceil(_CHECK_GROWTH * rounds))
    if monitor is not None:
        monitor.check(rounds)
    if checkpoint is not None:
        checkpoint(rounds, launches)
    return samples
