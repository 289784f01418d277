"""The sweep-at-a-glance builders (``kernelab.web.sweep``), the per-cell table and export
(``kernelab.service.judge.cell_table``) and the speedup words (``kernelab.service.judge.report``), on small
comparisons built by hand."""

from __future__ import annotations

import csv
import io
import json
import math
import re
from datetime import UTC, datetime

import numpy as np
import pytest

from kernelab.service.contract.schemas import (
    CellComparison,
    Comparison,
    CopyBandwidthReading,
    HistoryPoint,
    MatmulPeakReading,
    NodeInfo,
    ProbeReport,
    Series,
    SideStats,
)
from kernelab.service.judge import cell_table, report
from kernelab.service.judge.verdicts import VERDICT_ORDER
from kernelab.web import figures, sweep

T0 = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _cell(index: int, m: int, n: int, ratio: float | None, verdict: str, **extra: object) -> CellComparison:
    base = SideStats(n=10, median_ns=1000.0)
    cand = SideStats(n=10, median_ns=None if ratio is None else 1000.0 * ratio)
    fields: dict = {
        "index": index, "params": {"M": m, "N": n, "dtype": "float32"}, "label": f"M={m}, N={n}",
        "baseline": base, "candidate": cand, "ratio": ratio, "verdict": verdict,
        "ci_low": None if ratio is None else ratio * 0.98, "ci_high": None if ratio is None else ratio * 1.02,
        "delta_pct": None if ratio is None else (ratio - 1) * 100,
    }  # fmt: skip
    fields.update(extra)
    return CellComparison.model_validate(fields)


def _probe(copy_gbps: float | None, matmul_tflops: float | None) -> ProbeReport:
    return ProbeReport(
        phase="before", taken_at=T0,
        copy_bandwidth=[] if copy_gbps is None else [CopyBandwidthReading(
            device_index=0, size_bytes=1 << 26, time_us=1.0, bandwidth_gbps=copy_gbps)],
        matmul_peak=[] if matmul_tflops is None else [MatmulPeakReading(
            device_index=0, dtype="bfloat16", m=8, n=8, k=8, launches=1, time_us=1.0, tflops=matmul_tflops)],
    )  # fmt: skip


def _comparison(cells: list[CellComparison], probes: list[ProbeReport] | None = None) -> Comparison:
    return Comparison(benchmark="softmax", baseline_label="torch", candidate_label="triton",
                      threshold_pct=2.0, timer="cuda-event", node=NodeInfo(hostname="n", device_type="cuda"),
                      cells=cells, probes=probes or [])  # fmt: skip


def _grid() -> Comparison:
    """2 x 3 cells (M in 1, 2; N in 64, 128, 256): one 4618x slower, one incorrect, one failed."""
    rates = {
        "baseline_gbps": 800.0,
        "candidate_gbps": 1000.0,
        "baseline_tflops": 0.4,
        "candidate_tflops": 0.5,
    }
    cells = [
        _cell(0, 1, 64, 4618.4, "slower", throughput=rates),
        _cell(1, 1, 128, 0.8, "faster", throughput=rates),
        _cell(2, 1, 256, 1.001, "same", throughput=rates),
        _cell(3, 2, 64, 0.5, "incorrect", throughput=rates),
        _cell(4, 2, 128, None, "failed", error="out of memory"),
        _cell(5, 2, 256, 1.1, "slower", throughput=rates),
    ]
    return _comparison(cells, [_probe(4000.0, 900.0), _probe(4200.0, 850.0)])


@pytest.mark.parametrize(
    ("ratio", "text"),
    [(0.8, "1.25× faster"), (4618.4, "4,620× slower"), (1.003, "1.00×"), (1.5, "1.50× slower"),
     (0.05, "20.0× faster"), (None, "n/a"), (0.0, "n/a"), (math.inf, "n/a")],
)  # fmt: skip
def test_format_speedup_reads_as_a_factor(ratio: float | None, text: str) -> None:
    assert report.format_speedup(ratio) == text


def test_void_cells_get_a_bare_ratio_never_faster() -> None:
    wrong = _grid().cells[3]
    assert report.cell_speedup(wrong) == "0.500×" and "faster" not in report.cell_speedup(wrong)


