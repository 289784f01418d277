"""A fake clock and a fake ``kernelab.runners.timing.Timer`` for the engine's stop-rule tests.

``FakeTimer`` is a real ``Timer`` (the engine's protocol): ``time_ns(fn, launches)`` calls ``fn``
``launches`` times (so call logs and raised errors are real), reports the ns per launch that
``fn``'s script gives, and advances the ``FakeClock`` by ``launches`` times that. The engine reads
the same clock for its warm-up and budget (``measure_pair(..., clock=clock)``), so the budget,
the minimum time and the adaptive stop are decided on scripted durations: the same rounds on a
loaded 2-core CI box as on an idle workstation, and no time spent busy-waiting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from kernelab.runners.timing import Timer

Script = Callable[[], float]
"""Returns the ns per launch of one sample (called once per ``time_ns``)."""


class FakeClock:
    """A monotonic ns clock that moves only when told (``advance``); call it for the time."""

    def __init__(self, start_ns: int = 0) -> None:
        self.now_ns = int(start_ns)

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, ns: float) -> None:
        if ns < 0:
            raise ValueError(f"a clock does not go back: {ns} ns")
        self.now_ns += round(ns)

    def __repr__(self) -> str:
        return f"<FakeClock now_ns={self.now_ns}>"


def constant(ns: float) -> Script:
    """Every launch takes ``ns``."""
    return lambda: float(ns)


def uniform(mean_ns: float, spread_ns: float, seed: int) -> Script:
    """Launches drawn uniformly from ``mean_ns +- spread_ns`` (seeded numpy generator)."""
    rng = np.random.default_rng(seed)
    return lambda: float(mean_ns + spread_ns * (2 * rng.random() - 1))


class FakeTimer(Timer):
    """``Timer`` whose readings come from a script per callable, on a ``FakeClock``.

    ``scripts``: callable -> ``Script`` (ns per launch). ``min_window_ns``/``max_launches``: as
    ``CpuTimer``'s, so ``launches_for`` (the base class's ``choose_launches``) sizes samples the way
    the real timer does. ``overhead_ns``: clock time each sample costs beyond its launches.
    """

    name: ClassVar[str] = "fake"

    def __init__(
        self,
        clock: FakeClock,
        scripts: dict[Callable[[], Any], Script],
        *,
        min_window_ns: float = 1e6,
        max_launches: int = 10_000,
        overhead_ns: float = 0.0,
    ) -> None:
        super().__init__()
        self.device = torch.device("cpu")
        self.clock, self.scripts = clock, dict(scripts)
        self.min_window_ns, self.max_launches = float(min_window_ns), int(max_launches)
        self.overhead_ns = float(overhead_ns)
        self.samples = 0

    def time_ns(self, fn: Callable[[], Any], launches: int) -> float:
        if launches < 1:
            raise ValueError(f"launches must be >= 1, got {launches}")
        out = None
        for _ in range(launches):
            out = fn()
        per_launch_ns = self.scripts[fn]()
        self.clock.advance(per_launch_ns * launches + self.overhead_ns)
        self._outputs[fn] = out
        self.samples += 1
        return per_launch_ns

    def reset(self) -> None:
        self._outputs.clear()


def noop() -> Callable[[], None]:
    """A fresh zero-argument callable that does nothing (a distinct key for ``FakeTimer``)."""

    def fn() -> None:
        return None

    return fn


class FakeSide:
    """A side of the engine's pair (``kernelab.runners.engine.TimedSide`` plus the optional input
    sets and cross method ``LocalPairTimer`` passes on), on a ``FakeClock``.

    ``buffers``: the buffer set each input set of this side runs on (input set i runs
    ``buffers[i]``); ``buffer_ns``: buffer set -> ``Script``, shared by both sides, so a reading
    depends on which buffers run, not on which side runs them. ``cross_ns``: buffer set -> the
    script of the other timing method (None: the side offers no cross method); ``cross_error``:
    raised by every cross sample instead. Every sample is logged as ``(method, buffer)`` in ``log``.
    """

    def __init__(
        self,
        clock: FakeClock,
        buffers: list[str],
        buffer_ns: dict[str, Script],
        *,
        kind: str = "fake",
        cross_ns: dict[str, Script] | None = None,
        cross_kind: str = "fake-other",
        cross_error: Exception | None = None,
        min_window_ns: float = 1e6,
        max_launches: int = 10_000,
    ) -> None:
        self.clock, self.buffers, self.buffer_ns = clock, list(buffers), buffer_ns
        self.kind, self.cross_ns, self._cross_kind = kind, cross_ns, cross_kind
        self.cross_error = cross_error
        self.min_window_ns, self.max_launches = min_window_ns, max_launches
        self.current = 0
        self.log: list[tuple[str, str]] = []

    @property
    def timer_kind(self) -> str:
        return self.kind

    @property
    def input_sets(self) -> int:
        return len(self.buffers)

    def use_inputs(self, index: int) -> None:
        if not 0 <= index < len(self.buffers):
            raise IndexError(index)
        self.current = index

    def _sample(self, scripts: dict[str, Script], method: str, launches: int) -> float:
        if launches < 1:
            raise ValueError(f"launches must be >= 1, got {launches}")
        buffer = self.buffers[self.current]
        ns = scripts[buffer]()
        self.clock.advance(ns * launches)
        self.log.append((method, buffer))
        return ns

    def time_ns(self, launches: int) -> float:
        return self._sample(self.buffer_ns, self.kind, launches)

    def launches_for(self, per_launch_ns: float) -> int:
        from kernelab.runners.timing import choose_launches

        return choose_launches(
            per_launch_ns, min_window_ns=self.min_window_ns, max_launches=self.max_launches
        )

    def use_fallback(self) -> bool:
        return False

    @property
    def cross_kind(self) -> str | None:
        return None if self.cross_ns is None and self.cross_error is None else self._cross_kind

    def cross_launches_for(self, per_launch_ns: float) -> int:
        return self.launches_for(per_launch_ns)

    def cross_time_ns(self, launches: int) -> float:
        if self.cross_error is not None:
            raise self.cross_error
        assert self.cross_ns is not None
        return self._sample(self.cross_ns, self._cross_kind, launches)


class WarmData:
    """A data cache shared by both sides (their inputs are one set of tensors, as ``LocalSides``
    shares them when the parameters are equal): a sample on a buffer set is slower the longer ago
    that set last ran, whichever side ran it.

    ``script(buffer)`` gives the ``Script`` of one buffer set for ``FakeSide``: ``base_ns`` plus
    ``cold_pct`` percent when more than ``cache_samples`` samples ran since the set last did (or
    it never ran), else ``cold_pct * (age - 1) / cache_samples`` percent (age 1: the sample just
    before ran on it, the warmest), plus uniform noise of ``noise_ns``. Each call records the
    set as the latest one run.
    """

    def __init__(self, base_ns: float, cold_pct: float, *, cache_samples: int = 4, noise_ns: float = 3.0,
                 seed: int = 0) -> None:  # fmt: skip
        self.base_ns, self.cold_pct, self.cache_samples = base_ns, cold_pct, cache_samples
        self.noise_ns = noise_ns
        self.rng = np.random.default_rng(seed)
        self.samples = 0
        self.last: dict[str, int] = {}

    def script(self, buffer: str) -> Script:
        def run() -> float:
            age = self.samples - self.last[buffer] if buffer in self.last else None
            if age is None or age > self.cache_samples:
                pct = self.cold_pct
            else:
                pct = self.cold_pct * (age - 1) / self.cache_samples
            self.samples += 1
            self.last[buffer] = self.samples
            return self.base_ns * (1 + pct / 100) + self.noise_ns * (2 * self.rng.random() - 1)

        return run
