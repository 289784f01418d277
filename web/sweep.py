"""Sweep-at-a-glance figures of a stored comparison: a forest plot, a heat-map over two sweep
axes, and a roofline plot. Pure functions from ``Comparison`` to plotly figure dicts (plain lists
and dicts, not validated: ``kernelab.web.figures.figure_json`` serialises them); no statistic is
computed here, every number is the stored comparison's (``kernelab.service.judge.cell_table``).

* ``forest_figure_dict``: one row per cell, the ratio candidate/baseline with its 95 % CI on a log
  axis whose ticks read as Δ % near 0 and as "N× faster/slower" far from it (a +461,743 % cell
  and a −2 % cell on one axis); the ``same`` band (± the threshold) shaded; markers coloured by
  verdict; cells whose timing is void (``failed``, ``incorrect``, ``nondeterministic``,
  ``implausible``: ``kernelab.service.judge.report.void_timing``) drawn as crosses on a line of their own,
  never as a speed-up.
* ``heatmap_figure_dict``: two chosen axes, colour by Δ % (log of the ratio, diverging about 0) or
  by verdict; other varying axes held at chosen values.
* ``roofline_figure_dict``: arithmetic intensity (FLOP/byte) against achieved TFLOP/s of both
  sides with the roofs min(copy peak × intensity, matmul peak) of the node's probes (Williams,
  Waterman and Patterson, CACM 52(4), 2009).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from kernelab.service.contract.schemas import VERDICT_CATALOGUE, CellComparison, Comparison, ParamValue, Side
from kernelab.service.contract.units import format_sig3
from kernelab.service.judge.cell_table import (
    SIDES,
    SweepAxes,
    format_value,
    short_label,
    side_rates,
)
from kernelab.service.judge.report import cell_speedup, format_speedup, void_timing
from kernelab.service.judge.verdicts import VERDICT_ORDER
from kernelab.web.figures import _LAYOUT, VARIANT_COLOURS, _template, log_ticks

VERDICT_COLOURS: dict[str, str] = {e.name: e.plot for e in VERDICT_CATALOGUE}
"""Each verdict's colour in the figures (``VerdictEntry.plot``)."""
_BAND = "rgba(107, 117, 133, 0.14)"  # the "same" band
FOREST_ROW_PX = 16  # height per cell row of the forest plot
FOREST_MAX_PX = 4000  # the forest plot of a 1,000-cell sweep: rows of 4 px, labels thinned by plotly
HEATMAP_TEXT_CELLS = 400  # up to this many tiles a heat-map writes its value in each tile
HeatValue = Literal["delta", "verdict"]
# The Δ % heat map's diverging scale, blue (low: faster) through white to red (high: slower):
# ColorBrewer's RdBu (colorbrewer2.org, 11 classes) without its two darkest ends (#053061, #67001f),
# so no tile of a speed is near-black like ``failed`` or deep red-purple like ``incorrect``; the
# colours are written out (a named "RdBu" is plotly.js's own scale, a different one).
DELTA_SCALE = ("#2166ac", "#4393c3", "#92c5de", "#d1e5f0", "#f7f7f7", "#fddbc7", "#f4a582", "#d6604d",
               "#b2182b")  # fmt: skip
# Tick positions of the ratio axis: Δ % near 1, "N×" far from it.
_RATIO_TICKS = (1e-4, 1e-3, 0.01, 0.1, 0.2, 0.5, 0.8, 0.9, 0.95, 0.98, 1.0, 1.02, 1.05, 1.1, 1.25, 2.0, 5.0,
                10.0, 100.0, 1e3, 1e4, 1e5)  # fmt: skip


def _ratio_tick(r: float) -> str:
    """A ratio-axis tick: ``"−5 %"`` between 0.5 and 2, else ``"10× faster"``/``"100× slower"``."""
    if r == 1.0:
        return "0 %"
    if 0.5 <= r <= 2.0:
        return f"{(r - 1) * 100:+.0f} %".replace("-", "\u2212")
    return format_speedup(r)


