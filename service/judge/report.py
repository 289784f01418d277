"""Human-readable renderings of a ``Comparison``: an aligned text table and GitHub Markdown.

``format_table`` is what ``kernelab run``, ``submit --wait`` and ``report`` print; ``to_markdown`` is
the export pasted into a pull request (``GET /api/v1/jobs/{id}/report.md``). Both are pure functions
of a ``kernelab.service.contract.schemas.Comparison``; everything user-supplied (labels, names, parameters,
node
strings, error messages) is escaped in Markdown.

Both say the verdict of ``kernelab.service.judge.verdicts`` first: a cell whose verdict is a problem
(``PROBLEM_VERDICTS``: failed, incorrect, nondeterministic, implausible) keeps its timing numbers,
in parentheses (the timing of a wrong or untrustworthy result, never a speed-up), and every problem
or ``inconclusive`` cell has its deciding reason told under the table ("why"), identical reasons
grouped so that a 1,000-cell sweep stays readable (``why_groups``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple

from kernelab.service.contract.schemas import (
    VERDICT_CATALOGUE,
    VERDICT_INFO,
    CellComparison,
    Comparison,
    CorrectnessResult,
    Flag,
    NodeInfo,
    ProbeReport,
    Reason,
    RevisionsInfo,
    SideStats,
    StaticComparison,
    Verdict,
)
from kernelab.service.contract.schemas.probe_protocol import probes_with
from kernelab.service.contract.units import format_bytes, format_sig3
from kernelab.service.judge.verdicts import (
    FLAG_NOTES,
    PROBLEM_VERDICTS,
    REASONS,
    VERDICT_ORDER,
    deciding_class,
)

_MISSING = "n/a"
_VERDICT_ORDER = VERDICT_ORDER
_RANK = {v: i for i, v in enumerate(VERDICT_ORDER)}
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~&!#])")
"""ASCII punctuation that Markdown gives a meaning (CommonMark backslash-escapes every one): code,
emphasis, links and images, HTML and entities, table pipes, strike-through, headings."""
_MD_CODE_SAFE = re.compile(r"[0-9A-Za-z.,:;=+/@()-]+")
"""A string made only of these prints as itself inside a code span (no backtick, pipe, space or
backslash, which a code span cannot escape)."""

Paint = Callable[[str, Verdict], str]
"""Styles the text of a verdict (e.g. red on a terminal) without changing its visible width."""

EXPLAINED_VERDICTS: frozenset[Verdict] = frozenset(e.name for e in VERDICT_CATALOGUE if e.kind != "decided")
"""Verdicts whose deciding reason is told with the table (``why_groups``): a ``problem`` or an
``undecided`` one (``VerdictEntry.kind``)."""
WHY_GROUPS = 20
"""Most lines of reasons told under a table; the other cells are counted by verdict and code."""
WHY_LABELS = 4
"""Most cell labels named on one line of reasons shared by several cells."""


def word_list(words: Sequence[str], last: str = "or") -> str:
    """``"a, b, c or d"`` (``last`` joins the last two); ``""`` for none."""
    if len(words) < 2:
        return "".join(words)
    return f"{', '.join(words[:-1])} {last} {words[-1]}"


VOID_TIMING_NOTE = (
    "numbers in ( ): a timing that is no result (a "
    f"{word_list([v for v in VERDICT_ORDER if v in PROBLEM_VERDICTS])} cell, or a side timed in "
    "Triton's interpreter), kept for reference: never a speed-up"
)
"""Under a table with a void timing (``void_timing``: ``PROBLEM_VERDICTS`` in precedence order, or
the reason ``interpreted``)."""


def format_duration_ns(ns: float | None) -> str:
    """A duration with a readable unit and 4 significant digits: ``"12.34 µs"``; ``"n/a"`` if None."""
    if ns is None or not math.isfinite(ns):
        return _MISSING
    for scale, unit in ((1e9, "s"), (1e6, "ms"), (1e3, "µs")):
        if abs(ns) >= scale:
            return f"{_sig4(ns / scale)} {unit}"
    return f"{_sig4(ns)} ns"


def _sig4(x: float) -> str:
    decimals = 3 - math.floor(math.log10(abs(x))) if x else 3
    return f"{x:.{max(decimals, 0)}f}"


def format_pct(ratio: float) -> str:
    """Δ% of a ratio candidate/baseline, three significant figures (``format_sig3``):
    ``1.050234`` -> ``"+5.02"``, ``9776.6026`` -> ``"+978,000"``."""
    return format_sig3((ratio - 1) * 100, sign=True)


def format_delta(c: CellComparison) -> str:
    """``"+5.02% [+4.81, +5.23]"``: Δ% of the ratio of medians with its CI, three significant
    figures each (``format_pct``: ``"+978,000% [+975,000, +981,000]"`` for a 9,780× slowdown);
    ``"n/a"`` without one. The JSON keeps every digit."""
    if c.ratio is None or c.ci_low is None or c.ci_high is None:
        return _MISSING
    return f"{format_pct(c.ratio)}% [{format_pct(c.ci_low)}, {format_pct(c.ci_high)}]"


def format_speedup(ratio: float | None) -> str:
    """The ratio candidate/baseline in words: ``0.8`` -> ``"1.25x faster"``, ``4618.4`` ->
    ``"4,620x slower"``, ``1.003`` -> ``"1.00x"``; ``"n/a"`` for None, zero or non-finite.

    Three significant figures (``format_sig3``, thousands separators from 1,000): a
    ``+461743%`` reads as ``"4,620x slower"``. (The sign is U+00D7, the multiplication sign.)
    """
    if ratio is None or not math.isfinite(ratio) or ratio <= 0:
        return _MISSING
    factor = 1.0 / ratio if ratio < 1.0 else ratio
    if not math.isfinite(factor):  # 1 / a subnormal ratio overflows: no number to show
        return _MISSING
    text = format_sig3(factor)
    if text == "1.00":  # within 0.5 %: no direction to tell
        return "1.00\u00d7"
    return f"{text}\u00d7 {'faster' if ratio < 1.0 else 'slower'}"


def format_ratio(ratio: float | None) -> str:
    """The bare ratio candidate/baseline, no direction word: ``0.901`` -> ``"0.901\u00d7"``
    (three significant figures, ``format_sig3``); ``"n/a"`` for None or non-finite. For a cell
    whose timing is no result (``void_timing``), where "faster" would be a claim."""
    if ratio is None or not math.isfinite(ratio):
        return _MISSING
    return format_sig3(ratio) + "\u00d7"


def cell_speedup(cell: CellComparison) -> str:
    """``format_speedup`` of the cell's ratio, or ``format_ratio`` when its timing is void."""
    return format_ratio(cell.ratio) if void_timing(cell) else format_speedup(cell.ratio)


