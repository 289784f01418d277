"""kernelab.service.judge.report: the text table and the Markdown export, from a real ``stats.compare``."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import numpy as np
import pytest

from kernelab.service.contract.schemas import (
    VERDICT_INFO,
    AllReduceReading,
    CellResult,
    Comparison,
    CopyBandwidthReading,
    CorrectnessResult,
    JobResult,
    JobSpec,
    NodeInfo,
    ProbeReport,
    Sample,
)
from kernelab.service.judge import report, stats
from kernelab.service.judge.verdicts import VERDICT_ORDER, reason

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _samples(ratio: float, *, rounds: int = 40, base_ns: float = 12_340.0, seed: int = 0) -> list[Sample]:
    rng = np.random.default_rng(seed)
    noise = 1 + 0.005 * rng.standard_normal((rounds, 2))
    return [
        Sample(
            variant=v,
            round=r,
            position=p,
            duration_ns=base_ns * (ratio if v == "candidate" else 1.0) * noise[r, p],
        )
        for r in range(rounds)
        for p, v in enumerate(("baseline", "candidate"))
    ]


def _comparison(*, name: str = "softmax PR 42", mode: str = "plain") -> Comparison:
    """Three cells (slower, faster, failed), before/after probes; ``mode='pipes'`` puts pipes and
    newlines in every user-supplied string."""
    odd = mode == "pipes"
    cells = [
        CellResult(index=0, params={"N": "a|b" if odd else 1000}, samples=_samples(1.05, seed=1)),
        CellResult(
            index=1,
            params={"N": 2000},
            samples=_samples(0.9, seed=2),
            correctness={"candidate": CorrectnessResult(passed=False, message="tile 3|4 wrong")},
        ),
        CellResult(
            index=2, params={"N": 4000}, error="out of memory\nat line | 3" if odd else "out of memory"
        ),
    ]
    spec = JobSpec(
        name=name,
        benchmark="softmax",
        baseline={"variant": "torch"},
        candidate={"variant": "triton", "params": {"mode": "x|y"} if odd else {}},
        sweep={"N": ["a|b" if odd else 1000, 2000, 4000]},
    )
    probes = [
        ProbeReport(
            phase=phase,
            taken_at=NOW,
            nvml_status="ok",
            copy_bandwidth=[
                CopyBandwidthReading(
                    device_index=0, size_bytes=4 << 30, time_us=2000.0, bandwidth_gbps=4210.5
                )
            ],
            all_reduce=[
                AllReduceReading(
                    backend="nccl",
                    world_size=2,
                    ranks=[0, 1],
                    size_bytes=8,
                    time_us=19.5,
                    algbw_gbps=0.0,
                    busbw_gbps=0.0,
                ),
                AllReduceReading(
                    backend="nccl",
                    world_size=2,
                    ranks=[0, 1],
                    size_bytes=1 << 20,
                    time_us=25.25,
                    algbw_gbps=41.9,
                    busbw_gbps=41.9,
                ),
            ],
        )
        for phase in ("before", "after")
    ]
    node = NodeInfo(
        hostname="h200|a" if odd else "h200-a",
        device_type="cuda",
        device_name="NVIDIA H200",
        device_count=2,
        driver_version="580.65",
        cuda_version="13.0",
        torch_version="2.11.0",
        triton_version="3.6.0",
    )
    result = JobResult(
        idempotency_key="report-test-1",
        spec=spec,
        node=node,
        timer="cuda-event",
        started_at=NOW,
        finished_at=NOW,
        cells=cells,
        probes=probes,
    )
    return stats.compare(result, job_id=42)


@pytest.mark.parametrize(
    ("ns", "text"),
    [
        (950.0, "950.0 ns"),
        (0.5, "0.5000 ns"),
        (12_345.0, "12.35 µs"),
        (2.5e6, "2.500 ms"),
        (3.2e9, "3.200 s"),
        (None, "n/a"),
    ],
)
def test_format_duration_units(ns, text):
    assert report.format_duration_ns(ns) == text


def test_format_table_contains_numbers_probes_and_summary():
    c = _comparison()
    text = report.format_table(c)
    lines = text.splitlines()
    slow = c.cells[0]
    row = next(line for line in lines if line.startswith("N=1000 "))
    assert report.format_duration_ns(slow.baseline.median_ns) in row
    assert report.format_duration_ns(slow.candidate.median_ns) in row
    pct = report.format_pct
    assert f"{pct(slow.ratio)}% [{pct(slow.ci_low)}, {pct(slow.ci_high)}]" in row  # three significant figures
    assert "slower" in row
    wrong = c.cells[1]  # faster by its timing, wrong by its check: incorrect, its timing in ( )
    assert wrong.timing_verdict == "faster" and wrong.verdict == "incorrect"
    assert re.search(
        rf"^N=2000 +\({re.escape(report.format_duration_ns(wrong.baseline.median_ns))}\) .*"
        r"\(-\d+(\.\d+)?% .*\)\s+incorrect\s+incorrect$",
        text,
        re.M,
    )
    assert re.search(r"^N=4000 .*n/a\s+failed\s+failed$", text, re.M)
    assert "faster" not in text
    # the header and the rows align: the verdict column starts at one offset
    header = next(line for line in lines if line.startswith("cell "))
    col = header.index("verdict")
    assert row[col:].startswith("slower")
    probes = [line for line in lines if line.startswith("probes")]  # one line for every report
    assert probes == [
        "probes: before copy 4210.5 GB/s, all-reduce nccl x2: 8 B 19.5 µs, 1 MiB 25.2 µs, NVML ok | after "
        + probes[0].split(" | after ", 1)[1]
    ]
    assert probes[0].endswith("; healthy") and "full tables" not in probes[0]
    assert (
        report.format_table(c, probes_more="full tables with --probes").count("; full tables with --probes")
        == 1
    )
    assert "verdicts: 1 failed, 1 incorrect, 1 slower; job flags: incorrect, failed" in text
    why = text.split("\nwhy:\n", 1)[1].splitlines()
    assert why[:2] == ["  failed     N=4000: out of memory", "  incorrect  N=2000: candidate: tile 3|4 wrong"]
    assert report.VOID_TIMING_NOTE in text
    assert "timer cuda-event; state cold; threshold ±1%" in text
    assert "NVIDIA H200 x2, driver 580.65, CUDA 13.0, torch 2.11.0, triton 3.6.0" in text


def test_format_table_folds_newlines_in_user_text():
    text = report.format_table(_comparison(mode="pipes"))
    assert "  failed     N=4000: out of memory at line | 3" in text
    assert not any(line.startswith("at line") for line in text.splitlines())


def _split_row(line: str) -> list[str]:
    """Cells of a GFM table row, honouring ``\\|`` escapes."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def test_markdown_table_has_numbers_node_and_notes():
    c = _comparison()
    md = report.to_markdown(c)
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + len(c.cells)
    header = ["cell", "baseline (torch)", "candidate (triton)", "Δ% [95% CI]", "speedup", "p [BH]", "verdict",
              "flags"]  # fmt: skip
    assert _split_row(rows[0]) == header
    wrong = _split_row(rows[3])  # fast but wrong: incorrect, its timing in parentheses
    assert wrong[0] == "N=2000"
    assert wrong[2] == f"({report.format_duration_ns(c.cells[1].candidate.median_ns)})"
    assert wrong[3] == f"({report.format_delta(c.cells[1])})"
    assert wrong[4] == f"({report.format_ratio(c.cells[1].ratio)})"  # a bare ratio: no "faster"
    assert wrong[5] == f"({report.format_p(c.cells[1])})"
    assert wrong[6] == "❌ **incorrect**" and wrong[7] == "incorrect"
    slow = _split_row(rows[2])
    assert slow[4] == report.format_speedup(c.cells[0].ratio) and slow[4].endswith("\u00d7 slower")
    assert slow[6] == "**slower**" and _split_row(rows[4])[6] == "❌ **failed**"
    assert "**faster**" not in md
    assert "driver 580.65" in md and "torch 2.11.0" in md and "triton 3.6.0" in md
    assert "**timer** cuda-event" in md and "**threshold** ±1%" in md
    assert "- `incorrect`: " in md and "- `failed`: " in md and "`noisy`" not in md
    assert "**Verdicts:** ❌ 1 failed, ❌ 1 incorrect, 1 slower" in md
    why = md.split("**Why**\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert why == [
        "- ❌ **failed** · N=4000: out of memory",
        "- ❌ **incorrect** · N=2000: candidate: tile 3\\|4 wrong",
    ]
    assert md.index("**Why**") > md.index(rows[-1])  # directly under the table


