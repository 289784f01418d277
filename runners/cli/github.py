"""``--format github``: a GitHub Actions job summary and annotations of a comparison.

``summary(comparison, link)``: the pull-request Markdown of ``kernelab.service.judge.report.to_markdown``
with a first line that gates (pass/fail and the verdict counts) and a link back to the job's
dashboard page. ``annotation_lines(comparison, fail_on, link)``: one workflow command per cell whose
verdict is annotated (``ANNOTATED``, from ``VERDICT_CATALOGUE``: ``failed``, ``incorrect``,
``nondeterministic``, ``implausible``, ``inconclusive``, ``slower``): ``::error`` when the verdict is
in ``--fail-on``, else its entry's level (``::warning``), with the cell's deciding reason.
Workflow-command escaping follows the GitHub Actions runner (``actions/toolkit``
``packages/core/src/command.ts``: ``%``, CR and LF in the message; also ``:`` and ``,`` in a
property).

``write_github(comparison, fail_on, link)`` appends the summary to ``$GITHUB_STEP_SUMMARY`` when
that is set (stdout otherwise) and prints the annotations on stdout, where the runner reads
workflow commands.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

from kernelab.service.contract.schemas import VERDICT_CATALOGUE, VERDICT_INFO, Comparison, Verdict

ANNOTATED: tuple[Verdict, ...] = tuple(e.name for e in VERDICT_CATALOGUE if e.github is not None)
"""Verdicts whose cells are annotated (``VerdictEntry.github`` is a level), in precedence order."""


def escape_data(text: str) -> str:
    """A workflow command's message, escaped (``%`` -> ``%25``, CR -> ``%0D``, LF -> ``%0A``)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A workflow command's property value, escaped (``escape_data`` and ``:``, ``,``)."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def summary(comparison: Comparison, fail_on: frozenset[Verdict], link: str | None) -> str:
    """The job summary: a gating line, the dashboard link, then ``to_markdown``."""
    from kernelab.service.judge.report import to_markdown

    tripped = [c for c in comparison.cells if c.verdict in fail_on]
    counts = ", ".join(f"{n} {v}" for v, n in comparison.summary.items() if n)
    head = (
        f"**kernelab: gate failed** ({len(tripped)} of {len(comparison.cells)} cells in --fail-on "
        f"{','.join(sorted(fail_on))}): {counts}"
        if tripped
        else f"**kernelab: gate passed**: {counts}"
    )
    lines = [head]
    if link:
        lines += ["", f"[Job on the dashboard]({link})"]
    return "\n".join(lines) + "\n\n" + to_markdown(comparison)


def annotation_lines(comparison: Comparison, fail_on: frozenset[Verdict], link: str | None) -> list[str]:
    """One ``::error``/``::warning`` workflow command per cell with a verdict in ``ANNOTATED``."""
    from kernelab.service.judge.report import EXPLAINED_VERDICTS, format_delta, void_timing, why

    out = []
    for cell in comparison.cells:
        if cell.verdict not in ANNOTATED:
            continue
        level = "error" if cell.verdict in fail_on else VERDICT_INFO[cell.verdict].github
        title = escape_property(f"kernelab {comparison.benchmark}: {cell.verdict}")
        delta = "" if void_timing(cell) else f" {format_delta(cell)}"  # a wrong result's timing is no change
        message = f"{cell.label}: {cell.verdict}{delta}"
        if cell.verdict in EXPLAINED_VERDICTS:
            message += f": {why(cell)}"
        if link:
            message += f" ({link})"
        out.append(f"::{level} title={title}::{escape_data(message)}")
    return out


def write_github(comparison: Comparison, fail_on: frozenset[Verdict], link: str | None) -> None:
    """The summary to ``$GITHUB_STEP_SUMMARY`` (appended) or stdout; the annotations on stdout."""
    text = summary(comparison, fail_on, link)
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with Path(target).open("a", encoding="utf-8") as fh:
            fh.write(text + "\n")
    else:
        typer.echo(text)
    for line in annotation_lines(comparison, fail_on, link):
        typer.echo(line)
