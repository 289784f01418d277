"""Timers: how one sample of a kernel is timed.

A ``Timer`` turns "call ``fn`` ``launches`` times" into nanoseconds per launch. Three exist:

* ``CpuTimer`` (``'perf_counter'``): ``time.perf_counter_ns`` around the launches. Used on a
  CPU-only node, so the whole engine runs in CI.
* ``CudaEventTimer`` (``'cuda-event'``): CUDA events on the device's current stream, with the
  stream held by a spin kernel (``torch.cuda._sleep``) while the host enqueues the window, so host
  launch latency stays out of it, as nvbench's blocking kernel does. With ``l2_flush`` (cold mode)
  every launch gets its own event pair behind a memset of exactly the device's L2 size
  (``cudaDeviceProp::l2CacheSize``), and the flush stays outside the timed windows, as in
  nvbench's cold mode; without it (hot mode) one event pair spans all ``launches`` launches.
* ``CudaGraphTimer`` (``'cuda-graph'``): the ``launches`` calls are captured once into a
  ``torch.cuda.CUDAGraph`` and replayed between two events (no launch gaps at all, as
  ``triton.testing.do_bench_cudagraph``). With ``l2_flush`` only the first launch of a replay starts
  with a cold L2.

* ``FallbackTimer``: a preferred timer with a per-callable fallback: a callable the preferred
  timer cannot time (``TimerUnsupported``, e.g. a graph capture that fails because the callable
  synchronises or reads a value back to the host) is timed by the fallback from then on.

The GPU default (``MeasurementSpec.timer = 'auto'``) is ``FallbackTimer(CudaGraphTimer,
CudaEventTimer)``, chosen from the H200 measurements of ``benchmarks/timing_accuracy.py``
(``docs/results/2026-11-30-h200-timing-accuracy.md``, medians of 10 processes): for a one-element
kernel, graph replay per launch read 1.25 us against do_bench_cudagraph's 1.03 us (1.22x, the
only kernelab timer within the 1.25x target), while the event timer read 3.87 us cold and 1.77 us
hot (3.77x and 1.73x); for kernels of 100 us and more all methods agreed within ~2%. The graph
timer's minimum window is 1 ms (``_GRAPH_MIN_WINDOW_NS``; with 50 us windows the fixed ~5.7 us
cost of a replay read the one-element kernel 1.27-1.29x do_bench_cudagraph). With ``l2_flush``
the graph timer flushes once per replay, so only a replay's first launch is cold: kernels shorter
than the window are measured warm, as ``do_bench_cudagraph`` measures them; nvbench-style cold
numbers per launch come from ``timer: cuda-event`` with ``l2_flush``. A graph replays only device
work: host-side work inside the callable runs once, at capture.

Sources: nvbench (blocking kernel, cold mode, L2 size from device properties), nccl-tests and
nvbandwidth (spin kernel holding the stream), ``triton.testing.do_bench`` (milliseconds, L2 clear).
"""

from __future__ import annotations

import ctypes
import logging
import math
import time
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import torch

from kernelab.service.contract.schemas import MeasurementSpec

TimerKind = Literal["auto", "perf_counter", "cuda-event", "cuda-graph"]
logger = logging.getLogger(__name__)

# Minimum timed window per sample and the cap on launches per sample.
_CPU_MIN_WINDOW_NS = 1_000_000  # 1 ms: perf_counter_ns resolution and Python call noise amortised
_CPU_MAX_LAUNCHES = 1000
_GPU_MIN_WINDOW_NS = 50_000  # 50 us of kernel time per sample
# The CUDA driver queues about a thousand pending launches per stream before the host blocks; a
# blocked host would let the GPU drain the queue and idle inside the window. A hot-mode sample
# enqueues ~launches kernels, a cold-mode one ~4 operations per launch (memset, 2 events, kernel).
_GPU_MAX_LAUNCHES_HOT = 500
# CUDA-graph replay: one replay costs a fixed ~5.7 us besides its launches (graph launch, first
# node, the cold first launch; H200 fit t(n) = c + b*n, docs/results/2026-11-30-h200-timing-
# accuracy.md), so a 50 us window read a one-element kernel 1.27-1.29x do_bench_cudagraph; a 1 ms
# window keeps c under 0.6% of the window. A replay is one host launch, so no queue-depth cap
# applies; 10,000 launches covers 1 ms of the shortest kernels (~1 us).
_GRAPH_MIN_WINDOW_NS = 1_000_000
_GRAPH_MAX_LAUNCHES = 10_000
# cudaGraphNodeType values (CUDA runtime API, ``cudaGraphNodeType``) of nodes that a graph runs
# unlike the eager call it captured: a captured ``cudaMemcpyAsync``/``cudaMemsetAsync`` becomes a
# memcpy/memset node, which the driver executes its own way (H200, driver 580: a 1 GiB
# ``copy_`` replayed 1.53x slower than eagerly, a 64 MiB one 0.90x, as an SM ``memcpy128``
# kernel instead of the eager copy; ``benchmarks/graph_copy_h200.py``). A graph holding one
# would time another operation than the user's call, so the auto timer times it by events.
GRAPH_NODE_MEMCPY, GRAPH_NODE_MEMSET = 1, 2
_GRAPH_NODES_UNLIKE_EAGER = {GRAPH_NODE_MEMCPY: "memcpy", GRAPH_NODE_MEMSET: "memset"}
_GPU_MAX_LAUNCHES_COLD = 64
# Spin kernel sizing: cover the measured host enqueue time with a margin, within bounds.
_SPIN_MARGIN = 1.5
_SPIN_FLOOR_NS = 20_000  # 20 us: the spin kernel's own launch latency (~5-8 us) with room
_ENQUEUE_DECAY = 0.8  # per sample, of the remembered host enqueue cost (a decaying maximum)
_SPIN_MAX_NS = 200_000_000  # 200 ms: a sanity cap for very slow host-side launchers
_SPIN_CALIBRATION_CYCLES = 10_000_000  # ~5 ms at 2 GHz: long enough that event overhead is < 0.1%
# Cycles per ns the calibration may read: SM clocks run between ~0.2 GHz (idle floors) and ~3 GHz
# (H200 boost 1.98 GHz, nvidia-smi -q -d CLOCK); outside 0.05-10 the events read no time at all (a
# replaced elapsed_time: a spin sized from 1e7 cycles per ns slept ~100 s) or the spin did not run.
_SPIN_RATE_BOUNDS = (0.05, 10.0)


