"""The verdict catalogue (``kernelab.service.contract.schemas.VERDICT_CATALOGUE``) is the one declaration of
every verdict: each test here walks it, so a verdict added there that some view does not cover (no
colour, no CSS rule, no gate class, no bisect outcome, no GitHub level, no Markdown form, no
terminal style) fails here, naming the verdict.

The views are the real ones: the judgement's order and classes, the text table and Markdown, the
CLI's gate, colours and ``--fail-on``, the GitHub annotations, the bisect's judge, the dashboard's
figures and its served pages (a real app on a real database: the ``<style>`` block of a page and
the badge of every verdict rendered by the page templates).
"""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, get_args

import pytest
import typer

from kernelab.runners import bisect
from kernelab.runners.cli import common, github, output
from kernelab.runners.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from kernelab.service.contract.schemas import (
    VERDICT_CATALOGUE,
    VERDICT_INFO,
    CellComparison,
    Comparison,
    JobPublic,
    JobSpec,
    NodeInfo,
    SideStats,
    TimingVerdict,
    Verdict,
    VerdictEntry,
    verdict_css_class,
)
from kernelab.service.judge import report, verdicts
from kernelab.service.judge.cell_table import sweep_axes
from kernelab.web import routes, sweep, verdict_style

if TYPE_CHECKING:
    from service_api import Api

ENTRIES = pytest.mark.parametrize("entry", VERDICT_CATALOGUE, ids=[e.name for e in VERDICT_CATALOGUE])
HEX = re.compile(r"#(?:[0-9a-f]{3}|[0-9a-f]{6})")


def _comparison(*verdicts_: str, ratio: float = 1.3) -> Comparison:
    """One cell per verdict, ``N=0, 1, ...``, each with a ratio and a CI (a problem cell keeps its
    timing), no reasons."""
    side = SideStats(n=10, median_ns=100.0)
    cells = [
        CellComparison(index=i, params={"N": i}, label=f"N={i}", baseline=side, candidate=side, verdict=v,  # type: ignore[arg-type]
                       ratio=ratio, ci_low=ratio * 0.99, ci_high=ratio * 1.01)
        for i, v in enumerate(verdicts_)
    ]  # fmt: skip
    summary = {v: verdicts_.count(v) for v in verdicts_}
    return Comparison(
        benchmark="softmax", baseline_label="a", candidate_label="b", threshold_pct=1.0, timer="perf_counter",
        node=NodeInfo(hostname="h", device_type="cpu"), cells=cells, summary=summary,
    )  # fmt: skip


def _job() -> JobPublic:
    spec = JobSpec.model_validate(
        {"benchmark": "softmax", "baseline": {"variant": "torch"}, "candidate": {"variant": "triton"}}
    )
    return JobPublic(id=7, name="", benchmark="softmax", status="succeeded", spec=spec, attempts=1,
                     max_attempts=3, created_at=datetime(2026, 12, 1, tzinfo=UTC))  # fmt: skip


def test_the_catalogue_is_the_verdict_type_in_its_order() -> None:
    names = tuple(e.name for e in VERDICT_CATALOGUE)
    assert names == get_args(Verdict) == verdicts.VERDICT_ORDER
    assert len(set(names)) == len(names) and list(VERDICT_INFO) == list(names)
    assert set(get_args(TimingVerdict)) == {e.name for e in VERDICT_CATALOGUE if e.kind != "problem"}


@ENTRIES
def test_every_entry_is_complete_and_consistent(entry: VerdictEntry) -> None:
    assert verdict_css_class(entry.name) == f"verdict-{entry.name}"  # a CSS class name
    assert entry.meaning.strip() and "\n" not in entry.meaning
    for colour in (entry.plot, entry.badge, entry.badge_text, entry.stripe, entry.ink):
        assert colour is None or HEX.fullmatch(colour), (entry.name, colour)
    assert entry.stripe_px > 0
    if entry.terminal is not None:  # click knows the colour (it raises TypeError otherwise)
        assert typer.style("x", fg=entry.terminal).startswith("\x1b[")
    # what a problem or an undecided cell says can never be a bisect step's answer
    assert entry.kind == "decided" or entry.bisect == "undecided"
    # a verdict that can fail a gate is annotated in GitHub (the gate's reason is on the pull request)
    assert (entry.gate != "never") == (entry.github is not None)
    # a step is bad only on a decided verdict a gate may fail on, good only on one no gate fails on
    if entry.bisect == "bad":
        assert entry.kind == "decided" and entry.gate != "never"
    if entry.bisect == "good":
        assert entry.gate == "never"


