"""Quantities as people read them, the same on the command line, in the Markdown report and on the
dashboard."""

from __future__ import annotations

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