def test_markdown_escapes_pipes_in_user_text():
    c = _comparison(name="fix | race", mode="pipes")
    md = report.to_markdown(c)
    rows = [line for line in md.splitlines() if line.startswith("|")]
    assert all(len(_split_row(r)) == 8 for r in rows)  # no user pipe opened a column
    assert _split_row(rows[2])[0] == "N=a\\|b"
    assert "triton (mode=x\\|y)" in rows[0]
    assert "fix \\| race" in md and "h200\\|a" in md
    assert "out of memory at line \\| 3" in md
    assert "tile 3\\|4 wrong" in md
    assert not re.search(r"(?<!\\)\|", md.split("**Notes**")[1])


def _result(cells: list[CellResult], **spec_extra: object) -> JobResult:
    spec = JobSpec(
        benchmark="softmax",
        baseline={"variant": "torch"},
        candidate={"variant": "triton"},
        sweep={"N": [c.params["N"] for c in cells]},
        **spec_extra,
    )
    node = NodeInfo(hostname="cpu-box", device_type="cpu")
    return JobResult(
        idempotency_key="report-test-2",
        spec=spec,
        node=node,
        timer="perf-counter",
        started_at=NOW,
        finished_at=NOW,
        cells=cells,
    )


def test_implausible_cell_reads_implausible_with_its_reason_and_marked_timing():
    no_work = reason("no-device-work", "candidate: the timed call launched no device work", side="candidate")
    cells = [
        CellResult(index=0, params={"N": 1}, samples=_samples(0.2, seed=3), findings=[no_work]),
        CellResult(index=1, params={"N": 2}, samples=_samples(1.0, seed=4)),
    ]
    c = stats.compare(_result(cells))
    assert [cell.verdict for cell in c.cells][0] == "implausible"
    assert c.cells[0].timing_verdict == "faster"
    text = report.format_table(c)
    row = next(line for line in text.splitlines() if line.startswith("N=1 "))
    assert re.search(r"\(-\d+(\.\d+)?% \[.*\]\)\s+.*implausible\s+implausible$", row)
    assert "  implausible  N=1: candidate: the timed call launched no device work" in text
    assert report.VOID_TIMING_NOTE in text
    other = next(line for line in text.splitlines() if line.startswith("N=2 "))
    assert "(" not in other  # a cell whose timing stands is not marked
    md = report.to_markdown(c)
    assert "| ⚠️ **implausible** | implausible |" in md
    assert "- ⚠️ **implausible** · N=1: candidate: the timed call launched no device work" in md
    assert "- `implausible`: " in md  # the flag's note from the one catalogue


