"""Node-health probe readings a runner posts (``ProbeReport`` and its readings).

Every list of a report is bounded by what kernelab's full probe takes on one node of at most
``MAX_DEVICES`` GPUs (``kernelab.runners.probes``): at most 540 readings, about twice an 8-GPU
node's full report, so every page that reads a node's history costs at most about twice what an
honest 8-GPU fleet costs, however a runner filled its reports."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    Field,
    model_validator,
)

from kernelab.service import clock_events
from kernelab.service.schemas.types import (
    MAX_INT_VALUE,
    MAX_LIST_ITEMS,
    AtDoor,
    ErrorText,
    JsonObject,
    Name,
    Positive64,
    ShortText,
    Size64,
    Text,
    UtcDatetime,
    _Posted,
)

MAX_DEVICES = 16
"""Most GPUs of one node (8 on an HGX board or an MI300X platform, 4 on a GB200 tray, 16 on the
largest single systems): device indices are ``0 .. MAX_DEVICES - 1``, and a report holds at most
one copy, telemetry and matmul reading per GPU."""
MAX_RANKS = 4096
"""Most ranks of one all-reduce group (``world_size``), and largest rank index + 1."""
MAX_ALL_REDUCE_READINGS = 256
"""Most all-reduce readings of one report: the full probe's 14 sizes (8 B x 4^k to 128 MiB, then
256 MiB: ``kernelab.runners.probes.all_reduce.full_sizes_bytes``), eager and as a CUDA graph, over
the whole node and its sub-groups (``sub_groups``: 8 pairs on 16 GPUs; 4 pairs and 2 halves on 8):
14 x 2 x 9 = 252 at ``MAX_DEVICES``."""
MAX_PEER_READINGS = MAX_DEVICES * (MAX_DEVICES - 1)
"""Most peer-copy readings of one report: every ordered pair of GPUs (240 at ``MAX_DEVICES``)."""
DeviceIndex = Annotated[int, Field(ge=0), AtDoor(le=MAX_DEVICES - 1)]
"""A GPU's index on its node: 0 .. ``MAX_DEVICES`` - 1 (``probe_readings.device_index``)."""
Rank = Annotated[int, Field(ge=0), AtDoor(le=MAX_RANKS - 1)]


class CopyBandwidthReading(_Posted):
    """Device-local copy: bytes read + bytes written over time."""

    device_index: DeviceIndex
    size_bytes: Size64
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, read + written")


class MatmulPeakReading(_Posted):
    """Dense matmul rate of one GPU: the plausibility guard's FLOP/s bound (2*M*N*K per launch)."""

    device_index: DeviceIndex
    dtype: ShortText
    m: Positive64
    n: Positive64
    k: Positive64
    launches: Positive64
    time_us: float = Field(ge=0, description="per launch")
    tflops: float = Field(ge=0, description="TFLOP/s = 1e12 FLOP/s")


class AllReduceReading(_Posted):
    """One all-reduce size, timed as nccl-tests times it. busbw = algbw * 2(n-1)/n."""

    backend: ShortText
    world_size: Annotated[int, Field(ge=1), AtDoor(le=MAX_RANKS)]
    ranks: Annotated[list[Rank], AtDoor(max_length=MAX_RANKS)] = Field(
        default_factory=list, description="device indices in the group"
    )
    size_bytes: Size64
    time_us: float = Field(ge=0)
    algbw_gbps: float = Field(ge=0)
    busbw_gbps: float = Field(ge=0)
    correct: bool = True
    cuda_graph: bool = Field(default=False, description="timed as one CUDA-graph replay of the ops")
    timed_by: Literal["host-clock", "cuda-events"] = Field(
        default="host-clock",
        description="host clock around the ops + one sync (nccl-tests), or CUDA events behind a spin "
        "kernel (kernelab.runners.probes.all_reduce)",
    )


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


MAX_GPU_PROCESSES = 256
"""Most processes of one telemetry reading (NVML's compute processes of one GPU)."""


class GpuTelemetry(_Posted):
    """NVML snapshot of one GPU. None means "not readable here", never zero."""

    device_index: DeviceIndex
    name: Annotated[Text, AtDoor(max_length=255)] = ""
    uuid: Name = ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    clock_event_reasons: Annotated[int, Field(ge=0, strict=True), AtDoor(le=MAX_INT_VALUE)] | None = Field(
        default=None, description="NVML clock-event-reasons mask (kernelab.service.clock_events)"
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


class ProbeReport(_Posted):
    """Node-health readings taken at one moment (before or after a job, or on demand)."""

    phase: Literal["before", "after", "adhoc"] = "adhoc"
    taken_at: UtcDatetime
    wall_s: float = Field(default=0.0, ge=0, description="how long the probe took")
    copy_bandwidth: Annotated[list[CopyBandwidthReading], AtDoor(max_length=MAX_DEVICES)] = Field(
        default_factory=list
    )
    all_reduce: Annotated[list[AllReduceReading], AtDoor(max_length=MAX_ALL_REDUCE_READINGS)] = Field(
        default_factory=list
    )
    telemetry: Annotated[list[GpuTelemetry], AtDoor(max_length=MAX_DEVICES)] = Field(default_factory=list)
    peer_copy: Annotated[list[PeerCopyReading], AtDoor(max_length=MAX_PEER_READINGS)] = Field(
        default_factory=list
    )
    mode: Literal["quick", "full"] = "quick"
    notes: Annotated[list[ErrorText], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list, description="probes skipped and why"
    )
    matmul_peak: Annotated[list[MatmulPeakReading], AtDoor(max_length=MAX_DEVICES)] = Field(
        default_factory=list
    )
    nvml_status: ErrorText = Field(default="absent", description="'ok', 'absent' or the error")
    errors: Annotated[dict[ShortText, ErrorText], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=dict, description="probe name -> error text"
    )