def format_p(c: CellComparison) -> str:
    """``"0.0012 [0.0036]"``: Mann-Whitney p, raw, then Benjamini-Hochberg adjusted over the sweep
    (2 significant digits); ``"n/a"`` without a raw p, ``[n/a]`` without an adjusted one."""
    if c.p_value is None:
        return _MISSING
    adjusted = _MISSING if c.p_adjusted is None else f"{c.p_adjusted:.2g}"
    return f"{c.p_value:.2g} [{adjusted}]"


def format_flags(c: CellComparison) -> str:
    """The cell's flags, comma-separated; ``throttled`` says how many samples the statistics
    dropped per side: ``"noisy, throttled (3+1 dropped)"`` (baseline+candidate)."""
    dropped = f"throttled ({c.baseline.dropped_throttled}+{c.candidate.dropped_throttled} dropped)"
    return ", ".join(dropped if flag == "throttled" else flag for flag in c.flags)


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _md(text: str) -> str:
    """Escape user text for one GitHub Markdown table cell or line: one line (newlines and other
    whitespace runs become one space), every ``_MD_SPECIAL`` character backslash-escaped."""
    return _MD_SPECIAL.sub(r"\\\1", _one_line(text))


def _md_code(text: str) -> str:
    """User text as an inline code span when that is safe (``_MD_CODE_SAFE``), else as escaped
    text (``_md``): backslash escapes do not work inside a code span, so a backtick or a pipe
    there would end the span or the table cell (a revision ``sha`` with a backtick would break out)."""
    return f"`{text}`" if _MD_CODE_SAFE.fullmatch(text) else _md(text)


def verdict_summary(c: Comparison, paint: Paint | None = None) -> str:
    """``"1 incorrect, 2 faster, 1 same"`` in ``VERDICT_ORDER`` (precedence); ``"no cells"`` when
    empty. ``paint`` styles each part by its verdict."""
    parts = [_paint(paint, f"{c.summary[v]} {v}", v) for v in _VERDICT_ORDER if c.summary.get(v)]
    return ", ".join(parts) or "no cells"


def _paint(paint: Paint | None, text: str, verdict: Verdict) -> str:
    return text if paint is None else paint(text, verdict)


def deciding_reason(cell: CellComparison) -> Reason | None:
    """The reason that decides ``cell.verdict``: the first of ``cell.reasons`` of the verdict's
    class, else the first reason; None when the cell has none."""
    return next(
        (r for r in cell.reasons if deciding_class(r) == cell.verdict),
        cell.reasons[0] if cell.reasons else None,
    )


MORE_REASONS_WHERE = "--reasons or the job page"
"""Where a cell's other reasons are read, told after ``(+N more reasons: ...)``: the ``--reasons``
flag of ``kernelab run``, ``submit --wait`` and ``report``, or the job's page."""
REASONS_ABOVE = "listed above"
"""``MORE_REASONS_WHERE`` once ``--reasons`` has printed every reason before the table."""


def why(cell: CellComparison, where: str = MORE_REASONS_WHERE) -> str:
    """One line: why ``cell`` has its verdict. The deciding reason's message, with ``(+N more
    reasons: --reasons or the job page)`` (``where``, default ``MORE_REASONS_WHERE``) when other
    reasons that decide a verdict were found too; the cell's error when it has no reason; the
    meaning of its verdict class as the last resort."""
    r = deciding_reason(cell)
    if r is None:
        return _one_line(cell.error or f"no reason recorded: {cell.verdict} means {_meaning(cell.verdict)}")
    others = sum(1 for x in cell.reasons if x is not r and deciding_class(x) is not None)
    text = _one_line(r.message)
    if not text:
        text = REASONS[r.code].meaning if r.code in REASONS else r.code
    more = f" (+{others} more reason{'s' if others > 1 else ''}: {where})"
    return text + (more if others else "")


