"""Timers: launches selection, the CPU timer against busy-waits of known length, the timer factory.

The CUDA tests (``@pytest.mark.gpu``) are written for the H200 node; they are skipped without a GPU.
Figures they check were measured on an H200 node (each test names its own).
"""

from __future__ import annotations

import math
import time

import pytest
import torch

from kernelab.runners.timing import (
    GRAPH_NODE_MEMCPY,
    GRAPH_NODE_MEMSET,
    CpuTimer,
    CudaEventTimer,
    CudaGraphTimer,
    FallbackTimer,
    choose_launches,
    make_timer,
    unlike_eager,
)
from kernelab.service.contract.schemas import MeasurementSpec


def busy_wait(duration_ns: int) -> None:
    """Spin on the host clock for ``duration_ns`` ns (a callable of known length)."""
    end = time.perf_counter_ns() + duration_ns
    while time.perf_counter_ns() < end:
        pass


@pytest.mark.parametrize(
    ("per_launch_ns", "min_window_ns", "max_launches", "expected"),
    [
        (100_000.0, 1_000_000, 1000, 10),  # exactly fills the window
        (300_000.0, 1_000_000, 1000, 4),  # rounds up: 3 launches would be 0.9 ms
        (5_000_000.0, 1_000_000, 1000, 1),  # one launch is longer than the window
        (50.0, 1_000_000, 1000, 1000),  # capped
        (0.0, 1_000_000, 64, 64),  # too short to see: the cap
        (math.nan, 1_000_000, 64, 64),
        (2_000.0, 50_000, 500, 25),  # GPU window, 2 us kernel
    ],
)
def test_choose_launches(per_launch_ns, min_window_ns, max_launches, expected):
    assert choose_launches(per_launch_ns, min_window_ns=min_window_ns, max_launches=max_launches) == expected


def test_choose_launches_rejects_zero_cap():
    with pytest.raises(ValueError, match="max_launches"):
        choose_launches(1.0, min_window_ns=1.0, max_launches=0)


def test_cpu_timer_reads_busy_wait_length():
    timer = CpuTimer()
    readings = [timer.time_ns(lambda: busy_wait(200_000), 5) for _ in range(5)]
    # A busy-wait can only run long, never short; descheduling on a loaded CI box adds time,
    # so the fastest of a few samples is the one to hold to a tight bound.
    assert min(readings) >= 200_000
    assert min(readings) < 260_000


def test_cpu_timer_divides_by_launches():
    calls = []
    timer = CpuTimer()

    def fn() -> None:
        calls.append(1)
        busy_wait(300_000)

    one = min(timer.time_ns(fn, 1) for _ in range(3))
    four = min(timer.time_ns(fn, 4) for _ in range(3))
    assert len(calls) == 3 * 1 + 3 * 4
    assert 300_000 <= four < 390_000
    assert four == pytest.approx(one, rel=0.3)


def test_cpu_timer_rejects_zero_launches():
    with pytest.raises(ValueError, match="launches"):
        CpuTimer().time_ns(lambda: None, 0)


def test_cpu_timer_launches_for_uses_its_window():
    timer = CpuTimer(min_window_ns=2_000_000, max_launches=50)
    assert timer.launches_for(500_000.0) == 4
    assert timer.launches_for(1.0) == 50
    assert timer.name == "perf_counter"


def test_make_timer_on_cpu():
    timer = make_timer(torch.device("cpu"), MeasurementSpec())
    assert isinstance(timer, CpuTimer)
    assert timer.name == "perf_counter"
    assert timer.device == torch.device("cpu")


@pytest.mark.parametrize("kind", ["cuda-event", "cuda-graph"])
def test_make_timer_refuses_gpu_timer_on_cpu(kind):
    with pytest.raises(ValueError, match="CUDA"):
        make_timer(torch.device("cpu"), MeasurementSpec(), kind=kind)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_make_timer_without_cuda_raises():
    with pytest.raises(RuntimeError, match="CUDA"):
        make_timer(torch.device("cuda"), MeasurementSpec())


# --------------------------------------------------------------------------------------------------
# GPU (run by the lead on the H200 node)
# --------------------------------------------------------------------------------------------------


def _dev() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device())


@pytest.mark.gpu
def test_l2_flush_buffer_is_exactly_the_device_l2():
    timer = CudaEventTimer(_dev(), l2_flush=True)
    l2 = torch.cuda.get_device_properties(_dev()).L2_cache_size
    assert timer.flush_buffer is not None
    assert timer.flush_buffer.numel() * timer.flush_buffer.element_size() == l2 == timer.l2_bytes
    assert CudaEventTimer(_dev(), l2_flush=False).flush_buffer is None


