"""Interleaved measurement of a baseline and a candidate: warm-up, rounds, adaptive stop.

One call of ``measure_pair`` measures one sweep cell. The two variants are never timed as "all A
then all B": each round times both, in ABBA order (round r is A,B when r is even, B,A when odd,
so every pair of rounds cancels a linear drift) or in an order drawn per round from a seeded
``numpy.random.default_rng``. Every raw sample is kept, with its round, its position inside the
round, the launches it covered and the GPU context (SM clock, clock-event reasons, temperature,
power) read right after it. Between two timed samples the loop only writes these numbers into
preallocated numpy columns (``_SampleBuffer``: no object per sample); the cell's
``SampleColumns`` is validated once, after the last round.

Stop rule: never before ``min_rounds``; then stop as soon as the ratio's confidence interval
(``kernelab.service.judge.estimators.ratio_ci``, bootstrap over whole rounds) has a half-width below
``target_ci_pct`` of the ratio *and* the samples cover at least ``min_time_ms`` of timed device time
(both variants, ``duration_ns * launches`` summed: nvbench's ``--min-time``, 0.5 s by default, which
lets the GPU reach its sustained clock and power state before the CI may end the cell; H200 figures:
32 launches right after an idle spin read 9% faster than sustained), or another round would overrun
``budget_ms`` (measured from the end of the warm-up; the budget caps the minimum time), or
``max_rounds`` is reached. Past the same minimum time the cell also stops as soon as its verdict is
decided (``stop_rule: decided``, the default; ``decided``): the stop check's interval, widened by
``DECIDED_MARGIN``, gives ``faster``, ``slower`` or ``same`` under the server's rule
(``kernelab.service.judge.verdicts.timing_verdict``, its 99.8% decision interval included), so a clear
change, or a clear absence of one, does not wait for the target width. The margin keeps the server's
own interval (more resamples, the same samples) on the same side of the threshold; the looks are few
(the geometric schedule) and a change needs a 99.8% interval beyond the threshold, so stopping when
decided adds little to an A/A's false-change rate (repeated significance tests: Armitage, McPherson
& Rowe 1969). The CI is checked on a geometric schedule (at ``min_rounds``, then each time the round
count has grown by 20%, at least 4 rounds), so its cost stays a small fraction of the budget.

Placement (``measurement.placement: rotate``): when both sides were prepared on K >= 2 input sets
(``kernelab.runners.sides.LocalSide.add_input_set``; each set its own inputs and whatever the
side's ``prepare`` allocated), round r runs the baseline on set ``a = (r // SWAP_EVERY_ROUNDS) % K``
and the candidate on set ``a XOR 1`` (``input_set``; K even): a 2x2 crossover within each pair of
sets, balanced for the carry-over of warm data from one assignment to the next (with K = 2 the 2x2
crossover), so a set's placement effect falls on both sides alike, and each side's own buffers
sit at K places. K is what both sides offer, at most ``measurement.input_sets``, and after the
warm-up at most what lets the rounds cover every assignment twice within half of ``budget_ms``
(``sets_for_budget``). The stop check's ratio is stratified by assignment, and with K >= 3 its CI
spans how much the two sides differ set by set (``kernelab.service.judge.estimators.paired_sets_ci``),
so the CI may end the cell only once every assignment ran twice. After the rounds, ``cross_check`` times both
sides briefly with the other timing method (``measurement.cross_check``).

Power state (``measurement.state``): ``cold`` takes each sample as it comes (after the L2 flush
and the host's gap between samples, so the GPU idles briefly before every sample and a kernel of a
millisecond or more runs near the top clock); ``sustained`` warms up for at least
``SUSTAINED_WARMUP_MS`` and runs ``sustain_ms`` of untimed samples of the same side before every
timed one (``heat``), so the samples see the clock the power limit allows under load, as a
training step does. Both sides are in the same state either way, so the ratio is fair in both;
the absolute times differ (bf16 8192^3 matmul on an H200: ``docs/results/``). Energy
(``measurement.energy``): ``energy_check`` after the rounds.

Sources: ABBA interleaving (each round runs A B B A, so a linear drift falls equally on both
sides) and the round-level bootstrap of ``kernelab.service.judge.estimators.ratio_ci`` (Davison &
Hinkley 1997, section 3.8); the 75% clock rule from nvbench (a sample whose SM clock is below
75% of the default clock is throttled).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from kernelab.runners.timing import Timer
from kernelab.service.contract.samples import NULL_REASONS, SAMPLE_FIELDS, memory_dtype
from kernelab.service.contract.schemas import (
    EnergyBlock,
    EnergyMeasurement,
    MeasurementSpec,
    Placement,
    SampleColumns,
    Side,
    TimerCrossCheck,
)
from kernelab.service.judge.estimators import BETWEEN_STRATA_MIN_SETS, candidate_set, kept_samples, ratio_ci

THROTTLE_CLOCK_FRACTION = 0.75  # nvbench: below 75% of the expected SM clock is throttled
_MIN_WARMUP_PASSES = 2  # the first pass pays one-time costs (compilation, allocation)
_CHECK_GROWTH = 0.2  # re-check the CI when the round count has grown by 20% ...
_MIN_CHECK_INTERVAL_ROUNDS = 4  # ... but at least 4 rounds later
_STOP_CHECK_RESAMPLES = 500  # bootstrap resamples for the stop check (the report uses more)
_STOP_CHECK_CONFIDENCE = 0.95
_NS_PER_MS = 1e6
SUSTAINED_WARMUP_MS = 1_000.0
"""The shortest warm-up under ``measurement.state: sustained``: long enough for the GPU's power
limiter to bring the SM clock down to the clock it holds under load (H200, bf16 8192^3 matmul back
to back: 1980 MHz at the start, 1350-1485 MHz within the first second,
``docs/results/2026-12-02-h200-timing-artefacts.md``)."""
_MAX_HEAT_SAMPLES = 10_000  # cap on untimed samples before one timed sample (a tiny kernel)
_ENERGY_TICK_TIMEOUT_NS = 2_000_000_000  # the energy counter must change within 2 s
_ENERGY_CHUNK_NS = 20_000_000  # energy blocks: 20 ms of launches enqueued back to back per counter read

SIDES: tuple[Side, Side] = ("baseline", "candidate")
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


class EnergyMeter(Protocol):
    """A device's total-energy counter (``ContextSampler.energy_mj`` implements it): millijoules
    since some fixed moment, non-decreasing, None where unreadable. It may update in steps (NVML's
    every ~100 ms on an H200): ``energy_check`` reads it only at its updates."""

    def energy_mj(self) -> float | None: ...


class ContentionMonitor(Protocol):
    """Who else uses the GPU, read at each CI check (``kernelab.runners.probes.contention`` implements it).

    ``check(rounds)`` records one reading tagged with the rounds completed so far; the caller
    collects the readings after the cell. It must be cheap (a few NVML calls) and never raise.
    """

    def check(self, rounds: int) -> None: ...


def round_order(
    round_index: int, settings: MeasurementSpec, rng: np.random.Generator, mirror_every: int = 0
) -> list[Side]:
    """Variants in the order round ``round_index`` times them (``2 * samples_per_round`` entries).

    ``abba``: ``[baseline, candidate]`` for an even round, reversed for an odd one, repeated
    ``samples_per_round`` times; with ``mirror_every`` m > 0 the order of every other block of m
    rounds is reversed as a whole (rounds m..2m-1 run B,A / A,B / ...), so that the block is the
    previous one with the sides' roles exchanged: ``measure_interleaved`` passes one pair of
    assignments of a rotating placement (``2 * swap_every_rounds``), whose first round always
    follows a change to sets neither side ran lately. Which side runs first on them, and which
    side then follows itself on warm data while the other side's data are colder, alternates
    between pairs instead of always favouring the candidate (CPU softmax A/A, pairs of 1 MB sets:
    the candidate 3% faster in the second round of every pair, the cell's ratio 0.995,
    ``docs/results/``). ``random``: a permutation of that multiset drawn from ``rng`` (call once
    per round, in round order, for a reproducible sequence).
    """
    flip = (round_index // mirror_every) % 2 if mirror_every > 0 else 0
    pair: list[Side] = list(SIDES) if (round_index + flip) % 2 == 0 else list(reversed(SIDES))
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


def ci_half_width(
    samples: SampleColumns, settings: MeasurementSpec, placement: Placement | None = None
) -> tuple[float, float] | None:
    """``(ratio, relative CI half-width)`` of candidate/baseline over ``samples``, or None.

    Uses ``kernelab.service.judge.estimators.ratio_ci`` (bootstrap resampling whole rounds, 95%, seeded with
    ``settings.seed``; stratified by input-set assignment under a rotating ``placement``);
    throttled samples are left out when ``settings.exclude_throttled``. None when ``ratio_ci``
    cannot form an interval or the ratio is not positive.
    """
    kept = kept_samples(samples, exclude_throttled=settings.exclude_throttled)
    placement = placement or Placement()
    ci = ratio_ci(
        kept,
        confidence=_STOP_CHECK_CONFIDENCE,
        n_resamples=_STOP_CHECK_RESAMPLES,
        seed=settings.seed,
        input_sets=placement.input_sets,
        swap_every_rounds=placement.swap_every_rounds,
        schedule=placement.schedule,
    )
    if ci is None:
        return None
    ratio, low, high = ci
    if not (ratio > 0 and math.isfinite(low) and math.isfinite(high)):
        return None
    return ratio, (high - low) / 2.0 / ratio


DECIDED_MARGIN = 1.25
"""The stop check's interval is widened by this before ``decided`` reads a verdict from it."""


