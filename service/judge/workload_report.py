"""A workload comparison as text (CLI) and Markdown (pull requests): the phase table of the fourth
seed (metric | baseline | candidate | Δ% [CI] | verdict), per-rank times with the slowest rank,
the consistency table, the per-run timeline with the probes between runs, and the notes.

Pure functions of ``kernelab.service.contract.schemas.WorkloadComparison``."""

from __future__ import annotations

from collections.abc import Sequence

from kernelab.service.contract.schemas import QuantityVerdict, WorkloadComparison


def _num(v: float | None, unit: str = "") -> str:
    if v is None:
        return "-"
    text = f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
    return f"{text} {unit}".rstrip()


def _delta(q: QuantityVerdict) -> str:
    if q.delta_pct is None:
        return "-"
    if q.ci_low is None or q.ci_high is None:
        return f"{q.delta_pct:+.1f}%"
    return f"{q.delta_pct:+.1f}% [{100 * (q.ci_low - 1):+.1f}, {100 * (q.ci_high - 1):+.1f}]"


def _rows(c: WorkloadComparison) -> tuple[list[str], list[list[str]]]:
    head = ["metric", "baseline", "candidate", "Δ% [95% CI]", "verdict", "runs"]
    rows = []
    for q in c.quantities:
        label = q.name if q.kind == "phase" else f"{q.name} ({q.better} is better)"
        rows.append(
            [
                label,
                _num(q.baseline.median, q.unit),
                _num(q.candidate.median, q.unit),
                _delta(q),
                q.verdict,
                f"{q.baseline.runs}/{q.candidate.runs}",
            ]
        )
    return head, rows


def _rank_rows(c: WorkloadComparison) -> tuple[list[str], list[list[str]]]:
    head = ["phase", "arm", "per-rank median s", "slowest rank"]
    rows = []
    for q in c.quantities:
        for r in q.ranks:
            per = ", ".join(f"{k}: {v:.4g}" for k, v in r.medians_s.items())
            rows.append([q.name, r.side, per, str(r.slowest_rank)])
    return head, rows


def _consistency_rows(c: WorkloadComparison) -> tuple[list[str], list[list[str]]]:
    head = ["digest", "between", "mismatch count", "max |diff|", "bitwise equal", "note"]
    rows = []
    for r in c.consistency:
        between = "baseline vs candidate" if r.against == "arms" else f"runs of the {r.side}"
        count = "-" if r.mismatches is None else f"{r.mismatches} / {r.elements}"
        rows.append(
            [
                r.name,
                between,
                count,
                _num(r.max_abs_diff),
                "-" if r.bitwise_equal is None else str(r.bitwise_equal).lower(),
                r.note,
            ]
        )
    return head, rows


def _timeline_rows(c: WorkloadComparison) -> tuple[list[str], list[list[str]]]:
    phases = list(dict.fromkeys(p for line in c.timeline for p in line.phases_s))
    head = [
        "run",
        "arm",
        "outcome",
        "wall s",
        *[f"{p} s" for p in phases],
        "copy GB/s after",
        "all-reduce µs after",
        "other procs",
        "flags",
    ]
    rows = []
    for line in c.timeline:
        rows.append(
            [
                str(line.index),
                line.side,
                line.outcome,
                f"{line.wall_s:.2f}",
                *[_num(line.phases_s.get(p)) for p in phases],
                _num(line.copy_gbps),
                _num(line.all_reduce_us),
                "-" if line.other_processes is None else str(line.other_processes),
                ", ".join(line.flags),
            ]
        )
    return head, rows


def _text_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*r) for r in rows]


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def cell(x: str) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    return ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "---|" * len(head)] + [
        "| " + " | ".join(cell(x) for x in r) + " |" for r in rows
    ]


def _sections(c: WorkloadComparison, table: object) -> list[tuple[str, list[str]]]:
    build = table  # _text_table or _md_table
    return [(title, build(head, rows)) for title, head, rows in tables(c)]  # type: ignore[operator]


def tables(c: WorkloadComparison) -> list[tuple[str, list[str], list[list[str]]]]:
    """The comparison's tables as ``(title, head, rows)`` of plain strings, in the order the text and
    the Markdown show them (phases and metrics, per-rank times, consistency, runs): the dashboard's
    job page renders these, so the page, ``kernelab report`` and the Markdown agree cell for cell."""
    out = [("Phases and metrics", *_rows(c))]
    if any(q.ranks for q in c.quantities):
        out.append(("Per-rank times", *_rank_rows(c)))
    if c.consistency:
        out.append(("Consistency", *_consistency_rows(c)))
    out.append(("Runs (probe after each run)", *_timeline_rows(c)))
    return out


def why_lines(c: WorkloadComparison) -> list[str]:
    """One line per reason of an ``inconclusive``/``failed`` quantity and per note."""
    return _why(c)


def _why(c: WorkloadComparison) -> list[str]:
    lines = []
    for q in c.quantities:
        for r in q.reasons:
            if r.code not in ("sick-node", "probe-changed"):
                lines.append(f"{q.name}: {q.verdict}: {r.message}")
    lines += [f"{n.code}: {n.message}" for n in c.notes]
    return lines


def format_workload(c: WorkloadComparison) -> str:
    """The comparison as plain text for a terminal: a header, the tables, then why (one line per
    reason and note)."""
    lines = [f"workload: {c.name}" if c.name else "workload", f"CI: {c.pairing}"]
    if c.flags:
        lines.append("flags: " + ", ".join(c.flags))
    for title, table in _sections(c, _text_table):
        lines += ["", title, *table]
    why = _why(c)
    if why:
        lines += ["", "Why", *why]
    return "\n".join(lines)


def workload_markdown(c: WorkloadComparison) -> str:
    """The comparison as Markdown (tables with escaped cells), ready to paste into a pull request."""
    lines = [f"### Workload: {c.name}" if c.name else "### Workload", "", f"CI: {c.pairing}."]
    if c.flags:
        lines += ["", "**Flags:** " + ", ".join(f"`{f}`" for f in c.flags)]
    for title, table in _sections(c, _md_table):
        lines += ["", f"**{title}**", "", *table]
    why = _why(c)
    if why:
        lines += ["", "**Why**", "", *[f"- {w}" for w in why]]
    return "\n".join(lines) + "\n"
