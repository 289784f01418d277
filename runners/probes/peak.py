"""Matmul peak of a GPU: the FLOP/s bound of the plausibility guard, measured once per process.

``measure_matmul_peak(device)`` times a dense bf16 ``torch.mm`` of 8192 x 8192 x 8192 (2 * 8192^3
= 1.1 TFLOP per launch) with one CUDA event pair around ``launches`` back-to-back launches, after
warm-up launches, and keeps the fastest of ``repeats`` windows: a peak is an upper bound, so the
burst right after idle (which reads ~9% faster than the sustained rate on an H200) is the right
reading, not a problem. The result is cached
per device for the life of the process (``run_probes`` calls it before and after every job).

On an H200 this reads ~790 TFLOP/s (datasheet dense bf16: 989 TFLOP/s) and costs ~0.1 s. The bound
holds for kernels whose operands are 16 bits or wider; an 8-bit (fp8/int8) kernel can exceed it
up to 2x and would be flagged ``implausible`` wrongly, so declare such work in bf16-equivalent
FLOPs or pass ``peaks`` to ``kernelab.service.judge.stats.compare``.

On a CPU (for tests) the same measurement runs in float32 with ``time.perf_counter_ns``;
``run_probes`` does not measure CPUs, whose rates the guard does not bound.
"""

from __future__ import annotations

import functools
import time

import torch

from kernelab.service.contract.schemas import MatmulPeakReading

GPU_SIZE = 8192  # bf16 8192^3: large enough for the tensor cores to reach their peak
_WARMUP_LAUNCHES = 3
_LAUNCHES = 8  # per timed window: ~11 ms on an H200, far above event resolution (~0.5 us)
_REPEATS = 3


def _timed_ns(device: torch.device, fn: object, launches: int) -> float:
    """Nanoseconds for ``launches`` calls of ``fn`` (events on CUDA, perf_counter on a CPU)."""
    assert callable(fn)
    if device.type == "cuda":
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            fn()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) * 1e6
    t0 = time.perf_counter_ns()
    for _ in range(launches):
        fn()
    return float(time.perf_counter_ns() - t0)


def measure_matmul_peak(
    device: torch.device,
    *,
    size: int | None = None,
    dtype: torch.dtype | None = None,
    launches: int = _LAUNCHES,
    repeats: int = _REPEATS,
) -> MatmulPeakReading:
    """Dense matmul rate of ``device``: ``(size, size) @ (size, size)`` of ``dtype``, row-major.

    Defaults: 8192 and bfloat16 on CUDA, 256 and float32 on a CPU. TFLOP/s = 2 * size^3 /
    (fastest window / launches) / 1e12. Raises ``ValueError`` for ``size``, ``launches`` or
    ``repeats`` below 1; ``torch.OutOfMemoryError`` when the three matrices do not fit.
    """
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    size = size if size is not None else (GPU_SIZE if device.type == "cuda" else 256)
    dtype = dtype if dtype is not None else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if min(size, launches, repeats) < 1:
        raise ValueError(f"size, launches and repeats must be >= 1, got {size}, {launches}, {repeats}")
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    c = torch.empty_like(a)

    def mm() -> None:
        torch.mm(a, b, out=c)

    for _ in range(_WARMUP_LAUNCHES):
        mm()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    best_ns = min(_timed_ns(device, mm, launches) for _ in range(repeats))
    per_launch_ns = max(best_ns / launches, 1e-3)
    return MatmulPeakReading(
        device_index=device.index or 0,
        dtype=str(dtype).removeprefix("torch."),
        m=size,
        n=size,
        k=size,
        launches=launches,
        time_us=per_launch_ns / 1e3,
        tflops=2 * size**3 / per_launch_ns / 1e3,
    )


@functools.cache
def cached_matmul_peak(device_index: int) -> MatmulPeakReading:
    """``measure_matmul_peak`` of CUDA device ``device_index``, measured once per process.

    Raises ``RuntimeError`` when torch sees no CUDA GPU."""
    if not torch.cuda.is_available():
        raise RuntimeError("a CUDA matmul peak was asked for, but torch sees no CUDA GPU")
    with torch.cuda.device(device_index):
        reading = measure_matmul_peak(torch.device("cuda", device_index))
        torch.cuda.empty_cache()
    return reading