def decided(ci: tuple[float, float], threshold_pct: float) -> bool:
    """Whether the stop check's ``(ratio, relative 95% half-width)`` already decides the cell's
    verdict at ``threshold_pct`` (module docstring): ``timing_verdict`` of the interval widened by
    ``DECIDED_MARGIN`` is ``faster``, ``slower`` or ``same``."""
    from kernelab.service.judge.verdicts import timing_verdict

    ratio, half = ci
    half *= DECIDED_MARGIN
    if not (ratio > 0 and 0 <= half < 1):
        return False
    verdict, _ = timing_verdict(ratio, ratio * (1 - half), ratio * (1 + half), threshold_pct)
    return verdict != "inconclusive"


class PairTimer(Protocol):
    """The step of the engine that may run elsewhere: time one sample of one variant.

    ``kernelab.runners.engine`` decides the order and the launch counts; a ``PairTimer`` only executes.
    ``LocalPairTimer`` calls two ``TimedSide`` objects: prepared in this process
    (``kernelab.runners.sides.LocalSide``), or forwarding each call to the worker process of that
    variant's source revision (``kernelab.runners.revision_job.WorkerSide``).
    """

    def time_ns(self, variant: Side, launches: int) -> float:
        """One sample of ``variant``: ``launches`` back-to-back launches; ns per launch."""
        ...

    def launches_for(self, variant: Side, per_launch_ns: float) -> int:
        """Launches per sample for ``variant`` whose launch is estimated at ``per_launch_ns``."""
        ...

    def timer_kind(self, variant: Side) -> str:
        """The timer kind that times ``variant`` now (a CUDA-graph capture may have fallen back)."""
        ...

    def use_fallback(self, variant: Side) -> bool:
        """Time ``variant`` with its timer's fallback from now on; False when there is none."""
        ...