@ENTRIES
def test_judgement_and_the_text_and_markdown_reports_cover_it(entry: VerdictEntry) -> None:
    v = entry.name
    assert (v in verdicts.PROBLEM_VERDICTS) == (entry.kind == "problem")
    assert (v in report.EXPLAINED_VERDICTS) == (entry.kind != "decided")
    # the note under a table with a problem cell's timing names every problem verdict
    assert (re.search(rf"\b{v}\b", report.VOID_TIMING_NOTE) is not None) == (entry.kind == "problem")
    # Markdown: the entry's sign and emphasis, in the table and in the summary line
    sign = f"{entry.mark} " if entry.mark else ""
    shown = sign + (f"**{v}**" if entry.bold else v)
    assert report.md_verdict(v) == shown
    c = _comparison(v)
    markdown = report.to_markdown(c)
    assert f"| {shown} |" in markdown
    assert f"{sign}1 {v}" in next(ln for ln in markdown.splitlines() if ln.startswith("**Verdicts:**"))
    # a cell of it with no recorded reason reads the verdict's meaning
    assert entry.meaning in report.why(c.cells[0])
    # the text table: the verdict word, in the terminal's colour when painted
    painted = report.format_table(c, paint=output.paint_verdict)
    style = output.VERDICT_COLORS.get(v)
    expected = v if entry.terminal is None else typer.style(v, fg=entry.terminal, bold=entry.terminal_bold)
    assert style == (None if entry.terminal is None else (entry.terminal, entry.terminal_bold))
    assert output.paint_verdict(v, v) == expected and expected in painted


@ENTRIES
def test_the_gate_and_fail_on_cover_it(entry: VerdictEntry, capsys: pytest.CaptureFixture[str]) -> None:
    v = entry.name
    assert (v in common.GATE_VERDICTS) == (entry.gate != "never")
    assert (v in common.DEFAULT_FAIL_ON.split(",")) == (v in common.DEFAULT_GATE) == (entry.gate == "default")
    from kernelab.runners import api

    assert (v in api.DEFAULT_FAIL_ON) == (entry.gate == "default")
    if entry.gate == "never":
        with pytest.raises(typer.Exit) as refused:
            output.parse_fail_on(v)
        assert refused.value.exit_code == EXIT_BAD_INPUT and "--fail-on" in capsys.readouterr().err
        return
    assert output.parse_fail_on(v.upper()) == frozenset({v})
    assert output.gate(_comparison(v, "same"), frozenset({v})) == EXIT_FAILED
    assert output.gate(_comparison("same"), frozenset({v})) == EXIT_OK


@ENTRIES
def test_github_annotations_cover_it(entry: VerdictEntry) -> None:
    v = entry.name
    c = _comparison(v, "same")
    assert (v in github.ANNOTATED) == (entry.github is not None)
    lines = github.annotation_lines(c, frozenset(), None)
    if entry.github is None:
        assert lines == []
        return
    (line,) = lines
    assert line.startswith(f"::{entry.github} title=kernelab softmax%3A {v}::N=0: {v}")
    if entry.kind != "decided":  # its reason is told (here: its meaning, the cell has no reason)
        assert github.escape_data(entry.meaning) in line
    (failing,) = github.annotation_lines(c, frozenset({v}), None)
    assert failing.startswith("::error ")


@ENTRIES
def test_bisect_judges_a_step_of_it_by_its_entry(entry: VerdictEntry) -> None:
    v = entry.name
    assert (v in bisect.PROBLEM_VERDICTS) == (entry.kind == "problem")
    judged = bisect.judge(_job(), _comparison(v, "same"))
    assert judged.outcome == entry.bisect
    if entry.bisect != "good":  # the cell that decided is the evidence
        assert judged.verdict == v and judged.cell == "N=0"
    if entry.kind == "problem":  # whatever another cell says
        assert bisect.judge(_job(), _comparison("slower", v)).outcome == "undecided"


@ENTRIES
def test_the_dashboards_figures_colour_it(entry: VerdictEntry) -> None:
    v = entry.name
    assert sweep.VERDICT_COLOURS[v] == entry.plot
    c = _comparison(v, "same", ratio=1.0)
    c = c.model_copy(update={"cells": [x.model_copy(update={"params": {"N": x.index, "M": 1 + x.index}})
                                       for x in c.cells]})  # fmt: skip
    axes = sweep_axes(c.cells)
    heat = sweep.heatmap_figure_dict(c, axes, "N", "M", value="verdict")["data"][0]
    k = verdicts.VERDICT_ORDER.index(v)  # its band of the colour scale, its tick
    assert [colour for _, colour in heat["colorscale"][2 * k : 2 * k + 2]] == [entry.plot] * 2
    assert heat["colorbar"]["ticktext"][k] == v and heat["z"][0][0] == k
    forest = sweep.forest_figure_dict(c, axes)
    if entry.kind != "problem":  # a void cell is drawn as a cross on a line of its own
        (trace,) = [t for t in forest["data"] if t.get("name") == v]
        assert trace["marker"]["color"] == entry.plot


