"""What ``run``, ``submit --wait`` and ``report`` print (with ``--probes`` the probe reports' full
tables, with ``--reasons`` every cell's reasons, then the table last, verdicts in colour on a
terminal) and the exit status they gate on (``--fail-on``), told on stderr after the table."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import typer

from kernelab.runners.cli.common import (
    DEFAULT_GATE,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_NO_VERDICT,
    EXIT_OK,
    GATE_VERDICTS,
    TableLayout,
    fail,
)
from kernelab.runners.client import KernelabAPIError, KernelabClient, is_settled
from kernelab.runners.progress import describe
from kernelab.service.contract.schemas import (
    VERDICT_CATALOGUE,
    CellComparison,
    Comparison,
    JobPublic,
    Verdict,
)

VERDICT_COLORS: dict[Verdict, tuple[str, bool]] = {
    e.name: (e.terminal, e.terminal_bold) for e in VERDICT_CATALOGUE if e.terminal is not None
}
"""Terminal colour (click colour name) and boldness of a verdict (``VerdictEntry.terminal``); the
others are plain."""


def parse_fail_on(text: str) -> frozenset[Verdict]:
    """The verdicts of a ``--fail-on`` comma list (case and spaces ignored). Exits 2 with a message
    naming ``--fail-on`` for an empty list, ``faster``/``same`` or a name that is no verdict."""
    names = [n.strip().lower() for n in text.split(",")]
    allowed = ", ".join(GATE_VERDICTS)
    if not any(names) or not all(names):
        raise fail(f"--fail-on: {text!r} names no verdict; give a comma list of {allowed}", EXIT_BAD_INPUT)
    for name in names:
        if name in ("faster", "same"):
            raise fail(f"--fail-on: {name!r} is not a failure; choose from {allowed}", EXIT_BAD_INPUT)
        if name not in GATE_VERDICTS:
            raise fail(f"--fail-on: unknown verdict {name!r}; choose from {allowed}", EXIT_BAD_INPUT)
    return frozenset(v for v in GATE_VERDICTS if v in names)


def use_color() -> bool:
    """Colour the verdicts: stdout is a terminal and ``NO_COLOR`` (no-color.org) is unset or empty."""
    return not os.environ.get("NO_COLOR") and sys.stdout.isatty()


def paint_verdict(text: str, verdict: Verdict) -> str:
    """``text`` in the terminal colour of ``verdict`` (``VERDICT_COLORS``), ANSI escapes by click."""
    color = VERDICT_COLORS.get(verdict)
    return text if color is None else typer.style(text, fg=color[0], bold=color[1])


PROBES_MORE = "full tables with --probes"
"""Ends the table's ``probes:`` line when the full probe tables are not printed."""


def print_comparison(
    comparison: Comparison,
    *,
    probes: bool = False,
    reasons: bool = False,
    table: TableLayout = TableLayout.cells,
) -> None:
    """Print a ``Comparison``, its table last (verdicts in colour on a terminal, ``use_color``):
    with ``probes`` each probe report's full tables first, with ``reasons`` every cell's reasons
    (``reason_lines``) next. Without ``probes`` the table's one ``probes:`` line sums the reports
    up and says where the tables are (``PROBES_MORE``). ``table``: the table's layout (``TableLayout``)."""
    from kernelab.service.judge.report import MORE_REASONS_WHERE, REASONS_ABOVE, format_table, reason_lines

    if probes and comparison.probes:
        from kernelab.runners.probes.format import format_probe_report

        for report in comparison.probes:
            typer.echo(format_probe_report(report, comparison.node))
    if reasons:
        lines = reason_lines(comparison)
        typer.echo("reasons:" if lines else "reasons: none")
        for text in lines:
            typer.echo(f"  {text}")
        typer.echo("")
    more = "" if probes else PROBES_MORE
    columns = None
    if table is TableLayout.axes:
        from kernelab.service.judge.cell_table import axis_columns

        columns = axis_columns(comparison)
    paint = paint_verdict if use_color() else None
    where = REASONS_ABOVE if reasons else MORE_REASONS_WHERE
    typer.echo(format_table(comparison, paint=paint, probes_more=more, columns=columns, reasons_where=where))