def test_all_cells_failed_is_a_failed_job_in_text_and_markdown():
    cells = [
        CellResult(index=i, params={"N": i + 1}, error="SyntaxError: invalid syntax (impl.py, line 3)")
        for i in range(3)
    ]
    c = stats.compare(_result(cells))
    assert c.summary == {"failed": 3}
    text = report.format_table(c)
    assert "verdicts: 3 failed" in text
    assert "job failed: all 3 cells failed; first: SyntaxError: invalid syntax (impl.py, line 3)" in text
    # the three identical reasons are one line
    assert "  failed  3 cells (N=1; N=2; N=3): SyntaxError: invalid syntax (impl.py, line 3)" in text
    assert report.VOID_TIMING_NOTE not in text  # no timing to mark
    md = report.to_markdown(c)
    assert "**Job failed:** all 3 cells failed; first: SyntaxError: invalid syntax (impl.py, line 3)" in md
    assert md.index("**Job failed:**") < md.index("| cell |")
    assert "**Verdicts:** ❌ 3 failed" in md


def test_reasons_of_a_large_sweep_are_grouped_and_capped():
    """60 cells wrong in the same way are one line; 30 cells wrong each in its own way fill the
    told lines up to WHY_GROUPS, the rest are counted by verdict and code."""
    same = CorrectnessResult(passed=False, message="FAIL: every row unnormalised")
    cells = [
        CellResult(
            index=i,
            params={"N": i + 1},
            samples=_samples(0.5, rounds=8, seed=i),
            correctness={"candidate": same},
        )
        for i in range(60)
    ]
    cells += [
        CellResult(
            index=60 + i,
            params={"N": 61 + i},
            samples=_samples(0.5, rounds=8, seed=60 + i),
            correctness={"candidate": CorrectnessResult(passed=False, message=f"FAIL: row {i}")},
        )
        for i in range(30)
    ]
    c = stats.compare(_result(cells), n_resamples=200)
    assert c.summary == {"incorrect": 90}
    groups = report.why_groups(c)
    assert len(groups) == report.WHY_GROUPS + 1
    assert groups[0].labels == [f"N={i + 1}" for i in range(60)]
    assert groups[-1].message == "" and len(groups[-1].labels) == 30 - (report.WHY_GROUPS - 1)
    text = report.format_table(c)
    why = text.split("\nwhy:\n", 1)[1].splitlines()[: report.WHY_GROUPS + 1]
    assert why[0] == (
        "  incorrect  60 cells (N=1; N=2; N=3; N=4; ...): candidate: FAIL: every row unnormalised"
    )
    assert why[1] == "  incorrect  N=61: candidate: FAIL: row 0"
    assert why[-1].startswith(
        "  incorrect  11 more cells: wrong-output (the output differs from the reference)"
    )
    assert len(text.splitlines()) < 90 + 40  # 90 table rows, about 20 lines of reasons