def _rules(css: str) -> dict[str, str]:
    """Selector -> declarations of ``css``, one rule a line."""
    out = {}
    for line in css.splitlines():
        match = re.fullmatch(r"\s*(.+?) \{ (.+) \}\s*", line)
        assert match, line
        out[match.group(1)] = match.group(2)
    return out


@ENTRIES
def test_the_dashboards_css_has_its_rules(entry: VerdictEntry) -> None:
    rules = _rules(verdict_style.verdict_css())
    v = entry.name
    assert rules.get(f".verdict-{v}") == f"background: {entry.badge}; color: {entry.badge_text};"
    row = rules.get(f"tr.verdict-row-{v} td:first-child")
    stripe = f"box-shadow: inset {entry.stripe_px}px 0 {entry.stripe};"
    assert row == (None if entry.stripe is None else stripe)
    reason = rules.get(f".reason-{v} .reason-verdict")
    assert reason == (None if entry.ink is None else f"color: {entry.ink};")


def test_no_stylesheet_template_or_script_names_a_verdict() -> None:
    """Every verdict's style and every list of verdicts on a page comes from the catalogue."""
    web = routes.Path(routes.__file__).resolve().parent
    files = [*sorted((web / "static").glob("*")), *sorted((web / "templates").glob("*.html"))]
    assert files
    names = "|".join(e.name for e in VERDICT_CATALOGUE)
    by_hand = [
        rf"(?:verdict-(?:row-)?|reason-)(?:{names})\b",  # a verdict's CSS class
        rf"verdict\w*\s*[!=]=\s*[\"'](?:{names})\b",  # a test of a verdict
        rf"\b(?:{names})(?:, | or | and | / )(?:{names})\b",  # a list of verdicts in a text
    ]
    found = [
        f"{path.name}: {m.group(0)!r}"
        for path in files
        for pattern in by_hand
        for m in re.finditer(pattern, path.read_text(encoding="utf-8"))
    ]
    assert found == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_served_page_styles_every_verdict_and_its_templates_render_each(api: Api) -> None:
    page = api.client.get("/login")
    assert page.status_code == 200, page.text
    style = re.search(r'<style id="verdict-style">(.*?)</style>', page.text, flags=re.S)
    assert style is not None
    rules = _rules(html.unescape(style.group(1)).strip())
    env = routes.templates.env
    badge = env.from_string('{% from "_macros.html" import verdict_badge %}{{ verdict_badge(v) }}')
    for entry in VERDICT_CATALOGUE:
        rendered = badge.render(v=entry.name)
        assert rendered == f'<span class="badge verdict-{entry.name}">{entry.name}</span>'
        assert f".verdict-{entry.name}" in rules


def test_the_pytest_plugin_gates_on_the_cli_default_without_importing_the_catalogue() -> None:
    from kernelab.runners import pytest_plugin

    assert pytest_plugin.DEFAULT_FAIL_ON == common.DEFAULT_FAIL_ON == "failed,incorrect,slower"
    assert pytest_plugin._default_fail_on() == common.DEFAULT_FAIL_ON
    import subprocess
    import sys

    schemas = "kernelab.service.contract.schemas"
    code = f"import sys, kernelab.runners.pytest_plugin; print({schemas!r} in sys.modules)"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "False"


def _rgb(colour: str) -> tuple[int, int, int]:
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


@pytest.mark.parametrize("problem", ["incorrect", "failed"])
def test_a_wrong_result_is_not_drawn_in_a_speed_colour(problem: str) -> None:
    """``incorrect``'s and ``failed``'s plot colours stand apart from ``slower``'s and ``faster``'s,
    from every colour of the Δ% heat map's scale (``kernelab.web.sweep.DELTA_SCALE``) and from each
    other: at least 100 apart in RGB, so a wrong or failed cell never reads as a speed."""
    from kernelab.service.contract.schemas.types import VERDICT_CATALOGUE
    from kernelab.web.sweep import DELTA_SCALE

    plot = {e.name: e.plot for e in VERDICT_CATALOGUE}
    others = {"incorrect", "failed"} - {problem}
    for other in (plot["slower"], plot["faster"], *DELTA_SCALE, *(plot[o] for o in others)):
        distance = sum((a - b) ** 2 for a, b in zip(_rgb(plot[problem]), _rgb(other), strict=True)) ** 0.5
        assert distance >= 100, (problem, plot[problem], other, distance)