_SPIN_RATES: dict[int, float] = {}


def measure_spin_cycles_per_ns(index: int) -> float:
    """Cycles per ns of ``torch.cuda._sleep`` (clock64 cycles, at the current SM clock) on CUDA
    device ``index``, measured now: one calibration spin raises the clocks from idle, a second one
    is timed with events (``_SPIN_CALIBRATION_CYCLES``, ~5 ms at 2 GHz). Raises ``RuntimeError``
    without CUDA, ``TimerImplausible`` for a rate outside ``_SPIN_RATE_BOUNDS`` (the events read
    no plausible time)."""
    with torch.cuda.device(index):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(_SPIN_CALIBRATION_CYCLES)  # raise the clocks from idle first
        start.record()
        torch.cuda._sleep(_SPIN_CALIBRATION_CYCLES)
        stop.record()
        stop.synchronize()
        elapsed_ms = start.elapsed_time(stop)
    rate = _SPIN_CALIBRATION_CYCLES / max(elapsed_ms * 1e6, 1.0)
    if not _SPIN_RATE_BOUNDS[0] <= rate <= _SPIN_RATE_BOUNDS[1]:
        raise TimerImplausible(
            f"CUDA events read {elapsed_ms!r} ms for a spin of {_SPIN_CALIBRATION_CYCLES:,} clock cycles: "
            f"{rate:.3g} cycles per ns, no SM clock a GPU runs at ({_SPIN_RATE_BOUNDS[0]:g}-"
            f"{_SPIN_RATE_BOUNDS[1]:g} GHz); the event timer (or torch.cuda._sleep) is not what it "
            "should be, and every spin sized from it would be wrong"
        )
    return rate