def _meaning(verdict: Verdict) -> str:
    entry = VERDICT_INFO.get(verdict)
    return verdict if entry is None else entry.meaning


def void_timing(cell: CellComparison) -> bool:
    """True when the cell's timing numbers are no result (its verdict is in ``PROBLEM_VERDICTS``,
    or a side was timed in Triton's interpreter: reason ``interpreted``): renderers show them marked
    (parentheses, greyed), never as a speed-up."""
    return cell.verdict in PROBLEM_VERDICTS or any(r.code == "interpreted" for r in cell.reasons)


class WhyGroup(NamedTuple):
    """Cells that share a verdict and a deciding reason (``labels``: all of them, sweep order);
    ``message`` is empty for a line that only counts cells by verdict and ``code``."""

    verdict: Verdict
    code: str
    message: str
    labels: list[str]


def why_groups(c: Comparison, limit: int = WHY_GROUPS, where: str = MORE_REASONS_WHERE) -> list[WhyGroup]:
    """The deciding reasons of the cells whose verdict is in ``EXPLAINED_VERDICTS``, cells with the
    same verdict, reason code and ``why`` text grouped: in verdict precedence, then sweep order.

    At most ``limit`` groups are told; the cells of the others are counted in one group per
    (verdict, code) with an empty ``message`` (their reasons differ cell by cell: e.g. 970
    confidence intervals that straddle the threshold). ``where``: where the other reasons are read
    (``why``). Raises nothing.
    """
    groups: dict[tuple[Verdict, str, str], WhyGroup] = {}
    for cell in c.cells:
        if cell.verdict not in EXPLAINED_VERDICTS:
            continue
        r = deciding_reason(cell)
        key = (cell.verdict, r.code if r else "", why(cell, where))
        groups.setdefault(key, WhyGroup(*key, [])).labels.append(_one_line(cell.label))
    ordered = sorted(groups.values(), key=lambda g: _RANK[g.verdict])  # stable: sweep order within
    told, rest = ordered[:limit], ordered[limit:]
    counted: dict[tuple[Verdict, str], WhyGroup] = {}
    for g in rest:
        counted.setdefault((g.verdict, g.code), WhyGroup(g.verdict, g.code, "", [])).labels.extend(g.labels)
    return [*told, *counted.values()]


def cells_text(labels: Sequence[str], most: int = WHY_LABELS) -> str:
    """``"N=1"``; ``"3 cells (N=1; N=2; N=3)"``; ``"120 cells (N=1; N=2; N=3; N=4; ...)"`` (a label
    holds commas: ``"M=32, N=256"``)."""
    if len(labels) == 1:
        return labels[0]
    named = "; ".join(labels[:most]) + ("; ..." if len(labels) > most else "")
    return f"{len(labels)} cells ({named})"


def _why_line(g: WhyGroup) -> str:
    if g.message:
        return f"{cells_text(g.labels)}: {g.message}"
    meaning = REASONS[g.code].meaning if g.code in REASONS else "see each cell's reasons"
    return (
        f"{len(g.labels)} more cells: {g.code or 'no reason'} ({meaning}); each cell's reason: "
        "--json or the job page"
    )


def job_reason_lines(c: Comparison) -> list[str]:
    """One line per job-level reason: ``"job failed: all 3 cells failed; first: ..."`` (the class
    the reason decides, or ``note``)."""
    return [f"job {deciding_class(r) or 'note'}: {_one_line(r.message)}" for r in c.reasons]


def probe_summary(p: ProbeReport) -> str:
    """One line per probe report: each registered probe's ``summary`` parts in report order (copy
    GB/s, all-reduce time per size, NVML status), then errors."""
    return f"probes {p.phase}: " + "; ".join(_probe_parts(p))


def _probe_parts(p: ProbeReport) -> list[str]:
    parts = []
    for probe in probes_with("summary"):
        assert probe.summary is not None
        parts += probe.summary(p, probe.readings(p))
    return parts + [f"{name} error: {_one_line(err)}" for name, err in sorted(p.errors.items())]


def node_health_word(c: Comparison) -> str:
    """The node's health over the job, one word from the job's flags (the node-health judgement,
    ``kernelab.service.judge.health``): ``degraded`` (``degraded-node``), ``contended``, else
    ``healthy``."""
    if "degraded-node" in c.flags:
        return "degraded"
    return "contended" if "contended" in c.flags else "healthy"


def probes_line(c: Comparison, more: str = "") -> str | None:
    """All of a comparison's probe reports in one line: each report's ``probe_summary`` parts after
    its phase, reports joined by `` | ``, then ``node_health_word`` and ``more`` (where the full
    tables are: ``"full tables with --probes"`` on the command line), e.g. ``"probes: before copy
    12.3 GB/s, NVML absent | after copy 12.1 GB/s, NVML absent; healthy; full tables with
    --probes"``. None without a probe report."""
    if not c.probes:
        return None
    phases = [f"{p.phase} {', '.join(_probe_parts(p))}" for p in c.probes]
    return "probes: " + " | ".join(phases) + f"; {node_health_word(c)}" + (f"; {more}" if more else "")


