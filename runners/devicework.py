"""Does a call launch device work? Counted with PyTorch's profiler (Kineto over CUPTI).

A timed call that launches no kernel, copy or memset is no timing, whatever the benchmark
declares: a result cached on the host, a call that returns early on most invocations. A CUDA graph
captured from such calls is empty (``kernelab.runners.timing.CudaGraphTimer.empty_capture``); this module
sees eager calls: ``calls`` calls, each inside a ``torch.profiler.record_function`` range and
followed by a device synchronize, in one ``torch.profiler.profile`` session. Each device activity
the profiler records (kernels, memcpys, memsets: ``DeviceType.CUDA`` events) is attributed to the
call whose range holds the host-side launch it is linked to (CUPTI's correlation id), so the count
per call does not depend on how the device and host clocks are aligned.

Sources: ``torch.profiler`` (Kineto's CUPTI activity records, ``_KinetoEvent``: ``device_type``,
``correlation_id``, ``linked_correlation_id``, ``start_ns``).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable
from typing import Any

import torch

log = logging.getLogger(__name__)
PROFILED_CALLS = 3
_RANGE = "kernelab-call-"


def device_work_per_call(
    fn: Callable[[], Any], device: torch.device, *, calls: int = PROFILED_CALLS
) -> list[int] | None:
    """Device activities (kernels, copies, memsets) each of ``calls`` calls of ``fn`` launched, in
    order; None where the profiler cannot count them (no CUDA, no CUPTI, a profiler already
    running) or cannot attribute every activity to a call. Whatever ``fn`` raises propagates."""
    if device.type != "cuda":
        return None
    try:
        from torch.autograd import DeviceType
        from torch.profiler import ProfilerActivity, profile, record_function
    except ImportError:
        return None
    torch.cuda.synchronize(device)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for i in range(calls):
                with record_function(f"{_RANGE}{i}"):
                    fn()
                    torch.cuda.synchronize(device)
    except RuntimeError as exc:  # e.g. "Profiler is already enabled", CUPTI unavailable
        log.info("device work not counted: %s", exc)
        return None
    results = prof.profiler.kineto_results if prof.profiler is not None else None
    if results is None:
        return None
    events = results.events()
    ranges = sorted(
        (e.start_ns(), e.end_ns(), int(e.name()[len(_RANGE) :]))
        for e in events
        if e.device_type() == DeviceType.CPU and e.name().startswith(_RANGE)
    )
    if len(ranges) != calls:
        return None
    launch_ns = {
        e.correlation_id(): e.start_ns()
        for e in events
        if e.device_type() == DeviceType.CPU and e.correlation_id()
    }
    starts = [r[0] for r in ranges]
    counts = [0] * calls
    for e in events:
        if e.device_type() != DeviceType.CUDA or e.name().startswith(_RANGE):
            continue  # a range's own mark on the device timeline is no work
        t = launch_ns.get(e.linked_correlation_id())
        if t is None:
            return None  # an activity not linked to a launch: cannot attribute it
        i = bisect.bisect_right(starts, t) - 1
        if i < 0 or t > ranges[i][1]:
            return None  # launched outside every call's range
        counts[ranges[i][2]] += 1
    return counts