def spin_cycles_per_ns(device: torch.device) -> float:
    """``measure_spin_cycles_per_ns`` of CUDA ``device``, measured once per process (the probes'
    spin kernels). Raises ``RuntimeError`` without CUDA."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SPIN_RATES:
        _SPIN_RATES[index] = measure_spin_cycles_per_ns(index)
    return _SPIN_RATES[index]


def choose_launches(per_launch_ns: float, *, min_window_ns: float, max_launches: int) -> int:
    """Launches per sample so one sample covers at least ``min_window_ns``.

    ``per_launch_ns`` is a warm-up estimate of one launch (ns). Returns an int in
    ``[1, max_launches]``: ``ceil(min_window_ns / per_launch_ns)`` clamped. A non-positive or
    non-finite estimate (a launch too short to see) gives ``max_launches``. Raises ``ValueError``
    when ``max_launches < 1``.
    """
    if max_launches < 1:
        raise ValueError(f"max_launches must be >= 1, got {max_launches}")
    if not math.isfinite(per_launch_ns) or per_launch_ns <= 0:
        return max_launches
    return max(1, min(max_launches, math.ceil(min_window_ns / per_launch_ns)))


_MAX_HEAT_LAUNCHES = 1_000_000


def heat_launches(per_launch_ns: float, sustain_ns: float) -> int:
    """Launches of ``per_launch_ns`` that fill ``sustain_ns`` (at least 1, at most 1,000,000)."""
    if not math.isfinite(per_launch_ns) or per_launch_ns <= 0:
        return 1
    return int(min(_MAX_HEAT_LAUNCHES, max(1, math.ceil(sustain_ns / per_launch_ns))))


class TimerImplausible(RuntimeError):
    """The device timer read a time no device takes (``measure_spin_cycles_per_ns``): nothing it
    times can be trusted, and no other method of this timer is tried instead."""


class TimerUnsupported(RuntimeError):
    """This timer cannot time this callable (e.g. it cannot be captured in a CUDA graph)."""


class Timer(ABC):
    """Times ``launches`` back-to-back calls of a zero-argument callable; ns per launch.

    ``fn`` must launch the work once per call on the timer's device (for CUDA: on the current
    stream of ``device``). Allocation and correctness checks stay outside ``fn``.
    """

    name: ClassVar[str]
    device: torch.device
    min_window_ns: float
    max_launches: int

    def __init__(self) -> None:
        # fn -> what its last timed launch returned (``output_of``)
        self._outputs: dict[Callable[[], Any], Any] = {}

    @abstractmethod
    def time_ns(self, fn: Callable[[], Any], launches: int) -> float:
        """Time one sample: ``launches`` calls of ``fn``; returns nanoseconds per launch (float).

        Raises ``ValueError`` when ``launches < 1``; whatever ``fn`` raises propagates.
        """

    def output_of(self, fn: Callable[[], Any]) -> Any:
        """What the timed method's last launch of ``fn`` returned: the return value of the last
        call of the latest ``time_ns`` (for a CUDA graph, the graph's static output, which every
        replay rewrites). None before the first sample. The checked samples (``kernelab.runners.sides``)
        poison it before a sample and verify it after."""
        return self._outputs.get(fn)

    def empty_capture(self, fn: Callable[[], Any]) -> bool:
        """True when the timed method saw ``fn`` launch no device work at all (a CUDA graph
        captured from its calls holds no node). Only the CUDA-graph timer can tell; else False."""
        return False

    def forget_output(self, fn: Callable[[], Any]) -> None:
        """Drop the reference to ``fn``'s last output (so its memory can be reused)."""
        self._outputs.pop(fn, None)

    def graph_nodes(self, fn: Callable[[], Any]) -> tuple[int, int] | None:
        """``(nodes, launches)`` of the CUDA graph that times ``fn`` (its node count, counted once
        at capture), or None: not timed by a graph, or the count is not available here."""
        return None

    def rejected_graph(self, fn: Callable[[], Any]) -> str | None:
        """Why this timer would not time ``fn`` with the CUDA graph it captured from its calls (one
        holding nodes a replay runs unlike the eager call), which it keeps for ``replay_rejected``;
        None when there is no such graph (only ``CudaGraphTimer(eager_nodes_only=True)`` keeps one)."""
        return None

    def replay_rejected(self, fn: Callable[[], Any]) -> Any:
        """Replay ``fn``'s rejected graph (``rejected_graph``) once, synchronised, and return its
        static output, so a replay's output can be checked too. Raises ``LookupError`` without one."""
        raise LookupError("no rejected CUDA graph")

    def launches_for(self, per_launch_ns: float, fn: Callable[[], Any] | None = None) -> int:
        """Launches per sample for a launch of ``fn`` estimated at ``per_launch_ns``; see
        ``choose_launches``. ``fn`` matters only to a timer that times callables differently
        (``FallbackTimer``)."""
        return choose_launches(
            per_launch_ns, min_window_ns=self.min_window_ns, max_launches=self.max_launches
        )

    def heat(self, fn: Callable[[], Any], per_launch_ns: float, sustain_ns: float) -> int:
        """Run ``fn`` back to back, untimed, for about ``sustain_ns`` ns (``per_launch_ns`` each),
        without waiting for the device in between (``measurement.state: sustained``: the timed
        sample that follows finds the device loaded). Returns the launches enqueued (1 to
        ``_MAX_HEAT_LAUNCHES``). Whatever ``fn`` raises propagates."""
        n = heat_launches(per_launch_ns, sustain_ns)
        for _ in range(n):
            fn()
        return n

    @abstractmethod
    def reset(self) -> None:
        """Drop per-callable state (calibrations, captured graphs, last outputs) so their memory
        can be freed."""

    def kind_for(self, fn: Callable[[], Any]) -> str:
        """The timer kind that times ``fn`` (``name``, unless a fallback took over for it)."""
        return self.name

    @property
    def label(self) -> str:
        """What ``JobResult.timer`` records: ``name``, or ``'<primary>+<fallback>'`` once any
        callable of the job fell back (see ``FallbackTimer``)."""
        return self.name

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} device={self.device}>"


def _check_launches(launches: int) -> None:
    if launches < 1:
        raise ValueError(f"launches must be >= 1, got {launches}")


