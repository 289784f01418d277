"""Human-readable renderings of a ``Comparison``: an aligned text table and GitHub Markdown.

``format_table`` is what ``kernelab run`` and ``kernelab report`` print; ``to_markdown`` is the
export pasted into a pull request (``GET /api/v1/jobs/{id}/report.md``). Both are pure functions
of a ``service.schemas.Comparison``; everything user-supplied (labels, names, parameters, node
strings, error messages) is escaped in Markdown.
"""

from __future__ import annotations

import math
import re

from service.schemas import CellComparison, Comparison, NodeInfo, ProbeReport

_MISSING = "n/a"
_VERDICT_ORDER = ("faster", "slower", "same", "inconclusive")
FLAG_NOTES: dict[str, str] = {
    "noisy": "IQR/median above 10% on a side (torch.utils.benchmark's warning threshold).",
    "throttled": "some samples were taken while the GPU was throttled (excluded from the statistics "
    "unless the spec keeps them).",
    "contended": "another process was running on a GPU of the node during the job.",
    "degraded-node": "the node's health probes were below its healthy band.",
    "implausible": "an implied rate exceeds 1.1x the node's measured peak: a timing error, never "
    "reported as a speed-up.",
    "incorrect": "a variant failed its correctness check: its timing is of a wrong result.",
    "nondeterministic": "outputs differed bitwise between identical runs.",
    "failed": "the cell (or job) could not be measured; see the error.",
}
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


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


