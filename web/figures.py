"""Plotly figure builders for the dashboard: pure functions from schemas to figures.

No database access and no I/O: every builder takes pydantic objects from ``service.schemas`` and
returns a ``plotly.graph_objects.Figure``. The routes serialise figures with ``figure_json`` (which
makes the JSON safe to embed in an HTML ``<script>`` element) and plotly.js draws them.

Durations are stored in nanoseconds per launch (``Sample.duration_ns``); the figures display them in
the unit that keeps the numbers readable (ns, µs or ms, chosen from the median of what is drawn).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from statistics import median

import plotly.graph_objects as go
from markupsafe import Markup
from plotly.subplots import make_subplots

from service import stats
from service.history import HistoryPoint
from service.schemas import CellResult, Comparison, HealthBand, JobResult, ProbeReport, Sample, Variant

# Colours of the two sides everywhere on the dashboard (the CSS badges use the same pair).
VARIANT_COLOURS: dict[Variant, str] = {"baseline": "#5b6b7f", "candidate": "#d9622b"}
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
_LAYOUT = dict(
    template="plotly_white",
    margin=dict(l=60, r=20, t=80, b=50),
    font=dict(family="system-ui, -apple-system, Segoe UI, Roboto, sans-serif", size=12),
    legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0),
)


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


def _side_labels(result: JobResult) -> dict[Variant, str]:
    baseline, candidate = stats.variant_labels(result)
    return {"baseline": baseline, "candidate": candidate}


def _kept(result: JobResult, cell: CellResult, variant: Variant) -> list[Sample]:
    """The samples of ``variant`` that ``service.stats`` keeps, in execution order."""
    kept = stats.kept_samples(cell.samples, exclude_throttled=result.spec.measurement.exclude_throttled)
    return sorted((s for s in kept if s.variant == variant), key=lambda s: (s.round, s.position))


def _median_span(groups: Iterable[Sequence[float]]) -> float:
    """max/min of the positive medians of ``groups`` (1.0 when fewer than two)."""
    medians = [median(g) for g in groups if g]
    positive = [m for m in medians if m > 0]
    return max(positive) / min(positive) if len(positive) >= 2 else 1.0


def _apply_log(fig: go.Figure, log_y: bool | None, groups: Iterable[Sequence[float]]) -> None:
    """Log y when asked, or (``log_y=None``) when the groups' medians span > ``_AUTO_LOG_SPAN``."""
    if log_y is None:
        log_y = _median_span(groups) > _AUTO_LOG_SPAN
    fig.update_layout(yaxis_type="log" if log_y else "linear", updatemenus=_log_toggle(active=int(log_y)))


def _log_toggle(active: int) -> list[dict]:
    """A linear/log switch of the y axis, drawn above the legend at the top right."""
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
                dict(label="linear", method="relayout", args=[{"yaxis.type": "linear"}]),
                dict(label="log", method="relayout", args=[{"yaxis.type": "log"}]),
            ],
        )
    ]


def samples_figure(data: JobResult | Comparison, *, log_y: bool | None = None) -> go.Figure:
    """Per-cell distributions of baseline vs candidate, side by side.

    ``data`` is either a ``JobResult`` (raw samples: one box per cell and variant with every kept
    sample drawn as a jittered point; the kept samples are those ``service.stats`` uses) or a
    ``Comparison`` (no raw samples: the median per cell and variant with its interquartile range as
    an error bar). Either way the figure has exactly two traces, ``baseline`` then ``candidate``,
    with the cells along x in sweep order. Durations are per launch, shown in the unit chosen by
    ``time_unit``. ``log_y``: start the y axis in log (True) or linear (False) scale; None picks
    log when the (cell, variant) medians span more than 30x. A button toggles it in the browser.
    """
    fig = go.Figure()
    if isinstance(data, JobResult):
        _raw_boxes(fig, data)
        title = "Samples per cell (each point is one timed sample)"
    else:
        _summary_points(fig, data)
        title = "Median per cell (bars: interquartile range)"
    fig.update_layout(
        **_LAYOUT,
        title=dict(text=title, x=0.0, xanchor="left", y=0.98),
        boxmode="group",
        scattermode="group",
        xaxis=dict(title=dict(text="cell"), type="category"),
    )
    groups: dict[tuple[int, str], list[float]] = {}
    for i, trace in enumerate(fig.data):
        for x, y in zip(trace.x or (), trace.y or (), strict=True):
            groups.setdefault((i, x), []).append(y)
    _apply_log(fig, log_y, groups.values())
    return fig


