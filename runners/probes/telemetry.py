"""NVML telemetry: clocks, clock-event reasons, temperatures, power, ECC, other processes.

NVML is read through ``pynvml`` (the ``nvidia-ml-py`` distribution), imported lazily: on a node
without it (a CPU-only CI box) every reading is ``None`` and the status is ``"absent"``; nothing
is ever reported as zero because it could not be read.

Two entry points:

* ``read_telemetry()`` -> ``(list[GpuTelemetry], nvml_status)``: a full snapshot per GPU, taken
  before and after a job (``kernelab.runners.probes.run_probes``).
* ``ContextSampler(device_index)``: the cheap per-sample reader the measurement engine calls
  around every timed sample (SM clock, clock-event reasons, temperature, power).

GPU indices are CUDA indices (as ``torch.cuda`` numbers them, after ``CUDA_VISIBLE_DEVICES``); they
are mapped to NVML handles through the device UUID, because NVML numbers all GPUs of the host in
PCI order.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, TypeVar

from kernelab.service.contract import clock_events
from kernelab.service.contract.schemas import GpuTelemetry

T = TypeVar("T")

# Clock-event ("throttle") reason bits and the throttle/informational split:
# ``kernelab.service.contract.clock_events``,
# shared with the server's statistics and node health (one rule).
CLOCK_EVENT_REASONS: dict[int, str] = clock_events.NAMES
THROTTLE_REASONS_MASK = clock_events.THROTTLE_MASK

STATUS_OK = "ok"
STATUS_ABSENT = "absent"

_MW_PER_W = 1000.0  # NVML reports power in milliwatts
_NVML_MEMORY_TEMP_FIELD = 82  # NVML_FI_DEV_MEMORY_TEMP (nvml.h)
# c_nvmlFieldValue_t.valueType -> union member (nvml.h nvmlValueType_t)
_FIELD_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}
# nvmlInit errors that mean "no NVIDIA driver here" rather than "NVML is broken".
_ABSENT_ERRORS = ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded")

_nvml_initialised = False


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used here. ``status`` is ``"absent"`` or the error text."""

    def __init__(self, status: str):
        super().__init__(status)
        self.status = status


def decode_clock_event_reasons(mask: int) -> list[str]:
    """Names of the bits set in an NVML clock-event-reasons bitmask, lowest bit first
    (``kernelab.service.contract.clock_events.decode``): unnamed bits read ``"unknown_0x<bit>"``, a DCGM blank
    placeholder reads as no reasons. Raises ``ValueError`` for a negative mask."""
    return clock_events.decode(mask)


def is_throttled(mask: int | None) -> bool:
    """True when ``mask`` holds a power, thermal or hardware-slowdown reason
    (``kernelab.service.contract.clock_events.is_throttled``); None or a placeholder is False."""
    return clock_events.is_throttled(mask)


def load_nvml() -> ModuleType:
    """Import ``pynvml`` and initialise NVML once per process.

    Raises ``NvmlUnavailable("absent")`` when the package or the driver library is missing, and
    ``NvmlUnavailable(<error text>)`` when NVML is present but fails to initialise.
    """
    global _nvml_initialised
    try:
        with warnings.catch_warnings():
            # The old ``pynvml`` wrapper distribution warns on import that it is deprecated.
            warnings.simplefilter("ignore")
            import pynvml
    except ImportError as exc:
        raise NvmlUnavailable(STATUS_ABSENT) from exc
    if not _nvml_initialised:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            if type(exc).__name__ in _ABSENT_ERRORS:
                raise NvmlUnavailable(STATUS_ABSENT) from exc
            raise NvmlUnavailable(f"nvmlInit failed: {exc}") from exc
        _nvml_initialised = True
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(nvml: ModuleType, fn: Callable[[], T]) -> T | None:
    """``fn()``, or None when NVML says the reading is not supported or not permitted."""
    try:
        return fn()
    except nvml.NVMLError:
        return None