def test_sweep_axes_split_varying_and_fixed_parameters() -> None:
    axes = cell_table.sweep_axes(_grid().cells)
    assert axes.axes == {"M": [1, 2], "N": [64, 128, 256]} and axes.fixed == {"dtype": "float32"}
    assert cell_table.short_label(_grid().cells[0], axes.axes) == "M=1, N=64"
    mixed = [_cell(0, 1, 64, 1.0, "same"), _cell(1, 1, 64, 1.0, "same")]
    mixed[1] = mixed[1].model_copy(update={"params": {"M": True, "N": 64, "dtype": "float32"}})
    assert list(cell_table.sweep_axes(mixed).axes) == ["M"]  # 1 and True are two values


def test_side_rates_against_the_best_probe_readings() -> None:
    c = _grid()
    peaks = cell_table.comparison_peaks(c)
    assert peaks == {"copy_gbps": 4200.0, "matmul_tflops": 900.0}
    r = cell_table.side_rates(c.cells[1], "candidate", peaks)
    assert r.pct_copy == pytest.approx(100 * 1000 / 4200) and r.pct_matmul == pytest.approx(100 * 0.5 / 900)
    assert r.intensity == pytest.approx(0.5e12 / 1000e9)  # FLOP per byte = FLOP/s over B/s
    none = cell_table.side_rates(c.cells[4], "baseline", peaks)
    assert (none.gbps, none.tflops, none.pct_copy, none.intensity) == (None, None, None, None)
    assert cell_table.side_rates(c.cells[1], "baseline", {}).pct_copy is None  # no probe, no percentage


def test_export_csv_and_json_carry_every_cell() -> None:
    c = _grid()
    c.cells[1] = c.cells[1].model_copy(update={"label": "=HYPERLINK(1)"})
    rows = list(csv.DictReader(io.StringIO(cell_table.export_csv(c))))
    assert [r["index"] for r in rows] == [str(i) for i in range(6)]
    assert rows[0]["param.M"] == "1" and rows[0]["speedup"] == "4,620× slower"
    assert rows[1]["label"] == "'=HYPERLINK(1)"  # no formula in a spreadsheet
    assert rows[4]["ratio"] == "" and rows[4]["error"] == "out of memory" and rows[4]["verdict"] == "failed"
    assert float(rows[1]["delta_ci_low_pct"]) == pytest.approx((0.8 * 0.98 - 1) * 100)
    doc = json.loads(cell_table.export_json(c))
    assert doc["fixed"] == {"dtype": "float32"} and doc["axes"] == ["M", "N"]
    assert doc["cells"][3]["speedup"] == "0.500×"
    assert doc["cells"][3]["candidate_pct_copy_peak"] == pytest.approx(100 * 1000 / 4200)


def test_forest_rows_per_cell_band_and_void_crosses() -> None:
    c = _grid()
    fig = sweep.forest_figure_dict(c, cell_table.sweep_axes(c.cells))
    by_name = {t["name"]: t for t in fig["data"]}
    void = by_name["timing void: failed / incorrect / implausible"]
    assert void["y"] == ["3: M=2, N=64", "4: M=2, N=128"] and void["x"] == [1.0, 1.0]  # 0.5: at 1
    assert by_name["slower"]["x"] == [4618.4, 1.1] and by_name["faster"]["x"] == [0.8]
    assert by_name["faster"]["error_x"]["arrayminus"] == [pytest.approx(0.8 * 0.02)]
    band = fig["layout"]["shapes"][0]
    assert (band["x0"], band["x1"]) == (pytest.approx(1 / 1.02), pytest.approx(1.02))
    axis = fig["layout"]["xaxis"]
    assert axis["type"] == "log" and 10 ** axis["range"][1] > 4618.4 and "0 %" in axis["ticktext"]
    assert fig["layout"]["yaxis"]["categoryarray"][0] == "0: M=1, N=64"


