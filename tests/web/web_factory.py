"""Small, deterministic ``JobResult``/``Comparison`` builders for the dashboard tests.

The numbers are drawn from a seeded generator so a test controls the shape of the data (cells,
rounds, throttled samples, clocks) without running a benchmark.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np

from kernelab.service.contract.schemas import (
    AllReduceReading,
    CellComparison,
    CellResult,
    Comparison,
    CopyBandwidthReading,
    GpuTelemetry,
    JobResult,
    JobSpec,
    NodeInfo,
    ProbeReport,
    Sample,
    SideStats,
)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def make_spec(name: str = "softmax rows", rows: tuple[int, ...] = (4, 8)) -> JobSpec:
    """A softmax spec over ``rows`` (one cell per value), eager baseline vs Triton candidate."""
    return JobSpec(
        name=name,
        benchmark="softmax",
        baseline={"variant": "torch"},
        candidate={"variant": "triton", "params": {"BLOCK_M": 4}},
        params={"N": 256, "dtype": "float32"},
        sweep={"M": list(rows)},
        measurement={"min_rounds": 2, "max_rounds": 50, "threshold_pct": 2.0},
    )


def make_samples(
    rounds: int,
    *,
    base_ns: float,
    speedup: float,
    seed: int,
    throttled_rounds: tuple[int, ...] = (),
    clock_mhz: float | None = None,
) -> list[Sample]:
    """ABBA-interleaved samples: ``rounds`` rounds, two samples (one per variant) per round."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rounds):
        order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        for position, variant in enumerate(order):
            centre = base_ns * (speedup if variant == "candidate" else 1.0)
            out.append(
                Sample(
                    variant=variant,
                    round=r,
                    position=position,
                    duration_ns=float(centre * rng.lognormal(0.0, 0.02)),
                    sm_clock_mhz=clock_mhz,
                    throttled=r in throttled_rounds,
                )
            )
    return out


def make_probe(phase: str, taken_at: datetime, *, copy_gbps: float = 40.0) -> ProbeReport:
    """A probe report with one copy reading, three all-reduce sizes and no NVML."""
    return ProbeReport(
        phase=phase,
        taken_at=taken_at,
        wall_s=1.5,
        copy_bandwidth=[
            CopyBandwidthReading(
                device_index=0, size_bytes=64 << 20, time_us=3355.4, bandwidth_gbps=copy_gbps
            )
        ],
        all_reduce=[
            AllReduceReading(
                backend="gloo",
                world_size=2,
                ranks=[0, 1],
                size_bytes=size,
                time_us=t,
                algbw_gbps=size / t / 1e3,
                busbw_gbps=size / t / 1e3,
            )
            for size, t in ((8, 40.0), (1 << 20, 300.0), (64 << 20, 9000.0))
        ],
        telemetry=[GpuTelemetry(device_index=0, name="cpu")],
        nvml_status="absent",
    )


def make_result(
    spec: JobSpec | None = None,
    *,
    rounds: int = 10,
    throttled_rounds: tuple[int, ...] = (),
    clock_mhz: float | None = None,
    job_id: int | None = None,
    speedup: float = 0.8,
) -> JobResult:
    """A finished job result: every cell of ``spec`` measured for ``rounds`` ABBA rounds; cell ``i``
    takes ``(i + 1)`` µs on the baseline and ``speedup`` times that on the candidate."""
    spec = spec or make_spec()
    cells = [
        CellResult(
            index=i,
            params=params,
            samples=make_samples(
                rounds,
                base_ns=1_000.0 * (i + 1),
                speedup=speedup,
                seed=i,
                throttled_rounds=throttled_rounds,
                clock_mhz=clock_mhz,
            ),
        )
        for i, params in enumerate(spec.cells("cpu"))
    ]
    return JobResult(
        idempotency_key=f"test-{job_id or 0:08d}",
        job_id=job_id,
        spec=spec,
        node=NodeInfo(hostname="ci-node-1", device_type="cpu", python_version="3.11"),
        timer="perf_counter",
        started_at=T0,
        finished_at=T0 + timedelta(seconds=5),
        cells=cells,
        probes=[make_probe("before", T0), make_probe("after", T0 + timedelta(seconds=5))],
    )


def make_comparison(n_cells: int = 3) -> Comparison:
    """A comparison with ``n_cells`` cells, the last one without candidate statistics."""
    cells = []
    for i in range(n_cells):
        base = SideStats(n=10, median_ns=1000.0 * (i + 1), q1_ns=950.0 * (i + 1), q3_ns=1050.0 * (i + 1))
        cand = SideStats(n=10, median_ns=800.0 * (i + 1), q1_ns=780.0 * (i + 1), q3_ns=820.0 * (i + 1))
        if i == n_cells - 1:
            cand = SideStats(n=0)
        cells.append(
            CellComparison(
                index=i,
                params={"M": i},
                label=f"M={i}",
                baseline=base,
                candidate=cand,
                verdict="faster" if i < n_cells - 1 else "inconclusive",
            )
        )
    return Comparison(
        benchmark="softmax",
        baseline_label="torch",
        candidate_label="triton",
        threshold_pct=1.0,
        timer="perf_counter",
        node=NodeInfo(hostname="n", device_type="cpu"),
        cells=cells,
    )
