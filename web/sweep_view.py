"""What the job page shows of a sweep at a glance: fixed parameters, short labels, achieved rates,
the forest plot, the heat-map over two chosen axes and the roofline plot.

Built from the stored comparison of a ``kernelab.web.job_view.JobView`` (never computed here) and
cached on it (``JobView.sweep``): the forest and roofline figures once per view, heat-maps per
choice of axes (``HEATMAPS_PER_VIEW`` most recent). The heat-map's choice comes from the query:
``heat_x``, ``heat_y`` (sweep axes), ``heat_value`` (``delta`` or ``verdict``) and
``heat_at.NAME`` (the value another varying axis ``NAME`` is held at); an unknown value falls back
to the default choice (``kernelab.web.sweep.axis_choice``), never an error.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup

from kernelab.service.contract.schemas import CellComparison
from kernelab.service.judge.cell_table import (
    SIDES,
    SideRates,
    comparison_peaks,
    format_value,
    short_label,
    side_rates,
    sweep_axes,
)
from kernelab.web import figures, sweep
from kernelab.web.job_view import JobView

HEATMAPS_PER_VIEW = 8
HEAT_VALUES: dict[str, str] = {"delta": "Δ %", "verdict": "verdict"}


def _cached(view: JobView, key: Any, build: Any) -> Any:
    if key not in view.sweep:
        view.sweep[key] = build()
    return view.sweep[key]


def context(view: JobView, page_cells: Sequence[CellComparison], query: Mapping[str, str]) -> dict[str, Any]:
    """Template context of the sweep views: ``fixed`` (``["N=256", ...]``), ``axes`` (varying
    parameter names), ``short`` (cell index -> label of the varying parameters, for the page's
    cells), ``rates`` (cell index -> {side: ``SideRates``}, page cells), ``has_rates``, ``peaks``,
    ``forest_json``, ``roofline_json`` (None without declared FLOPs and bytes), ``heat`` (None with
    fewer than two varying axes, else the choice, its options and ``json``)."""
    comparison = view.comparison
    axes = _cached(view, "axes", lambda: sweep_axes(comparison.cells))
    peaks = _cached(view, "peaks", lambda: comparison_peaks(comparison))
    forest = _cached(view, "forest", lambda: figures.figure_json(sweep.forest_figure_dict(comparison, axes)))

    def roofline() -> Markup | None:
        fig = sweep.roofline_figure_dict(comparison, peaks)
        return None if fig is None else figures.figure_json(fig)

    roof = _cached(view, "roofline", roofline)
    has_rates = _cached(view, "has_rates", lambda: any(c.throughput for c in comparison.cells))
    rates: dict[int, dict[str, SideRates]] = {
        c.index: {side: side_rates(c, side, peaks) for side in SIDES} for c in page_cells
    }
    return {
        "fixed": sweep.fixed_text(axes.fixed), "axes": list(axes.axes),
        "short": {c.index: short_label(c, axes.axes) for c in page_cells},
        "axis_values": {c.index: [format_value(c.params[a]) if a in c.params else "—" for a in axes.axes]
                        for c in page_cells},
        "rates": rates, "has_rates": has_rates, "peaks": peaks,
        "forest_json": forest, "roofline_json": roof, "heat": _heat(view, axes, query),
    }  # fmt: skip


def _heat(view: JobView, axes: sweep.SweepAxes, query: Mapping[str, str]) -> dict[str, Any] | None:
    held_query = {k.removeprefix("heat_at."): v for k, v in query.items() if k.startswith("heat_at.")}
    choice = sweep.axis_choice(axes, query.get("heat_x"), query.get("heat_y"), held_query)
    if choice is None:
        return None
    x, y, held = choice
    value = query.get("heat_value", "delta")
    if value not in HEAT_VALUES:
        value = "delta"
    key = ("heat", x, y, value, tuple(sorted(held.items())))
    heatmaps: OrderedDict[Any, Markup] = view.sweep.setdefault("heatmaps", OrderedDict())
    text = heatmaps.get(key)
    if text is None:
        fig = sweep.heatmap_figure_dict(view.comparison, axes, x, y, value, held)  # type: ignore[arg-type]
        text = heatmaps[key] = figures.figure_json(fig)
        while len(heatmaps) > HEATMAPS_PER_VIEW:
            heatmaps.popitem(last=False)
    else:
        heatmaps.move_to_end(key)
    return {"x": x, "y": y, "value": value, "held": held, "values": HEAT_VALUES,
            "options": sweep.param_options(axes), "json": text}  # fmt: skip
