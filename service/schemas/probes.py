"""Node-health probe readings a runner posts (``ProbeReport`` and its readings)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    Field,
    model_validator,
)

from kernelab.service import clock_events
from kernelab.service.schemas.types import JsonObject, Text, UtcDatetime, _Posted


class CopyBandwidthReading(_Posted):
    """Device-local copy: bytes read + bytes written over time."""

    device_index: int = Field(ge=0)
    size_bytes: int = Field(ge=0)
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, read + written")


class MatmulPeakReading(_Posted):
    """Dense matmul rate of one GPU: the plausibility guard's FLOP/s bound (2*M*N*K per launch)."""

    device_index: int = Field(ge=0)
    dtype: Text
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    launches: int = Field(ge=1)
    time_us: float = Field(ge=0, description="per launch")
    tflops: float = Field(ge=0, description="TFLOP/s = 1e12 FLOP/s")


class AllReduceReading(_Posted):
    """One all-reduce size, timed as nccl-tests times it. busbw = algbw * 2(n-1)/n."""

    backend: Text
    world_size: int = Field(ge=1)
    ranks: list[int] = Field(default_factory=list, description="device indices in the group")
    size_bytes: int = Field(ge=0)
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

    src_device: int = Field(ge=0)
    dst_device: int = Field(ge=0)
    peer_access: bool
    size_bytes: int = Field(ge=0)
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, bytes copied once")


class GpuTelemetry(_Posted):
    """NVML snapshot of one GPU. None means "not readable here", never zero."""

    device_index: int = Field(ge=0)
    name: Text = ""
    uuid: Text = ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    clock_event_reasons: int | None = Field(
        default=None,
        ge=0,
        strict=True,
        description="NVML clock-event-reasons mask (kernelab.service.clock_events)",
    )
    clock_event_reason_names: list[Text] = Field(
        default_factory=list,
        description="the mask's reasons, decoded by the server (posted names that contradict the mask "
        "are replaced; names without a mask are kept for display and never judged)",
    )
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    ecc_volatile_uncorrected: int | None = None
    other_processes: list[JsonObject] = Field(default_factory=list)

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
    copy_bandwidth: list[CopyBandwidthReading] = Field(default_factory=list)
    all_reduce: list[AllReduceReading] = Field(default_factory=list)
    telemetry: list[GpuTelemetry] = Field(default_factory=list)
    peer_copy: list[PeerCopyReading] = Field(default_factory=list)
    mode: Literal["quick", "full"] = "quick"
    notes: list[Text] = Field(default_factory=list, description="probes skipped and why")
    matmul_peak: list[MatmulPeakReading] = Field(default_factory=list)
    nvml_status: Text = Field(default="absent", description="'ok', 'absent' or the error")
    errors: dict[Text, Text] = Field(default_factory=dict, description="probe name -> error text")