def reason_lines(c: Comparison) -> list[str]:
    """Every reason of every cell (``kernelab run``/``submit --wait``/``report --reasons``), one line
    each: ``"N=1  incorrect  [nonfinite-output] message"`` (label, the verdict the reason decides or
    ``note``, its code, its message folded onto one line); the job's own reasons first
    (``job_reason_lines``). Empty when there are none."""
    lines = job_reason_lines(c)
    for cell in c.cells:
        for r in cell.reasons:
            lines.append(
                f"{_one_line(cell.label)}  {deciding_class(r) or 'note'}  [{r.code}] {_one_line(r.message)}"
            )
    return lines


def node_summary(node: NodeInfo) -> str:
    """``"host (NVIDIA H200 x2, driver 580, CUDA 13.0, torch 2.11, triton 3.6)"``."""
    device = node.device_name or node.device_type
    facts = [f"{device} x{node.device_count}" if node.device_count > 1 else device]
    for label, value in (
        ("driver", node.driver_version),
        ("CUDA", node.cuda_version),
        ("torch", node.torch_version),
        ("triton", node.triton_version),
    ):
        if value:
            facts.append(f"{label} {value}")
    if node.triton_interpret:
        facts.append("TRITON_INTERPRET=1")
    return f"{node.hostname} ({', '.join(facts)})"


def _notes(c: Comparison) -> list[str]:
    """The comparison's own notes (e.g. a degraded node), one plain-text line each (a cell's errors
    and failed checks are its reasons: ``why_groups``), then ``estimator_note``."""
    note = estimator_note(c)
    return [_one_line(n) for n in c.notes] + ([note] if note else [])


def estimator_note(c: Comparison) -> str | None:
    """What "median" means in the table where a cell's sides rotated input sets (``SideStats.
    estimator``): the set-balanced median, with the largest difference from the pooled median of
    all kept samples (which box plots and raw samples show); None when every median is plain."""
    balanced = [
        (abs(math.log(st.median_ns / st.pooled_median_ns)), cell.label, side, st.median_ns,
         st.pooled_median_ns)
        for cell in c.cells
        for side, st in (("baseline", cell.baseline), ("candidate", cell.candidate))
        if st.estimator == "set-balanced median" and st.median_ns and st.pooled_median_ns
    ]  # fmt: skip
    if not balanced:
        return None
    gap, label, side, centre, pooled = max(balanced)
    return (
        "median: the set-balanced median where the sides rotated input sets (the geometric mean of each "
        "input-set assignment's median, the centre the ratio is formed from); the pooled median of all "
        f"kept samples (box plots, raw samples) differs by up to {(math.exp(gap) - 1) * 100:.2g}%: "
        f"{label} {side} {format_duration_ns(centre)} set-balanced, {format_duration_ns(pooled)} pooled"
    )


def _sci(x: float | None) -> str:
    return _MISSING if x is None else f"{x:.4g}"


def check_summary(check: CorrectnessResult) -> str:
    """One line of a variant's correctness checks (``kernelab.runners.checks``), e.g. for the seed's conv3d:

    ``FAIL rel 0.543; repeats 12/200 failed, worst rel 0.3075, identical error (clobber), bad-set
    Jaccard 1; deterministic over 20 runs; where: 9120/27648 bad (33%): ...; tolerance: |out - ref|
    <= ...`` (a failure names the rule it failed, ``CorrectnessResult.tolerance``).
    """
    parts = [f"{'ok' if check.passed else 'FAIL'} rel {_sci(check.rel_error)}"]
    r = check.repeats
    if r is not None:
        text = f"repeats ({r.inputs} inputs) {r.failures}/{r.runs} failed"
        if r.failures:
            text += f", worst rel {_sci(r.worst_rel_error)}"
            if r.failure_errors_identical is not None:
                same = r.failure_errors_identical
                text += ", identical error (clobber)" if same else ", error moves (race)"
            if r.bad_set_jaccard is not None:
                text += f", bad-set Jaccard {r.bad_set_jaccard:.2f}"
        parts.append(text)
    d = check.determinism
    if d is not None:
        if d.deterministic:
            parts.append(f"bitwise deterministic over {d.runs} runs")
        else:
            jac = f", Jaccard {d.bad_set_jaccard:.2f}" if d.bad_set_jaccard is not None else ""
            parts.append(
                f"NON-DETERMINISTIC: {d.differing_runs}/{d.runs - 1} runs differ from run 0, up to "
                f"{d.max_differing_elements} elements, max |diff| {_sci(d.max_abs_difference)}{jac}"
            )
    b = check.batch_invariance
    if b is not None:
        parts.append(
            f"batch-invariant ({b.rows_checked} rows)" if b.invariant else f"batch-VARIANT: {b.message}"
        )
    v = check.vs_baseline
    if v is not None:
        parts.append(
            "bitwise = baseline"
            if v.identical
            else f"differs from baseline in {v.differing_elements} elements (max |diff| "
            f"{_sci(v.max_abs_difference)})"
        )
    where = check.where or (r.where if r is not None else "") or (d.where if d is not None else "")
    if where:
        parts.append(f"where: {where}")
    if not check.passed and check.tolerance:
        parts.append(f"tolerance: {check.tolerance}")
    return "; ".join(parts)