def test_heatmap_over_chosen_axes_with_the_others_held() -> None:
    c = _grid()
    axes = cell_table.sweep_axes(c.cells)
    fig = sweep.heatmap_figure_dict(c, axes, "N", "M")
    trace = fig["data"][0]
    assert trace["x"] == ["64", "128", "256"] and trace["y"] == ["1", "2"]
    assert trace["z"][0][0] == pytest.approx(math.log10(4618.4)) and trace["z"][1][0] is None  # incorrect
    assert trace["text"][1][1] == "failed" and trace["text"][0][1] == "-20.0 %"
    # the void tiles (incorrect, failed) are filled by a trace of their own, in their verdicts' colours
    void = fig["data"][1]
    assert void["name"] == "timing void" and void["z"][1][0] is not None and void["z"][0][0] is None
    order = list(sweep.VERDICT_ORDER)
    assert void["z"][1][0] == order.index("incorrect") and void["z"][1][1] == order.index("failed")
    assert void["text"][1][0] == "incorrect" and void["text"][0][1] == ""
    colour_at = {round(stop, 6): colour for stop, colour in void["colorscale"]}
    k = order.index("incorrect")
    assert colour_at[round(k / len(order), 6)] == sweep.VERDICT_COLOURS["incorrect"]
    verdicts = sweep.heatmap_figure_dict(c, axes, "M", "N", "verdict")["data"][0]
    assert verdicts["x"] == ["1", "2"] and verdicts["text"][0][1] == "incorrect"
    three = [cell.model_copy(update={"params": {**cell.params, "K": k}}) for cell in c.cells for k in (1, 2)]
    held = sweep.axis_choice(cell_table.sweep_axes(three), "N", "M", {"K": "2"})
    assert held == ("N", "M", {"K": "2"})
    assert sweep.axis_choice(cell_table.sweep_axes(three), "bogus", "M", {"K": "9"}) == ("N", "M", {"K": "1"})
    assert sweep.axis_choice(cell_table.sweep_axes(c.cells[:3]), None, None, {}) is None  # one axis


def test_roofline_points_roofs_and_none_without_work() -> None:
    c = _grid()
    fig = sweep.roofline_figure_dict(c, cell_table.comparison_peaks(c))
    assert fig is not None
    names = [t["name"] for t in fig["data"]]
    assert "baseline: torch" in names and "candidate, timing void: triton" in names
    roof = next(t for t in fig["data"] if t["name"].startswith("roof:"))
    ridge = 900.0 * 1e3 / 4200.0
    assert roof["x"][1] == pytest.approx(ridge) and roof["y"][1:] == [900.0, 900.0]
    assert roof["y"][0] == pytest.approx(4200.0 * roof["x"][0] / 1e3)
    base = next(t for t in fig["data"] if t["name"] == "baseline: torch")
    assert base["x"][0] == pytest.approx(0.4e3 / 800.0)
    no_work = _comparison([_cell(0, 1, 64, 1.0, "same")], [_probe(4000.0, 900.0)])
    assert sweep.roofline_figure_dict(no_work, cell_table.comparison_peaks(no_work)) is None


def test_roofline_axes_label_their_ticks_with_values() -> None:
    c = _grid()
    fig = sweep.roofline_figure_dict(c, cell_table.comparison_peaks(c))
    assert fig is not None
    for name in ("xaxis", "yaxis"):
        axis = fig["layout"][name]
        lo, hi = (10**e for e in axis["range"])
        assert 3 <= len(axis["tickvals"]) <= 8
        assert all(lo <= v <= hi for v in axis["tickvals"])
        for v, text in zip(axis["tickvals"], axis["ticktext"], strict=True):  # each label is its value
            assert float(text.replace(",", "").replace("\u2212", "-")) == pytest.approx(v)


def test_log_ticks_step_1_2_5_then_decades_then_fewer() -> None:
    assert sweep.log_ticks(0.3, 30.0)["ticktext"] == ["0.5", "1", "2", "5", "10", "20"]
    assert sweep.log_ticks(0.05, 2e5)["ticktext"] == ["0.1", "1", "10", "100", "1,000", "10,000", "1e5"]
    wide = sweep.log_ticks(1e-9, 1e9)
    assert len(wide["tickvals"]) <= 8 and "1e\u22129" in wide["ticktext"]
    assert sweep.log_ticks(0.002, 0.009)["ticktext"] == ["0.002", "0.005"]


