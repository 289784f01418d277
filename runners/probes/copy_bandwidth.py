"""Device-local copy bandwidth, counting bytes read + bytes written (as nvbandwidth does).

CUDA, per visible GPU: a buffer at least 8x the device's L2 (so the copy streams from HBM, not
from cache), ``copies_per_sample`` copies between one event pair queued behind a spin kernel
(``torch.cuda._sleep``) so the host's enqueue latency stays out of the window, the median of
``samples`` samples. This is nvbandwidth's method (spin kernel, 16 copies per event pair, median
of 3; NVIDIA's nvbandwidth, github.com/NVIDIA/nvbandwidth). On an H200 a 4 GiB ``copy_`` measured
this way moves ~4.2 TB/s; the HBM3e datasheet says 4.8 TB/s.

CPU: the same idea with host tensors and ``time.perf_counter_ns``, the buffer sized from the
last-level cache and clamped to 64-256 MiB so the probe stays well under a second.
"""

from __future__ import annotations

import statistics
import time

import torch

from kernelab.runners.probes.node import cpu_cache_bytes
from kernelab.service.contract.schemas import CopyBandwidthReading, PeerCopyReading

MIB = 1024**2
L2_MULTIPLE = 8  # buffer >= 8x the cache it must not fit in
CUDA_MIN_SIZE_BYTES = 512 * MIB  # above 8x L2 of every current GPU (H200: 60 MiB L2 -> 480 MiB)
CPU_MIN_SIZE_BYTES = 64 * MIB
CPU_MAX_SIZE_BYTES = 256 * MIB
CUDA_COPIES_PER_SAMPLE = 16  # nvbandwidth
CUDA_SAMPLES = 5
CPU_COPIES_PER_SAMPLE = 2
CPU_SAMPLES = 3
SPIN_MS = 2.0  # spin kernel length: longer than the host takes to enqueue one sample's copies
_FALLBACK_CLOCK_KHZ = 2_000_000  # used to size the spin when the device does not report its clock


def copy_bandwidth_gbps(size_bytes: int, time_ns: float) -> float:
    """Bandwidth in GB/s (1e9 B/s) of one copy of ``size_bytes`` taking ``time_ns`` nanoseconds.

    A copy reads ``size_bytes`` and writes ``size_bytes``, so the traffic is ``2 * size_bytes``;
    bytes per nanosecond equal GB/s. Raises ``ValueError`` for a non-positive time or a negative size.
    """
    if time_ns <= 0:
        raise ValueError(f"a copy takes positive time, got {time_ns} ns")
    if size_bytes < 0:
        raise ValueError(f"size_bytes must be >= 0, got {size_bytes}")
    return 2 * size_bytes / time_ns


