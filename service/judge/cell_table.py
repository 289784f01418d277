"""A stored comparison's cells as a flat table: sweep axes, short labels, achieved rates, export rows.

Everything here is arithmetic on what a compare worker stored (``Comparison``): no statistic is
computed. The dashboard's sweep views (``kernelab.web.sweep``) and the per-cell export
(``GET /api/v1/jobs/{id}/cells?format=csv|json``) both read it.

* **Axes**: the parameters whose value changes across the cells, in the order they first appear;
  a parameter with one value in every cell is *fixed* and shown once (``sweep_axes``).
* **Achieved rates** (``side_rates``): per side, GB/s and TFLOP/s at the median time from the work
  the benchmark declared (``CellComparison.throughput``, ``kernelab.service.judge.estimators.throughput``),
  as a percentage of the node's probed peaks (``kernelab.service.judge.verdicts.probe_peaks``: the best
  device-local copy reading, GB/s read + written, and the best matmul reading, TFLOP/s). The
  arithmetic intensity is FLOP per byte moved, ``flops / (bytes_read + bytes_written)`` =
  ``tflops * 1e3 / gbps`` (both rates share the median time), as in Williams, Waterman and
  Patterson, "Roofline: an insightful visual performance model for multicore architectures",
  CACM 52(4), 2009.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kernelab.service.contract.samples import Side
from kernelab.service.contract.schemas import CellComparison, Comparison, ParamValue
from kernelab.service.contract.units import format_sig3
from kernelab.service.judge.report import (
    Columns,
    cell_speedup,
    deciding_reason,
    format_delta,
    format_duration_ns,
    format_flags,
    marked,
)
from kernelab.service.judge.verdicts import probe_peaks

SIDES: tuple[Side, Side] = ("baseline", "candidate")


@dataclass(frozen=True)
class SweepAxes:
    """``axes``: parameter name -> its distinct values across the cells (first-seen order, at least
    two each); ``fixed``: parameter name -> the one value every cell has."""

    axes: dict[str, list[ParamValue]]
    fixed: dict[str, ParamValue]


def _key(value: ParamValue) -> str:
    """A parameter value as a hashable, type-exact key (``1`` and ``True`` and ``1.0`` differ)."""
    return f"{type(value).__name__}:{value!r}"


def sweep_axes(cells: Sequence[CellComparison]) -> SweepAxes:
    """The varying and fixed parameters of ``cells`` (see ``SweepAxes``). A parameter missing from
    some cells (a per-device grid) counts as varying when present with two or more values, and is
    never fixed."""
    values: dict[str, dict[str, ParamValue]] = {}
    present: dict[str, int] = {}
    for cell in cells:
        for name, value in cell.params.items():
            values.setdefault(name, {}).setdefault(_key(value), value)
            present[name] = present.get(name, 0) + 1
    axes = {name: list(v.values()) for name, v in values.items() if len(v) > 1}
    fixed = {name: next(iter(v.values())) for name, v in values.items()
             if len(v) == 1 and present[name] == len(cells)}  # fmt: skip
    return SweepAxes(axes, fixed)


def format_value(value: ParamValue) -> str:
    """A parameter value as the labels write it: ``4096``, ``0.5``, ``float32``, ``True``."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def short_label(cell: CellComparison, axes: Iterable[str]) -> str:
    """``"M=8, N=16"``: the cell's values of the varying parameters ``axes`` only; the stored label
    when no parameter varies (a one-cell job)."""
    parts = [f"{k}={format_value(cell.params[k])}" for k in axes if k in cell.params]
    return ", ".join(parts) or cell.label


@dataclass(frozen=True)
class SideRates:
    """One side's achieved rates: GB/s (bytes read + written per second, 1e9 B/s) and TFLOP/s
    (1e12 FLOP/s) at its median time, their percentages of the node's peaks, and the arithmetic
    intensity in FLOP/byte. None where the work was not declared or no peak was probed."""

    gbps: float | None
    tflops: float | None
    pct_copy: float | None
    pct_matmul: float | None
    intensity: float | None