class TimedSide(Protocol):
    """One side as ``LocalPairTimer`` drives it (``CallableSide``; the cell pipeline's sides,
    ``kernelab.runners.pipeline.CellSide``, extend it)."""

    @property
    def timer_kind(self) -> str: ...

    def time_ns(self, launches: int) -> float: ...

    def launches_for(self, per_launch_ns: float) -> int: ...

    def use_fallback(self) -> bool: ...


class CallableSide:
    """A ``TimedSide`` of one zero-argument callable timed by a ``kernelab.runners.timing.Timer``."""

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

    def heat(self, per_launch_ns: float, sustain_ns: float) -> int:
        """``timer.heat`` of the callable."""
        return self.timer.heat(self.fn, per_launch_ns, sustain_ns)


class LocalPairTimer:
    """``PairTimer`` over two ``TimedSide`` objects in this process.

    Besides the protocol it offers what a side may add (``kernelab.runners.sides.LocalSide`` does;
    a side without them answers "not offered"): ``input_sets``/``use_inputs`` (the side was
    prepared on two input sets, ``Placement``) and ``cross_kind``/``cross_launches_for``/
    ``cross_time_ns`` (a sample with the other timing method, ``cross_check``).
    """

    def __init__(self, sides: Mapping[Side, TimedSide]):
        self.sides = dict(sides)
        self._limit: int | None = None

    def time_ns(self, variant: Side, launches: int) -> float:
        return self.sides[variant].time_ns(launches)

    def launches_for(self, variant: Side, per_launch_ns: float) -> int:
        return self.sides[variant].launches_for(per_launch_ns)

    def timer_kind(self, variant: Side) -> str:
        return self.sides[variant].timer_kind

    def use_fallback(self, variant: Side) -> bool:
        return self.sides[variant].use_fallback()

    def heat(self, variant: Side, per_launch_ns: float, sustain_ns: float) -> int:
        """Run ``variant`` back to back for ``sustain_ns`` through its side's ``heat`` (enqueued
        without waiting); the launches enqueued, or 0 when the side offers none (the engine then
        runs untimed samples)."""
        heat = getattr(self.sides[variant], "heat", None)
        if heat is None:
            return 0
        return max(1, int(heat(per_launch_ns, sustain_ns)))

    def input_sets(self) -> int:
        """Input sets both sides were prepared on (the fewer of the two; 1 when a side offers none),
        at most the limit ``limit_input_sets`` set."""
        offered = min(int(getattr(side, "input_sets", 1)) for side in self.sides.values())
        return offered if self._limit is None else min(offered, self._limit)

    def limit_input_sets(self, sets: int) -> None:
        """Rotate only the first ``sets`` input sets from now on (``sets_for_budget``)."""
        self._limit = max(1, int(sets))

    def use_inputs(self, variant: Side, index: int) -> None:
        """Time ``variant`` on its input set ``index`` from now on."""
        self.sides[variant].use_inputs(index)  # type: ignore[attr-defined]

    def cross_kind(self, variant: Side) -> str | None:
        """The other timing method for ``variant`` now, None when its side offers none."""
        kind = getattr(self.sides[variant], "cross_kind", None)
        return kind if isinstance(kind, str) else None

    def cross_launches_for(self, variant: Side, per_launch_ns: float) -> int:
        return int(self.sides[variant].cross_launches_for(per_launch_ns))  # type: ignore[attr-defined]

    def cross_time_ns(self, variant: Side, launches: int) -> float:
        return float(self.sides[variant].cross_time_ns(launches))  # type: ignore[attr-defined]


SWAP_EVERY_ROUNDS = 3
"""Rounds between two swaps of the input sets. Odd, so that the sample that follows one of the
same side on the same input set (warm data: a cache the last sample filled) falls on both sides
alike. Under ABBA (A,B then B,A) a side follows itself only across a round boundary, B after an
even round and A after an odd one; a swap on that boundary makes the follower cold. With an even
period every swap falls after an odd round, so the baseline never ran on warm data and the
candidate did in 2 of 4 samples: A/A read ``faster`` in 13 of 40 cells on an idle CPU (softmax,
``benchmarks/aa_cpu.py``), 3 with a period of 3 (each side warm in 2 of 6 samples; 0 of 40 once
``placement-disagreement`` judges, ``docs/results/2026-12-02-aa-cpu.md``). Over the 6 rounds of a
swap cycle the linear drift still cancels (each side's mean position is the same)."""

