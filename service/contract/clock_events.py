"""NVML clock-event reasons: the one reading of the mask that telemetry, samples and node health share.

An NVML clock-event-reasons mask (``nvmlDeviceGetCurrentClocksEventReasons``, formerly
``...ThrottleReasons``) says why the SM clock is where it is. Bits, from nvml.h
(``nvmlClocksEventReason*`` since CUDA 12.2, ``nvmlClocksThrottleReason*`` before; the values did
not change)::

    0x1 gpu_idle              0x2 applications_clocks_setting   0x4 sw_power_cap
    0x8 hw_slowdown           0x10 sync_boost                   0x20 sw_thermal
    0x40 hw_thermal           0x80 hw_power_brake               0x100 display_clock_setting

Two classes (nvidia-smi ``-q -d PERFORMANCE`` lists the same split under "Clocks Event Reasons"):

* **throttle** (``THROTTLE_MASK``): sw_power_cap, hw_slowdown, sw_thermal, hw_thermal,
  hw_power_brake: power, heat or hardware protection pulled the clock below what the work asked;
* **informational** (everything else, unknown future bits included): idleness or configuration
  (gpu_idle, applications_clocks_setting, sync_boost, display_clock_setting). They never make a
  sample throttled or a node degraded.

Placeholders. DCGM reports a field it could not read as a *blank* value, ``DCGM_INT64_BLANK =
0x7ffffffffffffff0`` and the codes just above it (``..f1`` not found, ``..f2`` not supported,
``..f3`` not permissioned; dcgm_structs.h), and some exporters pass them on as the mask. Read as
bits, 0x7ffffffffffffff0 would be 59 reasons; it is "no data" (``is_placeholder``), as is any
value above the int64 range.

``is_throttled`` (a sample) and the node-health rule (``kernelab.service.judge.health``) both use
``throttle_reasons``: one rule. Names a client posts beside a mask are never trusted over it.
Pure Python; no numpy, no pydantic.
"""

from __future__ import annotations

NAMES: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
}
"""nvml.h's clock-event reason bits and kernelab's names for them."""
THROTTLE_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
"""sw_power_cap | hw_slowdown | sw_thermal | hw_thermal | hw_power_brake."""
POWER_CAP = 0x4
SAMPLE_THROTTLE_MASK = THROTTLE_MASK & ~POWER_CAP
"""The reasons that make a *sample* throttled whatever its clock (``kernelab.service.judge.estimators.
throttled_mask``): every throttle reason but ``sw_power_cap``. That one alone is the power limiter
holding the board at its limit under the kernel's own load, the state a long, dense kernel runs in
however the samples are spaced: on an H200, 8192^3 bf16 matmuls in one process read 0x4 on every
sample at 1635-1650 MHz (83% of 1980 MHz), so 8 of 10 A/A jobs kept no sample and had no verdict
(``docs/results/2026-12-04-h200-honest.md``). For it the clock decides, as nvbench decides
throttling by the clock alone (a sample below 75% of the expected SM clock,
``kernelab.runners.engine.THROTTLE_CLOCK_FRACTION``); node health ignores it alone too
(``kernelab.service.judge.health.IGNORED_CLOCK_REASONS``)."""
THROTTLE_NAMES: frozenset[str] = frozenset(NAMES[b] for b in NAMES if b & THROTTLE_MASK)
INFORMATIONAL_NAMES: frozenset[str] = frozenset(NAMES.values()) - THROTTLE_NAMES
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
"""dcgm_structs.h ``DCGM_INT64_BLANK``: the first of DCGM's placeholder values for a 64-bit field."""
INT64_MAX = 2**63 - 1


def is_placeholder(mask: int | None) -> bool:
    """True when ``mask`` carries no data: None, a DCGM blank value (>= ``DCGM_INT64_BLANK``) or a
    value outside the non-negative int64 range."""
    return mask is None or mask < 0 or mask >= DCGM_INT64_BLANK


def decode(mask: int | None) -> list[str]:
    """Names of the bits set in ``mask``, lowest bit first; bits nvml.h does not name (as of CUDA 13)
    decode to ``"unknown_0x<bit>"``. ``[]`` for a placeholder (``is_placeholder``) or None.
    Raises ``ValueError`` for a negative mask."""
    if mask is not None and mask < 0:
        raise ValueError(f"a clock-event-reasons mask is non-negative, got {mask}")
    if is_placeholder(mask):
        return []
    assert mask is not None
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(NAMES.get(bit, f"unknown_0x{bit:x}"))
        bit <<= 1
    return names


def throttle_reasons(mask: int | None) -> list[str]:
    """The throttle reasons (``THROTTLE_MASK``) set in ``mask``; ``[]`` for a placeholder or None."""
    if is_placeholder(mask):
        return []
    assert mask is not None
    return [NAMES[bit] for bit in sorted(NAMES) if bit & THROTTLE_MASK & mask]


def is_throttled(mask: int | None) -> bool:
    """True when ``mask`` holds a throttle reason. None or a placeholder (not readable) is False:
    an unknown state is not evidence of throttling."""
    return bool(throttle_reasons(mask))