def side_rates(cell: CellComparison, side: Side, peaks: Mapping[str, float]) -> SideRates:
    """``SideRates`` of ``side`` of ``cell`` against ``peaks`` (``probe_peaks``: ``copy_gbps``,
    ``matmul_tflops``; a missing or zero peak gives no percentage)."""
    gbps = cell.throughput.get(f"{side}_gbps")
    tflops = cell.throughput.get(f"{side}_tflops")
    copy, matmul = peaks.get("copy_gbps"), peaks.get("matmul_tflops")
    return SideRates(
        gbps=gbps,
        tflops=tflops,
        pct_copy=None if gbps is None or not copy else 100.0 * gbps / copy,
        pct_matmul=None if tflops is None or not matmul else 100.0 * tflops / matmul,
        intensity=None if gbps is None or tflops is None or gbps <= 0 else tflops * 1e3 / gbps,
    )


def comparison_peaks(comparison: Comparison) -> dict[str, float]:
    """The node's probed peaks of ``comparison`` (``probe_peaks`` of its stored probe reports)."""
    return probe_peaks(comparison.probes)


def has_work(comparison: Comparison) -> bool:
    """True when any cell's stored throughput has a rate (some work was declared)."""
    return any(cell.throughput for cell in comparison.cells)


def noise_pct(cell: CellComparison, side: Side) -> float | None:
    """A side's noise: the interquartile range of its kept samples over their median, in percent
    (a robust counterpart of nvbench's "Noise", the relative standard deviation); None without
    both."""
    stats = cell.baseline if side == "baseline" else cell.candidate
    if stats.iqr_ns is None or not stats.median_ns:
        return None
    return 100.0 * stats.iqr_ns / stats.median_ns


def _rate_text(rates: SideRates) -> str:
    if rates.gbps is None:
        return "n/a"
    pct = "" if rates.pct_copy is None else f", {format_sig3(rates.pct_copy)}%"
    return f"{format_sig3(rates.gbps)} GB/s{pct}"


def axis_columns(comparison: Comparison) -> Columns:
    """The comparison table in nvbench's layout (``kernelab.service.judge.report.format_table``'s
    ``columns``): one column per sweep axis (``sweep_axes``; the fixed parameters said once above
    the table), then each side's median and noise (``noise_pct``), each side's achieved GB/s with
    its % of the probed copy peak (only when the cells declare bytes), Δ% [95% CI], speedup,
    verdict and flags. A void timing is in parentheses, as in the default layout. A comparison
    with no varying parameter gets a ``cell`` column of labels instead of axis columns."""
    axes = sweep_axes(comparison.cells)
    names = list(axes.axes)
    peaks = comparison_peaks(comparison)
    with_rates = any(f"{side}_gbps" in cell.throughput for cell in comparison.cells for side in SIDES)
    labels = {"baseline": comparison.baseline_label, "candidate": comparison.candidate_label}
    header = [*(names or ["cell"])]
    for side in SIDES:
        header += [f"{side} ({labels[side]})", "noise"]
    if with_rates:
        header += [f"{side} GB/s, % peak" for side in SIDES]
    header += ["Δ% [95% CI]", "speedup", "verdict", "flags"]
    rows = []
    for cell in comparison.cells:
        keys = [format_value(cell.params[k]) if k in cell.params else "-" for k in names] or [cell.label]
        timing: list[str] = []
        for side in SIDES:
            noise = noise_pct(cell, side)
            stats = cell.baseline if side == "baseline" else cell.candidate
            timing += [
                format_duration_ns(stats.median_ns),
                "n/a" if noise is None else f"{format_sig3(noise)}%",
            ]
        if with_rates:
            timing += [_rate_text(side_rates(cell, side, peaks)) for side in SIDES]
        timing += [format_delta(cell), cell_speedup(cell)]
        rows.append([*keys, *marked(cell, timing), cell.verdict, format_flags(cell)])
    first = len(names or ["cell"])
    right = frozenset(range(first, first + 4 + (2 if with_rates else 0)))
    fixed = [f"{k}={format_value(v)}" for k, v in axes.fixed.items()]
    return Columns(header, rows, right, [f"every cell: {' '.join(fixed)}"] if fixed and names else [])


EXPORT_COLUMNS: tuple[str, ...] = (
    "index", "label", "verdict", "reason_code", "reason", "flags", "error",
    "baseline_n", "candidate_n", "baseline_median_ns", "candidate_median_ns",
    "ratio", "ci_low", "ci_high", "delta_pct", "delta_ci_low_pct", "delta_ci_high_pct", "speedup",
    "p_value", "p_adjusted", "mde_pct",
    "baseline_gbps", "baseline_tflops", "baseline_pct_copy_peak", "baseline_pct_matmul_peak",
    "baseline_flop_per_byte",
    "candidate_gbps", "candidate_tflops", "candidate_pct_copy_peak", "candidate_pct_matmul_peak",
    "candidate_flop_per_byte",
)  # fmt: skip
"""Columns of the per-cell export after the ``param.NAME`` columns (one per parameter of any cell):
``ratio`` = candidate median / baseline median (< 1: faster), ``ci_low``/``ci_high`` its 95 %
bootstrap CI, ``delta_*`` the same as percentages, ``speedup`` the ratio in words
(``"1.23× faster"``; the bare ratio ``"0.9×"`` for a cell whose timing is void: failed,
incorrect, nondeterministic, implausible), ``*_gbps``/``*_tflops`` the achieved rates and
``*_pct_*_peak`` their share of the node's probed peaks (``SideRates``)."""