def _ratio_axis(values: Sequence[float], threshold_pct: float) -> dict[str, Any]:
    """A log x axis over ``values`` (positive ratios) and the threshold band, with ticks from
    ``_RATIO_TICKS`` inside the range, each at least a ninth of the axis (log10) from the others,
    picked from 0 % outward (so at most 10, none crowding another's label)."""
    band = (1.0 / (1.0 + threshold_pct / 100.0), 1.0 + threshold_pct / 100.0)
    lo = min([*values, band[0]]) / 1.15
    hi = max([*values, band[1]]) * 1.15
    # ticks at least a ninth of the axis apart (in log10), 0 % first, then outward from it: a wide
    # axis (1,000x slower) keeps its far ticks and drops the crowd of ±2-20 % next to 0 %
    gap = (math.log10(hi) - math.log10(lo)) / 9
    ticks = [1.0] if lo <= 1.0 <= hi else []
    for t in sorted(
        (t for t in _RATIO_TICKS if lo <= t <= hi and t != 1.0), key=lambda t: abs(math.log10(t))
    ):
        if all(abs(math.log10(t) - math.log10(k)) >= gap for k in ticks):
            ticks.append(t)
    ticks.sort()
    return {
        "type": "log", "range": [math.log10(lo), math.log10(hi)], "tickvals": ticks,
        "ticktext": [_ratio_tick(t) for t in ticks], "zeroline": False,
        "title": {"text": "candidate vs baseline: Δ % of the median, 95 % CI (log scale)"},
    }  # fmt: skip


def _hover(cell: CellComparison, label: str) -> str:
    if cell.delta_pct is None or cell.ratio is None:
        delta = "no ratio"
    else:
        ci = ""
        if cell.ci_low is not None and cell.ci_high is not None:
            ci = f" [{(cell.ci_low - 1) * 100:+.1f}, {(cell.ci_high - 1) * 100:+.1f}]"
        delta = f"Δ {cell.delta_pct:+.1f} %{ci} · {cell_speedup(cell)}"
    return f"{label}<br>{delta}<br>{cell.verdict}"