def format_bytes(n: int) -> str:
    """``8 B``, ``4 KiB``, ``1 MiB``, ``256 MiB``, ``1.5 GiB`` (binary units)."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def format_delta(c: CellComparison) -> str:
    """``"+5.02% [+4.81, +5.23]"``: Δ% of the ratio of medians with its CI; ``"n/a"`` without one."""
    if c.ratio is None or c.ci_low is None or c.ci_high is None:
        return _MISSING
    return f"{(c.ratio - 1) * 100:+.2f}% [{(c.ci_low - 1) * 100:+.2f}, {(c.ci_high - 1) * 100:+.2f}]"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _md(text: str) -> str:
    """Escape user text for one GitHub Markdown table cell or line (pipes, emphasis, HTML)."""
    return _MD_SPECIAL.sub(r"\\\1", _one_line(text))


def verdict_summary(c: Comparison) -> str:
    """``"2 faster, 1 same"`` in a fixed verdict order; ``"no cells"`` when empty."""
    parts = [f"{c.summary[v]} {v}" for v in _VERDICT_ORDER if c.summary.get(v)]
    return ", ".join(parts) or "no cells"


def probe_summary(p: ProbeReport) -> str:
    """One line per probe report: copy GB/s, all-reduce time per size, NVML status, errors."""
    parts = []
    if p.copy_bandwidth:
        bw = sorted(r.bandwidth_gbps for r in p.copy_bandwidth)
        span = f"{bw[0]:.1f}" if len(bw) == 1 else f"{bw[0]:.1f}-{bw[-1]:.1f}"
        parts.append(f"copy {span} GB/s" + (f" ({len(bw)} devices)" if len(bw) > 1 else ""))
    groups: dict[tuple[str, int, tuple[int, ...]], list[str]] = {}
    for r in sorted(p.all_reduce, key=lambda r: r.size_bytes):
        key = (r.backend, r.world_size, tuple(r.ranks))
        mark = "" if r.correct else " WRONG"
        groups.setdefault(key, []).append(f"{format_bytes(r.size_bytes)} {r.time_us:.1f} µs{mark}")
    for (backend, world, _), sizes in groups.items():
        parts.append(f"all-reduce {backend} x{world}: " + ", ".join(sizes))
    parts.append(f"NVML {p.nvml_status}")
    parts += [f"{name} error: {_one_line(err)}" for name, err in sorted(p.errors.items())]
    return f"probes {p.phase}: " + "; ".join(parts)


def node_summary(node: NodeInfo) -> str:
    """``"host (NVIDIA H200 x2, driver 580, CUDA 13.0, torch 2.11, triton 3.6)"``."""
    device = node.device_name or node.device_type
    facts = [f"{device} x{node.device_count}" if node.device_count > 1 else device]
    for label, value in (("driver", node.driver_version), ("CUDA", node.cuda_version),
                         ("torch", node.torch_version), ("triton", node.triton_version)):
        if value:
            facts.append(f"{label} {value}")
    if node.triton_interpret:
        facts.append("TRITON_INTERPRET=1")
    return f"{node.hostname} ({', '.join(facts)})"


def _cell_notes(c: Comparison) -> list[str]:
    """Per-cell errors and failed correctness checks, one plain-text line each."""
    notes = []
    for cell in c.cells:
        if cell.error:
            notes.append(f"{cell.label}: error: {_one_line(cell.error)}")
        for variant, check in cell.correctness.items():
            if not check.passed:
                detail = check.message or f"rel. error {check.rel_error}"
                notes.append(f"{cell.label}: {variant} incorrect: {_one_line(detail)}")
    return notes


def _rows(c: Comparison) -> list[list[str]]:
    return [
        [_one_line(cell.label), format_duration_ns(cell.baseline.median_ns),
         format_duration_ns(cell.candidate.median_ns), format_delta(cell), cell.verdict,
         ", ".join(cell.flags)]
        for cell in c.cells
    ]


def _title(c: Comparison) -> str:
    name = f"{c.name} " if c.name else ""
    job = f"job {c.job_id} " if c.job_id is not None else ""
    return f"{job}{name}[{c.benchmark}]: {c.candidate_label} vs {c.baseline_label}"


def format_table(c: Comparison) -> str:
    """Plain-text report for a terminal: title, aligned table, probe lines, summary, notes.

    Columns: cell | baseline median | candidate median | Δ% [95% CI] | verdict | flags; times in
    ns/µs/ms/s. Newlines in user text are folded so the columns stay aligned.
    """
    header = ["cell", f"baseline ({c.baseline_label})", f"candidate ({c.candidate_label})",
              "Δ% [95% CI]", "verdict", "flags"]
    rows = [[_one_line(h) for h in header], *_rows(c)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    right = {1, 2}  # numbers align right

    def line(r: list[str]) -> str:
        pairs = enumerate(zip(r, widths, strict=True))
        cells = [v.rjust(w) if i in right else v.ljust(w) for i, (v, w) in pairs]
        return "  ".join(cells).rstrip()

    out = [_one_line(_title(c)),
           f"timer {c.timer}; threshold ±{c.threshold_pct:g}%; node {_one_line(node_summary(c.node))}", ""]
    out += [line(rows[0]), "  ".join("-" * w for w in widths), *(line(r) for r in rows[1:]), ""]
    out += [probe_summary(p) for p in c.probes]
    out.append(f"verdicts: {verdict_summary(c)}" + (f"; job flags: {', '.join(c.flags)}" if c.flags else ""))
    out += [f"note: {n}" for n in _cell_notes(c)]
    return "\n".join(out) + "\n"


def _flags_present(c: Comparison) -> list[str]:
    seen: list[str] = []
    for flag in [*c.flags, *(f for cell in c.cells for f in cell.flags)]:
        if flag not in seen:
            seen.append(flag)
    return seen


def to_markdown(c: Comparison) -> str:
    """GitHub-flavoured Markdown ready to paste into a pull request.

    A heading, the node (GPU, driver, CUDA, torch and triton versions), timer method and threshold,
    the before/after table, the verdict summary, one line per probe report, and notes explaining
    each flag present plus cell errors and failed correctness checks. User text is escaped
    (``|`` becomes ``\\|``; Markdown emphasis, code and HTML characters are backslash-escaped).
    """
    header = ["cell", f"baseline ({_md(c.baseline_label)})", f"candidate ({_md(c.candidate_label)})",
              "Δ% [95% CI]", "verdict", "flags"]
    lines = [
        f"### {_md(_title(c))}",
        "",
        f"**Node** {_md(node_summary(c.node))} · **timer** {_md(c.timer)} · "
        f"**threshold** ±{c.threshold_pct:g}% · ratio of medians, CI by bootstrap over rounds",
        "",
        "| " + " | ".join(header) + " |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for row in _rows(c):
        row[0] = _md(row[0])
        row[4] = f"**{row[4]}**"
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"**Verdicts:** {verdict_summary(c)}" + (f" · **job flags:** {', '.join(c.flags)}"
                                                            if c.flags else "")]
    if c.probes:
        lines += ["", "**Node health**", ""] + [f"- {_md(probe_summary(p))}" for p in c.probes]
    notes = [f"- `{flag}`: {FLAG_NOTES.get(flag, '')}" for flag in _flags_present(c)]
    notes += [f"- {_md(n)}" for n in _cell_notes(c)]
    if notes:
        lines += ["", "**Notes**", "", *notes]
    return "\n".join(lines) + "\n"
