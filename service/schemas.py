"""Pydantic schemas shared by the server, the runner and the CLI.

This module imports pydantic only: ``runners/`` may import it, never the ORM or the database.
Schemas are split per direction (``JobCreate`` in, ``JobPublic`` out) as in
fastapi/full-stack-fastapi-template. Units are in field names (``duration_ns``, ``sm_clock_mhz``).

The shape of a job, end to end::

    JobSpec  --POST /api/v1/jobs-->  server queue  --claim-->  runner
    runner: probes(before) -> for each sweep cell: interleaved rounds of baseline/candidate
            -> correctness check -> probes(after)  ==> JobResult --POST results--> server
    server: stores raw samples; service.stats turns a JobResult into a Comparison on read.
"""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Variant = Literal["baseline", "candidate"]
Verdict = Literal["faster", "slower", "same", "inconclusive"]
DeviceType = Literal["cpu", "cuda"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
# Flags that travel with every number (DESIGN.md "Statistics and verdicts").
Flag = Literal[
    "noisy", "throttled", "contended", "degraded-node", "implausible", "incorrect", "nondeterministic",
    "failed",
]

ParamValue = int | float | str | bool


class _Strict(BaseModel):
    """Base for inbound schemas: unknown fields are an error that names the field."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------------
# Job specification (what a user submits)
# --------------------------------------------------------------------------------------------------


class VariantSpec(_Strict):
    """One side of the comparison: a named variant of the benchmark and parameter overrides.

    ``params`` override the cell's parameters for this side only, so "two parameter sets of one
    benchmark" (e.g. two tile sizes of the Triton matmul) is a baseline and a candidate that name the
    same variant with different ``params``.
    """

    variant: str = Field(min_length=1, max_length=200)
    params: dict[str, ParamValue] = Field(default_factory=dict)


class MeasurementSpec(_Strict):
    """How to measure. Durations are milliseconds, as in ``triton.testing.do_bench``."""

    warmup_ms: float = Field(default=25.0, ge=0, le=60_000)
    budget_ms: float = Field(default=2_000.0, gt=0, le=600_000, description="time budget per cell")
    min_rounds: int = Field(default=5, ge=2, le=100_000)
    max_rounds: int = Field(default=10_000, ge=2, le=1_000_000)
    samples_per_round: int = Field(
        default=1, ge=1, le=1_000, description="samples of each variant per round (ABBA uses 2 rounds of A,B)"
    )
    order: Literal["abba", "random"] = "abba"
    seed: int = Field(default=0, ge=0)
    l2_flush: bool = Field(default=True, description="flush L2 before each sample (cold mode)")
    target_ci_pct: float = Field(
        default=1.0, gt=0, le=100, description="stop once the ratio's CI half-width is below this"
    )
    threshold_pct: float = Field(
        default=1.0, gt=0, le=100, description="smallest change that counts as faster/slower"
    )
    exclude_throttled: bool = True

    @model_validator(mode="after")
    def _rounds_ordered(self) -> MeasurementSpec:
        if self.max_rounds < self.min_rounds:
            raise ValueError("max_rounds must be >= min_rounds")
        return self


class ProbeSpec(_Strict):
    """Which node-health probes run before and after the job."""

    copy_bandwidth: bool = True
    all_reduce: bool = True
    nvml: bool = True


class CorrectnessSpec(_Strict):
    """Correctness checks against the benchmark's higher-precision reference."""

    enabled: bool = True
    rtol: float | None = Field(default=None, gt=0, description="None: dtype-aware default")
    atol: float | None = Field(default=None, ge=0, description="None: dtype-aware default")


SweepGrid = dict[str, list[ParamValue]]


class JobSpec(_Strict):
    """A benchmark job: one benchmark, a baseline and a candidate, a sweep of cells.

    ``sweep`` is a grid: the cells are the cartesian product of its lists, each merged over
    ``params``. ``sweep_by_device`` replaces keys of the grid on one device type, so one spec can
    run large shapes on a GPU and small ones on a CPU (the Triton interpreter is slow).

    Raises (pydantic ``ValidationError``, HTTP 422 on the server): unknown fields, empty sweep
    lists, more than 4096 cells. Parameter values are validated per benchmark by
    ``kernels.validate_spec``.
    """

    name: str = Field(default="", max_length=200)
    benchmark: str = Field(min_length=1, max_length=500, description="registry name or 'module:object'")
    baseline: VariantSpec
    candidate: VariantSpec
    params: dict[str, ParamValue] = Field(default_factory=dict)
    sweep: SweepGrid = Field(default_factory=dict)
    sweep_by_device: dict[DeviceType, SweepGrid] = Field(default_factory=dict)
    measurement: MeasurementSpec = Field(default_factory=MeasurementSpec)
    probes: ProbeSpec = Field(default_factory=ProbeSpec)
    correctness: CorrectnessSpec = Field(default_factory=CorrectnessSpec)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout_s: float = Field(default=1800.0, gt=0, le=86_400)

    @field_validator("sweep")
    @classmethod
    def _non_empty_lists(cls, v: SweepGrid) -> SweepGrid:
        for key, values in v.items():
            if not values:
                raise ValueError(f"sweep.{key} must list at least one value")
        return v

    @model_validator(mode="after")
    def _cell_count(self) -> JobSpec:
        for dev in ("cpu", "cuda"):
            n = len(self.cells(dev))
            if n > 4096:
                raise ValueError(f"the sweep has {n} cells on {dev}; at most 4096")
        return self

    def cells(self, device_type: DeviceType) -> list[dict[str, ParamValue]]:
        """The sweep's cells for ``device_type``, in a stable order: list of parameter dicts."""
        grid = dict(self.sweep)
        grid.update(self.sweep_by_device.get(device_type, {}))
        keys = list(grid)
        out = []
        for combo in itertools.product(*(grid[k] for k in keys)):
            cell = dict(self.params)
            cell.update(zip(keys, combo, strict=True))
            out.append(cell)
        return out or [dict(self.params)]


# --------------------------------------------------------------------------------------------------
# Results (what a runner posts)
# --------------------------------------------------------------------------------------------------


class Work(BaseModel):
    """Work one launch does, declared by the benchmark: used for throughput and plausibility."""

    flops: float = Field(default=0.0, ge=0)
    bytes_read: float = Field(default=0.0, ge=0)
    bytes_written: float = Field(default=0.0, ge=0)


class Sample(BaseModel):
    """One timed sample of one variant.

    ``duration_ns`` is the time of one launch: the timed window divided by ``launches``.
    Context fields are None where the platform cannot read them (CPU, no NVML).
    """

    variant: Variant
    round: int = Field(ge=0, description="interleaving round number")
    position: int = Field(ge=0, description="position of this sample inside its round")
    duration_ns: float = Field(ge=0)
    launches: int = Field(default=1, ge=1)
    sm_clock_mhz: float | None = Field(default=None, ge=0)
    clock_event_reasons: int | None = Field(default=None, ge=0, description="NVML bitmask")
    temperature_c: float | None = None
    power_w: float | None = Field(default=None, ge=0)
    throttled: bool = False


class CorrectnessResult(BaseModel):
    """One variant's output compared with the reference (float64)."""

    passed: bool
    rel_error: float | None = Field(default=None, description="||out-ref|| / ||ref||")
    max_abs_error: float | None = None
    cosine_similarity: float | None = None
    rtol: float | None = None
    atol: float | None = None
    nonfinite: int = Field(default=0, ge=0, description="NaN/Inf elements in the output")
    message: str = ""


class CellResult(BaseModel):
    """All raw data measured for one sweep cell."""

    index: int = Field(ge=0)
    params: dict[str, ParamValue]
    baseline_params: dict[str, ParamValue] = Field(default_factory=dict)
    candidate_params: dict[str, ParamValue] = Field(default_factory=dict)
    work: dict[Variant, Work] = Field(default_factory=dict)
    samples: list[Sample] = Field(default_factory=list)
    correctness: dict[Variant, CorrectnessResult] = Field(default_factory=dict)
    error: str | None = Field(default=None, description="set when the cell could not be measured")


class CopyBandwidthReading(BaseModel):
    """Device-local copy: bytes read + bytes written over time."""

    device_index: int = Field(ge=0)
    size_bytes: int = Field(ge=0)
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, read + written")


class AllReduceReading(BaseModel):
    """One all-reduce size, timed as nccl-tests times it. busbw = algbw * 2(n-1)/n."""

    backend: str
    world_size: int = Field(ge=1)
    ranks: list[int] = Field(default_factory=list, description="device indices in the group")
    size_bytes: int = Field(ge=0)
    time_us: float = Field(ge=0)
    algbw_gbps: float = Field(ge=0)
    busbw_gbps: float = Field(ge=0)
    correct: bool = True


class GpuTelemetry(BaseModel):
    """NVML snapshot of one GPU. None means "not readable here", never zero."""

    device_index: int = Field(ge=0)
    name: str = ""
    uuid: str = ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    clock_event_reasons: int | None = None
    clock_event_reason_names: list[str] = Field(default_factory=list)
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    ecc_volatile_uncorrected: int | None = None
    other_processes: list[dict[str, Any]] = Field(default_factory=list)


class ProbeReport(BaseModel):
    """Node-health readings taken at one moment (before or after a job, or on demand)."""

    phase: Literal["before", "after", "adhoc"] = "adhoc"
    taken_at: datetime
    wall_s: float = Field(default=0.0, ge=0, description="how long the probe took")
    copy_bandwidth: list[CopyBandwidthReading] = Field(default_factory=list)
    all_reduce: list[AllReduceReading] = Field(default_factory=list)
    telemetry: list[GpuTelemetry] = Field(default_factory=list)
    nvml_status: str = Field(default="absent", description="'ok', 'absent' or the error")
    errors: dict[str, str] = Field(default_factory=dict, description="probe name -> error text")


class NodeInfo(BaseModel):
    """What the node is: hardware and software fingerprint of a result."""

    hostname: str
    device_type: DeviceType
    device_name: str = ""
    device_count: int = Field(default=0, ge=0)
    l2_bytes: int | None = None
    driver_version: str | None = None
    cuda_version: str | None = None
    torch_version: str | None = None
    triton_version: str | None = None
    python_version: str = ""
    triton_interpret: bool = False


class JobResult(BaseModel):
    """Everything a runner measured for one job: posted whole, stored whole or not at all.

    ``idempotency_key`` makes a retried post harmless: the server stores the first and answers
    later posts with the same key by pointing at it.
    """

    idempotency_key: str = Field(min_length=8, max_length=200)
    job_id: int | None = None
    spec: JobSpec
    node: NodeInfo
    timer: str = Field(description="'cuda-event' or 'perf_counter'")
    started_at: datetime
    finished_at: datetime
    cells: list[CellResult]
    probes: list[ProbeReport] = Field(default_factory=list)
    error: str | None = None


# --------------------------------------------------------------------------------------------------
# Statistics (computed by service.stats from a JobResult)
# --------------------------------------------------------------------------------------------------


class VariantStats(BaseModel):
    """Robust summary of one variant's kept samples, nanoseconds per launch."""

    n: int
    dropped_throttled: int = 0
    median_ns: float | None = None
    min_ns: float | None = None
    q1_ns: float | None = None
    q3_ns: float | None = None
    iqr_ns: float | None = None
    mean_ns: float | None = None


class CellComparison(BaseModel):
    """Before/after for one cell: ratio = candidate median / baseline median (< 1 is faster)."""

    index: int
    params: dict[str, ParamValue]
    label: str
    baseline: VariantStats
    candidate: VariantStats
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    delta_pct: float | None = Field(default=None, description="(ratio - 1) * 100")
    hl_shift_ns: float | None = Field(default=None, description="Hodges-Lehmann candidate - baseline")
    hl_ci_low_ns: float | None = None
    hl_ci_high_ns: float | None = None
    p_value: float | None = Field(default=None, description="Mann-Whitney U, two-sided")
    p_adjusted: float | None = Field(default=None, description="Benjamini-Hochberg over the sweep")
    mde_pct: float | None = Field(default=None, description="minimum detectable effect, percent")
    verdict: Verdict
    flags: list[Flag] = Field(default_factory=list)
    correctness: dict[Variant, CorrectnessResult] = Field(default_factory=dict)
    throughput: dict[str, float] = Field(default_factory=dict, description="e.g. candidate_tflops")
    error: str | None = None


class Comparison(BaseModel):
    """A job's before/after comparison, as JSON (``GET /api/v1/jobs/{id}/comparison``)."""

    job_id: int | None = None
    name: str = ""
    benchmark: str
    baseline_label: str
    candidate_label: str
    threshold_pct: float
    timer: str
    node: NodeInfo
    cells: list[CellComparison]
    probes: list[ProbeReport] = Field(default_factory=list)
    flags: list[Flag] = Field(default_factory=list, description="job-level flags")
    summary: dict[str, int] = Field(default_factory=dict, description="verdict -> count")


# --------------------------------------------------------------------------------------------------
# API payloads
# --------------------------------------------------------------------------------------------------


class JobPublic(BaseModel):
    id: int
    name: str
    benchmark: str
    status: JobStatus
    spec: JobSpec
    attempts: int
    max_attempts: int
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    node: str | None = None
    error: str | None = None
    summary: dict[str, int] = Field(default_factory=dict)


class JobsPage(BaseModel):
    data: list[JobPublic]
    count: int


class RunnerRegister(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")]
    node: NodeInfo | None = None


class RunnerRegistered(BaseModel):
    runner_id: int
    name: str
    token: str = Field(description="per-runner bearer token; shown once, stored hashed")


class ClaimRequest(_Strict):
    wait_s: float = Field(default=0.0, ge=0, le=60, description="long-poll for up to this long")
    lease_s: float = Field(default=120.0, ge=5, le=3600)


class JobClaim(BaseModel):
    job_id: int
    attempt: int
    spec: JobSpec
    lease_expires_at: datetime


class Heartbeat(_Strict):
    lease_s: float = Field(default=120.0, ge=5, le=3600)


class JobFailure(_Strict):
    error: str = Field(min_length=1, max_length=20_000)
    retry: bool = False


class ResultAccepted(BaseModel):
    job_id: int
    result_id: int
    duplicate: bool = False