class CpuTimer(Timer):
    """``time.perf_counter_ns`` around ``launches`` calls; for CPU devices (work is synchronous)."""

    name: ClassVar[str] = "perf_counter"

    def __init__(
        self, *, min_window_ns: float = _CPU_MIN_WINDOW_NS, max_launches: int = _CPU_MAX_LAUNCHES
    ) -> None:
        super().__init__()
        self.device = torch.device("cpu")
        self.min_window_ns = float(min_window_ns)
        self.max_launches = int(max_launches)

    def time_ns(self, fn: Callable[[], Any], launches: int) -> float:
        """ns per launch over ``launches`` calls of ``fn`` (wall clock, ``perf_counter_ns``)."""
        _check_launches(launches)
        out = None
        t0 = time.perf_counter_ns()
        for _ in range(launches):
            out = fn()
        elapsed = time.perf_counter_ns() - t0
        self._outputs[fn] = out
        return elapsed / launches

    def reset(self) -> None:
        """Drop the last outputs (the CPU timer keeps no other per-callable state)."""
        self._outputs.clear()


class _CudaTimerBase(Timer):
    """Shared CUDA state: device, L2 flush buffer, spin-kernel calibration."""

    def __init__(self, device: torch.device, *, l2_flush: bool, min_window_ns: float, max_launches: int):
        super().__init__()
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA timers need a CUDA device; torch.cuda.is_available() is False")
        if device.type != "cuda":
            raise ValueError(f"CUDA timers need a cuda device, got {device}")
        index = device.index if device.index is not None else torch.cuda.current_device()
        self.device = torch.device("cuda", index)
        self.min_window_ns = float(min_window_ns)
        self.max_launches = int(max_launches)
        self.l2_bytes = int(torch.cuda.get_device_properties(self.device).L2_cache_size)
        # nvbench cold mode: a memset of exactly the L2 size evicts everything the last launch left.
        self.flush_buffer: torch.Tensor | None = (
            torch.empty(self.l2_bytes, dtype=torch.uint8, device=self.device) if l2_flush else None
        )
        self._cycles_per_ns: float | None = None
        # Host enqueue cost per launch (ns), measured while the stream was held by the spin kernel.
        self._enqueue_ns: dict[Callable[[], Any], float] = {}
        self.samples = 0
        self.uncovered_samples = 0  # samples whose enqueue outlasted the spin kernel

    def reset(self) -> None:
        self._enqueue_ns.clear()
        self._outputs.clear()

    def _flush(self) -> None:
        if self.flush_buffer is not None:
            self.flush_buffer.zero_()

    def _cycles_for(self, spin_ns: float) -> int:
        """Spin-kernel cycles for ``spin_ns`` at the clock measured once by ``_calibrate_spin``."""
        if self._cycles_per_ns is None:
            self._calibrate_spin()
        assert self._cycles_per_ns is not None
        return max(1, int(spin_ns * self._cycles_per_ns))

    def _calibrate_spin(self) -> None:
        """Measure the spin kernel's cycles per ns once per timer (``measure_spin_cycles_per_ns``)."""
        self._cycles_per_ns = measure_spin_cycles_per_ns(self.device.index)

    def _first_enqueue_estimate_ns(self, fn: Callable[[], Any]) -> float:
        """An upper bound of the host cost of one launch: one synchronised call, host clock."""
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter_ns()
        self._flush()
        fn()
        torch.cuda.synchronize(self.device)
        return float(time.perf_counter_ns() - t0)

    def _spin(self, fn: Callable[[], Any], enqueue_ops: int) -> tuple[float, int]:
        """Launch the spin kernel sized for ``enqueue_ops`` launches of ``fn``; (spin ns, t0 ns)."""
        per_launch = self._enqueue_ns.get(fn)
        if per_launch is None:
            per_launch = self._first_enqueue_estimate_ns(fn)
        spin_ns = min(_SPIN_MAX_NS, _SPIN_MARGIN * per_launch * enqueue_ops + _SPIN_FLOOR_NS)
        cycles = self._cycles_for(spin_ns)
        torch.cuda._sleep(cycles)
        return spin_ns, time.perf_counter_ns()

    def _account(self, fn: Callable[[], Any], spin_ns: float, t_spin_ns: int, enqueue_ops: int) -> None:
        """Record the measured enqueue cost for the next spin and count exposed windows."""
        enqueue_ns = time.perf_counter_ns() - t_spin_ns
        # A decaying maximum: one quick enqueue must not shrink the next spin below a slow one.
        previous = self._enqueue_ns.get(fn, 0.0)
        self._enqueue_ns[fn] = max(enqueue_ns / enqueue_ops, _ENQUEUE_DECAY * previous)
        self.samples += 1
        if enqueue_ns > spin_ns:
            self.uncovered_samples += 1