def _cuda_uuid(index: int) -> str | None:
    """NVML-style UUID (``GPU-...``) of CUDA device ``index``, or None without CUDA torch."""
    try:
        import torch

        if not torch.cuda.is_available():
            return None
        raw = str(torch.cuda.get_device_properties(index).uuid)
    except (ImportError, RuntimeError, AssertionError):
        return None
    return raw if raw.startswith(("GPU-", "MIG-")) else f"GPU-{raw}"


def nvml_handle(nvml: ModuleType, device_index: int) -> Any:
    """NVML handle of CUDA device ``device_index``: by UUID when torch sees CUDA, else by NVML index.

    Raises ``nvml.NVMLError`` when no such GPU exists.
    """
    uuid = _cuda_uuid(device_index)
    if uuid is not None:
        try:
            return nvml.nvmlDeviceGetHandleByUUID(uuid)
        except nvml.NVMLError:
            pass
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


def _device_indices(nvml: ModuleType) -> list[int]:
    try:
        import torch

        if torch.cuda.is_available():
            return list(range(torch.cuda.device_count()))
    except ImportError:
        pass
    return list(range(nvml.nvmlDeviceGetCount()))


def _clock_event_reasons(nvml: ModuleType, handle: Any) -> int | None:
    # Renamed in CUDA 12.2's NVML; older nvidia-ml-py only has the "Throttle" name.
    getter = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    if getter is None:
        getter = nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    return _try(nvml, lambda: int(getter(handle)))


def _memory_temperature_c(nvml: ModuleType, handle: Any) -> float | None:
    values = _try(nvml, lambda: nvml.nvmlDeviceGetFieldValues(handle, [_NVML_MEMORY_TEMP_FIELD]))
    if not values or values[0].nvmlReturn != 0:
        return None
    member = _FIELD_VALUE_MEMBERS.get(int(values[0].valueType))
    if member is None:
        return None
    value = float(getattr(values[0].value, member))
    return value if value > 0 else None  # boards without an HBM sensor answer 0


# Processes of this runner besides the current one that hold GPU contexts (the persistent
# all-reduce ranks of ``kernelab.runners.probes.all_reduce.AllReducePool``): registered in-process, or
# handed to a job's worker process in ``POOL_ENV`` (JSON with a "pids" list) by the daemon.
_OWN_PIDS: set[int] = set()
POOL_ENV = "KERNELAB_ALL_REDUCE_POOL"


def register_own_pids(pids: Iterable[int]) -> None:
    """Count ``pids`` as this runner's own GPU processes (never as another tenant)."""
    _OWN_PIDS.update(int(p) for p in pids)


def unregister_own_pids(pids: Iterable[int]) -> None:
    """Undo ``register_own_pids`` for ``pids`` (their processes have ended)."""
    _OWN_PIDS.difference_update(int(p) for p in pids)


OWN_PIDS_ENV = "KERNELAB_OWN_PIDS"  # comma-separated pids of kernelab processes above this one


def own_pids() -> frozenset[int]:
    """This process, the pids registered with ``register_own_pids``, those of ``POOL_ENV`` and of
    ``OWN_PIDS_ENV`` (the job's orchestrating process, ``kernelab.runners.measure``)."""
    pids = {os.getpid(), *_OWN_PIDS}
    for part in os.environ.get(OWN_PIDS_ENV, "").split(","):
        if part.strip().isdigit():
            pids.add(int(part))
    raw = os.environ.get(POOL_ENV)
    if raw:
        try:
            pids.update(int(p) for p in json.loads(raw).get("pids", []))
        except (ValueError, TypeError, AttributeError):
            pass  # a malformed hand-over only loses the own-marking, never the reading
    return frozenset(pids)


def _other_processes(nvml: ModuleType, handle: Any) -> list[dict[str, Any]]:
    procs = _try(nvml, lambda: nvml.nvmlDeviceGetComputeRunningProcesses(handle)) or []
    own = own_pids()
    out = []
    for proc in procs:
        used = getattr(proc, "usedGpuMemory", None)
        out.append(
            {
                "pid": int(proc.pid),
                "used_memory_bytes": int(used) if used is not None else None,
                "own": int(proc.pid) in own,
            }
        )
    return out