def not_gated_text(comparison: Comparison, fail_on: frozenset[Verdict]) -> str:
    """``"; 3 slower cells not gated (add --fail-on failed,incorrect,slower)"``: the cells whose
    verdict a gate could name (``GATE_VERDICTS``) but ``fail_on`` does not, counted per verdict in
    precedence order, with the ``--fail-on`` that would gate them too; ``""`` when there are none."""
    counts = {v: n for v in GATE_VERDICTS if v not in fail_on and (n := comparison.summary.get(v, 0))}
    if not counts:
        return ""
    told = ", ".join(f"{n} {v} cell{'s' if n > 1 else ''}" for v, n in counts.items())
    wider = ",".join(v for v in GATE_VERDICTS if v in fail_on or v in counts)
    return f"; {told} not gated (to gate them: --fail-on {wider})"


def gate(comparison: Comparison, fail_on: frozenset[Verdict]) -> int:
    """``EXIT_FAILED`` when a cell's verdict is in ``fail_on``, else ``EXIT_OK``; says which cells
    tripped the gate (per verdict, a few labels each) or that none did, on stderr, with the cells
    of a verdict the gate leaves out (``not_gated_text``: a passed gate is no "all good" when cells
    are ``slower``, ``inconclusive``, ...)."""
    from kernelab.service.judge.report import cells_text

    tripped: dict[Verdict, list[CellComparison]] = {}
    for cell in comparison.cells:
        if cell.verdict in fail_on:
            tripped.setdefault(cell.verdict, []).append(cell)
    names = ",".join(v for v in GATE_VERDICTS if v in fail_on)
    if not tripped:
        typer.echo(
            f"gate passed: no cell is {' or '.join(v for v in GATE_VERDICTS if v in fail_on)} "
            f"(--fail-on {names})" + not_gated_text(comparison, fail_on),
            err=True,
        )
        return EXIT_OK
    n = sum(len(cells) for cells in tripped.values())
    typer.echo(f"gate failed (--fail-on {names}): {n} of {len(comparison.cells)} cells", err=True)
    for v in GATE_VERDICTS:
        if v in tripped:
            typer.echo(f"  {v}: {cells_text([c.label for c in tripped[v]])}", err=True)
    return EXIT_FAILED


def show_job(
    client: KernelabClient,
    job: JobPublic,
    fail_on: frozenset[Verdict],
    *,
    markdown: bool = False,
    render: Callable[[Comparison], None] | None = None,
    json_path: Path | None = None,
    probes: bool = False,
    reasons: bool = False,
    table: TableLayout = TableLayout.cells,
) -> int:
    """Print a finished ``job``'s comparison (its table, with ``markdown`` the server's Markdown,
    or what ``render`` prints; ``json_path`` gets the ``Comparison`` JSON) and return the exit
    status: ``EXIT_NO_VERDICT`` for a cancelled job, ``EXIT_FAILED`` for a failed one (its error on
    stderr; its table too when it has a result), else ``gate``. ``probes`` and ``reasons`` go to
    ``print_comparison``."""
    if job.status == "cancelled":
        typer.echo(f"job {job.id} cancelled: no verdict", err=True)
        return EXIT_NO_VERDICT
    if job.comparison_status == "comparing":
        typer.echo(f"job {job.id}: comparing… (its result is stored; a compare worker computes the "
                   "comparison): no verdict yet", err=True)  # fmt: skip
        return EXIT_NO_VERDICT
    if job.comparison_status == "failed":
        typer.echo(f"job {job.id}: computing its comparison failed: {job.comparison_error}", err=True)
        return EXIT_NO_VERDICT
    try:
        comparison = client.comparison(job.id)
    except KernelabAPIError as exc:
        if exc.status_code == 409 and "comparing" in exc.detail:  # re-queued since the job was read
            typer.echo(f"job {job.id}: comparing…: no verdict yet", err=True)
            return EXIT_NO_VERDICT
        if exc.status_code != 409 or job.status == "succeeded":
            raise
        comparison = None  # a failed job without a result: its error is all there is
    if comparison is not None:
        if json_path is not None:
            json_path.write_text(comparison.model_dump_json(indent=2), encoding="utf-8")
        if render is not None:
            render(comparison)
        elif markdown:
            typer.echo(client.report_md(job.id))
        else:
            print_comparison(comparison, probes=probes, reasons=reasons, table=table)
    if job.status == "failed":  # fails the gate whatever --fail-on says
        typer.echo(f"job {job.id} failed" + (f": {job.error}" if job.error else ""), err=True)
        return EXIT_FAILED
    if job.status != "succeeded" or comparison is None:
        typer.echo(f"job {job.id} is {job.status}: no verdict yet", err=True)
        return EXIT_NO_VERDICT
    return gate(comparison, fail_on)


