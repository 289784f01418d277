"""run_probes, node_info and the text report."""

from __future__ import annotations

import json
import platform
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
import torch

from kernelab.runners.probes import format_probe_report, node_info, run_probes
from kernelab.runners.probes.node import cpu_cache_bytes
from kernelab.service.contract.schemas import (
    AllReduceReading,
    CopyBandwidthReading,
    GpuTelemetry,
    NodeInfo,
    ProbeReport,
    ProbeSpec,
)


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU probe path")
def test_cpu_probe_runs_everything_and_times_itself(no_pynvml: None) -> None:
    t0 = time.perf_counter()
    report = run_probes(ProbeSpec(), "before")
    outer_s = time.perf_counter() - t0
    assert report.errors == {}
    assert report.phase == "before"
    assert 0 < report.wall_s <= outer_s
    assert report.taken_at.tzinfo is not None
    (copy,) = report.copy_bandwidth
    assert copy.bandwidth_gbps > 0
    assert [r.backend for r in report.all_reduce] == ["gloo", "gloo"]
    assert all(r.correct and r.world_size == 2 for r in report.all_reduce)
    assert report.nvml_status == "absent" and report.telemetry == []


def test_impossible_configuration_is_collected_not_raised() -> None:
    report = run_probes(ProbeSpec(nvml=False), device_type="tpu")
    assert set(report.errors) == {"copy_bandwidth", "all_reduce"}
    assert "ValueError" in report.errors["copy_bandwidth"] and "tpu" in report.errors["all_reduce"]
    assert report.copy_bandwidth == [] and report.all_reduce == []
    assert report.wall_s > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA failure")
def test_cuda_probes_on_a_cpu_node_report_errors(no_pynvml: None) -> None:
    report = run_probes(ProbeSpec(), "after", device_type="cuda")
    assert set(report.errors) == {"copy_bandwidth", "all_reduce", "matmul_peak"}
    assert all("no CUDA GPU" in text for text in report.errors.values())
    assert report.nvml_status == "absent"


def test_disabled_probes_run_nothing() -> None:
    report = run_probes(ProbeSpec(copy_bandwidth=False, all_reduce=False, nvml=False))
    assert report.nvml_status == "disabled"
    assert report.copy_bandwidth == report.all_reduce == report.telemetry == []
    assert report.errors == {}
    assert report.wall_s >= 0


def test_unknown_phase_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="phase"):
        run_probes(ProbeSpec(), "during")


def test_node_info_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    info = node_info(torch.device("cpu"))
    assert info.device_type == "cpu" and info.device_count == 1
    assert info.hostname == socket.gethostname()
    assert info.python_version == platform.python_version()
    assert info.torch_version == torch.__version__
    assert info.triton_interpret is True
    assert info.driver_version is None and info.cuda_version is None
    assert info.l2_bytes == cpu_cache_bytes(2)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert node_info(torch.device("cpu")).triton_interpret is False


def test_cpu_cache_levels_are_ordered() -> None:
    sizes = [cpu_cache_bytes(level) for level in (1, 2)] + [cpu_cache_bytes()]
    known = [s for s in sizes if s is not None]
    assert known == sorted(known)
    assert all(s > 0 for s in known)


