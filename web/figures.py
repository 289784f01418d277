"""Plotly figure builders for the dashboard: pure functions from schemas to figures.

No database access and no I/O: every builder takes pydantic objects from ``kernelab.service.contract.schemas``
and
returns a ``plotly.graph_objects.Figure``. The routes serialise figures with ``figure_json`` (which
makes the JSON safe to embed in an HTML ``<script>`` element) and plotly.js draws them.

Durations are stored in nanoseconds per launch (``Sample.duration_ns``); the figures display them in
the unit that keeps the numbers readable (ns, µs or ms, chosen from the median of what is drawn).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import cache
from statistics import median
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from markupsafe import Markup
from plotly.subplots import make_subplots

from kernelab.service.contract.samples import VARIANT_NAMES
from kernelab.service.contract.schemas import (
    CellResult,
    Comparison,
    HealthBand,
    JobResult,
    ProbeReport,
    SampleColumns,
    Series,
    Side,
)
from kernelab.service.contract.schemas.probe_protocol import Panel, Probe, probes_with
from kernelab.service.contract.units import format_sig3
from kernelab.service.judge import estimators, stats

# Colours of the two sides everywhere on the dashboard (the CSS badges use the same pair).
VARIANT_COLOURS: dict[Side, str] = {"baseline": "#5b6b7f", "candidate": "#d9622b"}
_THROTTLED_COLOUR = "#b00020"
_CLOCK_COLOUR = "rgba(60, 120, 60, 0.55)"
_BAND_COLOUR = "rgba(60, 120, 60, 0.15)"  # a healthy band
# (unit name, nanoseconds per unit), smallest first.
_TIME_UNITS: tuple[tuple[str, float], ...] = (("ns", 1.0), ("µs", 1e3), ("ms", 1e6), ("s", 1e9))
# Log y axis by default when the medians drawn span more than this factor (e.g. an interpreted
# kernel 1000x slower than eager code would flatten the other variant on a linear axis).
_AUTO_LOG_SPAN = 30.0
# Above this many samples per variant a box shows outliers only, not every point (page weight).
_MAX_POINTS_PER_VARIANT = 5_000
_Group = Sequence[float] | np.ndarray  # durations of one (variant, cell): the log-axis choice
_LAYOUT = dict(
    margin=dict(l=60, r=20, t=80, b=50),
    font=dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12),
    legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0),
)


@cache
def _template() -> dict[str, Any]:
    """The ``plotly_white`` template as a plain dict (figure dicts carry it resolved, as
    ``Figure.to_json`` does)."""
    return pio.templates["plotly_white"].to_plotly_json()


def time_unit(values_ns: Iterable[float]) -> tuple[str, float]:
    """Display unit for durations: ``(name, ns_per_unit)`` from the median of ``values_ns`` (ns).

    The largest unit in which the median is at least 1 (``ns``, ``µs``, ``ms``, ``s``); ``ns`` for
    an empty input.
    """
    values = [v for v in values_ns if v is not None]
    if not values:
        return _TIME_UNITS[0]
    mid = median(values)
    chosen = _TIME_UNITS[0]
    for name, scale in _TIME_UNITS:
        if mid >= scale:
            chosen = (name, scale)
    return chosen


def _side_labels(result: JobResult) -> dict[Side, str]:
    baseline, candidate = stats.variant_labels(result)
    return {"baseline": baseline, "candidate": candidate}


def _execution_order(samples: SampleColumns) -> np.ndarray:
    """Indices of ``samples`` sorted by (round, position), ties kept in posting order: (n,) int64."""
    keys = (np.asarray(samples.position, dtype=np.int64), np.asarray(samples.round, dtype=np.int64))
    return np.lexsort(keys)


def _kept(result: JobResult, cell: CellResult, variant: Side) -> np.ndarray:
    """Durations (ns, float64) of the samples of ``variant`` that the statistics keep
    (``estimators.kept_mask``), in execution order."""
    samples = cell.samples
    if not len(samples):
        return np.empty(0)
    order = _execution_order(samples)
    keep = np.asarray(samples.variant)[order] == VARIANT_NAMES.index(variant)
    keep &= estimators.kept_mask(samples, exclude_throttled=result.spec.measurement.exclude_throttled)[order]
    return np.asarray(samples.duration_ns, dtype=np.float64)[order][keep]


def _median_span(groups: Iterable[_Group]) -> float:
    """max/min of the positive medians of ``groups`` (1.0 when fewer than two)."""
    medians = [float(np.percentile(g, 50)) for g in groups if len(g)]  # a + (b - a) / 2: cannot overflow
    positive = [m for m in medians if m > 0]
    return max(positive) / min(positive) if len(positive) >= 2 else 1.0


def _spread(groups: Sequence[_Group]) -> float:
    """How far what is drawn spreads, as a factor: the larger of the medians' span
    (``_median_span``) and max(95th percentile) / min(5th percentile) over the groups' positive
    values (one group with a 100x tail counts as much as two groups 100x apart); 1.0 without data.
    One ``np.percentile`` call per group of two or more values (a one-value group is its value)."""
    lows, mids, highs = [], [], []
    for g in groups:
        if len(g) == 1:
            v = float(g[0])
            if v > 0:
                lows.append(v)
                mids.append(v)
                highs.append(v)
            continue
        a = np.asarray(g, dtype=np.float64)
        if not a.size:
            continue
        mid = float(np.percentile(a, 50))
        if mid > 0:
            mids.append(mid)
        a = a[a > 0]
        if a.size:
            lo, hi = np.percentile(a, [5, 95])
            lows.append(float(lo))
            highs.append(float(hi))
    medians = max(mids) / min(mids) if len(mids) >= 2 else 1.0
    tails = max(highs) / min(lows) if lows else 1.0
    return max(medians, tails)


def _decade_ticks(spread: float) -> int | str:
    """The log axis's ``dtick``: 1 (a label at every power of ten) when the data spans 1.5
    decades or more, else ``"D2"`` (labels at 1, 2 and 5 of each decade: a narrow range still has
    ticks)."""
    return 1 if spread >= 10**1.5 else "D2"


def _log_layout(log_y: bool | None, groups: Iterable[_Group]) -> dict[str, Any]:
    """Layout keys for a log y axis when asked, or (``log_y=None``) when what is drawn spreads
    over more than ``_AUTO_LOG_SPAN`` (``_spread``: the medians' span or the samples' 5-95 %
    range); a log axis labels decades (``_decade_ticks``). With the linear/log toggle."""
    groups = list(groups)
    spread = _spread(groups)
    if log_y is None:
        log_y = spread > _AUTO_LOG_SPAN
    dtick = _decade_ticks(spread)
    return {"updatemenus": _log_toggle(active=int(log_y), dtick=dtick),
            "yaxis_type": "log" if log_y else "linear", "yaxis_dtick": dtick if log_y else None}  # fmt: skip


def _log_toggle(active: int, dtick: int | str = "D2") -> list[dict]:
    """A linear/log switch of the y axis, drawn above the legend at the top right; the log
    button sets ``dtick`` (decade labels), the linear one clears it (plotly's automatic ticks)."""
    return [
        dict(
            type="buttons",
            direction="right",
            active=active,
            x=1.0,
            xanchor="right",
            y=1.14,
            yanchor="bottom",
            showactive=True,
            buttons=[
                dict(label="linear", method="relayout", args=[{"yaxis.type": "linear", "yaxis.dtick": None}]),
                dict(label="log", method="relayout", args=[{"yaxis.type": "log", "yaxis.dtick": dtick}]),
            ],
        )
    ]


def _layout(title: str, log: dict[str, Any], yaxis: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """The common layout with ``title`` (top left), the log switch of ``_log_layout`` and ``yaxis``."""
    return {
        **_LAYOUT, "template": _template(), "title": {"text": title, "x": 0.0, "xanchor": "left", "y": 0.98},
        "updatemenus": log["updatemenus"], "yaxis": {**yaxis, "type": log["yaxis_type"],
        **({"dtick": log["yaxis_dtick"]} if log["yaxis_dtick"] is not None else {})}, **extra,
    }  # fmt: skip


def samples_figure(data: JobResult | Comparison, *, log_y: bool | None = None) -> go.Figure:
    """``samples_figure_dict`` as a validated ``plotly.graph_objects.Figure``."""
    return go.Figure(samples_figure_dict(data, log_y=log_y))


def samples_figure_dict(data: JobResult | Comparison, *, log_y: bool | None = None) -> dict[str, Any]:
    """Per-cell distributions of baseline vs candidate, side by side, as a plotly figure dict.

    ``data`` is either a ``JobResult`` (raw samples: one box per cell and variant with every kept
    sample drawn as a jittered point; the kept samples are those ``kernelab.service.judge.stats`` uses) or a
    ``Comparison`` (no raw samples: the median per cell and variant with its interquartile range as
    an error bar). Either way the figure has exactly two traces, ``baseline`` then ``candidate``,
    with the cells along x in sweep order. Durations are per launch, shown in the unit chosen by
    ``time_unit``. ``log_y``: start the y axis in log (True) or linear (False) scale; None picks
    log when the (cell, variant) medians span more than 30x. A button toggles it in the browser.

    Returns ``{"data": [trace, trace], "layout": {...}}`` of plain lists, dicts, str and float (not
    validated: ``go.Figure(d)`` validates it; ``figure_json`` serialises it). O(samples) work and
    no plotly object construction, so a 1,000-cell sweep costs milliseconds.
    """
    if isinstance(data, JobResult):
        traces, groups, ytitle = _raw_boxes(data)
        title = "Samples per cell (each point is one timed sample)"
    else:
        traces, groups, ytitle = _summary_points(data)
        title = "Median per cell (bars: interquartile range)"
    layout = _layout(
        title,
        _log_layout(log_y, groups),
        {"title": {"text": ytitle}},
        boxmode="group",
        scattermode="group",
        xaxis={"title": {"text": "cell"}, "type": "category"},
    )
    return {"data": traces, "layout": layout}


def _raw_boxes(result: JobResult) -> tuple[list[dict[str, Any]], list[_Group], str]:
    """Box traces, the (variant, cell) groups of durations for the log choice, the y title."""
    labels = _side_labels(result)
    kept = {v: [_kept(result, cell, v) for cell in result.cells] for v in VARIANT_COLOURS}
    names = [stats.cell_label(result, cell) for cell in result.cells]
    every = np.concatenate([a for per_cell in kept.values() for a in per_cell] or [np.empty(0)])
    unit, scale = time_unit(every.tolist())
    traces = []
    for variant, per_cell in kept.items():
        n = sum(a.size for a in per_cell)
        traces.append({
            "type": "box", "name": f"{variant}: {labels[variant]}", "legendgroup": variant,
            "x": [name for name, a in zip(names, per_cell, strict=True) for _ in range(a.size)],
            "y": (np.concatenate(per_cell) / scale).tolist() if per_cell else [],
            "marker": {"color": VARIANT_COLOURS[variant], "size": 4, "opacity": 0.6},
            "line": {"width": 1.5},
            "boxpoints": "all" if n <= _MAX_POINTS_PER_VARIANT else "outliers",
            "jitter": 0.4, "pointpos": 0,
            "hovertemplate": f"%{{x}}<br>%{{y:.4g}} {unit}<extra>{variant}</extra>",
        })  # fmt: skip
    groups: list[_Group] = [a for per_cell in kept.values() for a in per_cell]
    return traces, groups, f"time per launch ({unit})"


def _summary_points(comparison: Comparison) -> tuple[list[dict[str, Any]], list[_Group], str]:
    """Median markers with IQR bars, the (variant, cell) medians for the log choice, the y title."""
    medians = [
        v.median_ns for c in comparison.cells for v in (c.baseline, c.candidate) if v.median_ns is not None
    ]
    unit, scale = time_unit(medians)
    labels = {"baseline": comparison.baseline_label, "candidate": comparison.candidate_label}
    traces = []
    groups: list[_Group] = []
    for variant in ("baseline", "candidate"):
        xs, ys, lo, hi = [], [], [], []
        for cell in comparison.cells:
            side = getattr(cell, variant)
            if side.median_ns is None:
                continue
            q1 = side.q1_ns if side.q1_ns is not None else side.median_ns
            q3 = side.q3_ns if side.q3_ns is not None else side.median_ns
            xs.append(cell.label)
            ys.append(side.median_ns / scale)
            lo.append((side.median_ns - q1) / scale)
            hi.append((q3 - side.median_ns) / scale)
        groups += [[y] for y in ys]
        traces.append({
            "type": "scatter", "name": f"{variant}: {labels[variant]}", "x": xs, "y": ys, "mode": "markers",
            "marker": {"color": VARIANT_COLOURS[variant], "size": 9, "symbol": "diamond"},
            "error_y": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo, "thickness": 1.5},
            "hovertemplate": f"%{{x}}<br>median %{{y:.4g}} {unit}<extra>{variant}</extra>",
        })  # fmt: skip
    return traces, groups, f"median time per launch ({unit})"


def timeline_figure(result: JobResult, cell_index: int, *, log_y: bool | None = None) -> go.Figure:
    """``timeline_figure_dict`` of the cell of ``result`` with ``index == cell_index`` (its samples,
    the sides' labels, "Timeline of cell 3: M=8, N=16" as title), as a validated ``Figure``.
    Raises ``KeyError`` when no cell of ``result`` has that index."""
    cell = next((c for c in result.cells if c.index == cell_index), None)
    if cell is None:
        raise KeyError(f"job result has no cell with index {cell_index}")
    title = timeline_title(cell.index, stats.cell_label(result, cell))
    labels = _side_labels(result)
    return go.Figure(timeline_figure_dict(cell.samples, labels=labels, title=title, log_y=log_y))


def timeline_title(cell_index: int, label: str) -> str:
    """The title of a cell's timeline: ``"Timeline of cell 3: M=8, N=16"``."""
    return f"Timeline of cell {cell_index}: {label}"


def timeline_figure_dict(
    samples: SampleColumns, *, labels: Mapping[Side, str], title: str, log_y: bool | None = None
) -> dict[str, Any]:
    """Round-by-round durations of one cell's ``samples``, as a plotly figure dict: interleaving,
    drift and clocks at a glance.

    x is the interleaving round; samples inside a round are spread over it by their position, so
    an ABBA round reads A·B·B·A left to right. One line-and-marker trace per variant (all samples,
    throttled included; named ``"baseline: <labels['baseline']>"``), then, only when present, a trace
    of the throttled samples (red crosses) and a trace of the SM clock (MHz, right axis ``y2``).
    Durations in ns per launch, shown in the unit of ``time_unit``. ``log_y`` as in
    ``samples_figure_dict`` (None: log when the two variants' medians differ more than 30x).
    """
    s = samples
    order = _execution_order(s)
    rounds = np.asarray(s.round, dtype=np.int64)[order]
    position = np.asarray(s.position, dtype=np.float64)[order]
    duration = np.asarray(s.duration_ns, dtype=np.float64)[order]
    variant = np.asarray(s.variant)[order]  # uint8: 0 baseline, 1 candidate
    throttled = np.asarray(s.throttled, dtype=bool)[order]
    clock = np.asarray(s.sm_clock_mhz, dtype=np.float64)[order]  # NaN: not read
    _, first, counts = np.unique(rounds, return_inverse=True, return_counts=True)
    xs = rounds + position / np.maximum(counts[first], 1)
    unit, scale = time_unit(duration.tolist())
    clocked = ~np.isnan(clock)
    traces: list[dict[str, Any]] = []
    for v in ("baseline", "candidate"):
        mine = variant == VARIANT_NAMES.index(v)
        traces.append({
            "type": "scatter", "name": f"{v}: {labels[v]}", "x": xs[mine].tolist(),
            "y": (duration[mine] / scale).tolist(),
            "customdata": np.stack([rounds[mine], position[mine].astype(np.int64)], axis=1).tolist(),
            "mode": "lines+markers", "line": {"color": VARIANT_COLOURS[v], "width": 1},
            "marker": {"color": VARIANT_COLOURS[v], "size": 5},
            "hovertemplate": (f"round %{{customdata[0]}}, position %{{customdata[1]}}<br>%{{y:.4g}} {unit}"
                              f"<extra>{v}</extra>"),
            "xaxis": "x", "yaxis": "y",
        })  # fmt: skip
    if throttled.any():
        traces.append({
            "type": "scatter", "name": "throttled", "x": xs[throttled].tolist(),
            "y": (duration[throttled] / scale).tolist(), "mode": "markers",
            "marker": {"color": _THROTTLED_COLOUR, "symbol": "x", "size": 9},
            "hovertemplate": f"throttled %{{y:.4g}} {unit}<extra></extra>", "xaxis": "x", "yaxis": "y",
        })  # fmt: skip
    # The axes make_subplots(specs=[[{"secondary_y": ...}]]) lays out.
    xaxis = {"anchor": "y", "domain": [0.0, 1.0], "title": {"text": "interleaving round"}}
    axes: dict[str, Any] = {"xaxis": xaxis}
    if clocked.any():
        traces.append({
            "type": "scatter", "name": "SM clock", "x": xs[clocked].tolist(), "y": clock[clocked].tolist(),
            "mode": "lines", "line": {"color": _CLOCK_COLOUR, "width": 1, "shape": "hv"},
            "hovertemplate": "%{y:.0f} MHz<extra>SM clock</extra>", "xaxis": "x", "yaxis": "y2",
        })  # fmt: skip
        axes["xaxis"]["domain"] = [0.0, 0.94]
        axes["yaxis2"] = {"anchor": "x", "overlaying": "y", "side": "right", "showgrid": False,
                          "title": {"text": "SM clock (MHz)"}}  # fmt: skip
    groups: list[_Group] = [duration[variant == code] for code in (0, 1)]
    yaxis = {"anchor": "x", "domain": [0.0, 1.0], "title": {"text": f"time per launch ({unit})"}}
    return {"data": traces, "layout": {**_layout(title, _log_layout(log_y, groups), yaxis), **axes}}


MAX_HISTORY_TRACES = 64
"""Most traces per panel of ``probe_history_figure`` (an 8-GPU node's full probe draws 8 copy
traces and 39 all-reduce ones: 13 sizes over the node, its pairs and its halves)."""


def _log_tick_text(v: float) -> str:
    """A log-axis tick label: ``"0.5"``, ``"20"``, ``"1,000"`` from 0.001 to 99,999, else ``"2e-5"``
    or ``"1e6"`` (never plotly's bare minor digits ``"2 3 … 9"``)."""
    mantissa, exponent = f"{v:.0e}".split("e")
    if -3 <= int(exponent) <= 4:
        return f"{v:,.{max(0, -int(exponent))}f}"
    return f"{mantissa}e{int(exponent)}".replace("-", "\u2212")


def log_ticks(lo: float, hi: float, max_ticks: int = 8) -> dict[str, Any]:
    """Tick values and labels of a log axis over ``[lo, hi]`` (``0 < lo < hi``): 1-2-5 steps per
    decade, else every decade, else every second or third decade, so at most ``max_ticks`` ticks,
    each with its value written out (``_log_tick_text``). Returns plotly axis keys ``tickvals``
    and ``ticktext``."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for mantissas, every in (((1, 2, 5), 1), ((1,), 1), ((1,), 2), ((1,), 3), ((1,), 10)):
        vals = [m * 10.0**k for k in range(first, last + 1) if k % every == 0 for m in mantissas]
        vals = [v for v in vals if lo <= v <= hi]
        if len(vals) <= max_ticks:
            break
    return {"tickvals": vals, "ticktext": [_log_tick_text(v) for v in vals]}


def probe_history_figure(
    readings: Sequence[ProbeReport],
    bands: Sequence[HealthBand] = (),
    unhealthy: Sequence[tuple[ProbeReport, str]] = (),
    *,
    device: str = "GPU",
) -> go.Figure:
    """A node's probe history: one panel per registered probe that declares a ``panel``
    (``kernelab.service.contract.probes``), in report order, over time; today copy bandwidth (top) and
    all-reduce latency (bottom, log y).

    One point per report and trace: the median of the report's readings of that trace's key (that
    device; that group size and message size: the sub-groups' pairs of one report), at most
    ``MAX_HISTORY_TRACES`` traces per panel: the figure's size follows the reports drawn, not what
    a runner put in each. Traces are named by the probe (``{device}``: ``"GPU"``, or ``"CPU"`` on a
    CPU node), e.g. ``"copy GPU 0"`` (device-local copy, GB/s, bytes read + written) and
    ``"all-reduce ×2 1 MiB"`` (µs per op); those the panel's ``shown`` leaves out (all-reduce: all
    but the smallest and largest message sizes) start hidden in the legend.

    ``bands`` (``kernelab.service.judge.health``): each band a panel's ``band`` rule takes is drawn on it,
    as a shaded area from its healthy low to high with a dashed line at its limit (copy) or as a
    dashed limit line alone (all-reduce latency). ``unhealthy``: ``(report, status)`` pairs marked
    with a red cross on the top panel at the mean of the report's values there, the reasons in the
    hover text.

    ``readings`` may come in any order; they are drawn by ``taken_at``. Readings without a probe
    contribute nothing to a panel; with no readings at all the figure carries a "no probe readings"
    note and no traces.
    """
    ordered = sorted(readings, key=lambda r: r.taken_at)
    probes = [p for p in probes_with("panel") if p.panel is not None]
    panels = [p.panel for p in probes if p.panel is not None]
    fig = make_subplots(
        rows=max(len(panels), 1),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=tuple(panel.title for panel in panels),
    )
    for row, (probe, panel) in enumerate(zip(probes, panels, strict=True), start=1):
        traces: dict[tuple[Any, ...], tuple[str, list[datetime], list[float]]] = {}
        for report in ordered:
            per_key: dict[tuple[Any, ...], tuple[str, list[float]]] = {}
            for reading in probe.readings(report):
                key, name = panel.trace(reading)
                per_key.setdefault(key, (name, []))[1].append(panel.value(reading))
            for key, (name, values) in per_key.items():
                _, xs, ys = traces.setdefault(key, (name, [], []))
                xs.append(report.taken_at)
                ys.append(statistics.median(values))
        keys = sorted(traces)[:MAX_HISTORY_TRACES]
        shown = panel.shown(sorted(traces)) if panel.shown is not None else set(keys)
        for key in keys:
            name, xs, ys = traces[key]
            fig.add_trace(
                go.Scatter(
                    name=name.format(device=device),
                    x=xs,
                    y=ys,
                    mode="lines+markers",
                    visible=True if key in shown else "legendonly",
                    hovertemplate=f"{panel.hover}<extra>%{{fullData.name}}</extra>",
                ),
                row=row,
                col=1,
            )
        _draw_bands(fig, row, panel, bands, device)
        drawn = [y for key in keys for y in traces[key][2] if y > 0]
        drawn += [b.limit for b in bands if panel.band(b) is not None and b.limit > 0]
        if panel.log and drawn:  # every tick written as its value (never plotly's bare "2 5")
            lo, hi = min(drawn) / 1.5, max(drawn) * 1.5
            axis = {"range": [math.log10(lo), math.log10(hi)], **log_ticks(lo, hi)}
            fig.update_yaxes(type="log", row=row, col=1, **axis)
        elif panel.log:
            fig.update_yaxes(type="log", row=row, col=1)
    if probes:
        _mark_unhealthy(fig, probes[0], unhealthy)
    fig.update_layout(
        **{**_LAYOUT, "legend": dict(orientation="v"), "margin": dict(l=60, r=20, t=40, b=40)},
        template="plotly_white",
        height=280 * max(len(panels), 2),
    )
    if not ordered:
        fig.add_annotation(
            text="no probe readings", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5
        )
    return fig


_GPU_WORD = re.compile(r"\bGPU(s?)\b")


def device_text(text: str, device: str) -> str:
    """``text`` (a figure's key such as ``"copy GPU 0"``, a health reason) with the word GPU(s)
    said as ``device`` (``"CPU"`` on a CPU node, ``kernelab.web.routes.device_word``): ``"copy CPU
    0"``. Figure keys name GPUs on every node (they key the stored bands); this is how a page says
    them."""
    return text if device == "GPU" else _GPU_WORD.sub(lambda m: device + m.group(1), text)


def _draw_bands(
    fig: go.Figure, row: int, panel: Panel[Any], bands: Sequence[HealthBand], device: str = "GPU"
) -> None:
    """The healthy bands ``panel.band`` takes onto row ``row`` of ``probe_history_figure``."""
    for band in bands:
        how = panel.band(band)
        if how is None:
            continue
        if how == "area":
            fig.add_hrect(
                y0=band.low, y1=band.high, row=row, col=1, fillcolor=_BAND_COLOUR, line_width=0, layer="below"
            )
        fig.add_hline(
            y=band.limit, row=row, col=1, line_dash="dash", line_color=_THROTTLED_COLOUR, line_width=1
        )
        # Plotly places annotations on a log axis in log10 units (shapes take data units), so the
        # label of a log panel's limit line gets y = log10(limit).
        label_y = band.limit if not panel.log else math.log10(band.limit) if band.limit > 0 else None
        if label_y is not None:
            fig.add_annotation(
                text=f"{device_text(band.figure, device)} limit ({band.scope})",
                y=label_y,
                x=1,
                xref="x domain",
                xanchor="right",
                yanchor="bottom",
                showarrow=False,
                font_size=10,
                row=row,
                col=1,
            )


def _mark_unhealthy(fig: go.Figure, probe: Probe[Any], unhealthy: Sequence[tuple[ProbeReport, str]]) -> None:
    """Unhealthy reports as red crosses on the top panel (``probe``'s) at the mean of their values."""
    panel = probe.panel
    assert panel is not None
    marks = [
        (r, status, sum(values) / len(values))
        for r, status in unhealthy
        if (values := [panel.value(x) for x in probe.readings(r)])
    ]
    if marks:
        fig.add_trace(
            go.Scatter(
                name="not healthy",
                x=[r.taken_at for r, _, _ in marks],
                y=[y for _, _, y in marks],
                text=[status for _, status, _ in marks],
                mode="markers",
                marker=dict(symbol="x", size=11, color=_THROTTLED_COLOUR),
                hovertemplate="%{text}<extra>not healthy</extra>",
            ),
            row=1,
            col=1,
        )


# JSON escapes that keep an embedded document inside its <script> element: "<" cannot start
# "</script>" or "<!--", and U+2028/U+2029 are line terminators in older JavaScript engines.
_SCRIPT_SAFE = str.maketrans(
    {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def figure_json(fig: go.Figure | Mapping[str, Any]) -> Markup:
    """``fig`` (a ``Figure``, or a figure dict of the ``*_dict`` builders, serialised as is without
    validation) as plotly JSON that is safe inside ``<script type="application/json">``.

    Serialised with ``plotly.io.to_json``; ``<``, ``>``, ``&`` and U+2028/9 are then written as
    ``\\uXXXX`` escapes, which leaves the JSON value unchanged (they can only occur inside strings)
    while a user string such as ``</script><script>alert(1)</script>`` cannot end the element.
    """
    text = fig.to_json() if isinstance(fig, go.Figure) else pio.to_json(dict(fig), validate=False)
    return Markup(text.translate(_SCRIPT_SAFE))


def history_legend(series: Sequence[Series]) -> tuple[list[str], str]:
    """Short legend names of ``series`` and what they all share: each line is named by the parts
    of ``Series.name`` (code, cell parameters, GPU model, timer/state) that differ between the
    lines; the parts every line has alike are said once (``"all: dtype=float32 · NVIDIA H200 ·
    cuda-graph/cold"``). One line keeps its code and cell. E.g. two codes on one GPU, one cell:
    ``["baseline", "candidate"]``, ``"all: M=4 N=64 · NVIDIA H200 · cuda-graph/cold"``."""

    def parts(line: Series) -> list[list[str]]:
        params = [f"{k}={v}" for k, v in sorted(line.params.items())] or [line.cell]
        return [[line.code], params, [line.gpu_model], [f"{line.timer}/{line.state}"]]

    split = [parts(line) for line in series]
    if not split:
        return [], ""
    shared: list[str] = []
    names: list[list[str]] = [[] for _ in split]
    for k in range(4):
        common = [w for w in split[0][k] if all(w in p[k] for p in split)]
        keep_all = len(split) == 1 and k < 2  # one line still says what it is
        if not keep_all and common:
            shared.append(" ".join(common))
        for name, p in zip(names, split, strict=True):
            own = p[k] if keep_all else [w for w in p[k] if w not in common]
            if own:
                name.append(" ".join(own))
    return [" · ".join(n) or "(all alike)" for n in names], ("all: " + " · ".join(shared) if shared else "")


def history_figure(series: Sequence[Series]) -> go.Figure:
    """Median time per launch over time, one line per ``kernelab.service.server.history.Series`` (code, cell,
    GPU
    model, timer, state: results on different hardware never share a line); hover shows commit,
    side, job, node, driver and the change against the line's previous point; error bars are the
    points' 95% CIs, an ``x`` marks the first point after each change point (red: slower, green:
    faster). Empty series give an empty figure with a note; one moment (or one value) only gets a
    sane axis around it (``_one_point_axes``) instead of plotly's sub-millisecond date ticks."""
    fig = go.Figure()
    unit, scale = time_unit([p.median_ns for s in series for p in s.points] or [1.0])
    short, shared = history_legend(series)
    for line, legend_name in zip(series, short, strict=True):
        pts = line.points
        changes = ["-" if p.change_pct is None else f"{format_sig3(p.change_pct, sign=True)}%" for p in pts]
        has_ci = any(p.ci_low_ns is not None and p.ci_high_ns is not None for p in pts)
        up = [None if p.ci_high_ns is None else (p.ci_high_ns - p.median_ns) / scale for p in pts]
        down = [None if p.ci_low_ns is None else (p.median_ns - p.ci_low_ns) / scale for p in pts]
        bars = {"type": "data", "symmetric": False, "thickness": 1, "array": up, "arrayminus": down}
        error_y = bars if has_ci else None
        fig.add_trace(go.Scatter(
            x=[p.measured_at for p in pts], y=[p.median_ns / scale for p in pts], error_y=error_y,
            mode="lines+markers", name=legend_name, meta=line.name,
            customdata=[[p.sha[:12] or "-", p.side, p.job_id, p.node, p.driver or "-", change]
                        for p, change in zip(pts, changes, strict=True)],
            hovertemplate=(f"%{{y:.4g}} {unit}<br>commit %{{customdata[0]}} (%{{customdata[1]}})"
                           "<br>job %{customdata[2]} on %{customdata[3]}, driver %{customdata[4]}"
                           "<br>change %{customdata[5]}<extra>%{meta}</extra>"),
        ))  # fmt: skip
        for cp in line.change_points:  # the first point after each change, marked on its line
            fig.add_trace(go.Scatter(
                x=[cp.at], y=[cp.after_ns / scale], mode="markers", showlegend=False, name=legend_name,
                meta=line.name,
                marker={"symbol": "x-thin-open", "size": 16, "line": {"width": 3},
                        "color": "#c0392b" if cp.direction == "slower" else "#1e8449"},
                hovertemplate=(f"change point: {format_sig3(cp.change_pct, sign=True)}% ({cp.direction})<br>"
                               f"job {cp.job_before} → {cp.job_after}<extra>%{{meta}}</extra>"),
            ))  # fmt: skip
    fig.update_layout(
        xaxis_title="measured",
        yaxis_title=f"median per launch ({unit}), 95% CI",
        legend_title=shared or "code · cell · GPU · timer/state",
        margin={"l": 60, "r": 20, "t": 30, "b": 50},
        height=420,
    )
    _one_point_axes(
        fig,
        [p.measured_at for s in series for p in s.points],
        [p.median_ns / scale for s in series for p in s.points],
    )
    if not series:
        fig.add_annotation(
            text="no results with samples for this benchmark yet",
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0.5,
            y=0.5,
        )
    return fig


ONE_POINT_SPAN = timedelta(days=1)  # the x range drawn around a history of one moment


def _one_point_axes(fig: go.Figure, xs: Sequence[datetime], ys: Sequence[float]) -> None:
    """Ranges for a history whose points share one moment (``ONE_POINT_SPAN`` around it, whole
    hours labelled) or one value (±50 % around it, from 0 for a value of 0); plotly's autorange
    would otherwise draw a date axis a few milliseconds wide or a y axis of one tick."""
    if xs and len(set(xs)) == 1:
        t = xs[0]
        fig.update_xaxes(range=[t - ONE_POINT_SPAN / 2, t + ONE_POINT_SPAN / 2], dtick=3 * 3600 * 1000)
    if ys and len(set(ys)) == 1:
        y = ys[0]
        fig.update_yaxes(range=[0.5 * y, 1.5 * y] if y > 0 else [0, 1], rangemode="tozero")
