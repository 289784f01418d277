"""What ``run``, ``submit --wait``, ``report`` and ``up`` print of a comparison
(``kernelab.runners.cli.output``), through typer's ``CliRunner``: the table last, the probes in one
line unless ``--probes``, every reason with ``--reasons``, and the gate line that counts the cells
a passed gate leaves out. The comparison is the report tests' (three cells, before/after probes)."""

from __future__ import annotations

from typing import Annotated

import pytest
import typer
from typer.testing import CliRunner

from kernelab.runners.cli import EXIT_OK
from kernelab.runners.cli.common import DEFAULT_FAIL_ON, DEFAULT_GATE, TableLayout, TableOpt
from kernelab.runners.cli.output import PROBES_MORE, gate, parse_fail_on, print_comparison
from kernelab.service.contract.schemas import Comparison
from tests.service.test_report import _comparison


def _app(comparison: Comparison) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def show(
        probes: Annotated[bool, typer.Option("--probes")] = False,
        reasons: Annotated[bool, typer.Option("--reasons")] = False,
        fail_on: Annotated[str, typer.Option("--fail-on")] = DEFAULT_FAIL_ON,
        table: TableOpt = TableLayout.cells,
    ) -> None:
        print_comparison(comparison, probes=probes, reasons=reasons, table=table)
        raise typer.Exit(gate(comparison, parse_fail_on(fail_on)))

    return app


def test_the_table_comes_last_and_the_probes_are_one_line() -> None:
    result = CliRunner().invoke(_app(_comparison()), [])
    lines = result.stdout.splitlines()
    probes = [line for line in lines if line.startswith("probe")]
    assert len(probes) == 1 and probes[0].startswith("probes: before copy 4210.5 GB/s")
    assert probes[0].endswith(f"; healthy; {PROBES_MORE}")
    assert lines[0].startswith("job 42 softmax PR 42 [softmax]")  # the title: nothing before the table
    assert "copy bandwidth (bytes read + written)" not in result.stdout  # no probe table
    assert len(lines) < 25


def _two_reasons() -> Comparison:
    """``_comparison()`` with a second deciding reason on its incorrect cell."""
    c = _comparison()
    cells = [
        cell.model_copy(update={"reasons": [*cell.reasons, *(r.model_copy(update={"message": "again"})
                                                              for r in cell.reasons[:1])]})
        if cell.verdict == "incorrect" else cell
        for cell in c.cells
    ]  # fmt: skip
    return c.model_copy(update={"cells": cells})


def test_probes_and_reasons_print_before_the_table() -> None:
    hinted = CliRunner().invoke(_app(_two_reasons()), []).stdout
    assert "(+1 more reason: --reasons or the job page)" in hinted
    result = CliRunner().invoke(_app(_two_reasons()), ["--probes", "--reasons"])
    out = result.stdout
    title = out.index("job 42 softmax PR 42 [softmax]")
    assert 0 <= out.index("probe (before)") < out.index("probe (after)") < out.index("reasons:") < title
    assert "copy bandwidth (bytes read + written)" in out[:title]
    assert "  N=2000  incorrect  [" in out[:title]  # every reason: label, class, code, message
    assert PROBES_MORE not in out  # the tables are there
    assert out.rstrip().endswith(out[title:].rstrip())
    assert "(+1 more reason: listed above)" in out[title:] and "--reasons" not in out[title:]


def test_the_axes_table_has_a_column_per_sweep_axis() -> None:
    out = CliRunner().invoke(_app(_comparison()), ["--table", "axes"]).stdout
    header = next(line for line in out.splitlines() if line.startswith("N "))
    assert header.split()[:5] == ["N", "baseline", "(torch)", "noise", "candidate"]
    assert "cell " not in out
    bad = CliRunner().invoke(_app(_comparison()), ["--table", "wide"])
    assert bad.exit_code == 2 and "'wide' is not one of" in bad.stderr