class CudaEventTimer(_CudaTimerBase):
    """CUDA events behind a spin kernel; cold mode flushes L2 before every launch.

    Per sample: synchronise; enqueue ``torch.cuda._sleep`` long enough to cover the host's
    enqueue of the window (1.5x a decaying maximum of the enqueue times measured on earlier
    samples of this ``fn``, +20 us; the first sample uses one synchronised call as an upper bound);
    then either (hot) start event, ``launches`` calls, stop event, or (cold) for each launch: L2
    memset, start event, call, stop event. Wait on the last event; per launch time is
    the summed event time over ``launches``. ``uncovered_samples`` counts samples whose host
    enqueue outlasted the spin (the GPU may have idled inside the window).
    """

    name: ClassVar[str] = "cuda-event"

    def __init__(
        self,
        device: torch.device,
        *,
        l2_flush: bool = True,
        min_window_ns: float = _GPU_MIN_WINDOW_NS,
        max_launches: int | None = None,
    ) -> None:
        if max_launches is None:
            max_launches = _GPU_MAX_LAUNCHES_COLD if l2_flush else _GPU_MAX_LAUNCHES_HOT
        super().__init__(device, l2_flush=l2_flush, min_window_ns=min_window_ns, max_launches=max_launches)

    def time_ns(self, fn: Callable[[], Any], launches: int) -> float:
        """ns per launch from CUDA events; see the class docstring for the sequence."""
        _check_launches(launches)
        with torch.cuda.device(self.device):
            torch.cuda.synchronize(self.device)
            pairs = launches if self.flush_buffer is not None else 1
            starts = [torch.cuda.Event(enable_timing=True) for _ in range(pairs)]
            stops = [torch.cuda.Event(enable_timing=True) for _ in range(pairs)]
            spin_ns, t_spin = self._spin(fn, launches)
            out = None
            if self.flush_buffer is not None:
                for start, stop in zip(starts, stops, strict=True):
                    self.flush_buffer.zero_()
                    start.record()
                    out = fn()
                    stop.record()
            else:
                starts[0].record()
                for _ in range(launches):
                    out = fn()
                stops[0].record()
            self._account(fn, spin_ns, t_spin, launches)
            self._outputs[fn] = out
            stops[-1].synchronize()
            total_ms = sum(s.elapsed_time(e) for s, e in zip(starts, stops, strict=True))
        return total_ms * 1e6 / launches


