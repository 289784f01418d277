"""NVML telemetry: bitmask decoding (pure) and the NVML-absent path, for real."""

from __future__ import annotations

import sys

import pytest

from kernelab.runners.probes import telemetry
from kernelab.runners.probes.telemetry import (
    CLOCK_EVENT_REASONS,
    ContextSampler,
    decode_clock_event_reasons,
    is_throttled,
    read_telemetry,
)


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``import pynvml`` fail in this process, as on a node without nvidia-ml-py."""
    monkeypatch.setitem(sys.modules, "pynvml", None)


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0, []),
        (0x1, ["gpu_idle"]),
        (0x4 | 0x40, ["sw_power_cap", "hw_thermal"]),
        (0x8 | 0x20 | 0x80, ["hw_slowdown", "sw_thermal", "hw_power_brake"]),
        (0x2 | 0x10 | 0x100, ["applications_clocks_setting", "sync_boost", "display_clock_setting"]),
        (0x201, ["gpu_idle", "unknown_0x200"]),
    ],
)
def test_decode_clock_event_reasons(mask: int, names: list[str]) -> None:
    assert decode_clock_event_reasons(mask) == names


def test_decode_every_named_bit_in_order() -> None:
    assert decode_clock_event_reasons(0x1FF) == list(CLOCK_EVENT_REASONS.values())
    assert [1 << i for i in range(9)] == list(CLOCK_EVENT_REASONS)


def test_decode_rejects_negative_mask() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        decode_clock_event_reasons(-1)


@pytest.mark.parametrize(
    ("mask", "throttled"),
    [
        (None, False),
        (0, False),
        (0x1, False),
        (0x2, False),
        (0x10, False),
        (0x100, False),
        (0x4, True),
        (0x8, True),
        (0x20, True),
        (0x40, True),
        (0x80, True),
        (0x1 | 0x40, True),
    ],
)
def test_is_throttled(mask: int | None, throttled: bool) -> None:
    assert is_throttled(mask) is throttled


def test_read_telemetry_absent_reports_absent_and_no_readings(no_pynvml: None) -> None:
    readings, status = read_telemetry()
    assert status == "absent"
    assert readings == []


def test_load_nvml_absent_raises_with_status(no_pynvml: None) -> None:
    with pytest.raises(telemetry.NvmlUnavailable) as info:
        telemetry.load_nvml()
    assert info.value.status == "absent"


def test_context_sampler_absent_reads_none_never_zero(no_pynvml: None) -> None:
    sampler = ContextSampler(0)
    assert sampler.status == "absent"
    assert not sampler.available
    assert sampler.expected_sm_clock_mhz is None
    reading = sampler.read()
    assert reading == {
        "sm_clock_mhz": None,
        "clock_event_reasons": None,
        "temperature_c": None,
        "power_w": None,
    }
    assert "absent" in repr(sampler)


def test_context_sampler_without_device_reads_none() -> None:
    sampler = ContextSampler(None)
    assert not sampler.available
    assert all(v is None for v in sampler.read().values())
    assert set(sampler.read()) == set(ContextSampler.KEYS)


@pytest.mark.gpu
def test_gpu_telemetry_reads_every_visible_gpu() -> None:
    import torch

    readings, status = read_telemetry()
    assert status == "ok", status
    assert [t.device_index for t in readings] == list(range(torch.cuda.device_count()))
    for t in readings:
        assert t.name and t.uuid.startswith(("GPU-", "MIG-"))
        assert t.sm_clock_mhz is not None and t.sm_clock_mhz > 0
        assert t.max_sm_clock_mhz is not None and t.max_sm_clock_mhz >= t.sm_clock_mhz
        assert t.clock_event_reasons is not None
        assert t.clock_event_reason_names == decode_clock_event_reasons(t.clock_event_reasons)
        assert t.temperature_c is not None and t.temperature_c > 0
        assert t.memory_used_bytes is not None and t.memory_used_bytes >= 0


@pytest.mark.gpu
def test_gpu_context_sampler_reads_live_values() -> None:
    import torch

    assert torch.cuda.is_available()
    sampler = ContextSampler(0)
    assert sampler.available, sampler.status
    assert sampler.expected_sm_clock_mhz is not None and sampler.expected_sm_clock_mhz > 0
    reading = sampler.read()
    sm_clock_mhz = reading["sm_clock_mhz"]
    assert sm_clock_mhz is not None and 0 < sm_clock_mhz <= sampler.expected_sm_clock_mhz
    assert isinstance(reading["clock_event_reasons"], int)
    assert reading["temperature_c"] is not None and reading["power_w"] is not None
