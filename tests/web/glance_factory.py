"""Results for the sweep-at-a-glance browser tests: a 1,000-cell M x N sweep with declared work,
probed peaks and a few broken cells; a job without declared work; a job that failed outright.

Data, not mocks: the shapes a runner posts (``JobResult``), small enough per cell that the
compare worker stores the comparison in seconds. Timings are drawn from a seeded generator.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from kernelab.service.contract.schemas import (
    AllReduceReading,
    CellResult,
    CopyBandwidthReading,
    CorrectnessResult,
    GpuTelemetry,
    JobResult,
    JobSpec,
    MatmulPeakReading,
    NodeInfo,
    ProbeReport,
    SampleColumns,
    Work,
)

T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
M_VALUES = list(range(1, 26))  # 25 rows
N_VALUES = [64 * k for k in range(1, 41)]  # 40 columns: 1,000 cells
COPY_GBPS = 40.0  # the probed copy bandwidth (read + written)
MATMUL_TFLOPS = 2.0  # the probed matmul peak
ROUNDS = 6  # verdicts.MIN_ROUNDS (5) or more: cells reach a timing verdict
HUGE_RATIO = 4618.4  # one cell: "+461740 %", i.e. "4,618x slower"
HUGE_CELL = (1, 64)  # its (M, N)
INCORRECT = {(3, 128): "rows 3-5 wrong: max abs error 0.5 at (4, 17)", (7, 640): "NaN in 12 outputs"}
FAILED = {(9, 1280): "triton.CompilationError: out of resources: shared memory 262144 > 232448"}
HOSTNAME = "glance-node-1"


def sweep_spec(
    name: str = "softmax M x N", *, m: list[int] | None = None, n: list[int] | None = None
) -> JobSpec:
    """torch vs triton over ``m`` x ``n`` (default ``M_VALUES`` x ``N_VALUES``), float32 fixed."""
    return JobSpec.model_validate({
        "name": name, "benchmark": "softmax", "device": "cpu",
        "baseline": {"variant": "torch"}, "candidate": {"variant": "triton"},
        "params": {"dtype": "float32"}, "sweep": {"M": m or M_VALUES, "N": n or N_VALUES},
        "measurement": {"min_rounds": 2, "max_rounds": 50, "threshold_pct": 2.0},
    })  # fmt: skip


def ratio_of(m: int, n: int) -> float:
    """Candidate / baseline time of cell (m, n): spread over 0.7 .. 1.3, one cell ``HUGE_RATIO``."""
    if (m, n) == HUGE_CELL:
        return HUGE_RATIO
    return 0.7 + 0.06 * ((m * 7 + n // 64) % 11)


def baseline_ns(m: int, n: int) -> float:
    """Baseline time per launch: 2 µs plus the bytes (8 per element) at 20 GB/s."""
    return 2000.0 + 8.0 * m * n / 20.0


def _samples(base: float, ratio: float, seed: int) -> SampleColumns:
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(ROUNDS):
        order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        for position, side in enumerate(order):
            centre = base * (ratio if side == "candidate" else 1.0)
            rows.append({"variant": side, "round": r, "position": position,
                         "duration_ns": float(centre * rng.lognormal(0.0, 0.01))})  # fmt: skip
    return SampleColumns.model_validate(rows)


def probe(phase: str, taken_at: datetime) -> ProbeReport:
    """A CPU node's probe report: one copy reading, one matmul peak, one all-reduce size."""
    return ProbeReport(
        phase=phase,  # type: ignore[arg-type]
        taken_at=taken_at,
        wall_s=1.0,
        copy_bandwidth=[CopyBandwidthReading(device_index=0, size_bytes=1 << 26, time_us=3355.4,
                                             bandwidth_gbps=COPY_GBPS)],
        matmul_peak=[MatmulPeakReading(device_index=0, dtype="float32", m=1024, n=1024, k=1024, launches=10,
                                       time_us=2 * 1024**3 / MATMUL_TFLOPS / 1e6, tflops=MATMUL_TFLOPS)],
        all_reduce=[AllReduceReading(backend="gloo", world_size=2, ranks=[0, 1], size_bytes=8, time_us=40.0,
                                     algbw_gbps=0.0002, busbw_gbps=0.0002)],
        telemetry=[GpuTelemetry(device_index=0, name="cpu")],
        nvml_status="absent",
    )  # fmt: skip


def _ok() -> CorrectnessResult:
    return CorrectnessResult(passed=True, rel_error=1e-7, max_abs_error=1e-8, cosine_similarity=1.0,
                             rtol=1e-5, atol=1e-6)  # fmt: skip


def sweep_result(job_id: int, spec: JobSpec, *, work: bool = True) -> JobResult:
    """Every cell of ``spec`` measured (``ratio_of``, ``baseline_ns``), work declared when ``work``
    (5 FLOP and 8 bytes per element), ``INCORRECT`` cells failing the candidate's check and
    ``FAILED`` cells with an error and no samples."""
    cells = []
    for index, params in enumerate(spec.cells("cpu")):
        m, n = int(params["M"]), int(params["N"])  # type: ignore[arg-type]
        fields: dict[str, Any] = {"index": index, "params": params,
                                  "correctness": {"baseline": _ok(), "candidate": _ok()}}  # fmt: skip
        if work:
            w = Work(flops=5.0 * m * n, bytes_read=4.0 * m * n, bytes_written=4.0 * m * n)
            fields["work"] = {"baseline": w, "candidate": w}
        if (m, n) in FAILED:
            fields.update(error=FAILED[(m, n)], correctness={})
        else:
            fields["samples"] = _samples(baseline_ns(m, n), ratio_of(m, n), seed=index)
        if (m, n) in INCORRECT:
            bad = CorrectnessResult(passed=False, rel_error=0.5, max_abs_error=0.5, cosine_similarity=0.2,
                                    rtol=1e-5, atol=1e-6, message=INCORRECT[(m, n)])  # fmt: skip
            fields["correctness"] = {"baseline": _ok(), "candidate": bad}
        cells.append(CellResult.model_validate(fields))
    return JobResult(
        idempotency_key=f"glance-{job_id:08d}", job_id=job_id, spec=spec,
        node=NodeInfo(hostname=HOSTNAME, device_type="cpu", device_name="test-cpu", python_version="3.11"),
        timer="perf_counter", started_at=T0, finished_at=T0 + timedelta(seconds=30), cells=cells,
        probes=[probe("before", T0), probe("after", T0 + timedelta(seconds=31))],
    )  # fmt: skip


def failed_result(job_id: int, spec: JobSpec, error: str) -> JobResult:
    """A result that says the job failed as a whole (``error``) and has no cell."""
    return JobResult(
        idempotency_key=f"glance-failed-{job_id:08d}", job_id=job_id, spec=spec,
        node=NodeInfo(hostname=HOSTNAME, device_type="cpu", python_version="3.11"), timer="perf_counter",
        started_at=T0, finished_at=T0 + timedelta(seconds=2), cells=[], error=error,
        probes=[probe("before", T0)],
    )  # fmt: skip
