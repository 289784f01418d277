"""Benchmark modules that replace a timing function for everyone when they are imported, with a
constant: ``time.perf_counter_ns`` (the CPU timer's clock) in ``ClockPatchedAtImport``'s module
and ``torch.cuda.Event.elapsed_time`` in ``cheats_events_constant``. A timer that reads a constant
never lets a warm-up reach its target (on an H200 the event-timed spin calibration then sized
every spin at ~100 s: no answer after 95 s); kernelab must end the cell as ``timer-tampered``
before its first timing."""

from __future__ import annotations

import time

from cheats import ScaleBenchmark

time.perf_counter_ns = lambda: 0


class ClockPatchedAtImport(ScaleBenchmark):
    """``ScaleBenchmark`` from a module that made ``time.perf_counter_ns`` read 0 at import."""
