"""Who else uses the GPU while a cell is measured: NVML process lists, read at each CI check.

``GpuContentionMonitor`` implements ``kernelab.runners.engine.ContentionMonitor``: the engine calls
``check(rounds)`` before the first round, at each CI check (a geometric schedule, so a handful
of readings per cell) and after the last round; ``kernelab.runners.job`` collects the readings into
``CellResult.contention`` and ``kernelab.service.judge.stats`` flags the cell ``contended`` when a reading
shows
a process that is not ours. One reading costs two NVML calls (compute processes, and per-process
SM utilisation since the previous reading), tens to hundreds of microseconds, outside any timed
window.

A reading lists every process seen on the GPU: the compute processes (``nvmlDeviceGet
ComputeRunningProcesses``: any process with a context, busy or idle, holding memory) merged by
pid with the processes that have SM-utilisation samples since the previous reading
(``nvmlDeviceGetProcessUtilization``: catches short-lived work from a process that ended between
two readings). Without NVML (a CPU node, no driver, no permission) no reading is recorded:
"unknown" is never reported as "uncontended" evidence.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from kernelab.runners.probes.telemetry import open_device, own_pids
from kernelab.service.contract.schemas import ContentionReading

logger = logging.getLogger(__name__)

_NS_PER_US = 1000  # NVML utilisation timestamps are CPU time in microseconds since the epoch


def merge_processes(
    compute: Iterable[tuple[int, int | None]],
    utilisation: Iterable[tuple[int, float]],
    own_pid: int | Iterable[int],
) -> list[dict[str, Any]]:
    """One entry per pid: ``{"pid", "own", "used_memory_bytes", "sm_util_pct"}``, sorted by pid.

    ``compute``: ``(pid, used memory in bytes or None)`` per compute process; ``utilisation``:
    ``(pid, SM utilisation in percent)`` per NVML sample (a pid may have several: the highest is
    kept). ``sm_util_pct`` is None for a process without samples, ``used_memory_bytes`` None for
    a process seen only in the samples. ``own`` is ``pid in own_pid`` (one pid or several: this
    runner's processes, ``telemetry.own_pids``).
    """
    own = {own_pid} if isinstance(own_pid, int) else set(own_pid)
    merged: dict[int, dict[str, Any]] = {}
    for pid, used in compute:
        merged[pid] = {"pid": pid, "own": pid in own, "used_memory_bytes": used, "sm_util_pct": None}
    for pid, util in utilisation:
        entry = merged.setdefault(
            pid, {"pid": pid, "own": pid in own, "used_memory_bytes": None, "sm_util_pct": None}
        )
        entry["sm_util_pct"] = max(float(util), entry["sm_util_pct"] or 0.0)
    return [merged[pid] for pid in sorted(merged)]


class GpuContentionMonitor:
    """Reads the processes on CUDA device ``device_index`` (None: a CPU run, no readings).

    ``start()`` begins a cell (drops earlier readings, utilisation is counted from now);
    ``check(rounds)`` appends one ``ContentionReading``; ``take()`` returns and clears them.
    ``status`` is ``"ok"`` or why nothing is read. Never raises after construction.
    """

    def __init__(self, device_index: int | None) -> None:
        self.device_index = device_index
        self.readings: list[ContentionReading] = []
        self._nvml: ModuleType | None = None
        self._handle: Any = None
        self._since_us = 0
        nvml, self._handle, self.status = open_device(device_index)
        if nvml is None:
            return
        self._nvml = nvml
        self.start()

    @property
    def available(self) -> bool:
        """Whether readings come from NVML."""
        return self._nvml is not None

    def start(self) -> None:
        """Begin a cell: no readings yet; utilisation samples count from this moment."""
        self.readings = []
        self._since_us = time.time_ns() // _NS_PER_US

    def _compute(self, nvml: ModuleType) -> list[tuple[int, int | None]]:
        try:
            procs = nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except nvml.NVMLError:
            return []
        out = []
        for p in procs:
            used = getattr(p, "usedGpuMemory", None)
            out.append((int(p.pid), int(used) if used is not None else None))
        return out

    def _utilisation(self, nvml: ModuleType) -> list[tuple[int, float]]:
        since, self._since_us = self._since_us, time.time_ns() // _NS_PER_US
        try:
            samples = nvml.nvmlDeviceGetProcessUtilization(self._handle, since)
        except nvml.NVMLError:  # NOT_FOUND: no sample since ``since``; NOT_SUPPORTED: none at all
            return []
        return [(int(s.pid), float(s.smUtil)) for s in samples if int(s.timeStamp) >= since]

    def check(self, rounds: int) -> None:
        """Append the processes seen now, tagged with ``rounds`` completed. Never raises."""
        nvml = self._nvml
        if nvml is None:
            return
        try:
            processes = merge_processes(self._compute(nvml), self._utilisation(nvml), own_pids())
        except Exception:  # a monitoring failure must not lose the cell's measurement
            logger.exception("contention reading failed")
            return
        self.readings.append(ContentionReading(round=rounds, processes=processes))

    def take(self) -> list[ContentionReading]:
        """The readings since ``start``; clears them."""
        out, self.readings = self.readings, []
        return out

    def __repr__(self) -> str:
        return (
            f"<GpuContentionMonitor device={self.device_index} status={self.status!r} "
            f"readings={len(self.readings)}>"
        )