def _raw_boxes(fig: go.Figure, result: JobResult) -> None:
    labels = _side_labels(result)
    per_variant: dict[Variant, tuple[list[str], list[float]]] = {"baseline": ([], []), "candidate": ([], [])}
    for cell in result.cells:
        cell_name = stats.cell_label(result, cell)
        for variant, (xs, ys) in per_variant.items():
            for s in _kept(result, cell, variant):
                xs.append(cell_name)
                ys.append(s.duration_ns)
    unit, scale = time_unit(per_variant["baseline"][1] + per_variant["candidate"][1])
    for variant, (xs, ys) in per_variant.items():
        fig.add_trace(
            go.Box(
                name=f"{variant}: {labels[variant]}",
                legendgroup=variant,
                x=xs,
                y=[y / scale for y in ys],
                marker=dict(color=VARIANT_COLOURS[variant], size=4, opacity=0.6),
                line=dict(width=1.5),
                boxpoints="all" if len(ys) <= _MAX_POINTS_PER_VARIANT else "outliers",
                jitter=0.4,
                pointpos=0,
                hovertemplate=f"%{{x}}<br>%{{y:.4g}} {unit}<extra>{variant}</extra>",
            )
        )
    fig.update_yaxes(title=dict(text=f"time per launch ({unit})"))


def _summary_points(fig: go.Figure, comparison: Comparison) -> None:
    medians = [
        v.median_ns for c in comparison.cells for v in (c.baseline, c.candidate) if v.median_ns is not None
    ]
    unit, scale = time_unit(medians)
    labels = {"baseline": comparison.baseline_label, "candidate": comparison.candidate_label}
    for variant in ("baseline", "candidate"):
        xs, ys, lo, hi = [], [], [], []
        for cell in comparison.cells:
            stats = getattr(cell, variant)
            if stats.median_ns is None:
                continue
            q1 = stats.q1_ns if stats.q1_ns is not None else stats.median_ns
            q3 = stats.q3_ns if stats.q3_ns is not None else stats.median_ns
            xs.append(cell.label)
            ys.append(stats.median_ns / scale)
            lo.append((stats.median_ns - q1) / scale)
            hi.append((q3 - stats.median_ns) / scale)
        fig.add_trace(
            go.Scatter(
                name=f"{variant}: {labels[variant]}",
                x=xs,
                y=ys,
                mode="markers",
                marker=dict(color=VARIANT_COLOURS[variant], size=9, symbol="diamond"),
                error_y=dict(type="data", symmetric=False, array=hi, arrayminus=lo, thickness=1.5),
                hovertemplate=f"%{{x}}<br>median %{{y:.4g}} {unit}<extra>{variant}</extra>",
            )
        )
    fig.update_yaxes(title=dict(text=f"median time per launch ({unit})"))


def timeline_figure(result: JobResult, cell_index: int, *, log_y: bool | None = None) -> go.Figure:
    """Round-by-round durations of one cell: interleaving, drift and clocks at a glance.

    x is the interleaving round; samples inside a round are spread over it by their position, so
    an ABBA round reads A·B·B·A left to right. One line-and-marker trace per variant (all samples,
    throttled included), then, only when present, a trace of the throttled samples (red crosses)
    and a trace of the SM clock (MHz, right axis). ``log_y`` as in ``samples_figure`` (None: log
    when the two variants' medians differ more than 30x). Raises ``KeyError`` when no cell of
    ``result`` has ``index == cell_index``.
    """
    cell = next((c for c in result.cells if c.index == cell_index), None)
    if cell is None:
        raise KeyError(f"job result has no cell with index {cell_index}")
    ordered = sorted(cell.samples, key=lambda s: (s.round, s.position))
    per_round: dict[int, int] = {}
    for s in ordered:
        per_round[s.round] = per_round.get(s.round, 0) + 1
    xs = [s.round + s.position / max(per_round[s.round], 1) for s in ordered]
    unit, scale = time_unit(s.duration_ns for s in ordered)
    clocked = [s.sm_clock_mhz is not None for s in ordered]
    fig = make_subplots(specs=[[{"secondary_y": any(clocked)}]])
    labels = _side_labels(result)
    for variant in ("baseline", "candidate"):
        pts = [(x, s) for x, s in zip(xs, ordered, strict=True) if s.variant == variant]
        fig.add_trace(
            go.Scatter(
                name=f"{variant}: {labels[variant]}",
                x=[x for x, _ in pts],
                y=[s.duration_ns / scale for _, s in pts],
                customdata=[[s.round, s.position] for _, s in pts],
                mode="lines+markers",
                line=dict(color=VARIANT_COLOURS[variant], width=1),
                marker=dict(color=VARIANT_COLOURS[variant], size=5),
                hovertemplate=(
                    f"round %{{customdata[0]}}, position %{{customdata[1]}}<br>%{{y:.4g}} {unit}"
                    f"<extra>{variant}</extra>"
                ),
            ),
            secondary_y=False,
        )
    throttled = [(x, s) for x, s in zip(xs, ordered, strict=True) if s.throttled]
    if throttled:
        fig.add_trace(
            go.Scatter(
                name="throttled",
                x=[x for x, _ in throttled],
                y=[s.duration_ns / scale for _, s in throttled],
                mode="markers",
                marker=dict(color=_THROTTLED_COLOUR, symbol="x", size=9),
                hovertemplate=f"throttled %{{y:.4g}} {unit}<extra></extra>",
            ),
            secondary_y=False,
        )
    if any(clocked):
        pts = [(x, s) for x, s in zip(xs, ordered, strict=True) if s.sm_clock_mhz is not None]
        fig.add_trace(
            go.Scatter(
                name="SM clock",
                x=[x for x, _ in pts],
                y=[s.sm_clock_mhz for _, s in pts],
                mode="lines",
                line=dict(color=_CLOCK_COLOUR, width=1, shape="hv"),
                hovertemplate="%{y:.0f} MHz<extra>SM clock</extra>",
            ),
            secondary_y=True,
        )
        fig.update_yaxes(title=dict(text="SM clock (MHz)"), secondary_y=True, showgrid=False)
    fig.update_layout(
        **_LAYOUT,
        title=dict(text=f"Timeline of cell {cell.index}: {stats.cell_label(result, cell)}", x=0.0, y=0.98),
    )
    fig.update_xaxes(title=dict(text="interleaving round"))
    fig.update_yaxes(title=dict(text=f"time per launch ({unit})"), secondary_y=False)
    by_variant = [[s.duration_ns for s in ordered if s.variant == v] for v in ("baseline", "candidate")]
    _apply_log(fig, log_y, by_variant)
    return fig


