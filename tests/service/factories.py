"""Test data built by hand from ``kernelab.service.contract.schemas``: specs, results and probe reports.

These are data, not mocks: the shapes a runner really posts, small enough to read.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from kernelab.service.contract.schemas import (
    AllReduceReading,
    CellResult,
    CopyBandwidthReading,
    CorrectnessResult,
    JobResult,
    JobSpec,
    NodeInfo,
    ProbeReport,
    Sample,
    Work,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def spec_dict(**overrides: Any) -> dict[str, Any]:
    """A valid softmax job spec as JSON: torch vs triton over a 2-cell sweep."""
    spec: dict[str, Any] = {
        "name": "softmax torch vs triton",
        "benchmark": "softmax",
        "baseline": {"variant": "torch"},
        "candidate": {"variant": "triton"},
        "sweep": {"M": [4], "N": [64, 128]},
        "device": "cpu",
        "measurement": {"min_rounds": 4, "max_rounds": 8},
    }
    spec.update(overrides)
    return spec


def node_info(hostname: str = "node-a") -> NodeInfo:
    return NodeInfo(hostname=hostname, device_type="cpu", device_name="test-cpu", python_version="3.11")


def probe_report(phase: str = "before", *, taken_at: datetime = T0, gbps: float = 20.0) -> ProbeReport:
    """A probe report with one copy-bandwidth reading and two all-reduce sizes."""
    return ProbeReport(
        phase=phase,  # type: ignore[arg-type]
        taken_at=taken_at,
        wall_s=1.5,
        copy_bandwidth=[
            CopyBandwidthReading(device_index=0, size_bytes=1 << 26, time_us=6710.9, bandwidth_gbps=gbps)
        ],
        all_reduce=[
            AllReduceReading(backend="gloo", world_size=2, ranks=[0, 1], size_bytes=8, time_us=30.0,
                             algbw_gbps=0.00027, busbw_gbps=0.00027),
            AllReduceReading(backend="gloo", world_size=2, ranks=[0, 1], size_bytes=1 << 20, time_us=900.0,
                             algbw_gbps=1.165, busbw_gbps=1.165),
        ],
        nvml_status="absent",
    )  # fmt: skip


def samples(rounds: int, baseline_ns: float, candidate_ns: float) -> list[Sample]:
    """ABBA-interleaved samples: baseline at ``baseline_ns`` and candidate at ``candidate_ns``
    plus a small deterministic per-round wobble (rounds * 2 * 2 samples)."""
    out = []
    for r in range(rounds):
        order = ("baseline", "candidate", "candidate", "baseline") if r % 2 == 0 else (
            "candidate", "baseline", "baseline", "candidate")  # fmt: skip
        for position, variant in enumerate(order):
            centre = baseline_ns if variant == "baseline" else candidate_ns
            wobble = ((r * 7 + position * 3) % 5 - 2) * 0.002 * centre
            out.append(Sample(variant=variant, round=r, position=position, duration_ns=centre + wobble,  # type: ignore[arg-type]
                              launches=4, sm_clock_mhz=1980.0, clock_event_reasons=0, temperature_c=41.0,
                              power_w=300.0, throttled=(r == 0 and position == 0)))  # fmt: skip
    return out


def job_result(job_id: int | None, *, key: str = "result-key-0001", spec: dict[str, Any] | None = None,
               rounds: int = 6, hostname: str = "node-a", error: str | None = None) -> JobResult:  # fmt: skip
    """A complete ``JobResult`` for the cells of ``spec`` (default ``spec_dict()``): the
    candidate 20% faster, both variants correct, probes before and after."""
    job_spec = JobSpec.model_validate(spec or spec_dict())
    cells = []
    for index, params in enumerate(job_spec.cells("cpu")):
        base_ns = 1000.0 * (index + 1)
        work = Work(flops=5.0 * params["M"] * params["N"], bytes_read=4.0 * params["M"] * params["N"],  # type: ignore[operator]
                    bytes_written=4.0 * params["M"] * params["N"])  # type: ignore[operator]  # fmt: skip
        ok = CorrectnessResult(passed=True, rel_error=1e-7, max_abs_error=1e-8, cosine_similarity=1.0,
                               rtol=1e-5, atol=1e-6)  # fmt: skip
        cells.append(CellResult(
            index=index, params=params, work={"baseline": work, "candidate": work},
            samples=samples(rounds, base_ns, 0.8 * base_ns), correctness={"baseline": ok, "candidate": ok},
        ))  # fmt: skip
    return JobResult(
        idempotency_key=key, job_id=job_id, spec=job_spec, node=node_info(hostname), timer="perf_counter",
        started_at=T0, finished_at=T0 + timedelta(seconds=12), cells=cells,
        probes=[probe_report("before"), probe_report("after", taken_at=T0 + timedelta(seconds=13))],
        error=error,
    )  # fmt: skip


def big_result(job_id: int, spec: JobSpec, node: str, *, cells: int, samples_per_cell: int,
               key: str | None = None) -> JobResult:  # fmt: skip
    """A synthetic, valid ``JobResult`` of the first ``cells`` cells of ``spec`` on a CPU node,
    ``samples_per_cell`` alternating baseline/candidate samples each (for ingest and download
    drills: sizes, not statistics)."""
    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    work = Work(flops=1e6, bytes_read=1e6, bytes_written=1e6)
    ok = CorrectnessResult(passed=True, rel_error=0.0, max_abs_error=0.0, cosine_similarity=1.0, rtol=1e-5,
                           atol=1e-6)  # fmt: skip
    rows = [
        Sample(
            variant="baseline" if i % 2 == 0 else "candidate",
            round=i // 2,
            position=i % 2,  # type: ignore[arg-type]
            duration_ns=1000.0 + (i % 7),
        )  # fmt: skip
        for i in range(samples_per_cell)
    ]
    return JobResult(
        idempotency_key=key or f"drill-ingest-{job_id:06d}", job_id=job_id, spec=spec,
        node=NodeInfo(hostname=node, device_type="cpu"),
        timer="perf_counter", started_at=t0, finished_at=t0 + timedelta(seconds=60),
        cells=[CellResult(index=i, params=params, work={"baseline": work, "candidate": work},
                          correctness={"baseline": ok, "candidate": ok}, samples=rows)
               for i, params in enumerate(spec.cells("cpu")[:cells])],
    )  # fmt: skip


def list_form(result: JobResult) -> dict[str, Any]:
    """``result`` as a JSON body of a runner before ``schema_version`` 2: no ``schema_version``,
    every cell's samples as JSON-list columns (the form these tests edit value by value)."""
    body = json.loads(result.model_dump_json())
    del body["schema_version"]
    for cell, posted in zip(body["cells"], result.cells, strict=True):
        cell["samples"] = posted.samples.model_dump()
    return body


def wrong_candidate(result: JobResult, message: str = "FAIL: rows 0-3") -> JobResult:
    """``result`` with the candidate failing its correctness check in every cell (``passed``
    False, ``message``); the baseline and the samples unchanged."""
    cells = []
    for c in result.cells:
        bad = c.correctness["candidate"].model_copy(update={"passed": False, "message": message})
        cells.append(c.model_copy(update={"correctness": {**c.correctness, "candidate": bad}}))
    return result.model_copy(update={"cells": cells})