@pytest.mark.gpu
@pytest.mark.parametrize("l2_flush", [False, True])
@pytest.mark.parametrize("timer_cls", [CudaEventTimer, CudaGraphTimer])
def test_one_element_kernel_reads_below_8us(timer_cls, l2_flush):
    # A one-element add_ runs in ~2-3 us; an event pair around each synchronised launch reads
    # ~16 us on an H200 because host launch latency leaks in. The spin kernel / graph keep it out.
    x = torch.ones(1, device=_dev())
    timer = timer_cls(_dev(), l2_flush=l2_flush)

    def fn() -> torch.Tensor:
        return x.add_(1.0)

    launches = timer.launches_for(timer.time_ns(fn, 1))
    readings = sorted(timer.time_ns(fn, launches) for _ in range(20))
    median_us = readings[len(readings) // 2] / 1e3
    assert 0.3 < median_us < 8.0
    assert timer.uncovered_samples <= 2  # the spin kernel covered the host's enqueue


@pytest.mark.gpu
def test_graph_timer_flushes_l2_before_a_single_launch_replay_only():
    # a flush before a replay of many launches evicts every node's launch state (measured: +15%
    # per launch for a one-element kernel), while only the first launch's data would be cold
    x = torch.ones(1, device=_dev())
    timer = CudaGraphTimer(_dev(), l2_flush=True)
    flushes = []
    timer._flush = lambda: flushes.append(1)  # type: ignore[method-assign]

    def one() -> torch.Tensor:
        return x.add_(1.0)

    def many() -> torch.Tensor:
        return x.add_(1.0)

    timer.time_ns(one, 1)  # the first sample of a callable captures it and estimates its enqueue
    timer.time_ns(many, 100)
    flushes.clear()
    timer.time_ns(one, 1)
    assert len(flushes) == 1
    timer.time_ns(many, 100)
    timer.time_ns(many, 100)
    assert len(flushes) == 1


@pytest.mark.gpu
@pytest.mark.parametrize("timer_cls", [CudaEventTimer, CudaGraphTimer])
def test_matmul_never_reads_faster_than_the_datasheet(timer_cls):
    # do_bench once read 0.003 ms for a bf16 4096^3 matmul (46 PFLOP/s). H200 dense bf16 peak is
    # ~990 TFLOP/s (datasheet); a correct timer can never imply more.
    n = 4096
    a = torch.randn(n, n, device=_dev(), dtype=torch.bfloat16)
    b = torch.randn(n, n, device=_dev(), dtype=torch.bfloat16)
    out = torch.empty(n, n, device=_dev(), dtype=torch.bfloat16)
    timer = timer_cls(_dev(), l2_flush=True)

    def fn() -> torch.Tensor:
        return torch.mm(a, b, out=out)

    first = timer.time_ns(fn, 1)  # includes nothing from a previous process: a fresh timer
    launches = timer.launches_for(timer.time_ns(fn, 1))
    readings = [first] + [timer.time_ns(fn, launches) for _ in range(10)]
    tflops = [2 * n**3 / ns / 1e3 for ns in readings]
    assert max(tflops) < 1000.0
    assert min(tflops) > 100.0  # and not absurdly slow either


@pytest.mark.gpu
def test_event_and_graph_timers_agree_on_a_large_kernel():
    x = torch.randn(64 * 2**20, device=_dev())  # 256 MiB, several times the L2
    y = torch.empty_like(x)

    def fn() -> torch.Tensor:
        return torch.mul(x, 2.0, out=y)

    medians = []
    for timer in (CudaEventTimer(_dev(), l2_flush=True), CudaGraphTimer(_dev(), l2_flush=True)):
        launches = timer.launches_for(timer.time_ns(fn, 1))
        readings = sorted(timer.time_ns(fn, launches) for _ in range(15))
        medians.append(readings[len(readings) // 2])
    assert medians[1] == pytest.approx(medians[0], rel=0.10)


def test_unlike_eager_names_memcpy_and_memset_nodes_only():
    kernel, empty, event_record = 0, 5, 7
    assert unlike_eager([kernel, kernel, empty, event_record]) == ""
    assert unlike_eager([]) == ""
    assert unlike_eager([kernel, GRAPH_NODE_MEMCPY]) == "1 memcpy node"
    assert (
        unlike_eager([GRAPH_NODE_MEMCPY, GRAPH_NODE_MEMSET, GRAPH_NODE_MEMCPY])
        == "2 memcpy nodes, 1 memset node"
    )


@pytest.mark.gpu
def test_auto_timer_times_a_captured_copy_by_events_and_a_kernel_by_graph():
    """A ``copy_`` captures as a memcpy node, which a replay runs unlike the eager copy (a 1 GiB one
    read 1.5x slow): the auto timer times it by events, within 5% of an eager event timing."""
    x = torch.randint(0, 255, (512 * 2**20,), dtype=torch.uint8, device=_dev())
    y = torch.empty_like(x)
    z = torch.randn(2**20, device=_dev())

    def copy() -> torch.Tensor:
        return y.copy_(x)

    def kernel() -> torch.Tensor:
        return z.mul_(1.0)

    timer = make_timer(_dev(), MeasurementSpec())
    assert isinstance(timer, FallbackTimer)
    copy_ns = sorted(timer.time_ns(copy, 1) for _ in range(9))[4]
    timer.time_ns(kernel, 8)
    assert (timer.kind_for(copy), timer.kind_for(kernel)) == ("cuda-event", "cuda-graph")
    events = CudaEventTimer(_dev(), l2_flush=True)
    eager_ns = sorted(events.time_ns(copy, 1) for _ in range(9))[4]
    assert copy_ns == pytest.approx(eager_ns, rel=0.05)
    explicit = CudaGraphTimer(_dev(), l2_flush=True)  # ``timer: cuda-graph`` replays what it captured
    assert explicit.time_ns(copy, 1) > 0 and explicit.graph_nodes(copy) == (1, 1)


@pytest.mark.gpu
def test_cuda_timer_keeps_to_its_device():
    dev = torch.device("cuda", torch.cuda.device_count() - 1)
    x = torch.ones(1024, device=dev)
    timer = CudaEventTimer(dev, l2_flush=False)
    assert timer.time_ns(lambda: x.mul_(1.0), 4) > 0
    graph_timer = CudaGraphTimer(dev, l2_flush=False)
    assert graph_timer.time_ns(lambda: x.mul_(1.0), 4) > 0
    graph_timer.reset()
