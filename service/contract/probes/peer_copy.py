"""Peer copy: GPU to GPU bandwidth for every ordered pair (full mode), bytes moved once over time.

Figure ``peer <i>-><j>`` (GB/s, higher is better, limit ``Thresholds.copy_min_fraction`` x the
median) for pairs with peer access and a positive reading, also compared with the report's other
pairs (``health.peer_reasons``). Measured by ``kernelab.runners.probes.copy_bandwidth.measure_peer_copy``
(within ``kernelab.runners.probes.links.measure_links``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from kernelab.service.contract.schemas.probe_protocol import (
    Column,
    Figure,
    Probe,
    TextSection,
    Thresholds,
    register,
)
from kernelab.service.contract.schemas.probes import MAX_PEER_READINGS, DeviceIndex
from kernelab.service.contract.schemas.types import Size64, _Posted
from kernelab.service.contract.units import format_bytes


class PeerCopyReading(_Posted):
    """Copy from GPU ``src_device`` to GPU ``dst_device``: bytes moved (once) over time.

    ``peer_access`` is ``torch.cuda.can_device_access_peer``; without it the copy is staged through
    host memory by the driver and its bandwidth is measured all the same.
    """

    src_device: DeviceIndex
    dst_device: DeviceIndex
    peer_access: bool
    size_bytes: Size64
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, bytes copied once")


def figures(readings: Sequence[PeerCopyReading], t: Thresholds) -> list[Figure]:
    """``peer <i>-><j>`` per pair with peer access and a positive reading."""
    return [
        Figure(
            f"peer {p.src_device}->{p.dst_device}",
            p.bandwidth_gbps,
            "GB/s",
            "higher",
            "peer",
            ranks=(p.src_device, p.dst_device),
            limit_factor=t.copy_min_fraction,
            peers="GPU pairs",
        )
        for p in readings
        if p.peer_access and p.bandwidth_gbps > 0
    ]


PROBE = register(
    Probe(
        name="peer_copy",
        label="peer copy",
        reading=PeerCopyReading,
        units={"size_bytes": "B", "time_us": "us", "bandwidth_gbps": "GB/s"},
        max_readings=MAX_PEER_READINGS,
        position=40,
        runner="kernelab.runners.probes.copy_bandwidth:measure_peer_copy",
        generic_runner=False,
        figures=figures,
        text=TextSection(
            title=lambda report, readings: "peer copy (bytes copied once)",
            columns=(
                Column("src", lambda r: str(r.src_device)),
                Column("dst", lambda r: str(r.dst_device)),
                Column("peer access", lambda r: "yes" if r.peer_access else "no"),
                Column("size", lambda r: format_bytes(r.size_bytes)),
                Column("time us", lambda r: format(r.time_us, ".1f")),
                Column("GB/s", lambda r: format(r.bandwidth_gbps, ".1f")),
            ),
        ),
    )
)