MIN_BETWEEN_SETS = 4
"""The fewest input sets rotated when more than two are: the CI across placements then has at
least 3 degrees of freedom (Student-t 97.5% quantile 3.18; with 3 sets, 2 and 4.30). A cell whose
budget cannot cover this many assignments twice rotates two (``sets_for_budget``)."""
_CYCLES_BEFORE_STOP = 2  # every assignment runs this many times before the CI may end the cell
_BUDGET_FOR_CYCLES = 0.5  # ... within this fraction of the budget, by the warm-up's estimate


def input_set(
    round_index: int, variant: Side, swap_every_rounds: int = SWAP_EVERY_ROUNDS, input_sets: int = 2
) -> int:
    """The input set ``variant`` runs in round ``round_index`` under a rotating placement of
    ``input_sets`` (K, even) sets: with assignment a = ``(round_index // swap_every_rounds) % K``
    the baseline runs set a and the candidate set ``a XOR 1`` (the ``pairs`` schedule,
    ``kernelab.service.judge.estimators.candidate_set``: a 2x2 crossover within each pair of sets, so
    that at every change of assignment both sides move alike; over K assignments each side meets
    each set once, and each set serves both sides; with K = 2 the 2x2 crossover, the candidate on
    set 1 - a)."""
    a = (round_index // swap_every_rounds) % input_sets
    return a if variant == "baseline" else candidate_set(a, input_sets, "pairs")


def placement_of(pair: PairTimer, settings: MeasurementSpec) -> Placement:
    """How ``measure_interleaved`` places the input sets of ``pair`` under ``settings``: the sets
    both sides offer (``LocalPairTimer.input_sets``, after any ``limit_input_sets``), at most
    ``settings.input_sets``, swapped every ``SWAP_EVERY_ROUNDS`` rounds when ``settings.placement``
    is ``rotate`` and there are at least two (an odd count rounded down to an even one: the
    ``pairs`` schedule rotates pairs of sets); else one."""
    sets = getattr(pair, "input_sets", None)
    offered = int(sets()) if callable(sets) else 1
    used = _even(min(offered, settings.input_sets))
    rotate = settings.placement == "rotate" and used >= 2
    return Placement(input_sets=used if rotate else 1, swap_every_rounds=SWAP_EVERY_ROUNDS, schedule="pairs")


def _even(sets: int) -> int:
    """``sets`` rounded down to an even number (the ``pairs`` schedule pairs the sets), 1 for 1."""
    return sets if sets <= 1 else sets - sets % 2


def sets_for_budget(offered: int, round_ns: float, settings: MeasurementSpec) -> int:
    """How many of the ``offered`` input sets the rounds rotate: the most K in
    [``MIN_BETWEEN_SETS``, offered] whose ``_CYCLES_BEFORE_STOP`` full cycles
    (2 * ``SWAP_EVERY_ROUNDS`` * K rounds) fit in half of ``settings.budget_ms`` at ``round_ns``
    (ns per round, from the warm-up; half, because a loaded host makes the rounds slower than
    the warm-up said: a CPU cell under load ran 9 of the 30 rounds its estimate allowed) and in
    ``settings.max_rounds``; else 2 (or ``offered`` when < 2). More sets put each side's buffers
    at more places (a narrower spread of the placement effect in the mean), but a cycle the
    budget cuts short leaves assignments out. The count is even (``pairs`` schedule)."""
    if offered <= 2:
        return offered
    if round_ns > 0 and math.isfinite(round_ns):
        affordable = min(settings.max_rounds, _BUDGET_FOR_CYCLES * settings.budget_ms * _NS_PER_MS / round_ns)
    else:
        affordable = settings.max_rounds
    fit = int(affordable // (_CYCLES_BEFORE_STOP * SWAP_EVERY_ROUNDS))
    return _even(min(offered, fit)) if fit >= MIN_BETWEEN_SETS else 2


def _place(pair: PairTimer, placement: Placement, round_index: int, variant: Side) -> None:
    if placement.input_sets >= 2:
        index = input_set(round_index, variant, placement.swap_every_rounds, placement.input_sets)
        pair.use_inputs(variant, index)  # type: ignore[attr-defined]


def _reset_inputs(pair: PairTimer, placement: Placement) -> None:
    """Both sides back on input set 0 (what the checks and the eager call use)."""
    if placement.input_sets >= 2:
        for variant in SIDES:
            pair.use_inputs(variant, 0)  # type: ignore[attr-defined]


def cross_check(pair: PairTimer, samples: SampleColumns, settings: MeasurementSpec) -> TimerCrossCheck | None:
    """A short measurement of both sides with the other timing method (``settings.cross_check``).

    The other method is each side's ``cross_kind`` (``kernelab.runners.sides.LocalSide``: CUDA events
    behind a spin kernel for a side timed by CUDA-graph replay, graph replay for a side timed by
    events). Each side's launches per cross sample come from its median ns per launch in
    ``samples`` (``cross_launches_for``); one untimed sample per side warms the method up (a graph
    is captured there); then ``settings.cross_check_rounds`` ABBA rounds of one sample per side,
    on the same rotating placement as the rounds (``input_set``). Returns None when the spec turns
    the cross-check off or neither side has another method here (a CPU); a ``TimerCrossCheck`` with
    ``error`` when one side has none (a revision worker) or the other method cannot time the call faithfully
    (``kernelab.runners.timing.TimerUnsupported``: a CUDA graph that would replay memcpy nodes,
    a call that cannot be captured). Whatever else the sides raise propagates.
    """
    from kernelab.runners.timing import TimerUnsupported  # noqa: PLC0415 (torch is imported there)

    if not settings.cross_check:
        return None
    kinds: dict[Side, str | None] = {}
    for v in SIDES:
        get = getattr(pair, "cross_kind", None)
        kinds[v] = get(v) if callable(get) else None
    methods = {v: k for v, k in kinds.items() if k is not None}
    missing = [v for v in SIDES if kinds[v] is None]
    if not methods:  # one method on this device (a CPU): nothing to cross-check against
        return None
    if missing:
        return TimerCrossCheck(
            methods=methods,
            error=f"no other timing method for the {' and '.join(missing)} here "
            f"(timed by {pair.timer_kind(missing[0])})",
        )
    placement = placement_of(pair, settings)
    is_cand = np.asarray(samples.variant) == 1
    durations = np.asarray(samples.duration_ns, dtype=np.float64)
    launches = {}
    for v, own in (("baseline", ~is_cand), ("candidate", is_cand)):
        median = float(np.median(durations[own])) if own.any() else math.nan
        launches[v] = pair.cross_launches_for(v, median)  # type: ignore[attr-defined]
    out: dict[Side, list[float]] = {v: [] for v in SIDES}
    try:
        for variant in SIDES:
            for index in range(placement.input_sets):
                if placement.input_sets >= 2:
                    pair.use_inputs(variant, index)  # type: ignore[attr-defined]
                pair.cross_time_ns(variant, launches[variant])  # type: ignore[attr-defined]
        for r in range(settings.cross_check_rounds):
            for variant in SIDES if r % 2 == 0 else tuple(reversed(SIDES)):
                _place(pair, placement, r, variant)
                out[variant].append(pair.cross_time_ns(variant, launches[variant]))  # type: ignore[attr-defined]
    except TimerUnsupported as exc:
        return TimerCrossCheck(
            methods=methods, launches=launches, error=f"{', '.join(set(methods.values()))}: {exc}"
        )
    finally:
        _reset_inputs(pair, placement)
    return TimerCrossCheck(
        methods=methods, rounds=settings.cross_check_rounds, launches=launches, samples_ns=out
    )


def heat(pair: PairTimer, variant: Side, launches: int, per_launch_ns: float, sustain_ns: float) -> int:
    """Load the device with ``variant`` for ``sustain_ns`` ns right before its timed sample
    (``measurement.state: sustained``), so that sample finds the GPU at its loaded clock rather than
    after an idle gap. Through the side's ``heat`` where it offers one (``Timer.heat``: launches or
    graph replays enqueued back to back, no wait between: the GPU never idles); otherwise untimed
    samples of ``launches`` (a revision worker's side: one round trip per sample). Returns the
    untimed samples run (0 when the side heated itself)."""
    offered = getattr(pair, "heat", None)
    if callable(offered) and offered(variant, per_launch_ns, sustain_ns):
        return 0
    sample_ns = max(per_launch_ns * launches, 1.0)
    n = min(_MAX_HEAT_SAMPLES, max(1, math.ceil(sustain_ns / sample_ns)))
    for _ in range(n):
        pair.time_ns(variant, launches)
    return n


class _NoTick(RuntimeError):
    """The energy counter did not change within ``_ENERGY_TICK_TIMEOUT_NS``."""


def _energy_block(
    pair: PairTimer,
    variant: Side,
    launches: int,
    per_launch_ns: float,
    read: Callable[[], float | None],
    clock: Clock,
    block_ns: float,
    steps: list[float],
    periods: list[float],
) -> EnergyBlock:
    """One block of ``variant`` running back to back: from the first counter update seen to the
    first one at least ``block_ns`` later, the energy difference and the launches completed between
    the two (an update is seen after the step it fell in: one step of error at each end).

    A step is ``_ENERGY_CHUNK_NS`` of launches enqueued without waiting (the side's ``heat``, as in
    ``measurement.state: sustained``) and then one timed sample, which waits for the device, so
    every launch of the step has finished when the counter is read. The timed sample's own
    overhead (its synchronisation, spin kernel and L2 flush) is then a small part of the step;
    timed samples alone would bill their idle gaps and spin kernels to the kernel. A side that
    offers no ``heat`` (a revision worker's) runs timed samples only."""

    def step() -> int:
        offered = getattr(pair, "heat", None)
        done = int(offered(variant, per_launch_ns, _ENERGY_CHUNK_NS)) if callable(offered) else 0
        pair.time_ns(variant, launches)
        return done + launches

    start = read()
    t_wait = clock()
    while True:
        step()
        e0 = read()
        if e0 is None or start is None:
            raise _NoTick("the energy counter could not be read")
        if e0 != start:
            break
        if clock() - t_wait > _ENERGY_TICK_TIMEOUT_NS:
            raise _NoTick(f"the energy counter did not change in {_ENERGY_TICK_TIMEOUT_NS / 1e9:g} s")
    t0 = t_last = clock()
    e_last, n, n_last, ticks = e0, 0, 0, 0
    while True:
        n += step()
        e = read()
        now = clock()
        if e is None:
            raise _NoTick("the energy counter could not be read")
        if e != e_last:
            steps.append(e - e_last)
            periods.append((now - t_last) / 1e6)
            e_last, t_last, n_last, ticks = e, now, n, ticks + 1
            if t_last - t0 >= block_ns:
                break
        elif now - t_last > _ENERGY_TICK_TIMEOUT_NS:
            raise _NoTick(f"the energy counter did not change in {_ENERGY_TICK_TIMEOUT_NS / 1e9:g} s")
    return EnergyBlock(
        side=variant,
        joules=(e_last - e0) / 1e3,
        launches=max(n_last, 1),
        seconds=max((t_last - t0) / 1e9, 1e-9),
        ticks=ticks,
    )


def energy_check(
    pair: PairTimer,
    samples: SampleColumns,
    settings: MeasurementSpec,
    meter: object | None,
    *,
    clock: Clock = time.perf_counter_ns,
) -> EnergyMeasurement | None:
    """Joules per launch of each side from a total-energy counter (``measurement.energy``).

    After the rounds: ``settings.energy_blocks`` blocks per side in ABBA order (block k runs the
    baseline then the candidate when k is even, the reverse when odd), each ``energy_block_ms``
    of one side running back to back, on input set 0. A block is measured between two updates of
    the counter (``_energy_block``), so its energy is exact to the counter's accounting and its
    error is the launches of one step at each end.
    The energy is the whole device's (static power included): what a fleet pays per launch.
    ``meter``: an ``EnergyMeter`` (``ContextSampler``); without one, or one that reads None, the
    result holds ``error``. Returns None when the spec does not ask for energy. Whatever the
    sides raise propagates.
    """
    if not settings.energy:
        return None
    read = getattr(meter, "energy_mj", None)
    if read is None or not callable(read) or read() is None:
        return EnergyMeasurement(error="no energy counter on this device (NVML total energy consumption)")
    is_cand = np.asarray(samples.variant) == 1
    counts = np.asarray(samples.launches)
    durations = np.asarray(samples.duration_ns)
    launches: dict[Side, int] = {}
    per_launch: dict[Side, float] = {}
    masks: tuple[tuple[Side, np.ndarray], ...] = (("baseline", ~is_cand), ("candidate", is_cand))
    for v, own in masks:
        launches[v] = int(counts[own][-1]) if own.any() else 1
        per_launch[v] = float(np.median(durations[own])) if own.any() else 1.0
    placement = placement_of(pair, settings)
    _reset_inputs(pair, placement)
    blocks: list[EnergyBlock] = []
    steps: list[float] = []
    periods: list[float] = []
    try:
        for k in range(settings.energy_blocks):
            for variant in SIDES if k % 2 == 0 else tuple(reversed(SIDES)):
                blocks.append(
                    _energy_block(
                        pair, variant, launches[variant], per_launch[variant], read, clock,
                        settings.energy_block_ms * _NS_PER_MS, steps, periods,
                    )
                )  # fmt: skip
    except _NoTick as exc:
        return EnergyMeasurement(blocks=blocks, error=str(exc))
    return EnergyMeasurement(
        blocks=blocks,
        step_mj=min(steps) if steps else None,
        period_ms=float(np.median(periods)) if periods else None,
    )


Checkpoint = Callable[[int, Mapping[Side, int]], None]
"""Called by ``measure_interleaved`` after the first round and after the last one with the rounds
completed and each side's launches per sample (``kernelab.runners.pipeline`` takes its checked
samples there)."""


def _align_timers(pair: PairTimer) -> bool:
    """When the two sides are timed by different methods (one fell back from a CUDA-graph
    capture), move the other one to its fallback too, so both are timed alike; True when a side
    moved. Sides whose methods still differ are recorded by the caller (``timer-mismatch``)."""
    kinds = {v: pair.timer_kind(v) for v in SIDES}
    if kinds["baseline"] == kinds["candidate"]:
        return False
    moved = False
    for variant in SIDES:
        if pair.use_fallback(variant):
            moved = True
    return moved and pair.timer_kind("baseline") == pair.timer_kind("candidate")


def _warm_up(
    pair: PairTimer, warmup_ms: float, clock: Clock, placement: Placement | None = None
) -> tuple[dict[Side, int], float]:
    """Alternate the variants through ``pair`` until each has run ``warmup_ms``; launches per sample.

    Each variant's launches per call double from 1 up to what its fastest reading so far asks for
    (``pair.launches_for``), so later readings come from full-size windows. At least
    ``_MIN_WARMUP_PASSES`` passes run; under a rotating ``placement`` each pass is on the next
    assignment (``input_set`` with a swap every pass), and ``_prime`` later runs every set the
    rounds will use once (a slow kernel is not warmed up K times over before the budget decides
    how many sets it can afford). Returns each variant's launches per sample and an estimate of
    one round's wall time (ns): both sides' launches times their fastest reading, plus each side's
    overhead per call outside its launches (the wall time of its last call less the launches it
    timed).
    """
    placement = placement or Placement()
    sets = placement.input_sets
    spent_ns: dict[Side, float] = dict.fromkeys(SIDES, 0.0)
    best_ns: dict[Side, float] = dict.fromkeys(SIDES, math.inf)
    launches: dict[Side, int] = dict.fromkeys(SIDES, 1)
    overhead_ns: dict[Side, float] = dict.fromkeys(SIDES, 0.0)
    passes = 0
    while passes < _MIN_WARMUP_PASSES or min(spent_ns.values()) < warmup_ms * 1e6:
        for variant in SIDES if passes % 2 == 0 else tuple(reversed(SIDES)):
            if sets >= 2:  # a new assignment every pass: every side warms every set
                pair.use_inputs(variant, input_set(passes, variant, 1, sets))  # type: ignore[attr-defined]
            t0 = clock()
            estimate_ns = pair.time_ns(variant, launches[variant])
            wall_ns = clock() - t0
            spent_ns[variant] += wall_ns
            if math.isfinite(estimate_ns):
                overhead_ns[variant] = max(0.0, wall_ns - estimate_ns * launches[variant])
            # Delays only add time: the fastest reading is the robust estimate (first-call
            # compilation, preemption and small-window overhead all inflate the others).
            best_ns[variant] = min(best_ns[variant], estimate_ns)
            launches[variant] = min(2 * launches[variant], pair.launches_for(variant, best_ns[variant]))
        passes += 1
    _reset_inputs(pair, placement)
    final = {v: pair.launches_for(v, best_ns[v]) for v in SIDES}
    round_ns = sum(final[v] * best_ns[v] + overhead_ns[v] for v in SIDES)
    return final, round_ns


def _prime(pair: PairTimer, placement: Placement, launches: Mapping[Side, int]) -> None:
    """One untimed sample of each side on each of its input sets at its final launches, so a
    capture or first replay at that launch count (a CUDA graph) falls outside the rounds."""
    if placement.input_sets < 2:
        return
    for index in range(placement.input_sets):
        for variant in SIDES:
            pair.use_inputs(variant, index)  # type: ignore[attr-defined]
            pair.time_ns(variant, launches[variant])
    _reset_inputs(pair, placement)


class _SampleBuffer:
    """Preallocated numpy columns the measuring loop writes raw numbers into: no object per sample.

    Capacity doubles when full (amortised O(1) per sample), so the loop never sizes it from
    ``max_rounds`` (up to a million rounds). ``columns()`` views the filled part as
    ``SampleColumns`` without a copy (the CI check reads it between rounds); ``result()`` validates
    the samples once, at the end of the cell.
    """

    _CONTEXT = ("sm_clock_mhz", "clock_event_reasons", "temperature_c", "power_w")

    def __init__(self, capacity: int):
        self.n = 0
        self._arrays = {name: np.empty(max(capacity, 16), dtype=memory_dtype(name)) for name in SAMPLE_FIELDS}

    def _grow(self) -> None:
        for name, values in self._arrays.items():
            grown = np.empty(2 * len(values), dtype=values.dtype)
            grown[: self.n] = values[: self.n]
            self._arrays[name] = grown

    def add(
        self,
        variant: Side,
        round_index: int,
        position: int,
        duration_ns: float,
        launches: int,
        context: Mapping[str, Any] | None,
        expected_sm_clock_mhz: float | None,
    ) -> None:
        """Write one sample at the end: its numbers as the timer and ``ClockSampler.read()`` gave
        them (a context value of None is stored as the column's null: NaN, or -1 for the mask)."""
        if self.n == len(self._arrays["variant"]):
            self._grow()
        a, i = self._arrays, self.n
        a["variant"][i] = 1 if variant == "candidate" else 0
        a["round"][i] = round_index
        a["position"][i] = position
        a["duration_ns"][i] = duration_ns
        a["launches"][i] = launches
        if context is None:
            a["sm_clock_mhz"][i] = a["temperature_c"][i] = a["power_w"][i] = math.nan
            a["clock_event_reasons"][i] = NULL_REASONS
            a["throttled"][i] = False
        else:
            clock = context.get("sm_clock_mhz")
            reasons = context.get("clock_event_reasons")
            temperature, power = context.get("temperature_c"), context.get("power_w")
            a["sm_clock_mhz"][i] = math.nan if clock is None else clock
            a["clock_event_reasons"][i] = NULL_REASONS if reasons is None else reasons
            a["temperature_c"][i] = math.nan if temperature is None else temperature
            a["power_w"][i] = math.nan if power is None else power
            a["throttled"][i] = is_throttled(clock, expected_sm_clock_mhz)
        self.n = i + 1

    def columns(self) -> SampleColumns:
        """The samples so far, unvalidated views (valid for reading until the next ``add``)."""
        return SampleColumns.unchecked({name: values[: self.n] for name, values in self._arrays.items()})

    def result(self) -> SampleColumns:
        """The samples so far, copied out and validated (``SampleColumns.from_arrays``): raises
        ``pydantic.ValidationError`` naming the column and sample of a value ``Sample`` refuses (a
        timer that returned NaN or a negative time)."""
        return SampleColumns.from_arrays(
            **{name: values[: self.n].copy() for name, values in self._arrays.items()}
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

    ``progress(message)`` is called before the warm-up (``"warm-up"``), after it (``"measuring"``)
    and at each CI check (``"round N: ..."``); ``monitor.check(rounds)`` before the first
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
    placement = placement_of(pair, settings)
    sustained = settings.state == "sustained"
    warmup_ms = max(settings.warmup_ms, SUSTAINED_WARMUP_MS) if sustained else settings.warmup_ms
    if progress is not None:
        progress("warm-up")
    launches, round_ns = _warm_up(pair, warmup_ms, clock, placement)
    if _align_timers(pair):
        launches, round_ns = _warm_up(pair, warmup_ms, clock, placement)
    limit = getattr(pair, "limit_input_sets", None)
    if placement.input_sets > 2 and callable(limit):
        # a round holds samples_per_round samples of each side, under ``sustained`` each after
        # sustain_ms of heat
        round_ns = round_ns * settings.samples_per_round + (
            2 * settings.samples_per_round * settings.sustain_ms * _NS_PER_MS if sustained else 0.0
        )
        used = sets_for_budget(placement.input_sets, round_ns, settings)
        if used < placement.input_sets:
            limit(used)
            placement = placement_of(pair, settings)
    _prime(pair, placement, launches)
    # with the CI across placements, every assignment runs twice before the CI may end the cell
    cycle_rounds = (
        _CYCLES_BEFORE_STOP * placement.swap_every_rounds * placement.input_sets
        if placement.input_sets >= BETWEEN_STRATA_MIN_SETS
        else 0
    )
    if placement.input_sets >= BETWEEN_STRATA_MIN_SETS:
        # the stop check's interval across input sets imports scipy.special (~0.3 s on a loaded 2-core
        # machine): once, here, not inside the first check, where it would eat a 500 ms budget
        import scipy.special  # noqa: F401, PLC0415
    if progress is not None:
        progress("measuring")
    rng = np.random.default_rng(settings.seed)
    mirror_every = 2 * placement.swap_every_rounds if placement.input_sets >= 4 else 0
    budget_ns = settings.budget_ms * 1e6
    target = settings.target_ci_pct / 100.0
    buffer = _SampleBuffer(min(settings.max_rounds, 4096) * 2 * settings.samples_per_round)
    expected_clock = sampler.expected_sm_clock_mhz if sampler is not None else None
    next_check = settings.min_rounds
    rounds = 0
    min_time_ns = settings.min_time_ms * _NS_PER_MS
    timed_ns = 0.0  # device time the samples cover: nvbench's accumulated "total cuda time"
    if monitor is not None:
        monitor.check(rounds)
    last_ns: dict[Side, float] = {}  # each side's last ns per launch (sizes the heat of ``sustained``)
    sustain_ns = settings.sustain_ms * _NS_PER_MS
    t_start = clock()
    while rounds < settings.max_rounds:
        for position, variant in enumerate(round_order(rounds, settings, rng, mirror_every)):
            _place(pair, placement, rounds, variant)
            if sustained and variant in last_ns:
                heat(pair, variant, launches[variant], last_ns[variant], sustain_ns)
            duration_ns = pair.time_ns(variant, launches[variant])
            last_ns[variant] = duration_ns
            timed_ns += duration_ns * launches[variant]
            context = sampler.read() if sampler is not None else None
            buffer.add(variant, rounds, position, duration_ns, launches[variant], context, expected_clock)
        rounds += 1
        if rounds == 1 and checkpoint is not None:
            t_check = clock()
            _reset_inputs(pair, placement)
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
            ci = ci_half_width(buffer.columns(), settings, placement)
            if progress is not None:
                text = "no CI yet" if ci is None else f"ratio {ci[0]:.4f} ±{100 * ci[1]:.2f}%"
                per_sample = (f"launches per sample: baseline {launches['baseline']}, "
                              f"candidate {launches['candidate']}")  # fmt: skip
                timed = f"timed {timed_ns / _NS_PER_MS:.0f} ms (may stop from {settings.min_time_ms:g} ms)"
                progress(f"round {rounds}: {text}; {per_sample}; {timed}")
            may_stop = ci is not None and timed_ns >= min_time_ns and rounds >= cycle_rounds
            early = settings.stop_rule == "decided" and ci is not None and decided(ci, settings.threshold_pct)
            if may_stop and ci is not None and (ci[1] < target or early):
                break
            next_check = rounds + max(_MIN_CHECK_INTERVAL_ROUNDS, math.ceil(_CHECK_GROWTH * rounds))
    if monitor is not None:
        monitor.check(rounds)
    _reset_inputs(pair, placement)
    if checkpoint is not None:
        checkpoint(rounds, launches)
    return buffer.result()
