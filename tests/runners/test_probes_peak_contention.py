"""The matmul-peak probe and the contention monitor (the parts that run without a GPU)."""

from __future__ import annotations

import os

import pytest
import torch

from kernelab.runners.probes import run_probes
from kernelab.runners.probes.contention import GpuContentionMonitor, merge_processes
from kernelab.runners.probes.peak import measure_matmul_peak
from kernelab.service.contract.schemas import ProbeSpec

pytestmark = pytest.mark.timeout(60)


def test_matmul_peak_on_cpu_reports_a_consistent_rate():
    r = measure_matmul_peak(torch.device("cpu"), size=128, launches=2, repeats=2)
    assert (r.m, r.n, r.k, r.dtype, r.launches) == (128, 128, 128, "float32", 2)
    assert r.time_us > 0
    assert r.tflops == pytest.approx(2 * 128**3 / (r.time_us * 1e-6) / 1e12, rel=1e-9)


def test_matmul_peak_rejects_bad_sizes():
    with pytest.raises(ValueError, match="size, launches and repeats"):
        measure_matmul_peak(torch.device("cpu"), size=0)


def test_run_probes_measures_the_matmul_peak_only_on_cuda():
    report = run_probes(ProbeSpec(copy_bandwidth=False, all_reduce=False, nvml=False), device_type="cpu")
    assert report.matmul_peak == [] and "matmul_peak" not in report.errors


def test_merge_processes_unions_by_pid_and_marks_our_own():
    own = os.getpid()
    merged = merge_processes(
        compute=[(own, 1 << 30), (4242, None)],
        utilisation=[(own, 97.0), (5151, 12.0), (5151, 30.0)],
        own_pid=own,
    )
    by_pid = {p["pid"]: p for p in merged}
    assert [p["pid"] for p in merged] == sorted(by_pid)
    assert by_pid[own] == {"pid": own, "own": True, "used_memory_bytes": 1 << 30, "sm_util_pct": 97.0}
    assert by_pid[4242] == {"pid": 4242, "own": False, "used_memory_bytes": None, "sm_util_pct": None}
    assert by_pid[5151]["sm_util_pct"] == 30.0 and by_pid[5151]["used_memory_bytes"] is None


def test_monitor_without_a_device_reads_nothing():
    monitor = GpuContentionMonitor(None)
    assert not monitor.available and monitor.status == "no device"
    monitor.start()
    monitor.check(0)
    monitor.check(5)
    assert monitor.take() == []


@pytest.mark.gpu
def test_monitor_on_gpu_sees_our_own_process_only():
    monitor = GpuContentionMonitor(torch.cuda.current_device())
    x = torch.ones(1 << 24, device="cuda")
    monitor.start()
    for _ in range(100):
        x.mul_(1.0)
    torch.cuda.synchronize()
    monitor.check(1)
    (reading,) = monitor.take()
    assert reading.round == 1 and reading.processes  # we hold a context, so we are listed


@pytest.mark.gpu
def test_matmul_peak_on_gpu_is_below_the_datasheet():
    r = measure_matmul_peak(torch.device("cuda", torch.cuda.current_device()))
    assert r.dtype == "bfloat16" and 100 < r.tflops < 1000  # H200 dense bf16 datasheet: 989 TFLOP/s