def gpu_telemetry(nvml: ModuleType, device_index: int) -> GpuTelemetry:
    """One GPU's NVML snapshot. Every field NVML refuses (not supported, no permission) stays None.

    Units: clocks MHz, temperatures degrees C, power W (NVML's mW / 1000), memory bytes.
    ``other_processes``: ``{"pid", "used_memory_bytes", "own"}`` per compute process, ``own`` True
    for this runner's processes (``own_pids``; in a container NVML may report host PIDs, so
    ``own`` can be False for us).
    Raises ``nvml.NVMLError`` when the GPU itself cannot be opened.
    """
    h = nvml_handle(nvml, device_index)
    reasons = _clock_event_reasons(nvml, h)
    power_mw = _try(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(h))
    limit_mw = _try(nvml, lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(h))
    util = _try(nvml, lambda: nvml.nvmlDeviceGetUtilizationRates(h))
    mem = _try(nvml, lambda: nvml.nvmlDeviceGetMemoryInfo(h))
    ecc = _try(
        nvml,
        lambda: nvml.nvmlDeviceGetTotalEccErrors(
            h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        ),
    )
    sm = _try(nvml, lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
    mem_clock = _try(nvml, lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))
    max_sm = _try(nvml, lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM))
    temp = _try(nvml, lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
    return GpuTelemetry(
        device_index=device_index,
        name=_text(_try(nvml, lambda: nvml.nvmlDeviceGetName(h)) or ""),
        uuid=_text(_try(nvml, lambda: nvml.nvmlDeviceGetUUID(h)) or ""),
        sm_clock_mhz=float(sm) if sm is not None else None,
        mem_clock_mhz=float(mem_clock) if mem_clock is not None else None,
        max_sm_clock_mhz=float(max_sm) if max_sm is not None else None,
        clock_event_reasons=reasons,
        clock_event_reason_names=decode_clock_event_reasons(reasons) if reasons is not None else [],
        temperature_c=float(temp) if temp is not None else None,
        memory_temperature_c=_memory_temperature_c(nvml, h),
        power_w=power_mw / _MW_PER_W if power_mw is not None else None,
        power_limit_w=limit_mw / _MW_PER_W if limit_mw is not None else None,
        utilization_pct=float(util.gpu) if util is not None else None,
        memory_used_bytes=int(mem.used) if mem is not None else None,
        ecc_volatile_uncorrected=int(ecc) if ecc is not None else None,
        other_processes=_other_processes(nvml, h),
    )


def read_telemetry() -> tuple[list[GpuTelemetry], str]:
    """Snapshot of every GPU this process can see: ``(readings, nvml_status)``.

    ``nvml_status`` is ``"ok"``, ``"absent"`` (no ``pynvml`` or no NVIDIA driver: readings empty)
    or the error text. Never raises for NVML trouble; a GPU that cannot be opened ends the
    snapshot with its error as the status and the readings taken so far.
    """
    try:
        nvml = load_nvml()
    except NvmlUnavailable as exc:
        return [], exc.status
    readings: list[GpuTelemetry] = []
    try:
        for index in _device_indices(nvml):
            readings.append(gpu_telemetry(nvml, index))
    except nvml.NVMLError as exc:
        return readings, f"NVML error: {exc}"
    return readings, STATUS_OK


def exclusive_gpus(device_count: int) -> list[int]:
    """CUDA device indices (of ``0..device_count-1``) in an exclusive compute mode (NVML
    ``EXCLUSIVE_PROCESS`` or ``EXCLUSIVE_THREAD``), where a second process cannot create a context.
    Empty when NVML is absent or refuses the query: unknown is not exclusive."""
    try:
        nvml = load_nvml()
    except NvmlUnavailable:
        return []
    out = []
    for index in range(device_count):

        def compute_mode(i: int = index) -> int:
            return int(nvml.nvmlDeviceGetComputeMode(nvml_handle(nvml, i)))

        mode = _try(nvml, compute_mode)  # NVMLError (not supported / no permission): unknown
        if mode is None:
            continue
        exclusive = (
            nvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS,
            getattr(nvml, "NVML_COMPUTEMODE_EXCLUSIVE_THREAD", 1),
        )
        if mode in exclusive:
            out.append(index)
    return out


def open_device(device_index: int | None) -> tuple[ModuleType | None, Any, str]:
    """``(nvml, handle, status)`` for one CUDA device, for the per-sample readers.

    ``nvml`` and ``handle`` are None when nothing can be read: no device (a CPU run, status
    ``"no device"``), NVML absent (``NvmlUnavailable``'s status) or an NVML error for this device
    (``"NVML error: ..."``); otherwise status is ``"ok"``. Never raises.
    """
    if device_index is None:
        return None, None, "no device"
    try:
        nvml = load_nvml()
        handle = nvml_handle(nvml, device_index)
    except NvmlUnavailable as exc:
        return None, None, exc.status
    except Exception as exc:  # pynvml.NVMLError (e.g. a missing GPU): the reader degrades to None
        return None, None, f"NVML error: {exc}"
    return nvml, handle, STATUS_OK


class ContextSampler:
    """Cheap per-sample context of one GPU: SM clock, clock-event reasons, temperature, power.

    ``device_index`` is a CUDA index, or None for a CPU run (every reading None). Without NVML all
    readings are None and ``status`` says why; ``expected_sm_clock_mhz`` is NVML's maximum SM
    clock (the clock a busy, unthrottled GPU runs at: 1980 MHz on an H200), or None. One
    ``read()`` costs four NVML calls (tens of microseconds); call it outside the timed window.
    """

    KEYS = ("sm_clock_mhz", "clock_event_reasons", "temperature_c", "power_w")

    def __init__(self, device_index: int | None):
        self.device_index = device_index
        self.expected_sm_clock_mhz: float | None = None
        self._nvml: ModuleType | None = None
        self._handle: Any = None
        nvml, self._handle, self.status = open_device(device_index)
        if nvml is None:
            return
        self._nvml = nvml
        max_sm = _try(nvml, lambda: nvml.nvmlDeviceGetMaxClockInfo(self._handle, nvml.NVML_CLOCK_SM))
        self.expected_sm_clock_mhz = float(max_sm) if max_sm else None

    @property
    def available(self) -> bool:
        """Whether readings come from NVML (False: every value is None)."""
        return self._nvml is not None

    def energy_mj(self) -> float | None:
        """The board's total energy since the driver loaded, mJ (``nvmlDeviceGetTotalEnergyConsumption``,
        Volta and newer; it updates in steps, about every 100 ms on an H200), None where unreadable.
        Never raises."""
        nvml, h = self._nvml, self._handle
        if nvml is None:
            return None
        value = _try(nvml, lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h))
        return float(value) if value is not None else None

    def read(self) -> dict[str, Any]:
        """``{"sm_clock_mhz": float|None, "clock_event_reasons": int|None, "temperature_c":
        float|None, "power_w": float|None}`` at this moment. Never raises."""
        nvml, h = self._nvml, self._handle
        if nvml is None:
            return dict.fromkeys(self.KEYS)
        sm = _try(nvml, lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))
        temp = _try(nvml, lambda: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))
        power_mw = _try(nvml, lambda: nvml.nvmlDeviceGetPowerUsage(h))
        return {
            "sm_clock_mhz": float(sm) if sm is not None else None,
            "clock_event_reasons": _clock_event_reasons(nvml, h),
            "temperature_c": float(temp) if temp is not None else None,
            "power_w": power_mw / _MW_PER_W if power_mw is not None else None,
        }

    def __repr__(self) -> str:
        return f"<ContextSampler device={self.device_index} status={self.status!r}>"