def _has_checks(check: CorrectnessResult) -> bool:
    return any(
        x is not None for x in (check.repeats, check.determinism, check.batch_invariance, check.vs_baseline)
    )


def correctness_lines(c: Comparison) -> list[str]:
    """``label variant: check_summary`` for every variant that ran more than the single check."""
    return [
        f"{_one_line(cell.label)} {variant}: {check_summary(check)}"
        for cell in c.cells
        for variant, check in cell.correctness.items()
        if _has_checks(check)
    ]


def _marked(text: str) -> str:
    return text if text == _MISSING else f"({text})"


class Columns(NamedTuple):
    """A table's layout for ``format_table``: ``header``, one row per cell of the comparison in its
    order, the column indices that align right (numbers), and lines said once above the table
    (``"every cell: dtype=float32"``)."""

    header: list[str]
    rows: list[list[str]]
    right: frozenset[int]
    above: list[str]


def cell_columns(c: Comparison) -> Columns:
    """The default layout: cell label | baseline median | candidate median | Δ% [95% CI] | speedup
    | p [BH] | verdict | flags."""
    header = [
        "cell",
        f"baseline ({c.baseline_label})",
        f"candidate ({c.candidate_label})",
        "Δ% [95% CI]",
        "speedup",
        "p [BH]",
        "verdict",
        "flags",
    ]
    return Columns(header, _rows(c), frozenset({1, 2}), [])


def marked(cell: CellComparison, texts: list[str]) -> list[str]:
    """``texts`` (a cell's timing columns) in parentheses where its timing is void (``void_timing``)."""
    return [_marked(t) for t in texts] if void_timing(cell) else texts


def _rows(c: Comparison) -> list[list[str]]:
    """Table rows: label, medians, Δ%, speedup, p, verdict, flags; the timing of a ``void_timing`` cell in
    parentheses."""
    rows = []
    for cell in c.cells:
        timing = [
            side_time(cell.baseline),
            side_time(cell.candidate),
            format_delta(cell),
            cell_speedup(cell),
            format_p(cell),
        ]
        rows.append([_one_line(cell.label), *marked(cell, timing), cell.verdict, format_flags(cell)])
    return rows


def cross_check_line(cell: CellComparison) -> str | None:
    """One line of the cell's timer cross-check (``CellComparison.cross_check``), None without one:
    each side's median under the spec's method and the other one with their difference, both
    ratios, and whether they disagree; or why no cross measurement exists."""
    cc = cell.cross_check
    if cc is None:
        return None
    if cc.error is not None:
        return f"{cell.label}: no cross-check ({cc.error})"
    sides = "; ".join(
        f"{v} {cc.primary.get(v, '?')} {format_duration_ns(cc.primary_median_ns.get(v))} vs "
        f"{cc.cross.get(v, '?')} {format_duration_ns(cc.cross_median_ns.get(v))}"
        + (
            f" ({cc.difference_pct[v]:+.1f}%, allowance ±{cc.noise_pct[v]:.1f}%)"
            if v in cc.difference_pct
            else ""
        )
        for v in ("baseline", "candidate")
    )
    ratio = _MISSING if cell.ratio is None else format_sig3(cell.ratio)
    cross = _MISSING if cc.cross_ratio is None else format_sig3(cc.cross_ratio)
    state = "disagree" if cc.disagrees else "agree"
    if cc.disagrees and cc.ratio_agrees:
        state += ", ratios agree"
    return f"{cell.label}: {sides}; ratio {ratio} vs {cross} ({state})"


STATE_NOTES = {
    "cold": "samples as they come, after the L2 flush and the host's gap between samples",
    "sustained": "every sample follows untimed back-to-back samples: the loaded, power-limited clock",
}
"""What ``measurement.state`` means, for the page's and the Markdown's header."""


def side_time(stats: SideStats) -> str:
    """A side's median ns per launch, with the median SM clock of its samples when read
    (``"1.40 ms @1980 MHz"``)."""
    text = format_duration_ns(stats.median_ns)
    if stats.sm_clock_mhz is not None and stats.median_ns is not None:
        text += f" @{stats.sm_clock_mhz:.0f} MHz"
    return text


def _joules(value: float | None) -> str:
    if value is None:
        return _MISSING
    if value >= 1.0:
        return f"{value:.4g} J"
    if value >= 1e-3:
        return f"{value * 1e3:.4g} mJ"
    return f"{value * 1e6:.4g} µJ"


def energy_line(cell: CellComparison) -> str | None:
    """One line of the cell's energy per launch (``CellComparison.energy``), None without one:
    each side's joules per launch and power, the ratio with its CI, the blocks and the counter's
    resolution; or why there is none."""
    e = cell.energy
    if e is None:
        return None
    if e.error is not None and not e.joules_per_launch:
        return f"{cell.label}: no energy ({e.error})"
    sides = ", ".join(
        f"{v} {_joules(e.joules_per_launch.get(v))} per launch"
        + (f" ({e.watts[v]:.0f} W)" if v in e.watts else "")
        for v in ("baseline", "candidate")
    )
    ratio = _MISSING if e.ratio is None else format_sig3(e.ratio)
    if e.ci_low is not None and e.ci_high is not None:
        ratio += f" [{format_sig3(e.ci_low)}, {format_sig3(e.ci_high)}]"
    resolution = f"counter {e.counter}"
    if e.period_ms is not None:
        resolution += f", updates every {e.period_ms:.0f} ms"
    if e.step_mj is not None:
        resolution += f", smallest step {e.step_mj / 1e3:.3g} J"
    error = f"; {e.error}" if e.error else ""
    return f"{cell.label}: {sides}; ratio {ratio} over {e.blocks} block pair(s) ({resolution}){error}"