@pytest.mark.slow  # a Python process
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU node's description")
def test_node_info_of_a_cpu_node_does_not_import_torch() -> None:
    """A process without torch (a runner daemon) describes a CPU node as a process with torch
    does, and torch stays unimported there (its build and the driver library answer)."""
    code = (
        "import json, sys\n"
        "from kernelab.runners.probes import node_info\n"
        "print(json.dumps([node_info().model_dump(mode='json'), 'torch' in sys.modules]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    described, imported = json.loads(out.stdout)
    assert imported is False
    assert described == node_info().model_dump(mode="json")  # here torch is imported: asked as before
    assert described == node_info(torch.device("cpu")).model_dump(mode="json")
    assert described["torch_version"] == torch.__version__ and described["device_type"] == "cpu"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_node_info_cuda_without_gpu_raises() -> None:
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        node_info(torch.device("cuda"))


def test_format_probe_report_shows_readings_gaps_and_errors() -> None:
    node = NodeInfo(
        hostname="gpu-node-7",
        device_type="cuda",
        device_name="NVIDIA H200",
        device_count=2,
        l2_bytes=60 * 1024**2,
        driver_version="580.159.04",
        cuda_version="13.0",
        torch_version="2.11.0",
        triton_version="3.6.0",
        python_version="3.12.3",
    )
    report = ProbeReport(
        phase="before",
        taken_at=datetime(2026, 11, 30, 12, 0, tzinfo=UTC),
        wall_s=1.25,
        copy_bandwidth=[
            CopyBandwidthReading(
                device_index=1, size_bytes=512 * 1024**2, time_us=256.5, bandwidth_gbps=4185.3
            )
        ],
        all_reduce=[
            AllReduceReading(
                backend="nccl",
                world_size=2,
                ranks=[0, 1],
                size_bytes=8,
                time_us=19.46,
                algbw_gbps=0.0,
                busbw_gbps=0.0,
            ),
            AllReduceReading(
                backend="nccl",
                world_size=2,
                ranks=[0, 1],
                size_bytes=1024**2,
                time_us=25.1,
                algbw_gbps=41.78,
                busbw_gbps=41.78,
                correct=False,
            ),
        ],
        telemetry=[
            GpuTelemetry(
                device_index=0,
                name="NVIDIA H200",
                sm_clock_mhz=345.0,
                max_sm_clock_mhz=1980.0,
                clock_event_reasons=0x1,
                clock_event_reason_names=["gpu_idle"],
                other_processes=[{"pid": 1, "own": True}, {"pid": 2, "own": False}],
            )
        ],
        nvml_status="ok",
        errors={"all_reduce": "TimeoutError: did not finish"},
    )
    text = format_probe_report(report, node)
    lines = text.splitlines()
    assert lines[0].startswith("probe (before)  2026-11-30 12:00:00 UTC  took 1.25 s")
    assert "gpu-node-7" in text and "NVIDIA H200" in text and "60 MiB" in text and "driver 580.159.04" in text
    copy_row = next(line for line in lines if "512 MiB" in line)
    assert copy_row.split() == ["1", "512", "MiB", "256.5", "4185.3"]
    assert "all-reduce (nccl, 2 ranks, float32 sum, timed by host-clock)" in text
    assert next(line for line in lines if line.split()[:3] == ["0,1", "8", "B"]).split()[-1] == "yes"
    assert next(line for line in lines if line.split()[:3] == ["0,1", "1", "MiB"]).split()[-1] == "NO"
    gpu_row = next(line for line in lines if line.startswith("0 ") and "gpu_idle" in line)
    # unread readings show '-', never 0; one process that is not ours
    assert gpu_row.split() == ["0", "345", "1980", "-", "-", "-", "-", "-", "-", "-", "gpu_idle", "1"]
    assert lines[-1] == "  all_reduce: TimeoutError: did not finish"


def test_format_probe_report_of_a_real_cpu_probe(no_pynvml: None) -> None:
    report = run_probes(ProbeSpec(all_reduce=False))
    text = format_probe_report(report, node_info(torch.device("cpu")))
    assert "copy bandwidth" in text and "nvml: absent" in text and "all-reduce" not in text


@pytest.mark.gpu
def test_gpu_probe_end_to_end() -> None:
    n = torch.cuda.device_count()
    report = run_probes(ProbeSpec(), "adhoc")
    assert report.errors == {}, report.errors
    assert len(report.copy_bandwidth) == n
    assert all(r.correct and r.world_size == n for r in report.all_reduce)
    info = node_info()
    assert info.device_type == "cuda" and info.device_count == n and info.l2_bytes and info.l2_bytes > 0
    print(format_probe_report(report, info))