class CudaGraphTimer(_CudaTimerBase):
    """Replay of a CUDA graph of ``launches`` calls between two events (no launch gaps).

    The graph is captured on first use for a given ``(fn, launches)`` (after three warm-up calls
    on the capture stream, as the PyTorch CUDA-graph notes require) and kept until ``reset`` or a
    different ``launches`` for that ``fn``. Per sample: spin kernel, L2 memset when ``l2_flush``
    and ``launches`` is 1, start event, replay, stop event. Default window 1 ms, at most 10,000
    launches per replay (see ``_GRAPH_MIN_WINDOW_NS``).

    Why no flush before a replay of several launches: only its first launch would find a cold L2
    for its data, but every node of the replay finds its launch state (kernel parameters, node
    descriptors, kept in device memory) evicted. Measured on an H200 (one-element softmax, 100 to
    10,000 launches per replay): 1,200-1,236 ns per launch with the flush against 1,039-1,060 ns
    without it and 1,049-1,099 ns for a hand replay beside it, a cost eager launches never pay
    (docs/results/2026-12-02-h200-timing-artefacts.md). A single-launch sample (a kernel of 1 ms or
    more) is flushed, as nvbench's cold mode does.

    With ``eager_nodes_only`` (the auto timer's), a capture that holds a memcpy or memset node
    raises ``TimerUnsupported`` (``unlike_eager``): replaying it would time another operation than
    the eager call (``_GRAPH_NODES_UNLIKE_EAGER``), so the fallback times the callable.
    """

    name: ClassVar[str] = "cuda-graph"

    def __init__(
        self,
        device: torch.device,
        *,
        l2_flush: bool = True,
        min_window_ns: float = _GRAPH_MIN_WINDOW_NS,
        max_launches: int = _GRAPH_MAX_LAUNCHES,
        eager_nodes_only: bool = False,
    ) -> None:
        super().__init__(device, l2_flush=l2_flush, min_window_ns=min_window_ns, max_launches=max_launches)
        self.eager_nodes_only = eager_nodes_only
        self._graphs: dict[Callable[[], Any], tuple[int, torch.cuda.CUDAGraph]] = {}
        self._empty: set[Callable[[], Any]] = set()
        self._nodes: dict[Callable[[], Any], tuple[int, int]] = {}
        self._rejected: dict[Callable[[], Any], tuple[torch.cuda.CUDAGraph, Any, str]] = {}

    def reset(self) -> None:
        super().reset()
        self._graphs.clear()
        self._empty.clear()
        self._nodes.clear()
        self._rejected.clear()

    def rejected_graph(self, fn: Callable[[], Any]) -> str | None:
        """``Timer.rejected_graph``: why ``eager_nodes_only`` refused the graph it keeps for ``fn``."""
        kept = self._rejected.get(fn)
        return None if kept is None else kept[2]

    def replay_rejected(self, fn: Callable[[], Any]) -> Any:
        """``Timer.replay_rejected``: that graph replayed once (synchronised), its static output."""
        graph, out, _ = self._rejected[fn]
        with torch.cuda.device(self.device):
            graph.replay()
            torch.cuda.synchronize(self.device)
        return out

    def graph_nodes(self, fn: Callable[[], Any]) -> tuple[int, int] | None:
        """``(nodes, launches)`` of ``fn``'s latest graph (``cudaGraphGetNodes`` at capture)."""
        return self._nodes.get(fn)

    def empty_capture(self, fn: Callable[[], Any]) -> bool:
        """True when the latest graph captured from ``fn``'s calls holds no node: the calls
        launched no device work (torch warns "The CUDA Graph is empty")."""
        return fn in self._empty

    def _graph(self, fn: Callable[[], Any], launches: int) -> torch.cuda.CUDAGraph:
        cached = self._graphs.get(fn)
        if cached is not None and cached[0] == launches:
            return cached[1]
        self._graphs.pop(fn, None)
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = _new_graph()
        out = None
        try:
            # torch warns "The CUDA Graph is empty" when the capture recorded no node: the calls
            # launched no device work. Recorded (never raised, whatever the warning filters say).
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with torch.cuda.graph(graph, stream=stream):
                    for _ in range(launches):
                        out = fn()
        except RuntimeError as exc:  # torch raises RuntimeError (CUDA error) for capture failures
            del graph
            torch.cuda.synchronize(self.device)  # a sticky CUDA error is a real failure: raise it
            raise TimerUnsupported(f"cannot capture the callable in a CUDA graph: {exc}") from exc
        torch.cuda.synchronize(self.device)
        if any("graph is empty" in str(w.message).lower() for w in caught):
            self._empty.add(fn)
        else:
            self._empty.discard(fn)
        types = graph_node_types(graph)
        if types is not None:
            self._nodes[fn] = (len(types), launches)
            unlike = unlike_eager(types)
            if unlike and self.eager_nodes_only:
                why = f"the captured graph holds {unlike}: a graph replays those unlike the eager call"
                if hasattr(graph, "instantiate"):
                    graph.instantiate()
                # kept (not timed with): its replays' output is checked as well, since a user who
                # replays the call in a graph runs what it captured (``replay_rejected``)
                self._rejected[fn] = (graph, out, why)
                raise TimerUnsupported(why)
        else:
            self._nodes.pop(fn, None)
        if hasattr(graph, "instantiate"):
            graph.instantiate()  # a graph kept for counting is instantiated here, not at the first replay
        self._graphs[fn] = (launches, graph)
        self._outputs[fn] = out  # the graph's static output: every replay rewrites it
        return graph

    def heat(self, fn: Callable[[], Any], per_launch_ns: float, sustain_ns: float) -> int:
        """``Timer.heat`` by replays of ``fn``'s captured graph (back to back, no wait between),
        so the device runs what the timed replay runs; the calls themselves before a capture."""
        cached = self._graphs.get(fn)
        if cached is None:
            return super().heat(fn, per_launch_ns, sustain_ns)
        launches, graph = cached
        replays = heat_launches(per_launch_ns * launches, sustain_ns)
        with torch.cuda.device(self.device):
            for _ in range(replays):
                graph.replay()
        return replays * launches

    def time_ns(self, fn: Callable[[], Any], launches: int) -> float:
        """ns per launch: replay time of a graph of ``launches`` calls over ``launches``.

        Raises ``TimerUnsupported`` when ``fn`` cannot be captured (three uncaptured warm-up
        calls run first: what they raise propagates as is).
        """
        _check_launches(launches)
        with torch.cuda.device(self.device):
            graph = self._graph(fn, launches)
            torch.cuda.synchronize(self.device)
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            spin_ns, t_spin = self._spin(graph.replay, 1)
            if launches == 1:
                self._flush()  # runs behind the spin kernel, before the start event (class docstring)
            start.record()
            graph.replay()
            stop.record()
            self._account(graph.replay, spin_ns, t_spin, 1)
            stop.synchronize()
            elapsed_ms = start.elapsed_time(stop)
        return elapsed_ms * 1e6 / launches


def _new_graph() -> torch.cuda.CUDAGraph:
    """A ``CUDAGraph`` that keeps its ``cudaGraph_t`` after capture (so its nodes can be counted);
    a plain one where torch has no ``keep_graph``."""
    try:
        return torch.cuda.CUDAGraph(keep_graph=True)
    except TypeError:
        return torch.cuda.CUDAGraph()


