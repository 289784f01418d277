"""Copy bandwidth: the bytes-counted formula, buffer sizing, and a real host copy."""

from __future__ import annotations

import pytest
import torch

from kernelab.runners.probes.copy_bandwidth import (
    copy_bandwidth_gbps,
    cpu_copy_size_bytes,
    cuda_copy_size_bytes,
    measure_copy_bandwidth,
    measure_cpu_copy,
    measure_cuda_copy,
)

MIB = 1024**2


def test_bandwidth_counts_bytes_read_and_written() -> None:
    # 1 GiB copied in 0.5 ms moves 2 GiB: 2 * 2**30 B / 5e-4 s = 4294.967296 GB/s
    assert copy_bandwidth_gbps(2**30, 500_000.0) == pytest.approx(4294.967296, rel=1e-12)
    # 1e9 B in 1 s: 2e9 B/s = 2 GB/s
    assert copy_bandwidth_gbps(10**9, 1e9) == pytest.approx(2.0)


@pytest.mark.parametrize(("size", "time_ns"), [(1, 0.0), (1, -5.0), (-1, 1.0)])
def test_bandwidth_rejects_impossible_inputs(size: int, time_ns: float) -> None:
    with pytest.raises(ValueError):
        copy_bandwidth_gbps(size, time_ns)


@pytest.mark.parametrize(
    ("l2", "expected"),
    [(60 * MIB, 512 * MIB), (50 * MIB, 512 * MIB), (100 * MIB, 800 * MIB), (96 * MIB + 1, 769 * MIB)],
)
def test_cuda_buffer_is_at_least_eight_l2(l2: int, expected: int) -> None:
    size = cuda_copy_size_bytes(l2)
    assert size == expected
    assert size >= 8 * l2 and size % MIB == 0


@pytest.mark.parametrize(
    ("llc", "expected"),
    [(None, 64 * MIB), (4 * MIB, 64 * MIB), (16 * MIB, 128 * MIB), (32 * MIB, 256 * MIB), (2**30, 256 * MIB)],
)
def test_cpu_buffer_sized_from_llc_and_clamped(llc: int | None, expected: int) -> None:
    assert cpu_copy_size_bytes(llc) == expected


def test_cpu_copy_reading_is_positive_and_consistent() -> None:
    reading = measure_cpu_copy(size_bytes=16 * MIB, copies_per_sample=2, samples=3)
    assert reading.device_index == 0
    assert reading.size_bytes == 16 * MIB
    assert reading.time_us > 0
    assert reading.bandwidth_gbps > 0
    # the reported bandwidth is the read + written bytes over the reported time
    assert reading.bandwidth_gbps == pytest.approx(2 * 16 * MIB / (reading.time_us * 1e3), rel=1e-9)


def test_default_cpu_probe_returns_one_host_reading() -> None:
    readings = measure_copy_bandwidth("cpu")
    assert len(readings) == 1
    assert 64 * MIB <= readings[0].size_bytes <= 256 * MIB
    assert readings[0].bandwidth_gbps > 0


@pytest.mark.parametrize(("copies", "samples"), [(0, 3), (2, 0)])
def test_counts_below_one_are_rejected(copies: int, samples: int) -> None:
    with pytest.raises(ValueError, match=">= 1"):
        measure_cpu_copy(size_bytes=MIB, copies_per_sample=copies, samples=samples)


def test_unknown_device_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="not supported"):
        measure_copy_bandwidth("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_gpu_raises() -> None:
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        measure_copy_bandwidth("cuda")


@pytest.mark.gpu
def test_cuda_copy_every_gpu_with_buffer_beyond_l2() -> None:
    readings = measure_copy_bandwidth("cuda")
    assert [r.device_index for r in readings] == list(range(torch.cuda.device_count()))
    for r in readings:
        l2 = torch.cuda.get_device_properties(r.device_index).L2_cache_size
        assert r.size_bytes >= 8 * l2
        assert r.time_us > 0 and r.bandwidth_gbps > 0
        assert r.bandwidth_gbps == pytest.approx(2 * r.size_bytes / (r.time_us * 1e3), rel=1e-9)


@pytest.mark.gpu
def test_cuda_copy_time_scales_with_size() -> None:
    # Twice the bytes must take about twice the time once both buffers exceed the L2: the probe
    # measures streaming bandwidth, not launch overhead.
    small = measure_cuda_copy(0, size_bytes=512 * MIB)
    large = measure_cuda_copy(0, size_bytes=1024 * MIB)
    assert large.time_us / small.time_us == pytest.approx(2.0, rel=0.15)
