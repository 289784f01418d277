"""NVML telemetry of every GPU: clocks, clock-event mask, temperatures, power, ECC, other processes.

Instant reasons (no band): a throttle reason in a GPU's clock-event mask
(``kernelab.service.contract.clock_events``, decoded from the mask, never from posted names; reasons in
``Thresholds.ignored_clock_reasons`` and, in an ``after`` probe, in ``after_job_clock_reasons`` left
out), volatile uncorrected ECC errors grown since the previous report (GPUs matched by UUID, else
index), another compute process on a GPU (``contended``; ``foreign_processes`` decides what
"another" is, the one rule for probes and cells). Its failure is recorded under ``errors["nvml"]``.
Measured by ``kernelab.runners.probes.telemetry.read_telemetry``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from pydantic import Field, model_validator

from kernelab.service.contract import clock_events
from kernelab.service.contract.schemas.health import HealthReason
from kernelab.service.contract.schemas.probe_protocol import Column, Probe, TextSection, Thresholds, register
from kernelab.service.contract.schemas.probes import MAX_DEVICES, MAX_GPU_PROCESSES, DeviceIndex
from kernelab.service.contract.schemas.types import (
    MAX_INT_VALUE,
    MAX_LIST_ITEMS,
    AtDoor,
    JsonObject,
    Name,
    ShortText,
    Size64,
    Text,
    _Posted,
)
from kernelab.service.contract.units import format_bytes


class GpuTelemetry(_Posted):
    """NVML snapshot of one GPU. None means "not readable here", never zero."""

    device_index: DeviceIndex
    name: Annotated[Text, AtDoor(max_length=255)] = ""
    uuid: Name = ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    clock_event_reasons: Annotated[int, Field(ge=0, strict=True), AtDoor(le=MAX_INT_VALUE)] | None = Field(
        default=None, description="NVML clock-event-reasons mask (kernelab.service.contract.clock_events)"
    )
    clock_event_reason_names: Annotated[list[ShortText], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list,
        description="the mask's reasons, decoded by the server (posted names that contradict the mask "
        "are replaced; names without a mask are kept for display and never judged)",
    )
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: Size64 | None = None
    ecc_volatile_uncorrected: Size64 | None = None
    other_processes: Annotated[list[JsonObject], AtDoor(max_length=MAX_GPU_PROCESSES)] = Field(
        default_factory=list
    )

    @model_validator(mode="after")
    def _names_from_mask(self) -> GpuTelemetry:
        if self.clock_event_reasons is not None:
            self.clock_event_reason_names = clock_events.decode(self.clock_event_reasons)
        return self


def foreign_processes(processes: Sequence[Mapping[str, object]]) -> int:
    """Compute processes on one GPU that are not kernelab's own: the one rule for ``contended``,
    in a cell's comparison (``verdicts.contention_seen``, ``verdicts.probe_flags``) and in node
    health (``kernelab.service.judge.health``).

    Telemetry marks our process ``own``; inside a container NVML may report host PIDs so that no
    entry matches, in which case one unmarked process is presumed to be ours.
    """
    foreign = sum(1 for p in processes if not p.get("own"))
    if any(p.get("own") for p in processes):
        return foreign
    return max(foreign - 1, 0)


def instant(
    readings: Sequence[GpuTelemetry], previous: Sequence[GpuTelemetry] | None, phase: str, t: Thresholds
) -> list[HealthReason]:
    """``clock-event`` and ``ecc-growth`` (``degraded-node``), ``other-tenant`` (``contended``), GPU
    by GPU (module docstring)."""
    out: list[HealthReason] = []
    before = {(g.uuid or str(g.device_index)): g for g in (previous or [])}
    ignored = set(t.ignored_clock_reasons)
    if phase == "after":
        ignored |= set(t.after_job_clock_reasons)
    for g in readings:
        reasons = [r for r in clock_events.throttle_reasons(g.clock_event_reasons) if r not in ignored]
        if reasons:
            out.append(
                HealthReason(
                    code="clock-event",
                    flag="degraded-node",
                    device_index=g.device_index,
                    message=f"GPU {g.device_index}: clock-event reasons {', '.join(reasons)}",
                )
            )
        old = before.get(g.uuid or str(g.device_index))
        old_ecc = old.ecc_volatile_uncorrected if old is not None else None
        new_ecc = g.ecc_volatile_uncorrected
        if old_ecc is not None and new_ecc is not None and new_ecc > old_ecc:
            out.append(
                HealthReason(
                    code="ecc-growth",
                    flag="degraded-node",
                    device_index=g.device_index,
                    value=float(new_ecc),
                    limit=float(old_ecc),
                    message=(
                        f"GPU {g.device_index}: volatile uncorrected ECC errors grew from "
                        f"{old_ecc} to {new_ecc}"
                    ),
                )
            )
        foreign = foreign_processes(g.other_processes)
        if foreign:
            out.append(
                HealthReason(
                    code="other-tenant",
                    flag="contended",
                    device_index=g.device_index,
                    value=float(foreign),
                    message=f"GPU {g.device_index}: {foreign} other compute process(es)",
                )
            )
    return out


def _num(value: float | int | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _title(report: Any, readings: Sequence[GpuTelemetry]) -> str:
    return f"nvml: {report.nvml_status}"


PROBE = register(
    Probe(
        name="telemetry",
        label="NVML telemetry",
        reading=GpuTelemetry,
        units={
            "sm_clock_mhz": "MHz",
            "mem_clock_mhz": "MHz",
            "max_sm_clock_mhz": "MHz",
            "temperature_c": "°C",
            "memory_temperature_c": "°C",
            "power_w": "W",
            "power_limit_w": "W",
            "utilization_pct": "%",
            "memory_used_bytes": "B",
        },  # fmt: skip
        max_readings=MAX_DEVICES,
        position=30,
        runner="kernelab.runners.probes.telemetry:read_telemetry",
        generic_runner=False,
        error_key="nvml",
        instant=instant,
        contended=lambda readings: any(foreign_processes(t.other_processes) for t in readings),
        summary=lambda report, readings: [f"NVML {report.nvml_status}"],
        text=TextSection(
            title=_title,
            show_empty=True,
            columns=(
                Column("gpu", lambda t: str(t.device_index)),
                Column("sm MHz", lambda t: _num(t.sm_clock_mhz, ".0f")),
                Column("max MHz", lambda t: _num(t.max_sm_clock_mhz, ".0f")),
                Column("temp C", lambda t: _num(t.temperature_c, ".0f")),
                Column("mem C", lambda t: _num(t.memory_temperature_c, ".0f")),
                Column("power W", lambda t: _num(t.power_w)),
                Column("limit W", lambda t: _num(t.power_limit_w, ".0f")),
                Column("util %", lambda t: _num(t.utilization_pct, ".0f")),
                Column("mem used", lambda t: format_bytes(t.memory_used_bytes)),
                Column("ecc", lambda t: _num(t.ecc_volatile_uncorrected, "d")),
                Column("reasons", lambda t: ",".join(t.clock_event_reason_names) or "-"),
                Column("others", lambda t: str(sum(1 for p in t.other_processes if not p.get("own")))),
            ),
        ),
    )
)