def graph_node_types(graph: torch.cuda.CUDAGraph) -> list[int] | None:
    """The ``cudaGraphNodeType`` of every node of a captured ``graph`` (0 kernel, 1 memcpy,
    2 memset, ...): ``cudaGraphGetNodes`` and ``cudaGraphNodeGetType`` of its
    ``raw_cuda_graph()`` through the CUDA runtime library torch loaded (CUDA runtime API, Graph
    Management). None where torch keeps no ``cudaGraph_t`` or the runtime cannot be called."""
    raw = getattr(graph, "raw_cuda_graph", None)
    if raw is None:
        return None
    try:
        handle = ctypes.c_void_p(int(raw()))
        lib = cuda_runtime()
        count = ctypes.c_size_t(0)
        if lib.cudaGraphGetNodes(handle, None, ctypes.byref(count)) != 0:
            return None
        nodes = (ctypes.c_void_p * count.value)()
        if count.value and lib.cudaGraphGetNodes(handle, nodes, ctypes.byref(count)) != 0:
            return None
        types = []
        for node in nodes[: count.value]:
            kind = ctypes.c_int(-1)
            if lib.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) != 0:
                return None
            types.append(int(kind.value))
    except (RuntimeError, OSError, AttributeError, TypeError) as exc:
        logger.debug("cannot read graph nodes: %s", exc)
        return None
    return types


def unlike_eager(types: list[int]) -> str:
    """The nodes among ``types`` (``cudaGraphNodeType`` values) that a graph replays unlike the
    eager calls it captured, as text (``"2 memcpy nodes"``), or ``""`` when there are none."""
    counts: dict[str, int] = {}
    for kind in types:
        name = _GRAPH_NODES_UNLIKE_EAGER.get(kind)
        if name is not None:
            counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n} {name} node{'s' if n > 1 else ''}" for name, n in counts.items())


_CUDART: ctypes.CDLL | None = None


def cuda_runtime() -> ctypes.CDLL:
    """The CUDA runtime library (``libcudart``) torch loaded into this process. Raises
    ``RuntimeError`` when none is loaded (a CPU build, or a runtime linked statically)."""
    global _CUDART
    if _CUDART is None:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = sorted({line.split()[-1] for line in maps if "libcudart.so" in line})
        if not paths:
            raise RuntimeError("no libcudart is loaded in this process")
        _CUDART = ctypes.CDLL(paths[0])
    return _CUDART


class FallbackTimer(Timer):
    """``primary`` for every callable it can time; ``fallback`` for those it cannot.

    The first ``primary.time_ns(fn, ...)`` that raises ``TimerUnsupported`` moves ``fn`` to
    ``fallback`` (that sample is retaken there) until ``reset``; other exceptions propagate.
    ``min_window_ns`` is the larger and ``max_launches`` the smaller of the two timers' (so a
    launch count chosen before a fallback suits both). ``kind_for(fn)`` names the timer of ``fn``;
    ``fallbacks`` counts callables moved over this timer's lifetime (``reset`` keeps it), and
    ``label`` becomes ``'<primary>+<fallback>'`` once it is non-zero, so the job records it.
    """

    def __init__(self, primary: Timer, fallback: Timer) -> None:
        if primary.device != fallback.device:
            raise ValueError(f"timers on different devices: {primary.device} and {fallback.device}")
        super().__init__()
        self.primary, self.fallback = primary, fallback
        self.name = primary.name  # type: ignore[misc]  # an instance attribute shadows the ClassVar
        self.device = primary.device
        self.min_window_ns = max(primary.min_window_ns, fallback.min_window_ns)
        self.max_launches = min(primary.max_launches, fallback.max_launches)
        self._fallen_back: set[Callable[[], Any]] = set()
        self.fallbacks = 0

    def time_ns(self, fn: Callable[[], Any], launches: int) -> float:
        """ns per launch from ``primary``, or from ``fallback`` for a callable it cannot time."""
        _check_launches(launches)
        if fn not in self._fallen_back:
            try:
                return self.primary.time_ns(fn, launches)
            except TimerUnsupported as exc:
                logger.warning(
                    "%s cannot time %r (%s); using %s for it", self.primary.name, fn, exc, self.fallback.name
                )
                self._fallen_back.add(fn)
                self.fallbacks += 1
        return self.fallback.time_ns(fn, launches)

    def launches_for(self, per_launch_ns: float, fn: Callable[[], Any] | None = None) -> int:
        """Launches per sample from the timer that times ``fn`` (its own window and cap); with no
        ``fn``, the combined ``min_window_ns`` and ``max_launches`` (fits either timer)."""
        if fn is None:
            return super().launches_for(per_launch_ns)
        return self._timer_of(fn).launches_for(per_launch_ns, fn)

    def heat(self, fn: Callable[[], Any], per_launch_ns: float, sustain_ns: float) -> int:
        """``heat`` of the timer that times ``fn``."""
        return self._timer_of(fn).heat(fn, per_launch_ns, sustain_ns)

    def kind_for(self, fn: Callable[[], Any]) -> str:
        """``fallback.name`` for a callable that fell back, else ``primary.name``."""
        return self.fallback.name if fn in self._fallen_back else self.primary.name

    def _timer_of(self, fn: Callable[[], Any]) -> Timer:
        return self.fallback if fn in self._fallen_back else self.primary

    def output_of(self, fn: Callable[[], Any]) -> Any:
        """``output_of`` of the timer that times ``fn``."""
        return self._timer_of(fn).output_of(fn)

    def forget_output(self, fn: Callable[[], Any]) -> None:
        """``forget_output`` on both timers."""
        self.primary.forget_output(fn)
        self.fallback.forget_output(fn)

    def empty_capture(self, fn: Callable[[], Any]) -> bool:
        """``empty_capture`` of the primary timer (a CUDA graph captured from ``fn``'s calls that
        holds no node stays empty whatever times ``fn`` after it)."""
        return self.primary.empty_capture(fn)

    def graph_nodes(self, fn: Callable[[], Any]) -> tuple[int, int] | None:
        """``graph_nodes`` of the timer that times ``fn``."""
        return self._timer_of(fn).graph_nodes(fn)

    def rejected_graph(self, fn: Callable[[], Any]) -> str | None:
        """``rejected_graph`` of the primary timer (the graph it refused before ``fn`` fell back)."""
        return self.primary.rejected_graph(fn)

    def replay_rejected(self, fn: Callable[[], Any]) -> Any:
        """``replay_rejected`` of the primary timer."""
        return self.primary.replay_rejected(fn)

    def use_fallback(self, fn: Callable[[], Any]) -> None:
        """Time ``fn`` with the fallback from now on (until ``reset``): the engine moves the other
        side of a pair there when one side fell back, so both sides are timed by one method."""
        if fn not in self._fallen_back:
            self._fallen_back.add(fn)
            self.fallbacks += 1

    @property
    def label(self) -> str:
        return f"{self.primary.name}+{self.fallback.name}" if self.fallbacks else self.primary.name

    def reset(self) -> None:
        self.primary.reset()
        self.fallback.reset()
        self._fallen_back.clear()