def probe_history_figure(
    readings: Sequence[ProbeReport], bands: Sequence[HealthBand] = (),
    unhealthy: Sequence[tuple[ProbeReport, str]] = (),
) -> go.Figure:
    """A node's probe history: copy bandwidth (top) and all-reduce latency (bottom) over time.

    ``bands`` (``service.health``): each copy band is drawn as a shaded area from its healthy low
    to high with a dashed line at its limit (top panel); each all-reduce latency band as a dashed
    limit line (bottom panel). ``unhealthy``: ``(report, status)`` pairs marked with a red cross on
    the top panel at the report's mean copy bandwidth, the reasons in the hover text.

    ``readings`` may come in any order; they are drawn by ``taken_at``. Top panel: one trace per GPU
    (device-local copy, GB/s, bytes read + written). Bottom panel (log y): one trace per all-reduce
    group size and message size (µs per op); the smallest and largest message sizes are shown, the
    others start hidden in the legend. Readings without a probe contribute nothing to it; with no
    readings at all the figure carries a "no probe readings" note and no traces.
    """
    ordered = sorted(readings, key=lambda r: r.taken_at)
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.12,
        subplot_titles=("Device-local copy bandwidth (GB/s)", "All-reduce time per op (µs)"),
    )
    copy: dict[int, tuple[list, list]] = {}
    for report in ordered:
        for copy_reading in report.copy_bandwidth:
            xs, ys = copy.setdefault(copy_reading.device_index, ([], []))
            xs.append(report.taken_at)
            ys.append(copy_reading.bandwidth_gbps)
    for device_index in sorted(copy):
        xs, ys = copy[device_index]
        fig.add_trace(
            go.Scatter(
                name=f"copy GPU {device_index}",
                x=xs,
                y=ys,
                mode="lines+markers",
                hovertemplate="%{y:.1f} GB/s<extra>%{fullData.name}</extra>",
            ),
            row=1,
            col=1,
        )
    reduce: dict[tuple[int, int], tuple[list, list]] = {}
    for report in ordered:
        for reduce_reading in report.all_reduce:
            xs, ys = reduce.setdefault((reduce_reading.world_size, reduce_reading.size_bytes), ([], []))
            xs.append(report.taken_at)
            ys.append(reduce_reading.time_us)
    sizes = sorted({size for _, size in reduce})
    shown = {sizes[0], sizes[-1]} if sizes else set()
    for world_size, size in sorted(reduce):
        xs, ys = reduce[(world_size, size)]
        fig.add_trace(
            go.Scatter(
                name=f"all-reduce ×{world_size} {format_bytes(size)}",
                x=xs,
                y=ys,
                mode="lines+markers",
                visible=True if size in shown else "legendonly",
                hovertemplate="%{y:.1f} µs<extra>%{fullData.name}</extra>",
            ),
            row=2,
            col=1,
        )
    _draw_bands(fig, bands, unhealthy)
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_layout(
        **{**_LAYOUT, "legend": dict(orientation="v"), "margin": dict(l=60, r=20, t=40, b=40)}, height=560
    )
    if not ordered:
        fig.add_annotation(
            text="no probe readings", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5
        )
    return fig


