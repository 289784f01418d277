"""Probe reports built from recorded H200 readings, for the node-health tests.

* ``fixtures/h200x1_probe_2026-11-30.json``: a real ``kernelab probe`` report of one H200
  (copy 4196.5 GB/s at 512 MiB; NVML telemetry at idle).
* ``fixtures/nccl-tests-all_reduce_perf-2xH200.txt``: nccl-tests' all_reduce_perf on a 2xH200 node
  (in-place columns), the reference the probe is held to.

``h200x2_report`` joins them into the report a healthy 2xH200 node yields: the recorded copy and
telemetry for both GPUs, and nccl-tests' in-place times as all-reduce readings over ranks [0, 1].
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from kernelab.service.contract.schemas import AllReduceReading, ProbeReport

FIXTURES = Path(__file__).parent / "fixtures"
T0 = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def recorded_h200x1() -> ProbeReport:
    """The recorded one-GPU report, unchanged."""
    return ProbeReport.model_validate_json((FIXTURES / "h200x1_probe_2026-11-30.json").read_text())


def nccl_tests_in_place() -> dict[int, tuple[float, float]]:
    """nccl-tests' 2xH200 in-place rows: size in bytes -> (time us, busbw GB/s)."""
    rows: dict[int, tuple[float, float]] = {}
    for line in (FIXTURES / "nccl-tests-all_reduce_perf-2xH200.txt").read_text().splitlines():
        cols = line.split()
        if line.startswith("#") or len(cols) < 13:
            continue
        rows[int(cols[0])] = (float(cols[9]), float(cols[11]))
    return rows


def h200x2_report(
    minutes: float = 0.0,
    *,
    copy_scale: tuple[float, float] = (1.0, 1.0),
    latency_scale: float = 1.0,
    busbw_scale: float = 1.0,
    sizes: tuple[int, ...] = (8, 512 << 10, 128 << 20, 512 << 20),
) -> ProbeReport:
    """A 2xH200 report taken ``minutes`` after ``T0``: recorded copy x ``copy_scale`` per GPU,
    nccl-tests' times x ``latency_scale`` and busbw x ``busbw_scale``."""
    one = recorded_h200x1()
    copy = one.copy_bandwidth[0]
    gpu = one.telemetry[0]
    ref = nccl_tests_in_place()
    reduce = []
    for size in sizes:
        time_us, busbw = ref[size]
        t = time_us * latency_scale
        algbw = busbw * busbw_scale  # busbw = algbw x 2(n-1)/n = algbw for n = 2
        if busbw_scale != 1.0 and algbw > 0:
            t = size / (algbw * 1e3)
        reduce.append(
            AllReduceReading(
                backend="nccl",
                world_size=2,
                ranks=[0, 1],
                size_bytes=size,
                time_us=t,
                algbw_gbps=algbw,
                busbw_gbps=algbw,
                # nccl-tests' host clock around ncclAllReduce from C reads the device time: the
                # host enqueues faster than the GPU runs the ops (kernelab.runners.probes.all_reduce).
                timed_by="cuda-events",
            )
        )
    return one.model_copy(
        update={
            "taken_at": T0 + timedelta(minutes=minutes),
            "copy_bandwidth": [
                copy.model_copy(update={"device_index": i, "bandwidth_gbps": copy.bandwidth_gbps * s})
                for i, s in enumerate(copy_scale)
            ],
            "all_reduce": reduce,
            "telemetry": [gpu.model_copy(update={"device_index": i, "uuid": f"GPU-{i}"}) for i in range(2)],
        }
    )