def test_a_roofline_of_one_intensity_says_so() -> None:
    c = _grid()  # every cell: 0.4 TFLOP/s at 800 GB/s, 0.5 FLOP/byte
    fig = sweep.roofline_figure_dict(c, cell_table.comparison_peaks(c))
    assert fig is not None and len({x for t in fig["data"] if t["mode"] == "markers" for x in t["x"]}) == 1
    assert "every cell at 0.500 FLOP/byte: the cells differ in rate only" in fig["layout"]["title"]["text"]
    denser = c.cells[1].model_copy(
        update={"throughput": {**c.cells[1].throughput, "baseline_tflops": 4.0, "candidate_tflops": 5.0}}
    )
    varied = c.model_copy(update={"cells": [c.cells[0], denser]})
    fig = sweep.roofline_figure_dict(varied, cell_table.comparison_peaks(varied))
    assert fig is not None and len({x for t in fig["data"] if t["mode"] == "markers" for x in t["x"]}) == 2
    assert "differ in rate only" not in fig["layout"]["title"]["text"]


def test_samples_axis_goes_log_on_a_wide_spread_with_decade_labels() -> None:
    wide = [np.array([1e3, 1.1e3, 1.2e3, 2e5, 2.2e5, 2.5e5])]  # one group: a 200x tail
    layout = figures._log_layout(None, wide)
    assert layout["yaxis_type"] == "log" and layout["yaxis_dtick"] == 1
    narrow = figures._log_layout(None, [np.array([1e3, 1.05e3]), np.array([1.1e3, 1.2e3])])
    assert narrow["yaxis_type"] == "linear" and narrow["yaxis_dtick"] is None
    buttons = narrow["updatemenus"][0]["buttons"]
    assert buttons[0]["args"][0] == {"yaxis.type": "linear", "yaxis.dtick": None}
    assert buttons[1]["args"][0]["yaxis.type"] == "log"


def test_one_point_history_gets_a_sane_axis() -> None:
    line = {"code": "torch", "cell": "M=1", "gpu_model": "cpu", "timer": "perf_counter", "state": "warm"}
    point = HistoryPoint.model_validate({**line, "measured_at": T0, "median_ns": 1234.0, "side": "baseline",
                                         "job_id": 1, "node": "n", "cell_index": 0, "n": 10,
                                         "verdict": "same"})  # fmt: skip
    fig = figures.history_figure([Series.model_validate({**line, "points": [point]})])
    lo, hi = (datetime.fromisoformat(str(x)) for x in fig.layout.xaxis.range)
    assert hi - lo == figures.ONE_POINT_SPAN
    assert list(fig.layout.yaxis.range) == [pytest.approx(0.5 * 1.234), pytest.approx(1.5 * 1.234)]


def _line(code: str, gpu: str, **params: object) -> Series:
    return Series.model_validate({"code": code, "cell": " ".join(f"{k}={v}" for k, v in params.items()),
                                  "gpu_model": gpu, "timer": "cuda-graph", "state": "cold", "points": [],
                                  "params": params})  # fmt: skip


def test_history_legend_names_only_what_differs() -> None:
    f32 = "float32"
    lines = [
        _line("torch", "NVIDIA H200", N=64, dtype=f32),
        _line("triton", "NVIDIA H200", N=64, dtype=f32),
        _line("torch", "NVIDIA H200", N=128, dtype=f32),
        _line("torch", "NVIDIA A100", N=64, dtype=f32),
    ]
    names, shared = figures.history_legend(lines)
    assert names == ["torch · N=64 · NVIDIA H200", "triton · N=64 · NVIDIA H200",
                     "torch · N=128 · NVIDIA H200", "torch · N=64 · NVIDIA A100"]  # fmt: skip
    assert shared == "all: dtype=float32 · cuda-graph/cold"
    one, shared = figures.history_legend(lines[:1])
    assert one == ["torch · N=64 dtype=float32"] and shared == "all: NVIDIA H200 · cuda-graph/cold"
    assert figures.history_legend([]) == ([], "")
    fig = figures.history_figure(lines[:2])
    assert [t.name for t in fig.data] == ["torch", "triton"]  # the full name stays in the hover
    assert fig.data[0].meta == lines[0].name and "%{meta}" in fig.data[0].hovertemplate
    assert fig.layout.legend.title.text == "all: N=64 dtype=float32 · NVIDIA H200 · cuda-graph/cold"