def energy_lines(c: Comparison) -> list[str]:
    """``energy_line`` of every cell that has one."""
    return [line for cell in c.cells if (line := energy_line(cell)) is not None]


def cross_check_lines(c: Comparison) -> list[str]:
    """``cross_check_line`` of every cell that has one."""
    return [line for cell in c.cells if (line := cross_check_line(cell)) is not None]


def _has_void_timing(c: Comparison) -> bool:
    return any(void_timing(cell) and cell.baseline.median_ns is not None for cell in c.cells)


def _title(c: Comparison) -> str:
    """``job N name [benchmark]: baseline vs candidate``, the order of the table's columns and of
    ``kernelab run``'s ``running ...`` line."""
    name = f"{c.name} " if c.name else ""
    job = f"job {c.job_id} " if c.job_id is not None else ""
    return f"{job}{name}[{c.benchmark}]: {c.baseline_label} vs {c.candidate_label}"


def format_table(
    c: Comparison,
    paint: Paint | None = None,
    probes_more: str = "",
    columns: Columns | None = None,
    reasons_where: str = MORE_REASONS_WHERE,
) -> str:
    """Plain-text report for a terminal: title, aligned table, the probes' line (``probes_line``,
    ending in ``probes_more``), summary, reasons, notes.

    Columns: cell | baseline median | candidate median | Δ% [95% CI] | speedup (``format_speedup``:
    ``"1.25× faster"``) | p [BH] (Mann-Whitney, raw
    and Benjamini-Hochberg adjusted) | verdict | flags (``throttled`` with the samples dropped per
    side); times in ns/µs/ms/s, in parentheses for a cell whose verdict is a problem
    (``void_timing``). Under the table: job-level reasons (``job failed: ...``), then ``why:``, one
    line per ``why_groups`` group (``verdict  cells: reason``). ``paint`` styles verdict words
    (the CLI's colours on a terminal); padding is applied first, so the columns stay aligned.
    Newlines in user text are folded. ``columns``: another layout of the same cells (``Columns``;
    ``kernelab.service.judge.cell_table.axis_columns``: one column per sweep axis, as nvbench's
    tables); default ``cell_columns``. ``reasons_where``: where a cell's other reasons are read,
    after ``(+N more reasons: ...)`` (``REASONS_ABOVE`` when they were printed before the table).
    """
    layout = columns or cell_columns(c)
    header = layout.header
    rows = [[_one_line(h) for h in header], *layout.rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    right = layout.right
    verdict_col = header.index("verdict")

    def line(r: list[str], verdict: Verdict | None = None) -> str:
        pairs = enumerate(zip(r, widths, strict=True))
        cells = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in pairs]
        if verdict is not None:  # styled text, then its padding: the width stays that of the text
            text = r[verdict_col]
            cells[verdict_col] = _paint(paint, text, verdict) + " " * (widths[verdict_col] - len(text))
        return "  ".join(cells).rstrip()

    out = [
        _one_line(_title(c)),
        f"timer {c.timer}; state {c.state}; threshold ±{c.threshold_pct:g}%; "
        f"node {_one_line(node_summary(c.node))}",
        *(_one_line(text) for text in layout.above),
        "",
    ]
    out += [line(rows[0]), "  ".join("-" * w for w in widths)]
    out += [line(r, cell.verdict) for r, cell in zip(rows[1:], c.cells, strict=True)]
    out.append("")
    probes = probes_line(c, probes_more)
    out += [probes] if probes else []
    job_flags = f"; job flags: {', '.join(c.flags)}" if c.flags else ""
    out.append(f"verdicts: {verdict_summary(c, paint)}{job_flags}")
    out += job_reason_lines(c)
    groups = why_groups(c, where=reasons_where)
    if groups:
        width = max(len(g.verdict) for g in groups)
        out.append("why:")
        out += [
            f"  {_paint(paint, g.verdict, g.verdict)}{' ' * (width - len(g.verdict))}  {_why_line(g)}"
            for g in groups
        ]
    if _has_void_timing(c):
        out.append(VOID_TIMING_NOTE)
    out += [f"note: {n}" for n in _notes(c)]
    out += [f"check: {line}" for line in correctness_lines(c)]
    out += [f"cross-check: {line}" for line in cross_check_lines(c)]
    out += [f"energy: {line}" for line in energy_lines(c)]
    return "\n".join(out) + "\n"


def _flags_present(c: Comparison) -> list[Flag]:
    seen: list[Flag] = []
    for flag in [*c.flags, *(f for cell in c.cells for f in cell.flags)]:
        if flag not in seen:
            seen.append(flag)
    return seen