def make_timer(device: torch.device, settings: MeasurementSpec, *, kind: TimerKind | None = None) -> Timer:
    """The timer for ``device`` under ``settings`` (``settings.l2_flush`` applies on CUDA only).

    ``kind`` overrides ``settings.timer``. ``'auto'``: ``'perf_counter'`` on a CPU; on a GPU CUDA
    graph replay with a per-callable fall back to CUDA events (``FallbackTimer``; why graph replay
    is the default: the module docstring), a callable whose graph holds memcpy/memset nodes falling
    back too (``CudaGraphTimer(eager_nodes_only=True)``); ``'cuda-graph'`` replays whatever was
    captured. Raises ``ValueError`` for a kind that does not fit the
    device and ``RuntimeError`` for a CUDA device when CUDA is not available.
    """
    if kind is None:
        kind = settings.timer
    if device.type == "cpu":
        if kind not in ("auto", "perf_counter"):
            raise ValueError(f"timer {kind!r} needs a CUDA device; this device is {device}")
        return CpuTimer()
    if device.type != "cuda":
        raise ValueError(f"no timer for device type {device.type!r}")
    if kind == "auto":
        return FallbackTimer(
            CudaGraphTimer(device, l2_flush=settings.l2_flush, eager_nodes_only=True),
            CudaEventTimer(device, l2_flush=settings.l2_flush),
        )
    if kind == "cuda-event":
        return CudaEventTimer(device, l2_flush=settings.l2_flush)
    if kind == "cuda-graph":
        return CudaGraphTimer(device, l2_flush=settings.l2_flush)
    raise ValueError(f"timer {kind!r} does not run on a CUDA device")


def make_cross_timers(device: torch.device, settings: MeasurementSpec) -> dict[str, Timer]:
    """The other timing method for each GPU method, for the cell's cross-check
    (``kernelab.runners.engine.cross_check``): ``{"cuda-graph": CudaEventTimer, "cuda-event":
    CudaGraphTimer}``, keyed by the kind that times a side. The event timer runs hot (one event
    pair around the window, behind the spin kernel, no per-launch flush: the graph timer flushes
    once per replay, so the two differ only by one cold launch per sample); the graph timer keeps
    ``eager_nodes_only`` (a graph that would replay memcpy/memset nodes unlike the eager call is no
    second opinion: ``TimerUnsupported``) and the spec's ``l2_flush``. Empty on a CPU (one method)
    or when the spec turns the cross-check off. Raises ``RuntimeError`` for a CUDA device when
    CUDA is not available."""
    if device.type != "cuda" or not settings.cross_check:
        return {}
    return {
        "cuda-graph": CudaEventTimer(device, l2_flush=False),
        "cuda-event": CudaGraphTimer(device, l2_flush=settings.l2_flush, eager_nodes_only=True),
    }