def wait_and_show(
    client: KernelabClient,
    job: JobPublic,
    *,
    timeout_s: float,
    progress_log: Path | None = None,
    progress_from: int = 0,
    fail_on: frozenset[Verdict] = DEFAULT_GATE,
    json_path: Path | None = None,
    probes: bool = False,
    reasons: bool = False,
    table: TableLayout = TableLayout.cells,
) -> int:
    """Wait for ``job`` to finish and its comparison to be computed (``comparison_status`` no longer
    ``comparing``), echoing status changes, the job's ``waiting_for`` when it is set or changes,
    and each new progress (cell i/n, phase, cells done, ETA: ``JobPublic.progress`` from the
    runner's heartbeats; or, with ``progress_log``, a runner log file's progress lines from byte
    ``progress_from`` on: the lines of this job, not of earlier ones in the same log); print its
    comparison (``probes``, ``reasons``: ``print_comparison``). Returns the exit status
    (``show_job``); exits ``EXIT_NO_VERDICT`` when it is still unfinished or comparing after ``timeout_s``."""
    offset, partial = progress_from, b""

    def on_change(j: JobPublic) -> None:
        comparing = " (comparing…)" if j.comparison_status == "comparing" else ""
        typer.echo(f"job {j.id}: {j.status}" + (f" on {j.node}" if j.node else "") + comparing, err=True)

    def relay_progress() -> None:  # complete new lines only: the runner may be mid-line
        nonlocal offset, partial
        if progress_log is None or not progress_log.exists():
            return
        with progress_log.open("rb") as fh:
            fh.seek(offset)
            chunk = fh.read()
        offset += len(chunk)
        *lines, partial = (partial + chunk).split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", errors="replace")
            if "progress:" in line:
                typer.echo("  " + line.split("progress:", 1)[1].strip(), err=True)

    deadline = time.monotonic() + timeout_s
    seen: tuple[str, str] | None = None
    shown: tuple[object, ...] | None = None
    waiting: str | None = None
    while True:
        job = client.get_job(job.id)
        finished = job.status in ("succeeded", "failed", "cancelled")
        if finished:  # the log's lines written before it finished (the after-probes) come first
            relay_progress()
        if (job.status, job.comparison_status) != seen:
            seen = (job.status, job.comparison_status)
            on_change(job)
        if job.waiting_for != waiting:  # once, and again when the reason changes
            waiting = job.waiting_for
            if waiting:
                typer.echo(f"job {job.id}: {waiting}", err=True)
        if not finished:
            relay_progress()
        if job.progress is not None and progress_log is None:  # the runner's heartbeats, via the server
            p = job.progress
            key = (p.cell, p.cells_done, p.phase, p.message)
            if key != shown:
                shown = key
                typer.echo("  " + describe(p), err=True)
        if is_settled(job):
            break
        if time.monotonic() > deadline:
            state = "comparing" if job.comparison_status == "comparing" else job.status
            raise fail(f"job {job.id} still {state} after {timeout_s:.0f} s", EXIT_NO_VERDICT)
        time.sleep(0.5)
    return show_job(client, job, fail_on, json_path=json_path, probes=probes, reasons=reasons, table=table)