def test_paint_styles_verdicts_without_breaking_the_columns():
    c = _comparison()
    plain = report.format_table(c)
    painted = report.format_table(c, paint=lambda text, verdict: f"<{verdict}>{text}</{verdict}>")
    assert re.sub(r"</?[a-z]+>", "", painted) == plain
    assert "<incorrect>incorrect</incorrect>  incorrect" in painted  # the padded column, then flags
    assert "verdicts: <failed>1 failed</failed>, <incorrect>1 incorrect</incorrect>" in painted
    assert "  <failed>failed</failed>     N=4000: out of memory" in painted


def test_why_names_the_deciding_reason_and_counts_the_others():
    wrong = {
        side: CorrectnessResult(passed=False, message=f"{side} rows 0-3 wrong")
        for side in ("baseline", "candidate")
    }
    c = stats.compare(
        _result([CellResult(index=0, params={"N": 1}, samples=_samples(0.5, seed=5), correctness=wrong)])
    )
    [cell] = c.cells
    assert cell.verdict == "incorrect"
    more = "(+1 more reason: --reasons or the job page)"  # and where to read it
    assert report.why(cell) == f"baseline: baseline rows 0-3 wrong {more}"
    assert f"  incorrect  N=1: baseline: baseline rows 0-3 wrong {more}" in report.format_table(c)
    above = report.format_table(c, reasons_where=report.REASONS_ABOVE)  # --reasons printed them first
    assert "N=1: baseline: baseline rows 0-3 wrong (+1 more reason: listed above)" in above
    assert "--reasons" not in above
    assert [line for line in report.reason_lines(c) if line.startswith("N=1 ")] == [
        f"N=1  incorrect  [{r.code}] {r.message}" for r in cell.reasons
    ]


def test_cross_check_is_shown_in_the_table_and_the_markdown() -> None:
    """Both methods' medians per side and both ratios, under the table and in the Markdown; a cell
    without a cross measurement says why."""
    from kernelab.service.contract.schemas import TimerCrossCheck
    from tests.service.factories import job_result

    result = job_result(None)
    for cell in result.cells:
        cell.timers = {"baseline": "cuda-graph", "candidate": "cuda-graph"}
    result.cells[0].cross_check = TimerCrossCheck(
        methods={"baseline": "cuda-event", "candidate": "cuda-event"}, rounds=5,
        samples_ns={"baseline": [1300.0] * 5, "candidate": [1040.0] * 5},
    )  # fmt: skip
    result.cells[1].cross_check = TimerCrossCheck(error="cuda-graph: 1 memcpy node")
    c = stats.compare(result)
    table, markdown = report.format_table(c), report.to_markdown(c)
    line = f"ratio {c.cells[0].ratio:.3g} vs 0.800 (disagree, ratios agree)"  # three significant figures
    for text in (table, markdown):
        assert "cuda-event 1.300 µs" in text and line in text
        assert "no cross-check (cuda-graph: 1 memcpy node)" in text
    assert "cross-check: " in table and "**Timer cross-check**" in markdown
    assert c.cells[0].verdict == "faster" and "timer-disagreement" not in c.cells[0].flags  # a note


