"""Quantities as people read them, the same on the command line, in the Markdown report and on the
dashboard."""

from __future__ import annotations

import math

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def format_bytes(n: int | float | None) -> str:
    """``1048576`` -> ``"1 MiB"``, ``1536`` -> ``"1.5 KiB"``: binary (IEC 80000-13) units up to
    TiB, at most one decimal; None -> ``"-"``."""
    if n is None:
        return "-"
    value = float(n)
    for unit in _BYTE_UNITS:
        if abs(value) < 1024 or unit == _BYTE_UNITS[-1]:
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_seconds(seconds: float | None) -> str:
    """``41`` -> ``"41 s"``, ``130`` -> ``"2 min 10 s"``, ``4000`` -> ``"1 h 6 min"``; None -> ``"-"``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def format_sig3(x: float, *, sign: bool = False) -> str:
    """``x`` to three significant figures, the one form of ratios and percentages on the command
    line, in the Markdown report and on the dashboard: ``5.0234`` -> ``"5.02"``, ``0.04567`` ->
    ``"0.0457"``, ``977560.26`` -> ``"978,000"`` (thousands separators from 1,000),
    ``1.2345e7`` -> ``"1.23e7"`` (from ten million on, and below 0.001, a power of ten);
    ``sign`` puts ``+`` before a positive value (``"+5.02"``); zero is ``"0"`` (``"+0"`` with
    ``sign``). Non-finite values print as Python's ``"inf"``/``"nan"``; raises nothing."""
    if not math.isfinite(x):
        return f"{x:+}" if sign and x > 0 else str(x)
    lead = "+" if sign and x >= 0 else ""
    if x == 0:
        return lead + "0"
    # the exponent after rounding to three figures (99.96 -> 1.00e+02), from Python's own formatting:
    # exact for subnormals and for the largest float, where 10**exponent or the rounded value do not fit
    mantissa, _, power = f"{x:.2e}".partition("e")
    exponent = int(power)
    if exponent >= 7 or exponent < -3:
        return f"{lead}{mantissa}e{exponent}"
    rounded = float(f"{x:.3g}")  # three significant figures first: 99.96 -> 100, never "100.0"
    if exponent >= 2:
        return f"{lead}{rounded:,.0f}"
    return f"{lead}{rounded:.{2 - exponent}f}"
