"""``kernelab run`` of a workload spec (``kind: workload``): the arms' runs on this machine under
``torchrun``, then the phase table, per-rank times, the consistency table and the timeline."""

from __future__ import annotations

from pathlib import Path

import typer

from kernelab.runners.cli.common import EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK, fail
from kernelab.runners.client import KernelabClient
from kernelab.service.contract.schemas import JobPublic, Verdict, WorkloadComparison, WorkloadSpec

_AS_GATE = {"worse": "slower", "better": "faster"}  # a metric's verdict read as a --fail-on name


def run_workload_spec(
    spec_path: Path,
    spec: WorkloadSpec,
    *,
    gate_on: frozenset[Verdict],
    json_path: Path | None,
    markdown_path: Path | None,
    result_path: Path | None,
    quiet: bool,
) -> int:
    """Run ``spec`` here (``kernelab.runners.workload.run_workload``), print its comparison, write
    the files asked for; the exit status: 1 when no run finished or a verdict is in ``gate_on``
    (a metric's ``worse`` counts as ``slower``), else 0. Exits 2 (``fail``) for a spec this machine
    cannot run (more ranks than GPUs, several nodes: those need runners and a server)."""
    from kernelab.runners.workload import run_workload
    from kernelab.service.judge.workload_report import format_workload, workload_markdown
    from kernelab.service.judge.workload_stats import compare_workload

    if spec.launch.nnodes > 1:
        raise fail(
            f"{spec_path}: launch.nnodes = {spec.launch.nnodes}: a multi-node workload runs through a "
            "server and that many runners (kernelab submit)"
        )

    def progress(index: int, total: int, message: str) -> None:
        typer.echo(f"run [{index + 1}/{total}] {message}", err=True)

    if not quiet:
        typer.echo(
            f"running workload {spec.name or spec_path}: {2 * spec.runs} runs, "
            f"{spec.launch.nproc_per_node} rank(s) each",
            err=True,
        )
    try:
        result = run_workload(spec, progress=None if quiet else progress)
    except ValueError as exc:
        raise fail(f"{spec_path}: cannot run: {exc}") from None
    comparison = compare_workload(result)
    typer.echo(format_workload(comparison))
    if result_path is not None:
        result_path.write_text(result.model_dump_json(), encoding="utf-8")
    if json_path is not None:
        json_path.write_text(comparison.model_dump_json(), encoding="utf-8")
    if markdown_path is not None:
        markdown_path.write_text(workload_markdown(comparison), encoding="utf-8")
    if not any(r.outcome == "ok" for r in result.runs):
        typer.echo("job failed: no run finished", err=True)
        return EXIT_FAILED
    return gate_workload(comparison, gate_on)


def gate_workload(comparison: WorkloadComparison, gate_on: frozenset[Verdict]) -> int:
    """1 when a quantity's verdict is in ``gate_on`` (a metric's ``worse`` counts as ``slower``,
    named on stderr), else 0."""
    tripped = [q.name for q in comparison.quantities if _AS_GATE.get(q.verdict, q.verdict) in gate_on]
    if tripped:
        typer.echo(f"--fail-on: {', '.join(tripped)}", err=True)
        return EXIT_FAILED
    return EXIT_OK


def show_workload_job(
    client: KernelabClient,
    job: JobPublic,
    gate_on: frozenset[Verdict],
    *,
    markdown: bool = False,
    json_path: Path | None = None,
) -> int:
    """Print a stored workload job's comparison (``GET /jobs/{id}/workload``) as the text of
    ``kernelab run`` or its Markdown; the exit status: 3 while it has none (queued, running,
    comparing, cancelled), 1 when the job failed or a verdict is in ``gate_on``, else 0. Raises
    what the client raises."""
    from kernelab.service.judge.workload_report import format_workload, workload_markdown

    if job.comparison_status != "ready":
        if job.status == "failed":
            typer.echo(f"job {job.id} failed: {job.error}", err=True)
            return EXIT_FAILED
        state = f"status {job.status}, comparison {job.comparison_status}"
        typer.echo(f"job {job.id}: no comparison yet ({state})", err=True)
        return EXIT_NO_VERDICT
    comparison = client.workload(job.id)
    typer.echo(workload_markdown(comparison) if markdown else format_workload(comparison))
    if json_path is not None:
        json_path.write_text(comparison.model_dump_json(), encoding="utf-8")
    if job.status == "failed":
        typer.echo(f"job {job.id} failed: {job.error}", err=True)
        return EXIT_FAILED
    return gate_workload(comparison, gate_on)