@pytest.mark.parametrize("verdict", VERDICT_ORDER)
def test_markdown_verdict_line_reads_count_then_verdict_for_every_verdict(verdict):
    """The ``**Verdicts:**`` line is ``<sign>N verdict`` for each verdict word (an ``inconclusive``
    cell once read ``inconclusive2 inconclusive``: the plain verdict was taken as a prefix)."""
    base = _comparison()
    c = base.model_copy(
        update={"summary": {verdict: 2, "slower": 1} if verdict != "slower" else {verdict: 2}}
    )
    line = next(ln for ln in report.to_markdown(c).splitlines() if ln.startswith("**Verdicts:**"))
    summary = line.removeprefix("**Verdicts:** ").split(" · ")[0]
    mark = VERDICT_INFO[verdict].mark  # the catalogue's sign: ❌ failed/incorrect, ⚠️ nondeterministic/...
    sign = f"{mark} " if mark else ""
    parts = summary.split(", ")
    assert f"{sign}2 {verdict}" in parts
    assert all(re.fullmatch(r"(❌ |⚠️ )?\d+ [a-z]+", p) for p in parts), summary


def test_title_names_baseline_then_candidate_as_the_columns_do():
    """``kernelab run`` says ``torch vs triton`` (baseline vs candidate); the table's title said
    ``triton vs torch``. Both formats title the job baseline first, as their columns read."""
    c = _comparison()
    assert (c.baseline_label, c.candidate_label) == ("torch", "triton")
    first = report.format_table(c).splitlines()[0]
    assert first.endswith("[softmax]: torch vs triton"), first
    assert report.to_markdown(c).splitlines()[0].endswith("\\[softmax\\]: torch vs triton")


@pytest.mark.parametrize(
    ("ratio", "delta", "speedup"),
    [
        (1.050234, "+5.02", "1.05× slower"),
        (9776.6026, "+978,000", "9,780× slower"),  # the issue's +977560.26%
        (5051.4, "+505,000", "5,050× slower"),
        (0.8, "-20.0", "1.25× faster"),
        (1.0004, "+0.0400", "1.00×"),
        (1e7, "+1.00e9", "1.00e7× slower"),  # from ten million on, a power of ten
    ],
)
def test_ratios_and_percentages_read_with_three_significant_figures(ratio, delta, speedup):
    assert report.format_pct(ratio) == delta
    assert report.format_speedup(ratio) == speedup


def test_a_huge_slowdown_has_three_figures_in_table_and_markdown_and_full_precision_in_json():
    c = _comparison()
    cell = c.cells[0].model_copy(update={"ratio": 9776.602626, "ci_low": 9700.123, "ci_high": 9850.987})
    c = c.model_copy(update={"cells": [cell]})
    row = "+978,000% [+970,000, +985,000]"
    assert row in report.format_table(c) and row in report.to_markdown(c)
    assert "9,780× slower" in report.format_table(c) and "977560" not in report.format_table(c)
    assert "9776.602626" in c.model_dump_json()


@pytest.mark.parametrize(
    ("x", "text"),
    [(5e-324, "4.94e-324"), (-5e-324, "-4.94e-324"), (1e-320, "1.00e-320"),
     (1.7976931348623157e308, "1.80e308"), (9999500.0, "1.00e7"), (0.00099995, "0.00100")],
)  # fmt: skip
def test_three_figures_at_the_ends_of_the_floats(x: float, text: str) -> None:
    """Subnormals and the largest float: no ZeroDivisionError or OverflowError, a 3-digit mantissa."""
    from kernelab.service.contract.units import format_sig3

    assert format_sig3(x) == text


def test_a_speedup_that_overflows_is_no_number() -> None:
    assert report.format_speedup(1e-310) == report.format_speedup(None)
    assert report.format_ratio(5e-324).startswith("4.94e-324")
