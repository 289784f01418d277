"""Dense matmul peak of a GPU (bf16, CUDA only, once per process): the plausibility guard's
FLOP/s bound (``matmul_tflops`` of ``kernelab.service.judge.verdicts.probe_peaks``).

No health figure: the rate depends on clocks the telemetry probe already judges. Measured by
``kernelab.runners.probes.peak.cached_matmul_peak``.
"""

from __future__ import annotations

from pydantic import Field

from kernelab.service.contract.schemas.probe_protocol import Probe, register
from kernelab.service.contract.schemas.probes import MAX_DEVICES, DeviceIndex
from kernelab.service.contract.schemas.types import Positive64, ShortText, _Posted


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


PROBE = register(
    Probe(
        name="matmul_peak",
        label="matmul peak",
        reading=MatmulPeakReading,
        units={"time_us": "us", "tflops": "TFLOP/s"},
        max_readings=MAX_DEVICES,
        position=60,
        runner="kernelab.runners.probes.peak:cached_matmul_peak",
        generic_runner=False,
        error_key="matmul_peak",
        peak=("matmul_tflops", lambda r: r.tflops),
    )
)
