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
