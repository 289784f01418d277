"""Does a call launch device work? Counted with PyTorch's profiler (Kineto over CUPTI).

A timed call that launches no kernel, copy or memset is no timing, whatever the benchmark
declares: a result cached on the host, a call that returns early on most invocations. A CUDA graph
captured from such calls is empty (``runners.timing.CudaGraphTimer.empty_capture``); this module
sees the eager calls: each of ``calls`` calls runs alone inside its own ``torch.profiler.profile``
session on an idle device, and the device activities the profiler records for it (kernels,
memcpys, memsets; ``DeviceType.CUDA`` events) are counted.

Sources: ``torch.profiler`` (Kineto's CUPTI activity records, each a ``_KinetoEvent`` with
``device_type()``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)
PROFILED_CALLS = 3


def device_work_per_call(
    fn: Callable[[], Any], device: torch.device, *, calls: int = PROFILED_CALLS
) -> list[int] | None:
    """Device activities (kernels, copies, memsets) each of ``calls`` calls of ``fn`` launched, in
    order; None where the profiler cannot count them (no CUDA, no CUPTI, a profiler already
    running). Whatever ``fn`` raises propagates."""
    if device.type != "cuda":
        return None
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return None
    counts: list[int] = []
    for _ in range(calls):
        torch.cuda.synchronize(device)
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize(device)
        except RuntimeError as exc:  # e.g. "Profiler is already enabled", CUPTI unavailable
            log.info("device work not counted: %s", exc)
            return None
        results = prof.profiler.kineto_results if prof.profiler is not None else None
        if results is None:
            return None
        counts.append(sum(1 for e in results.events() if e.device_type() == DeviceType.CUDA))
    return counts
