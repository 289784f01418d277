"""Device-local copy bandwidth: bytes read + bytes written over time (as nvbandwidth counts them).

Figure ``copy GPU <i>`` (GB/s, higher is better; band limit ``Thresholds.copy_min_fraction`` x the
median), also compared with the report's other GPUs (``health.peer_reasons``); the node's probed
copy peak (``copy_gbps``) for the plausibility guard; a flat reading per GPU (``probe_readings``).
Measured by ``kernelab.runners.probes.copy_bandwidth.measure_copy_bandwidth``.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kernelab.service.contract.schemas.probe_protocol import (
    Cell,
    Column,
    Figure,
    Flat,
    Panel,
    Pivot,
    Probe,
    TextSection,
    Thresholds,
    register,
)
from kernelab.service.contract.schemas.probes import MAX_DEVICES, DeviceIndex
from kernelab.service.contract.schemas.types import Size64, _Posted
from kernelab.service.contract.units import format_bytes


class CopyBandwidthReading(_Posted):
    """Device-local copy: bytes read + bytes written over time."""

    device_index: DeviceIndex
    size_bytes: Size64
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, read + written")


def figures(readings: Sequence[CopyBandwidthReading], t: Thresholds) -> list[Figure]:
    """``copy GPU <i>`` per reading, GB/s, higher is better."""
    return [
        Figure(
            f"copy GPU {c.device_index}",
            c.bandwidth_gbps,
            "GB/s",
            "higher",
            "copy",
            device_index=c.device_index,
            limit_factor=t.copy_min_fraction,
            peers="GPUs",
        )
        for c in readings
    ]


def summary(report: object, readings: Sequence[CopyBandwidthReading]) -> list[str]:
    """``copy 4190.1-4196.5 GB/s (2 devices)``; nothing without readings."""
    if not readings:
        return []
    bw = sorted(r.bandwidth_gbps for r in readings)
    span = f"{bw[0]:.1f}" if len(bw) == 1 else f"{bw[0]:.1f}-{bw[-1]:.1f}"
    return [f"copy {span} GB/s" + (f" ({len(bw)} devices)" if len(bw) > 1 else "")]


PROBE = register(
    Probe(
        name="copy_bandwidth",
        label="copy bandwidth",
        reading=CopyBandwidthReading,
        units={"size_bytes": "B", "time_us": "us", "bandwidth_gbps": "GB/s"},
        max_readings=MAX_DEVICES,
        position=10,
        runner="kernelab.runners.probes.copy_bandwidth:measure_copy_bandwidth",
        generic_runner=False,
        figures=figures,
        peak=("copy_gbps", lambda r: r.bandwidth_gbps),
        text=TextSection(
            title=lambda report, readings: "copy bandwidth (bytes read + written)",
            columns=(
                Column("device", lambda r: str(r.device_index)),
                Column("size", lambda r: format_bytes(r.size_bytes)),
                Column("time us", lambda r: format(r.time_us, ".1f")),
                Column("GB/s", lambda r: format(r.bandwidth_gbps, ".1f")),
            ),
        ),
        summary=summary,
        pivot=Pivot(
            table_id="probe-copy",
            caption="Device-local copy bandwidth (GB/s, read + written)",
            key=lambda r: (r.device_index, r.size_bytes),
            label_headers=("{device}", "size"),
            labels=lambda r: (Cell(str(r.device_index), num=False), Cell(format_bytes(r.size_bytes))),
            value_suffixes=("",),
            values=lambda r: (Cell(f"{r.bandwidth_gbps:.1f}"),),
        ),
        panel=Panel(
            title="Device-local copy bandwidth (GB/s)",
            trace=lambda r: ((r.device_index,), f"copy {{device}} {r.device_index}"),
            value=lambda r: r.bandwidth_gbps,
            hover="%{y:.1f} GB/s",
            band=lambda b: "area" if b.unit == "GB/s" and b.figure.startswith("copy") else None,
        ),
        flat=lambda r: Flat(
            device_index=r.device_index,
            size_bytes=r.size_bytes,
            time_us=r.time_us,
            value_gbps=r.bandwidth_gbps,
        ),
    )
)