def test_figures_take_a_missing_delta_and_a_non_finite_ratio() -> None:
    """A cell with a ratio but no Δ % labels its tile with the speed-up; a non-finite ratio is no
    number to draw: a void cross on the 1x line, a void tile, never inf or NaN in the figure."""
    cells = [
        _cell(0, 1, 64, 0.5, "faster", delta_pct=None),
        _cell(1, 1, 128, float("inf"), "slower", delta_pct=None),
        _cell(2, 2, 64, 1.1, "slower"),
        _cell(3, 2, 128, 1.2, "slower"),
    ]
    c = _comparison(cells)
    axes = cell_table.sweep_axes(c.cells)
    heat = sweep.heatmap_figure_dict(c, axes, "N", "M")
    assert heat["data"][0]["text"][0][0] == report.format_speedup(0.5)
    assert heat["data"][0]["z"][0][1] is None and heat["data"][1]["z"][0][1] is not None
    forest = {t["name"]: t for t in sweep.forest_figure_dict(c, axes)["data"]}
    void = forest["timing void: failed / incorrect / implausible"]
    assert void["x"] == [1.0] and all(math.isfinite(x) for t in forest.values() for x in t["x"])


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of ``format_table``'s table, split on runs of 2+ spaces."""
    lines = text.splitlines()
    rule = next(i for i, line in enumerate(lines) if line.startswith("-"))
    split = [re.split(r"\s{2,}", line.strip()) for line in lines[rule - 1 : rule + 1 + len(_grid().cells)]]
    return split[0], [split[0], *split[2:]][1:]


def test_axis_table_has_a_column_per_sweep_axis_noise_and_rates() -> None:
    """nvbench's layout: one column per varying parameter, the fixed ones once above the table."""
    cells = _grid().cells
    noisy = cells[1].model_copy(update={"baseline": SideStats(n=10, median_ns=1000.0, iqr_ns=25.0)})
    c = _grid().model_copy(update={"cells": [cells[0], noisy, *cells[2:]]})
    text = report.format_table(c, columns=cell_table.axis_columns(c))
    assert "every cell: dtype=float32" in text
    header, rows = _table(text)
    assert header[:2] == ["M", "N"] and header[2:6] == [
        "baseline (torch)",
        "noise",
        "candidate (triton)",
        "noise",
    ]
    assert header[6:] == [
        "baseline GB/s, % peak",
        "candidate GB/s, % peak",
        "Δ% [95% CI]",
        "speedup",
        "verdict",
        "flags",
    ]
    assert [r[:2] for r in rows] == [[str(cell.params["M"]), str(cell.params["N"])] for cell in cells]
    assert rows[1][3] == "2.50%"  # IQR 25 ns over the median 1,000 ns
    assert rows[1][6] == "800 GB/s, 19.0%"  # the best copy probe: 4,200 GB/s
    incorrect = rows[3]
    assert incorrect[2].startswith("(") and incorrect[-1] == "incorrect"  # a void timing, as in the default
    assert [r[-1] if r[-1] in VERDICT_ORDER else r[-2] for r in rows] == [cell.verdict for cell in cells]


def test_axis_table_of_one_cell_keeps_its_label_and_no_rates_without_work() -> None:
    one = _comparison([_cell(0, 1, 64, 1.0, "same")])
    header, rows = _table(report.format_table(one, columns=cell_table.axis_columns(one)))
    assert header[0] == "cell" and rows[0][0] == "M=1, N=64"
    assert not any("GB/s" in h for h in header) and "every cell" not in report.format_table(
        one, columns=cell_table.axis_columns(one)
    )


def test_the_duration_filter_writes_three_figures_never_an_exponent() -> None:
    from kernelab.web.routes import _duration

    assert [_duration(x) for x in (999.7, 1234.5, 12.0, 5e4, None)] == [
        "1,000 ns", "1.23 µs", "12.0 ns", "50.0 µs", "—"
    ]  # fmt: skip


@pytest.mark.parametrize("values", [[0.5, 4618.4], [0.9, 1.1], [0.3, 3.0], [1e-4, 1.0], [0.98, 1.02, 250.0]])
def test_forest_ticks_never_crowd_each_other(values: list[float]) -> None:
    """The ticks of the ratio axis sit at least a ninth of the axis apart (log10): no "−2 %",
    "0 %" and "+5 %" written over each other on an axis that runs to 1,000x."""
    axis = sweep._ratio_axis(values, 1.0)
    logs = [math.log10(t) for t in axis["tickvals"]]
    span = axis["range"][1] - axis["range"][0]
    assert "0 %" in axis["ticktext"] and len(logs) >= 3
    assert all(b - a >= span / 9 - 1e-12 for a, b in zip(logs, logs[1:], strict=False))