def _draw_bands(
    fig: go.Figure, bands: Sequence[HealthBand], unhealthy: Sequence[tuple[ProbeReport, str]]
) -> None:
    """Healthy bands and unhealthy reports onto ``probe_history_figure``'s two panels."""
    for band in bands:
        row = 1 if band.unit == "GB/s" and band.figure.startswith("copy") else 2 if band.unit == "us" else 0
        if row == 0:
            continue  # peer copy and busbw bands have no panel of their own
        if row == 1:
            fig.add_hrect(y0=band.low, y1=band.high, row=1, col=1, fillcolor=_BAND_COLOUR, line_width=0,
                          layer="below")
        fig.add_hline(y=band.limit, row=row, col=1, line_dash="dash", line_color=_THROTTLED_COLOUR,
                      line_width=1)
        # Plotly places annotations on a log axis in log10 units (shapes take data units), so the
        # label of the log panel's limit line gets y = log10(limit).
        label_y = band.limit if row == 1 else math.log10(band.limit) if band.limit > 0 else None
        if label_y is not None:
            fig.add_annotation(text=f"{band.figure} limit ({band.scope})", y=label_y, x=1, xref="x domain",
                               xanchor="right", yanchor="bottom", showarrow=False, font_size=10,
                               row=row, col=1)
    marks = [(r, status, sum(c.bandwidth_gbps for c in r.copy_bandwidth) / len(r.copy_bandwidth))
             for r, status in unhealthy if r.copy_bandwidth]
    if marks:
        fig.add_trace(go.Scatter(
            name="not healthy", x=[r.taken_at for r, _, _ in marks], y=[y for _, _, y in marks],
            text=[status for _, status, _ in marks], mode="markers",
            marker=dict(symbol="x", size=11, color=_THROTTLED_COLOUR),
            hovertemplate="%{text}<extra>not healthy</extra>",
        ), row=1, col=1)


def format_bytes(size_bytes: float) -> str:
    """``1048576`` → ``"1 MiB"``: binary prefixes, at most three significant digits."""
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} GiB"


# JSON escapes that keep an embedded document inside its <script> element: "<" cannot start
# "</script>" or "<!--", and U+2028/U+2029 are line terminators in older JavaScript engines.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def figure_json(fig: go.Figure) -> Markup:
    """``fig`` as plotly JSON that is safe inside ``<script type="application/json">``.

    Serialised with ``plotly.io.to_json``; ``<``, ``>``, ``&`` and U+2028/9 are then written as
    ``\\uXXXX`` escapes, which leaves the JSON value unchanged (they can only occur inside strings)
    while a user string such as ``</script><script>alert(1)</script>`` can no longer end the element.
    """
    return Markup(fig.to_json().translate(_SCRIPT_SAFE))


def branch_history_figure(points: Sequence[HistoryPoint]) -> go.Figure:
    """Median time per launch over time, one line per (branch, sweep cell), from
    ``service.history.branch_history``; hover shows commit, side and job. Empty points give an
    empty figure with a note."""
    fig = go.Figure()
    measured = [p for p in points if p.median_ns is not None]
    unit, scale = time_unit([p.median_ns for p in measured if p.median_ns is not None] or [1.0])
    series: dict[tuple[str, str], list[HistoryPoint]] = {}
    for p in measured:
        series.setdefault((p.branch, p.cell), []).append(p)
    for (branch, cell), pts in sorted(series.items()):
        fig.add_trace(go.Scatter(
            x=[p.finished_at for p in pts], y=[(p.median_ns or 0.0) / scale for p in pts],
            mode="lines+markers", name=f"{branch} · {cell}",
            customdata=[[p.sha[:12], p.side, p.job_id, p.node] for p in pts],
            hovertemplate=(f"%{{y:.4g}} {unit}<br>commit %{{customdata[0]}} (%{{customdata[1]}})"
                           "<br>job %{customdata[2]} on %{customdata[3]}<extra>%{fullData.name}</extra>"),
        ))
    fig.update_layout(
        xaxis_title="finished", yaxis_title=f"median per launch ({unit})", legend_title="branch · cell",
        margin={"l": 60, "r": 20, "t": 30, "b": 50}, height=420,
    )
    if not measured:
        fig.add_annotation(text="no revision jobs with samples for this benchmark yet", showarrow=False,
                           xref="paper", yref="paper", x=0.5, y=0.5)
    return fig