def _pct(x: float | None) -> float | None:
    return None if x is None else (x - 1.0) * 100.0


def export_rows(comparison: Comparison) -> list[dict[str, Any]]:
    """One flat dict per cell in sweep order: ``params`` (a dict of the cell's parameters) then the
    ``EXPORT_COLUMNS``; floats as stored, None where the comparison has no number."""
    peaks = comparison_peaks(comparison)
    rows = []
    for cell in comparison.cells:
        reason = deciding_reason(cell)
        row: dict[str, Any] = {
            "index": cell.index, "params": dict(cell.params), "label": cell.label, "verdict": cell.verdict,
            "reason_code": reason.code if reason else None, "reason": reason.message if reason else None,
            "flags": list(cell.flags), "error": cell.error,
            "baseline_n": cell.baseline.n, "candidate_n": cell.candidate.n,
            "baseline_median_ns": cell.baseline.median_ns, "candidate_median_ns": cell.candidate.median_ns,
            "ratio": cell.ratio, "ci_low": cell.ci_low, "ci_high": cell.ci_high,
            "delta_pct": cell.delta_pct, "delta_ci_low_pct": _pct(cell.ci_low),
            "delta_ci_high_pct": _pct(cell.ci_high),
            "speedup": cell_speedup(cell) if cell.ratio is not None else None,
            "p_value": cell.p_value, "p_adjusted": cell.p_adjusted, "mde_pct": cell.mde_pct,
        }  # fmt: skip
        for side in SIDES:
            r = side_rates(cell, side, peaks)
            row.update({
                f"{side}_gbps": r.gbps, f"{side}_tflops": r.tflops, f"{side}_pct_copy_peak": r.pct_copy,
                f"{side}_pct_matmul_peak": r.pct_matmul, f"{side}_flop_per_byte": r.intensity,
            })  # fmt: skip
        rows.append(row)
    return rows


def export_json(comparison: Comparison) -> str:
    """``{"job_id", "benchmark", "baseline_label", "candidate_label", "threshold_pct", "timer",
    "peaks": {copy_gbps, matmul_tflops}, "fixed": {...}, "axes": [...], "cells": export_rows}``."""
    sweep = sweep_axes(comparison.cells)
    doc = {
        "job_id": comparison.job_id, "benchmark": comparison.benchmark,
        "baseline_label": comparison.baseline_label, "candidate_label": comparison.candidate_label,
        "threshold_pct": comparison.threshold_pct, "timer": comparison.timer,
        "peaks": comparison_peaks(comparison), "fixed": sweep.fixed, "axes": list(sweep.axes),
        "cells": export_rows(comparison),
    }  # fmt: skip
    return json.dumps(doc, allow_nan=False)


def export_csv(comparison: Comparison) -> str:
    """The rows of ``export_rows`` as CSV (RFC 4180 via ``csv``): a header of ``param.NAME`` for
    every parameter of any cell (first-seen order), then ``EXPORT_COLUMNS``; ``flags`` joined by
    ``;``; empty fields for None. A text field that a spreadsheet would read as a formula
    (starting with ``= + - @``, tab or CR) is prefixed with ``'`` (OWASP "CSV injection")."""
    rows = export_rows(comparison)
    names = list(dict.fromkeys(k for row in rows for k in row["params"]))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow([f"param.{n}" for n in names] + list(EXPORT_COLUMNS))
    for row in rows:
        params = [_csv_field(row["params"].get(n)) for n in names]
        rest = [_csv_field(";".join(row[c]) if c == "flags" else row[c]) for c in EXPORT_COLUMNS]
        writer.writerow(params + rest)
    return out.getvalue()


def _csv_field(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    text = str(value)
    return "'" + text if isinstance(value, str) and text[:1] in ("=", "+", "-", "@", "\t", "\r") else text