def cuda_copy_size_bytes(l2_bytes: int) -> int:
    """Buffer size for a device copy: max(8 x L2, 512 MiB), rounded up to a whole MiB."""
    size = max(L2_MULTIPLE * l2_bytes, CUDA_MIN_SIZE_BYTES)
    return -(-size // MIB) * MIB


def cpu_copy_size_bytes(llc_bytes: int | None) -> int:
    """Buffer size for a host copy: 8 x the last-level cache clamped to [64 MiB, 256 MiB]."""
    wanted = L2_MULTIPLE * llc_bytes if llc_bytes else CPU_MIN_SIZE_BYTES
    size = min(max(wanted, CPU_MIN_SIZE_BYTES), CPU_MAX_SIZE_BYTES)
    return -(-size // MIB) * MIB


def _check_counts(copies_per_sample: int, samples: int) -> None:
    if copies_per_sample < 1 or samples < 1:
        raise ValueError(f"copies_per_sample and samples must be >= 1, got {copies_per_sample}, {samples}")


def measure_cuda_copy(
    index: int,
    *,
    size_bytes: int | None = None,
    copies_per_sample: int = CUDA_COPIES_PER_SAMPLE,
    samples: int = CUDA_SAMPLES,
    spin_ms: float = SPIN_MS,
) -> CopyBandwidthReading:
    """Copy bandwidth of CUDA device ``index``: ``uint8`` buffers of ``size_bytes`` (None: 8x L2).

    ``time_us`` is the median over ``samples`` of (event-pair time / ``copies_per_sample``).
    Raises ``RuntimeError`` without CUDA or when the two buffers do not fit in free memory,
    ``ValueError`` for counts < 1. Frees its buffers (and the allocator's cache) before returning.
    """
    _check_counts(copies_per_sample, samples)
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA copy bandwidth asked for, but torch sees no CUDA GPU")
    device = torch.device("cuda", index)
    props = torch.cuda.get_device_properties(index)
    size = size_bytes if size_bytes is not None else cuda_copy_size_bytes(int(props.L2_cache_size))
    free_bytes, _ = torch.cuda.mem_get_info(device)
    if 2 * size > free_bytes:
        raise RuntimeError(f"cuda:{index} has {free_bytes} B free, the copy needs 2 x {size} B")
    clock_khz = getattr(props, "clock_rate", 0) or _FALLBACK_CLOCK_KHZ
    spin_cycles = int(spin_ms * clock_khz)  # ms x kHz = cycles
    times_ns: list[float] = []
    with torch.cuda.device(index):
        src = torch.empty(size, dtype=torch.uint8, device=device).fill_(0x5A)
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up: first touch, copy kernel selection
        torch.cuda.synchronize(device)
        for _ in range(samples):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(spin_cycles)
            start.record()
            for _ in range(copies_per_sample):
                dst.copy_(src)
            stop.record()
            stop.synchronize()
            times_ns.append(start.elapsed_time(stop) * 1e6 / copies_per_sample)  # ms -> ns
        del src, dst
        torch.cuda.empty_cache()
    time_ns = statistics.median(times_ns)
    return CopyBandwidthReading(
        device_index=index,
        size_bytes=size,
        time_us=time_ns / 1e3,
        bandwidth_gbps=copy_bandwidth_gbps(size, time_ns),
    )


def measure_cpu_copy(
    *,
    size_bytes: int | None = None,
    copies_per_sample: int = CPU_COPIES_PER_SAMPLE,
    samples: int = CPU_SAMPLES,
) -> CopyBandwidthReading:
    """Host copy bandwidth: ``uint8`` tensors of ``size_bytes`` (None: ``cpu_copy_size_bytes``).

    ``perf_counter_ns`` around ``copies_per_sample`` copies (torch's intra-op threads), median
    over ``samples``; ``device_index`` 0. Raises ``ValueError`` for counts < 1.
    """
    _check_counts(copies_per_sample, samples)
    size = size_bytes if size_bytes is not None else cpu_copy_size_bytes(cpu_cache_bytes())
    src = torch.empty(size, dtype=torch.uint8).fill_(0x5A)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: page faults of dst happen here, not in the window
    times_ns: list[float] = []
    for _ in range(samples):
        t0 = time.perf_counter_ns()
        for _ in range(copies_per_sample):
            dst.copy_(src)
        times_ns.append((time.perf_counter_ns() - t0) / copies_per_sample)
    time_ns = statistics.median(times_ns)
    return CopyBandwidthReading(
        device_index=0,
        size_bytes=size,
        time_us=time_ns / 1e3,
        bandwidth_gbps=copy_bandwidth_gbps(size, time_ns),
    )


def measure_copy_bandwidth(
    device_type: str | None = None, *, size_bytes: int | None = None
) -> list[CopyBandwidthReading]:
    """Copy bandwidth of every visible GPU (``"cuda"``) or of the host (``"cpu"``).

    ``device_type`` None picks CUDA when available. ``size_bytes`` overrides the buffer size.
    Raises ``RuntimeError`` for CUDA on a node without it, ``ValueError`` for another device type.
    """
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA copy bandwidth asked for, but torch sees no CUDA GPU")
        return [measure_cuda_copy(i, size_bytes=size_bytes) for i in range(torch.cuda.device_count())]
    if device_type == "cpu":
        return [measure_cpu_copy(size_bytes=size_bytes)]
    raise ValueError(f"device type {device_type!r} is not supported; use 'cuda' or 'cpu'")


PEER_SIZE_BYTES = 256 * MIB
PEER_COPIES_PER_SAMPLE = 8
PEER_SAMPLES = 3


def measure_peer_copy(
    *,
    size_bytes: int = PEER_SIZE_BYTES,
    copies_per_sample: int = PEER_COPIES_PER_SAMPLE,
    samples: int = PEER_SAMPLES,
    spin_ms: float = SPIN_MS,
) -> list[PeerCopyReading]:
    """Copy bandwidth from every visible GPU to every other (ordered pairs), ``uint8`` buffers of
    ``size_bytes``; ``peer_access`` from ``torch.cuda.can_device_access_peer`` (no peer access: the
    driver stages through the host and the reading shows it). Timed on the source's stream with
    events behind a spin kernel, median of ``samples`` of (event time / ``copies_per_sample``);
    bandwidth counts the bytes once (nvbandwidth's device-to-device copy convention).
    Empty with fewer than 2 GPUs. Raises ``RuntimeError`` without CUDA, ``ValueError`` for counts < 1.
    """
    _check_counts(copies_per_sample, samples)
    if not torch.cuda.is_available():
        raise RuntimeError("peer copy bandwidth asked for, but torch sees no CUDA GPU")
    n = torch.cuda.device_count()
    out: list[PeerCopyReading] = []
    for src_index in range(n):
        props = torch.cuda.get_device_properties(src_index)
        spin_cycles = int(spin_ms * (getattr(props, "clock_rate", 0) or _FALLBACK_CLOCK_KHZ))
        for dst_index in range(n):
            if dst_index == src_index:
                continue
            peer = bool(torch.cuda.can_device_access_peer(src_index, dst_index))
            with torch.cuda.device(src_index):
                src = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{src_index}").fill_(0x5A)
                dst = torch.empty(size_bytes, dtype=torch.uint8, device=f"cuda:{dst_index}")
                dst.copy_(src)  # warm-up: peer mapping, first touch
                torch.cuda.synchronize(src_index)
                torch.cuda.synchronize(dst_index)
                times_ns = []
                for _ in range(samples):
                    start = torch.cuda.Event(enable_timing=True)
                    stop = torch.cuda.Event(enable_timing=True)
                    torch.cuda._sleep(spin_cycles)
                    start.record()
                    for _ in range(copies_per_sample):
                        dst.copy_(src, non_blocking=True)
                    stop.record()
                    stop.synchronize()
                    times_ns.append(start.elapsed_time(stop) * 1e6 / copies_per_sample)
                del src, dst
            time_ns = statistics.median(times_ns)
            out.append(
                PeerCopyReading(
                    src_device=src_index,
                    dst_device=dst_index,
                    peer_access=peer,
                    size_bytes=size_bytes,
                    time_us=time_ns / 1e3,
                    bandwidth_gbps=size_bytes / time_ns,
                )
            )
    torch.cuda.empty_cache()
    return out