def _versions_text(versions: dict[str, str | None]) -> str:
    parts = [
        f"{name} {versions[name]}"
        for name in ("torch", "triton", "cuda", "driver", "python")
        if versions.get(name)
    ]
    return ", ".join(parts) or _MISSING


def revisions_markdown(r: RevisionsInfo) -> list[str]:
    """Markdown lines for a revision A/B job: one table row per side (repository, branch, commit,
    versions), the diff's one-line summary and, folded, its ``git diff --stat`` (file names are
    escaped; a backtick inside the stat becomes a quote so the fence holds)."""
    lines = [
        "**Revisions**",
        "",
        "| side | repository | branch / ref | commit | versions |",
        "| --- | --- | --- | --- | --- |",
    ]
    for side, rev in (("baseline", r.baseline), ("candidate", r.candidate)):
        if rev.sha:
            repo = _md(rev.repo) + (f" ({_md(rev.subdir)})" if rev.subdir else "")
            ref = _md(rev.branch or rev.ref)
            commit = _md_code(rev.sha[:12])
        else:
            repo, ref, commit = "installed code", _MISSING, _MISSING
        lines.append(f"| {side} | {repo} | {ref} | {commit} | {_md(_versions_text(rev.versions))} |")
    if r.diff_shortstat:
        lines += ["", f"Diff baseline → candidate: {_md(r.diff_shortstat)}"]
    if r.diff_stat:
        stat = r.diff_stat.replace("`", "'")
        lines += ["", "<details><summary>git diff --stat</summary>", "", "```", stat, "```", "", "</details>"]
    return lines


def md_verdict(verdict: Verdict) -> str:
    """A verdict in Markdown: its sign (``VerdictEntry.mark``: ``❌ **incorrect**``,
    ``⚠️ **implausible**``), in bold where its entry says ``bold`` (``inconclusive`` is plain).
    Raises ``KeyError`` for a name that is no verdict."""
    return _md_mark(verdict) + (f"**{verdict}**" if VERDICT_INFO[verdict].bold else verdict)


def _md_mark(verdict: Verdict) -> str:
    """The sign ``md_verdict`` puts before a verdict (``"❌ "``, ``"⚠️ "``), ``""`` for none."""
    mark = VERDICT_INFO[verdict].mark
    return f"{mark} " if mark else ""


def _md_summary(c: Comparison) -> str:
    """``"❌ 1 incorrect, 2 slower, 1 inconclusive"``: ``verdict_summary`` with each part's sign."""
    return verdict_summary(c, lambda text, v: _md_mark(v) + text)