def test_one_default_gate_fails_a_slower_cell() -> None:
    assert DEFAULT_GATE == {"failed", "incorrect", "slower"}
    assert DEFAULT_FAIL_ON == "failed,incorrect,slower"
    result = CliRunner().invoke(_app(_comparison()), [])
    assert result.exit_code == 1
    assert "gate failed (--fail-on failed,incorrect,slower): 3 of 3 cells" in result.stderr


def test_a_passed_gate_counts_the_cells_it_leaves_out() -> None:
    c = _comparison()
    slower = c.model_copy(update={"cells": [c.cells[0]], "summary": {"slower": 1}})
    result = CliRunner().invoke(_app(slower), ["--fail-on", "failed,incorrect"])
    assert result.exit_code == EXIT_OK
    assert result.stderr.strip() == (
        "gate passed: no cell is failed or incorrect (--fail-on failed,incorrect); 1 slower cell not "
        "gated (to gate them: --fail-on failed,incorrect,slower)"
    )
    same = c.model_copy(update={"cells": [], "summary": {"same": 2, "faster": 1}})
    quiet = CliRunner().invoke(_app(same), [])
    assert (
        quiet.stderr.strip()
        == "gate passed: no cell is failed or incorrect or slower (--fail-on failed,incorrect,slower)"
    )


def test_run_submit_report_and_up_document_probes_and_reasons() -> None:
    from kernelab.runners.cli import app

    for command in ("run", "submit", "report", "up"):
        help_text = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"}).stdout
        assert "--probes" in help_text and "--table" in help_text, command
        if command != "up":
            assert "--reasons" in help_text, command


def test_the_jobs_list_is_aligned_whatever_the_names() -> None:
    from datetime import UTC, datetime

    from kernelab.runners.cli.manage import NAME_WIDTH, job_table
    from kernelab.service.contract.schemas import JobPublic, JobSpec

    spec = JobSpec.model_validate(
        {"benchmark": "softmax", "baseline": {"variant": "torch"}, "candidate": {"variant": "triton"}}
    )
    made = datetime(2026, 12, 7, tzinfo=UTC)
    jobs = [
        JobPublic(id=12345, name="a long name " * 8, benchmark="softmax", status="succeeded", spec=spec,
                  attempts=1, max_attempts=3, created_at=made, node="node-with-a-long-name",
                  summary={"slower": 2, "same": 1}),
        JobPublic(id=7, name="", benchmark="a-benchmark-name-longer-than-24-characters", status="queued",
                  spec=spec, attempts=0, max_attempts=3, created_at=made, rerun_of=3),
    ]  # fmt: skip
    lines = job_table(jobs)
    assert lines[0].split() == ["id", "status", "benchmark", "name", "node", "verdicts", "/", "progress"]
    starts = [lines[0].index(word) for word in ("status", "benchmark", "name", "node", "verdicts")]
    for line in lines[1:]:  # every column starts where its header does, after a gap of two spaces
        assert len(line) > starts[3]  # an empty last column (a queued job) is the only one left off
        assert all(line[s - 2 : s] == "  " and line[s] != " " for s in starts if s < len(line)), line
    assert "…" in lines[1] and len(lines[1].split("  ")[3].strip()) <= NAME_WIDTH + 1
    assert "- (re-run of #3)" in lines[2] and lines[1].endswith("2 slower, 1 same")


@pytest.mark.parametrize("url", ["notaurl", "foo://x/y", "postgresql://u:s3cretPW@[::1/db"])
def test_serve_refuses_a_bad_database_url_in_one_line(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelab.runners.cli import app

    monkeypatch.setenv("KERNELAB_ADMIN_TOKEN", "a" * 20)
    monkeypatch.setenv("KERNELAB_DATABASE_URL", url)  # serve sets it: restored after the test
    result = CliRunner().invoke(app, ["serve", "--database-url", url])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("--database-url: not a database URL SQLAlchemy can use: ")
    assert len(result.stderr.strip().splitlines()) == 1 and "s3cretPW" not in result.stderr