def forest_figure_dict(comparison: Comparison, sweep: SweepAxes) -> dict[str, Any]:
    """The forest plot of ``comparison`` (see the module docstring): one trace per verdict present
    among cells with a timing result (markers at the ratio, asymmetric error bars to the CI), and
    one trace ``"timing void: failed / incorrect / …"`` of crosses for the void cells, drawn at
    their ratio when it is above 1, else at 1 (no number, or a ratio that would read faster: a
    wrong result is never drawn on the faster side; the hover gives the ratio). Cells top to bottom
    in sweep order, y labelled by ``short_label`` (the varying parameters only). A figure with no
    cell has a note."""
    labels = [f"{c.index}: {short_label(c, sweep.axes)}" for c in comparison.cells]
    traces: list[dict[str, Any]] = []
    by_verdict: dict[str, tuple[list, list, list, list, list]] = {}
    void: tuple[list, list, list] = ([], [], [])
    ratios: list[float] = []
    for cell, label in zip(comparison.cells, labels, strict=True):
        if void_timing(cell) or cell.ratio is None or not math.isfinite(cell.ratio) or cell.ratio <= 0:
            # a void timing is no speed: never drawn on the faster side (a cached answer "reads"
            # 100x faster); at its ratio only when that is slower, else on the no-change line
            x = cell.ratio if cell.ratio is not None and 1.0 < cell.ratio < math.inf else 1.0
            void[0].append(x)
            void[1].append(label)
            void[2].append(_hover(cell, label) + (f"<br>{cell.error[:200]}" if cell.error else ""))
            ratios.append(x)
            continue
        xs, ys, lo, hi, text = by_verdict.setdefault(cell.verdict, ([], [], [], [], []))
        xs.append(cell.ratio)
        ys.append(label)
        lo.append(cell.ratio - cell.ci_low if cell.ci_low is not None else 0.0)
        hi.append(cell.ci_high - cell.ratio if cell.ci_high is not None else 0.0)
        text.append(_hover(cell, label))
        ratios += [cell.ratio, cell.ci_low or cell.ratio, cell.ci_high or cell.ratio]
    n = len(labels)
    size = 8 if n <= 100 else 5 if n <= 400 else 3
    for verdict in VERDICT_ORDER:
        if verdict not in by_verdict:
            continue
        xs, ys, lo, hi, text = by_verdict[verdict]
        colour = VERDICT_COLOURS.get(verdict, "#445")
        traces.append({
            "type": "scatter", "mode": "markers", "name": verdict, "x": xs, "y": ys, "text": text,
            "hovertemplate": "%{text}<extra></extra>",
            "marker": {"color": colour, "size": size, "symbol": "circle"},
            "error_x": {"type": "data", "symmetric": False, "array": hi, "arrayminus": lo,
                        "color": colour, "thickness": 1.2, "width": 0 if n > 100 else 3},
        })  # fmt: skip
    if void[0]:
        traces.append({
            "type": "scatter", "mode": "markers", "name": "timing void: failed / incorrect / implausible",
            "x": void[0], "y": void[1], "text": void[2], "hovertemplate": "%{text}<extra></extra>",
            "marker": {"color": VERDICT_COLOURS["incorrect"], "size": size + 4, "symbol": "x-thin-open",
                       "line": {"width": 2, "color": VERDICT_COLOURS["incorrect"]}},
        })  # fmt: skip
    t = comparison.threshold_pct
    xaxis = _ratio_axis(ratios or [1.0], t)
    height = min(max(120 + FOREST_ROW_PX * n if n <= 100 else 120 + 4 * n, 260), FOREST_MAX_PX)
    layout: dict[str, Any] = {
        **_LAYOUT, "template": _template(), "height": height,
        "title": {"text": f"Δ per cell with its 95 % CI (shaded: ± {t:g} %, \"same\")", "x": 0.0,
                  "xanchor": "left", "y": 0.995 if n > 100 else 0.98, "yanchor": "top"},
        "xaxis": xaxis,
        "yaxis": {"type": "category", "autorange": "reversed", "categoryorder": "array",
                  "categoryarray": labels, "automargin": True, "title": {"text": "cell"}},
        "shapes": [
            {"type": "rect", "xref": "x", "yref": "paper", "x0": 1.0 / (1.0 + t / 100.0),
             "x1": 1.0 + t / 100.0, "y0": 0, "y1": 1, "fillcolor": _BAND, "line": {"width": 0},
             "layer": "below"},
            {"type": "line", "xref": "x", "yref": "paper", "x0": 1.0, "x1": 1.0, "y0": 0, "y1": 1,
             "line": {"color": "#6b7585", "width": 1, "dash": "dot"}},
        ],
        "margin": {"l": 60, "r": 20, "t": 70, "b": 50},
    }  # fmt: skip
    if not labels:
        layout["annotations"] = [{"text": "no cells", "showarrow": False, "xref": "paper", "yref": "paper",
                                  "x": 0.5, "y": 0.5}]  # fmt: skip
    return {"data": traces, "layout": layout}


def _matches(cell: CellComparison, held: Mapping[str, str]) -> bool:
    return all(k in cell.params and format_value(cell.params[k]) == v for k, v in held.items())


