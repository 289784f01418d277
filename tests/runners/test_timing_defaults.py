"""Timing defaults: nvbench's minimum time, the timer chosen by the spec, and the
per-callable fallback from CUDA-graph replay to CUDA events.

CPU tests drive ``FallbackTimer`` with two CPU timers, the preferred one refusing callables marked
as not capturable (a CUDA graph capture cannot be attempted on a CPU); the ``gpu`` test does the
same with a real graph capture on the H200 node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fake_timing import FakeClock, FakeTimer, constant, noop

from kernelab.runners.engine import measure_pair
from kernelab.runners.job import run_job
from kernelab.runners.timing import CpuTimer, FallbackTimer, TimerUnsupported, make_timer
from kernelab.service.contract.schemas import JobSpec, MeasurementSpec, SampleColumns

pytestmark = pytest.mark.timeout(60)


def busy(duration_ns: float) -> Callable[[], None]:
    def fn() -> None:
        end = time.perf_counter_ns() + duration_ns
        while time.perf_counter_ns() < end:
            pass

    return fn


def timed_ms(samples: SampleColumns) -> float:
    return sum(s.duration_ns * s.launches for s in samples.rows()) / 1e6


def rounds_of(samples: SampleColumns) -> int:
    return len(set(samples.round))


def spec(**kw: Any) -> MeasurementSpec:
    # target 50%: the CI condition holds from the first check, so only the minimum time decides;
    # stop_rule target-ci: where a test sets an unreachable target, a decided verdict must not end it
    base = {"warmup_ms": 0.0, "budget_ms": 60_000.0, "target_ci_pct": 50.0, "min_rounds": 4,
            "stop_rule": "target-ci"}  # fmt: skip
    return MeasurementSpec(**{**base, **kw})


# --------------------------------------------------------------------------------------------------
# Minimum measurement time
# --------------------------------------------------------------------------------------------------


def test_defaults_are_nvbench_min_time_and_auto_timer():
    m = MeasurementSpec()
    assert m.min_time_ms == 500.0 and m.timer == "auto"


def fake_pair(spec: MeasurementSpec) -> SampleColumns:
    """``measure_pair`` on a ``FakeTimer``: 0.1 ms launches, one per sample, on the engine's clock.
    Constant durations give a zero-width CI, so the CI condition holds at every check."""
    b, c = noop(), noop()
    clock = FakeClock()
    timer = FakeTimer(
        clock, {b: constant(100_000), c: constant(100_000)}, min_window_ns=100_000, max_launches=1
    )
    return measure_pair(b, c, spec, timer, clock=clock)


def test_without_min_time_the_ci_stops_at_the_first_check():
    assert rounds_of(fake_pair(spec(min_time_ms=0.0))) == 4


@pytest.mark.parametrize("min_time_ms", [20.0, 60.0])
def test_ci_stop_waits_for_the_min_time(min_time_ms: float):
    samples = fake_pair(spec(min_time_ms=min_time_ms))
    assert timed_ms(samples) >= min_time_ms
    # It stops at the first CI check past the minimum: at most ~20% more rounds (check schedule)
    # plus one check interval of 4 rounds (2 samples of 0.1 ms each per round).
    assert timed_ms(samples) <= 1.2 * min_time_ms + 4 * 2 * 0.1


def test_budget_caps_the_min_time():
    samples = fake_pair(spec(min_time_ms=60_000.0, budget_ms=80.0))
    assert 80.0 - 2 * 0.2 < timed_ms(samples) <= 80.0  # within a round of the budget, never past it


def test_min_time_is_validated():
    with pytest.raises(ValueError, match="min_time_ms"):
        MeasurementSpec(min_time_ms=-1)
    with pytest.raises(ValueError, match="timer"):
        MeasurementSpec(timer="rdtsc")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# Timer from the spec; per-callable fallback
# --------------------------------------------------------------------------------------------------


def test_make_timer_takes_the_kind_from_the_spec_with_the_kwarg_overriding():
    cpu = torch.device("cpu")
    assert make_timer(cpu, MeasurementSpec()).name == "perf_counter"
    assert make_timer(cpu, MeasurementSpec(timer="perf_counter")).name == "perf_counter"
    with pytest.raises(ValueError, match="needs a CUDA device"):
        make_timer(cpu, MeasurementSpec(timer="cuda-graph"))
    assert make_timer(cpu, MeasurementSpec(timer="cuda-graph"), kind="auto").name == "perf_counter"


class RefusingTimer(CpuTimer):
    """The preferred timer of the tests: refuses callables in ``refused`` as a graph capture would."""

    name = "preferred"

    def __init__(self, refused: set[Callable[[], Any]], **kw: Any) -> None:
        super().__init__(**kw)
        self.refused = refused
        self.calls = 0

    def time_ns(self, fn: Callable[[], Any], launches: int) -> float:
        self.calls += 1
        if fn in self.refused:
            raise TimerUnsupported("cannot capture")
        return super().time_ns(fn, launches)


def test_a_side_that_cannot_be_captured_takes_the_other_side_to_the_fallback_too():
    good, bad = busy(20_000), busy(20_000)
    preferred = RefusingTimer({bad}, min_window_ns=40_000, max_launches=500)
    timer = FallbackTimer(preferred, CpuTimer(min_window_ns=100_000, max_launches=64))
    assert timer.name == "preferred" and timer.label == "preferred"
    assert timer.min_window_ns == 100_000 and timer.max_launches == 64  # suits both timers
    samples = measure_pair(good, bad, spec(min_time_ms=0.0, max_rounds=6, target_ci_pct=1e-6), timer)
    assert len(samples) == 12 and all(s.duration_ns > 15_000 for s in samples.rows())
    # both sides timed by one method: a ratio of a graph replay and an event window means nothing
    assert timer.kind_for(good) == "perf_counter" and timer.kind_for(bad) == "perf_counter"
    assert timer.fallbacks == 2 and timer.label == "preferred+perf_counter"
    calls = preferred.calls
    timer.time_ns(bad, 1)
    timer.time_ns(good, 1)
    assert preferred.calls == calls  # a callable that fell back is not offered to the primary again
    timer.reset()
    assert timer.kind_for(bad) == "preferred"  # new callables (next cell) start from the primary
    assert timer.label == "preferred+perf_counter"  # the job keeps the record


def test_without_a_fallback_for_the_other_side_the_methods_stay_apart_and_the_cell_says_so():
    from kernelab.service.contract.schemas import CellResult
    from kernelab.service.judge.verdicts import timer_reasons

    cell = CellResult(index=0, params={}, timers={"baseline": "cuda-graph", "candidate": "cuda-event"})
    (found,) = timer_reasons(cell)
    assert found.code == "timer-mismatch" and "cuda-graph" in found.message and "cuda-event" in found.message
    same = CellResult(index=0, params={}, timers=dict.fromkeys(("baseline", "candidate"), "cuda-event"))
    assert timer_reasons(same) == []


def test_fallback_sizes_each_callables_window_with_its_own_timer():
    # A graph timer's window and cap (1 ms, 10,000) must not be cut to the event timer's (64
    # launches) for callables the graph times, nor the other way round.
    good, bad = busy(1_000), busy(1_000)
    preferred = RefusingTimer({bad}, min_window_ns=1_000_000, max_launches=10_000)
    timer = FallbackTimer(preferred, CpuTimer(min_window_ns=50_000, max_launches=64))
    timer.time_ns(bad, 1)  # falls back
    assert timer.launches_for(1_000.0, good) == 1_000
    assert timer.launches_for(1_000.0, bad) == 50
    assert timer.launches_for(1_000.0) == 64  # no callable: fits both timers


def test_fallback_propagates_real_errors():
    def broken() -> None:
        raise ZeroDivisionError("kernel failed")

    timer = FallbackTimer(RefusingTimer(set()), CpuTimer())
    with pytest.raises(ZeroDivisionError):
        timer.time_ns(broken, 1)
    assert timer.fallbacks == 0 and timer.kind_for(broken) == "preferred"
    with pytest.raises(ValueError, match="launches"):
        timer.time_ns(busy(1), 0)


def test_cpu_job_records_the_timer_per_variant_and_no_contention():
    job = JobSpec.model_validate(
        {
            "benchmark": "softmax",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "torch"},
            "params": {"M": 4, "N": 64, "dtype": "float32"},
            "device": "cpu",
            "measurement": {"warmup_ms": 1, "budget_ms": 60, "min_rounds": 3, "min_time_ms": 5},
            "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
            "correctness": {"enabled": False},
        }
    )
    result = run_job(job)
    (cell,) = result.cells
    assert cell.error is None and result.timer == "perf_counter"
    assert cell.timers == {"baseline": "perf_counter", "candidate": "perf_counter"}
    assert cell.contention == []  # no NVML on a CPU run: nothing read, nothing claimed


# --------------------------------------------------------------------------------------------------
# GPU: a real capture failure falls back to CUDA events
# --------------------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_auto_timer_falls_back_for_a_callable_that_syncs():
    dev = torch.device("cuda", torch.cuda.current_device())
    timer = make_timer(dev, MeasurementSpec())
    x = torch.ones(1 << 20, device=dev)

    def capturable() -> torch.Tensor:
        return x.mul_(1.0)

    def syncs() -> float:
        return float(x.sum().item())  # a device-to-host read: illegal while capturing

    samples = measure_pair(capturable, syncs, MeasurementSpec(budget_ms=300, min_time_ms=10), timer)
    assert samples and all(s.duration_ns > 0 for s in samples.rows())
    assert timer.kind_for(capturable) == "cuda-event" and timer.kind_for(syncs) == "cuda-event"
    assert timer.label == "cuda-graph+cuda-event"
    torch.cuda.synchronize(dev)  # the failed capture left no error behind