def to_markdown(c: Comparison) -> str:
    """GitHub-flavoured Markdown ready to paste into a pull request.

    A heading, the node (GPU, driver, CUDA, torch and triton versions), timer method and threshold,
    the job-level reasons (``**Job failed:** ...``), the before/after table (verdicts by
    ``md_verdict``; the timing of a ``void_timing`` cell in parentheses), right under it the
    deciding reason of every problem or inconclusive cell (``why_groups``), the verdict summary in
    precedence order, the revisions of a revision A/B job (commits, diff stat, versions per side),
    one line per probe report, and notes explaining each flag present (``FLAG_NOTES``). User text
    is escaped (``|`` becomes ``\\|``; Markdown emphasis, code and HTML characters are
    backslash-escaped).
    """
    header = [
        "cell",
        f"baseline ({_md(c.baseline_label)})",
        f"candidate ({_md(c.candidate_label)})",
        "Δ% [95% CI]",
        "speedup",
        "p [BH]",
        "verdict",
        "flags",
    ]
    lines = [
        f"### {_md(_title(c))}",
        "",
        f"**Node** {_md(node_summary(c.node))} · **timer** {_md(c.timer)} · **state** {_md(c.state)} · "
        f"**threshold** ±{c.threshold_pct:g}% · ratio of medians, CI by bootstrap over rounds · "
        "p: Mann-Whitney, raw [Benjamini-Hochberg]",
        "",
    ]
    for r in c.reasons:
        lines += [f"**Job {deciding_class(r) or 'note'}:** {_md(r.message)}", ""]
    lines += ["| " + " | ".join(header) + " |", "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    verdict_col = header.index("verdict")
    for row, cell in zip(_rows(c), c.cells, strict=True):
        row[0] = _md(row[0])
        row[verdict_col] = md_verdict(cell.verdict)
        lines.append("| " + " | ".join(row) + " |")
    groups = why_groups(c)
    if groups:
        lines += ["", "**Why**", ""]
        lines += [f"- {md_verdict(g.verdict)} · {_md(_why_line(g))}" for g in groups]
    if _has_void_timing(c):
        lines += ["", f"_{_md(VOID_TIMING_NOTE)}_"]
    lines += [
        "",
        f"**Verdicts:** {_md_summary(c)}" + (f" · **job flags:** {', '.join(c.flags)}" if c.flags else ""),
    ]
    if c.node.revisions is not None:
        lines += ["", *revisions_markdown(c.node.revisions)]
    if c.probes:
        lines += ["", "**Node health**", ""] + [f"- {_md(probe_summary(p))}" for p in c.probes]
    notes = [f"- `{flag}`: {FLAG_NOTES.get(flag, '')}" for flag in _flags_present(c)]
    notes += [f"- {_md(n)}" for n in _notes(c)]
    if notes:
        lines += ["", "**Notes**", "", *notes]
    checks = correctness_lines(c)
    if checks:
        lines += ["", "**Correctness checks**", "", *(f"- {_md(line)}" for line in checks)]
    crosses = cross_check_lines(c)
    if crosses:
        lines += ["", "**Timer cross-check** (the spec's method vs the other one)", ""]
        lines += [f"- {_md(line)}" for line in crosses]
    energies = energy_lines(c)
    if energies:
        title = "**Energy per launch** (the device's energy counter, blocks of back-to-back launches)"
        lines += ["", title, ""]
        lines += [f"- {_md(line)}" for line in energies]
    lines += static_markdown(c)
    return "\n".join(lines) + "\n"


STATIC_HEADER = (
    "cell",
    "kernel",
    "ISA",
    "registers",
    "spills st/ld",
    "shared",
    "occupancy",
    "instructions",
    "loop body",
    "changes",
)


def _arrow(a: object, b: object) -> str:
    a_s = _MISSING if a is None else str(a)
    b_s = _MISSING if b is None else str(b)
    return a_s if a_s == b_s else f"{a_s} → {b_s}"


def static_rows(c: Comparison) -> list[list[str]]:
    """``static_table_rows`` of a comparison's cells."""
    return static_table_rows([(cell.label, cell.static) for cell in c.cells])


def static_table_rows(cells: Sequence[tuple[str, StaticComparison | None]]) -> list[list[str]]:
    """One row per kernel of every (label, static comparison) that has one, columns
    ``STATIC_HEADER``: baseline → candidate where they differ, a single value where equal. The ISA
    column is the verdict (``IDENTICAL`` or ``different``); a cell whose static metrics failed gets
    one row holding its error."""
    rows = []
    for label, st in cells:
        if st is None:
            continue
        if st.error:
            rows.append([_one_line(label), "", "error", "", "", "", "", "", "", _one_line(st.error)])
            continue
        for k in st.kernels:
            b, d = k.baseline, k.candidate

            def pick(attr: str, b: object = b, d: object = d) -> str:
                return _arrow(getattr(b, attr, None) if b else None, getattr(d, attr, None) if d else None)

            spills = _arrow(
                f"{b.spill_stores}/{b.spill_loads}" if b else None,
                f"{d.spill_stores}/{d.spill_loads}" if d else None,
            )
            shared = _arrow(
                format_bytes(b.shared_bytes) if b and b.shared_bytes is not None else None,
                format_bytes(d.shared_bytes) if d and d.shared_bytes is not None else None,
            )
            occ = _arrow(
                f"{b.occupancy_pct:g}%" if b and b.occupancy_pct is not None else None,
                f"{d.occupancy_pct:g}%" if d and d.occupancy_pct is not None else None,
            )
            loops = _arrow(
                "+".join(str(lp.instructions) for lp in b.loops) if b and b.loops else None,
                "+".join(str(lp.instructions) for lp in d.loops) if d and d.loops else None,
            )
            changes = ", ".join(f"{ch.sign}{ch.count} {ch.opcode} ({ch.region})" for ch in k.changes[:6])
            if len(k.changes) > 6:
                changes += f", {len(k.changes) - 6} more"
            isa_kind = (b or d).isa if (b or d) else ""  # type: ignore[union-attr]
            verdict = "IDENTICAL" if k.verdict == "identical" else k.verdict
            rows.append(
                [
                    _one_line(label),
                    k.name,
                    f"{verdict} ({isa_kind}, {st.target})",
                    pick("registers"),
                    spills,
                    shared,
                    occ,
                    pick("instructions"),
                    loops,
                    changes,
                ]
            )
    return rows


def static_markdown(c: Comparison) -> list[str]:
    """The "Static metrics" section of ``to_markdown`` (empty when no cell has static metrics):
    the ``static_rows`` table and one summary line per kernel in the seeds' words."""
    rows = static_rows(c)
    if not rows:
        return []
    lines = [
        "",
        "**Static metrics** (compiled kernels; baseline → candidate)",
        "",
        "| " + " | ".join(STATIC_HEADER) + " |",
        "| " + " | ".join("---" for _ in STATIC_HEADER) + " |",
    ]
    lines += ["| " + " | ".join(_md(v) for v in row) + " |" for row in rows]
    summaries = [
        f"- {_md(cell.label)} {_md_code(k.name)}: {_md(k.summary)}"
        for cell in c.cells
        if cell.static
        for k in cell.static.kernels
    ]
    if summaries:
        lines += ["", *summaries]
    return lines


def format_static(cells: Sequence[tuple[str, StaticComparison | None]]) -> str:
    """Plain-text static metrics table of (label, static comparison) pairs for a terminal
    (``kernelab static``), then one summary line per kernel."""
    rows = [list(STATIC_HEADER), *static_table_rows(cells)]
    if len(rows) == 1:
        return "no static metrics\n"
    widths = [max(len(r[i]) for r in rows) for i in range(len(STATIC_HEADER))]
    out = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    out += [_one_line(f"{label} {k.name}: {k.summary}") for label, st in cells if st for k in st.kernels]
    return "\n".join(out) + "\n"
