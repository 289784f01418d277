"""Figure builders: the traces a person sees, their counts and their values."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from web_factory import T0, make_comparison, make_probe, make_result, make_spec

from kernelab.web import figures


def test_samples_figure_raw_has_one_box_per_variant_with_every_kept_sample() -> None:
    result = make_result(make_spec(rows=(4, 8, 16)), rounds=6, throttled_rounds=(1,))
    fig = figures.samples_figure(result)
    assert [t.type for t in fig.data] == ["box", "box"]
    assert [t.name for t in fig.data] == ["baseline: torch", "candidate: triton (BLOCK_M=4)"]
    # 3 cells x 6 rounds x 1 sample, minus the throttled round of each cell (excluded by default).
    assert [len(t.y) for t in fig.data] == [15, 15]
    assert list(dict.fromkeys(fig.data[0].x)) == ["M=4", "M=8", "M=16"]
    assert fig.layout.yaxis.title.text == "time per launch (µs)"
    # Cell 0 is 1 µs baseline, 0.8 µs candidate (±2 % noise).
    assert max(fig.data[1].y[:5]) < min(fig.data[0].y[:5])


def test_samples_figure_keeps_throttled_samples_when_the_spec_says_so() -> None:
    spec = make_spec(rows=(4,)).model_copy(deep=True)
    spec.measurement.exclude_throttled = False
    fig = figures.samples_figure(make_result(spec, rounds=6, throttled_rounds=(1, 2)))
    assert [len(t.y) for t in fig.data] == [6, 6]


def test_samples_figure_log_option_and_toggle() -> None:
    fig = figures.samples_figure(make_result(), log_y=True)
    assert fig.layout.yaxis.type == "log"
    menu = fig.layout.updatemenus[0]
    assert [b.label for b in menu.buttons] == ["linear", "log"] and menu.active == 1
    assert figures.samples_figure(make_result()).layout.yaxis.type == "linear"  # auto: 0.8x apart


def test_log_axis_is_automatic_when_variants_are_orders_of_magnitude_apart() -> None:
    result = make_result(speedup=1000.0)  # e.g. a kernel in the Triton interpreter vs eager torch
    assert figures.samples_figure(result).layout.yaxis.type == "log"
    assert figures.samples_figure(result, log_y=False).layout.yaxis.type == "linear"
    assert figures.timeline_figure(result, 0).layout.yaxis.type == "log"
    assert figures.timeline_figure(make_result(), 0).layout.yaxis.type == "linear"


def test_samples_figure_from_comparison_skips_missing_statistics() -> None:
    fig = figures.samples_figure(make_comparison(3))
    assert [t.type for t in fig.data] == ["scatter", "scatter"]
    assert list(fig.data[0].x) == ["M=0", "M=1", "M=2"]
    assert list(fig.data[1].x) == ["M=0", "M=1"]  # the last cell has no candidate median
    assert fig.data[0].y[1] == pytest.approx(2.0)  # 2000 ns in µs
    assert fig.data[0].error_y.array[1] == pytest.approx(0.1)
    assert fig.data[0].error_y.arrayminus[1] == pytest.approx(0.1)


def test_timeline_orders_rounds_and_adds_throttle_and_clock_traces_only_when_present() -> None:
    plain = figures.timeline_figure(make_result(rounds=4), 1)
    assert [t.name for t in plain.data] == ["baseline: torch", "candidate: triton (BLOCK_M=4)"]
    # ABBA: round 0 is baseline then candidate, round 1 candidate then baseline.
    assert list(plain.data[0].x) == [0.0, 1.5, 2.0, 3.5]
    assert list(plain.data[1].x) == [0.5, 1.0, 2.5, 3.0]
    assert "cell 1" in plain.layout.title.text

    rich = figures.timeline_figure(make_result(rounds=4, throttled_rounds=(2,), clock_mhz=1980.0), 0)
    assert [t.name for t in rich.data][2:] == ["throttled", "SM clock"]
    assert len(rich.data[2].x) == 2
    assert rich.data[3].yaxis == "y2" and set(rich.data[3].y) == {1980.0}


def test_timeline_unknown_cell_raises() -> None:
    with pytest.raises(KeyError, match="index 7"):
        figures.timeline_figure(make_result(), 7)


def test_probe_history_figure_traces_and_order() -> None:
    readings = [make_probe("after", T0 + timedelta(hours=h), copy_gbps=40.0 + h) for h in (2, 0, 1)]
    fig = figures.probe_history_figure(readings)
    names = [t.name for t in fig.data]
    assert names == ["copy GPU 0", "all-reduce ×2 8 B", "all-reduce ×2 1 MiB", "all-reduce ×2 64 MiB"]
    assert list(fig.data[0].y) == [40.0, 41.0, 42.0]  # sorted by taken_at
    assert [t.visible for t in fig.data[1:]] == [True, "legendonly", True]
    assert fig.data[1].xaxis == "x2" and fig.layout.yaxis2.type == "log"
    axis = fig.layout.yaxis2  # the log panel writes every tick as its value, over what it draws
    lo, hi = (10**e for e in axis.range)
    drawn = [y for t in fig.data[1:] for y in t.y]
    assert lo < min(drawn) and max(drawn) < hi and len(axis.tickvals) >= 2
    assert [float(t.replace(",", "")) for t in axis.ticktext] == pytest.approx(list(axis.tickvals))


def test_probe_history_without_readings_says_so() -> None:
    fig = figures.probe_history_figure([])
    assert len(fig.data) == 0
    assert fig.layout.annotations[-1].text == "no probe readings"


@pytest.mark.parametrize("values, unit", [([], "ns"), ([500.0], "ns"), ([2e3, 4e3], "µs"), ([3e6], "ms")])
def test_time_unit(values: list[float], unit: str) -> None:
    assert figures.time_unit(values)[0] == unit


def test_figure_json_cannot_close_its_script_element() -> None:
    spec = make_spec(name="x").model_copy(deep=True)
    spec.baseline.variant = "</script><script>alert(1)</script>\u2028"
    text = str(figures.figure_json(figures.samples_figure(make_result(spec))))
    assert "<" not in text and ">" not in text and "\u2028" not in text
    decoded = json.loads(text)
    assert decoded["data"][0]["name"] == "baseline: </script><script>alert(1)</script>\u2028"


def test_probe_tables_pivot_phases_side_by_side() -> None:
    from kernelab.web.routes import probe_tables

    after = make_probe("after", T0 + timedelta(seconds=5), copy_gbps=20.0)
    tables = probe_tables([after, make_probe("before", T0, copy_gbps=40.0)])
    assert tables["phases"] == ["before", "after"]
    copy, reduce = tables["tables"]
    assert (copy["id"], reduce["id"]) == ("probe-copy", "probe-allreduce")
    [copy_row] = copy["rows"]
    assert {p: r.bandwidth_gbps for p, r in copy_row["by_phase"].items()} == {"before": 40.0, "after": 20.0}
    assert [c.text for c in copy_row["cells"]["before"]] == ["40.0"]
    assert copy["label_headers"] == ["device", "size"]
    assert copy["value_headers"] == ["before", "after"]
    assert [r["key"][2] for r in reduce["rows"]] == [8, 1 << 20, 64 << 20]
    assert set(reduce["rows"][0]["by_phase"]) == {"before", "after"}
    assert reduce["value_headers"] == ["before µs", "before busbw", "after µs", "after busbw"]


def test_probe_tables_leave_out_a_probe_without_readings_and_name_the_device() -> None:
    from kernelab.web.routes import probe_tables

    report = make_probe("before", T0, copy_gbps=40.0).model_copy(update={"all_reduce": []})
    tables = probe_tables([report], "cpu")
    assert [t["probe"] for t in tables["tables"]] == ["copy_bandwidth"]
    assert tables["tables"][0]["label_headers"] == ["CPU", "size"]
    assert probe_tables([])["tables"] == []