def heatmap_figure_dict(
    comparison: Comparison,
    sweep: SweepAxes,
    x_axis: str,
    y_axis: str,
    value: HeatValue = "delta",
    held: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A heat-map of ``comparison``'s cells over the sweep axes ``x_axis`` (columns) and ``y_axis``
    (rows), both keys of ``sweep.axes``, values in sweep order. ``held``: the other varying axes'
    values (as ``format_value`` writes them) that select the cells drawn; a cell without a match
    leaves its tile empty. ``value``: ``"delta"`` colours by log10(ratio) on a diverging scale
    centred at 0 (blue faster, red slower), tiles of void-timing cells left empty in that trace and
    filled in their verdict's colour by a second trace over it (``"timing void"``, labelled with the
    verdict), so a wrong result stands out more than any slower tile; ``"verdict"`` colours by
    verdict. Up to ``HEATMAP_TEXT_CELLS`` tiles carry their
    Δ % or verdict as text. Raises ``KeyError`` when an axis is not in ``sweep.axes``.
    """
    xs, ys = sweep.axes[x_axis], sweep.axes[y_axis]
    held = dict(held or {})
    col = {format_value(v): i for i, v in enumerate(xs)}
    row = {format_value(v): i for i, v in enumerate(ys)}
    z: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    void_z: list[list[float | None]] = [[None] * len(xs) for _ in ys]  # delta: void tiles' verdicts
    text: list[list[str]] = [[""] * len(xs) for _ in ys]
    hover: list[list[str]] = [["no cell"] * len(xs) for _ in ys]
    codes = {v: i for i, v in enumerate(VERDICT_ORDER)}
    for cell in comparison.cells:
        if x_axis not in cell.params or y_axis not in cell.params or not _matches(cell, held):
            continue
        i = row[format_value(cell.params[y_axis])]
        j = col[format_value(cell.params[x_axis])]
        label = f"{cell.index}: {short_label(cell, sweep.axes)}"
        hover[i][j] = _hover(cell, label)
        if value == "verdict":
            z[i][j] = float(codes[cell.verdict])
            text[i][j] = cell.verdict
        elif void_timing(cell) or cell.ratio is None or not math.isfinite(cell.ratio) or cell.ratio <= 0:
            text[i][j] = cell.verdict
            void_z[i][j] = float(codes[cell.verdict])
        else:
            z[i][j] = math.log10(cell.ratio)
            delta = cell.delta_pct  # three significant figures, as every view writes a Δ %
            near = delta is not None and abs(delta) < 100
            text[i][j] = (
                f"{format_sig3(delta, sign=True)} %"
                if delta is not None and near
                else format_speedup(cell.ratio)
            )
    show_text = len(xs) * len(ys) <= HEATMAP_TEXT_CELLS
    trace: dict[str, Any] = {
        "type": "heatmap", "x": [format_value(v) for v in xs], "y": [format_value(v) for v in ys], "z": z,
        "customdata": hover, "hovertemplate": "%{customdata}<extra></extra>", "xgap": 1, "ygap": 1,
        "hoverongaps": False,
    }  # fmt: skip
    if show_text:
        trace.update(text=text, texttemplate="%{text}", textfont={"size": 10})
    n = len(VERDICT_ORDER)
    scale: list[list[Any]] = []  # one solid colour per verdict, in verdict order
    for k, verdict in enumerate(VERDICT_ORDER):
        colour = VERDICT_COLOURS.get(verdict, "#445")
        scale += [[k / n, colour], [(k + 1) / n, colour]]
    overlay: list[dict[str, Any]] = []
    if value == "verdict":
        bar = {"tickvals": list(range(n)), "ticktext": list(VERDICT_ORDER), "title": {"text": "verdict"}}
        trace.update(colorscale=scale, zmin=-0.5, zmax=n - 0.5, colorbar=bar)
    else:
        finite = [abs(v) for r in z for v in r if v is not None]
        # the colour span: the 95th percentile of |log10 ratio| (one 4,618x cell would grey out all
        # others), at least twice the threshold; tiles beyond it take the end colours
        typical = sorted(finite)[int(0.95 * (len(finite) - 1))] if finite else 0.0
        span = max(typical, math.log10(1 + comparison.threshold_pct / 100.0) * 2)
        ticks = [t for t in (1e-3, 0.01, 0.1, 0.5, 0.8, 0.95, 1.0, 1.05, 1.25, 2.0, 10.0, 100.0, 1e3)
                 if abs(math.log10(t)) <= span]  # fmt: skip
        stops = [[k / (len(DELTA_SCALE) - 1), c] for k, c in enumerate(DELTA_SCALE)]
        trace.update(colorscale=stops, zmid=0.0, zmin=-span, zmax=span, colorbar={
            "tickvals": [math.log10(t) for t in ticks], "ticktext": [_ratio_tick(t) for t in ticks],
            "title": {"text": "Δ %"}})  # fmt: skip
        if any(v is not None for r in void_z for v in r):
            # a wrong or void tile is filled in its verdict's colour, over the Δ % scale: it stands
            # out more than any slower tile, and never reads as a speed
            void_trace: dict[str, Any] = {
                "type": "heatmap", "name": "timing void", "x": trace["x"], "y": trace["y"], "z": void_z,
                "colorscale": scale, "zmin": -0.5, "zmax": n - 0.5, "showscale": False,
                "customdata": hover, "hovertemplate": "%{customdata}<extra></extra>", "xgap": 1,
                "ygap": 1, "hoverongaps": False,
            }  # fmt: skip
            if show_text:
                void_text = [[t if v is not None else "" for t, v in zip(tr, vr, strict=True)]
                             for tr, vr in zip(text, void_z, strict=True)]  # fmt: skip
                void_trace.update(text=void_text, texttemplate="<b>%{text}</b>",
                                  textfont={"size": 11, "color": "#ffffff"})  # fmt: skip
            overlay.append(void_trace)
    what = "verdict" if value == "verdict" else "Δ % of the median (blue: faster, red: slower)"
    held_text = (" · " + ", ".join(f"{k}={v}" for k, v in held.items())) if held else ""
    layout = {
        **_LAYOUT, "template": _template(), "height": max(320, min(40 + 22 * len(ys), 900)) + 120,
        "title": {"text": f"{what}: {y_axis} × {x_axis}{held_text}", "x": 0.0, "xanchor": "left"},
        "xaxis": {"type": "category", "title": {"text": x_axis}},
        "yaxis": {"type": "category", "title": {"text": y_axis}, "automargin": True},
    }  # fmt: skip
    return {"data": [trace, *overlay], "layout": layout}


def roofline_figure_dict(comparison: Comparison, peaks: Mapping[str, float]) -> dict[str, Any] | None:
    """Arithmetic intensity (FLOP/byte, log x) against achieved TFLOP/s (log y) of every cell and
    side whose work declares both FLOPs and bytes, one trace per side (void-timing cells as crosses,
    a trace of their own); the roofs from ``peaks`` (``copy_gbps``: the slanted memory roof
    ``copy_gbps × intensity / 1e3`` TFLOP/s; ``matmul_tflops``: the flat compute roof) as lines,
    each drawn only when probed. None when no cell has both rates (no plot: nothing to place)."""
    points: dict[str, tuple[list[float], list[float], list[str], list[list[float | None]]]] = {}
    for cell in comparison.cells:
        for side in SIDES:
            r = side_rates(cell, side, peaks)
            if r.intensity is None or r.tflops is None or r.intensity <= 0 or r.tflops <= 0:
                continue
            name = f"{side}, timing void" if void_timing(cell) else side
            xs, ys, text, data = points.setdefault(name, ([], [], [], []))
            xs.append(r.intensity)
            ys.append(r.tflops)
            text.append(f"{cell.index}: {cell.label}")
            data.append([r.gbps, r.pct_copy, r.pct_matmul])
    if not points:
        return None
    labels = {"baseline": comparison.baseline_label, "candidate": comparison.candidate_label}
    traces: list[dict[str, Any]] = []
    for name, (xs, ys, text, data) in points.items():
        who: Side = "candidate" if name.startswith("candidate") else "baseline"
        void = name.endswith("void")
        traces.append({
            "type": "scatter", "mode": "markers", "name": f"{name}: {labels[who]}", "x": xs, "y": ys,
            "text": text, "customdata": data,
            "hovertemplate": ("%{text}<br>%{customdata[0]:.4g} GB/s (%{customdata[1]:.3g} % of copy peak)"
                              "<br>%{y:.4g} TFLOP/s (%{customdata[2]:.3g} % of matmul peak)"
                              f"<extra>{name}</extra>"),
            "marker": {"color": VARIANT_COLOURS[who], "size": 9 if void else 7,
                       "symbol": "x-thin-open" if void else "circle", "opacity": 0.85,
                       "line": {"width": 2 if void else 0, "color": VARIANT_COLOURS[who]}},
        })  # fmt: skip
    every_x = [x for xs, _, _, _ in points.values() for x in xs]
    every_y = [y for _, ys, _, _ in points.values() for y in ys]
    copy, matmul = peaks.get("copy_gbps"), peaks.get("matmul_tflops")
    lo_x, hi_x = min(every_x) / 4, max(every_x) * 4
    if copy and matmul:
        ridge = matmul * 1e3 / copy  # FLOP/byte where the two roofs meet
        lo_x, hi_x = min(lo_x, ridge / 4), max(hi_x, ridge * 4)
        xs = [lo_x, ridge, hi_x]
        traces.append({"type": "scatter", "mode": "lines", "name": f"roof: copy {copy:,.0f} GB/s, matmul "
                       f"{matmul:,.1f} TFLOP/s", "x": xs, "y": [copy * lo_x / 1e3, matmul, matmul],
                       "line": {"color": "#1d2430", "width": 2}, "hoverinfo": "name"})  # fmt: skip
    elif copy:
        traces.append({"type": "scatter", "mode": "lines", "name": f"memory roof: copy {copy:,.0f} GB/s",
                       "x": [lo_x, hi_x], "y": [copy * lo_x / 1e3, copy * hi_x / 1e3],
                       "line": {"color": "#1d2430", "width": 2}, "hoverinfo": "name"})  # fmt: skip
    elif matmul:
        traces.append({"type": "scatter", "mode": "lines",
                       "name": f"compute roof: matmul {matmul:,.1f} TFLOP/s",
                       "x": [lo_x, hi_x], "y": [matmul, matmul],
                       "line": {"color": "#1d2430", "width": 2}, "hoverinfo": "name"})  # fmt: skip
    roofs = [y for t in traces if t["mode"] == "lines" for y in t["y"]]
    lo_y, hi_y = min(every_y + roofs) / 4, max(every_y + roofs) * 4
    note = "" if (copy or matmul) else " (no peak probed on this node: no roof)"
    if max(every_x) <= min(every_x) * 1.01:  # e.g. softmax: FLOPs and bytes both grow with M x N
        note += f"<br><sub>every cell at {format_sig3(every_x[0])} FLOP/byte: the cells differ in rate only"
        note += "</sub>"
    layout = {
        **_LAYOUT, "template": _template(), "height": 420,
        "title": {"text": f"Roofline: achieved rate at the median time{note}", "x": 0.0, "xanchor": "left"},
        "xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP per byte read + written)"},
                  "range": [math.log10(lo_x), math.log10(hi_x)], **log_ticks(lo_x, hi_x)},
        "yaxis": {"type": "log", "title": {"text": "achieved TFLOP/s"},
                  "range": [math.log10(lo_y), math.log10(hi_y)], **log_ticks(lo_y, hi_y)},
    }  # fmt: skip
    return {"data": traces, "layout": layout}


def axis_choice(
    sweep: SweepAxes, x: str | None, y: str | None, held: Mapping[str, str]
) -> tuple[str, str, dict[str, str]] | None:
    """The heat-map's axes: ``x`` and ``y`` when both are distinct varying axes, else the two
    varying axes with the most values (x the larger); the other varying axes held at ``held``'s
    value when it is one of theirs, else at their first. None with fewer than two varying axes."""
    names = list(sweep.axes)
    if len(names) < 2:
        return None
    if x not in sweep.axes or y not in sweep.axes or x == y:
        ranked = sorted(names, key=lambda n: -len(sweep.axes[n]))
        x, y = ranked[0], ranked[1]
    rest: dict[str, str] = {}
    for name in names:
        if name in (x, y):
            continue
        options = [format_value(v) for v in sweep.axes[name]]
        rest[name] = held[name] if held.get(name) in options else options[0]
    assert x is not None and y is not None
    return x, y, rest


def param_options(sweep: SweepAxes) -> dict[str, list[str]]:
    """Each varying axis's values as ``format_value`` writes them (the heat-map form's options)."""
    return {name: [format_value(v) for v in values] for name, values in sweep.axes.items()}


def fixed_text(fixed: Mapping[str, ParamValue]) -> list[str]:
    """``["N=256", "dtype=float32"]``: the parameters every cell shares, for the line above the table."""
    return [f"{k}={format_value(v)}" for k, v in fixed.items()]
