"""Commands of a client of a server: ``submit`` (queue a job, ``--wait`` for its verdict) and
``report`` (a stored job's comparison)."""

from __future__ import annotations

from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Annotated

import typer

from kernelab.runners.cli.common import (
    DEFAULT_FAIL_ON,
    DEFAULT_SERVER,
    EXIT_BAD_INPUT,
    EXIT_NO_VERDICT,
    BaselineRefOpt,
    CandidateRefOpt,
    FailOnOpt,
    NoProbesOpt,
    ProbesOpt,
    ReasonsOpt,
    RepoOpt,
    ServerOpt,
    SpecArg,
    TableLayout,
    TableOpt,
    TokenOpt,
    apply_refs,
    client_for,
    fail,
    read_spec,
    without_probes,
)
from kernelab.runners.cli.output import parse_fail_on, show_job, wait_and_show
from kernelab.runners.client import KernelabAPIError, KernelabUnavailable
from kernelab.service.contract.schemas import WorkloadSpec


def _workload_spec(path: Path) -> WorkloadSpec | None:
    """The workload spec in ``path`` (checked for form: nothing of it is imported), or None for a
    benchmark spec; exits 2 naming ``FILE:LINE`` for a workload spec with problems."""
    from kernelab.runners.specfile import SpecFileError, load_any_spec

    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None  # read_spec says what is wrong with the file
    if "workload" not in text:
        return None
    try:
        spec = load_any_spec(path, check_benchmark=False)
    except SpecFileError as exc:
        if "kind" not in text:
            return None
        raise fail(exc.render(), EXIT_BAD_INPUT) from None
    return spec if isinstance(spec, WorkloadSpec) else None


class ReportFormat(StrEnum):
    """What ``report`` prints: the terminal table, the pull-request Markdown, or GitHub Actions'
    job summary and annotations (``kernelab.runners.cli.github``)."""

    table = "table"
    markdown = "markdown"
    github = "github"


def submit(
    spec_path: SpecArg,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    wait: Annotated[bool, typer.Option("--wait", help="wait and print the comparison")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="how long --wait waits")] = 3600.0,
    repo: RepoOpt = ".",
    baseline_ref: BaselineRefOpt = None,
    candidate_ref: CandidateRefOpt = None,
    fail_on: FailOnOpt = DEFAULT_FAIL_ON,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="with --wait: write the Comparison JSON here")
    ] = None,
    no_probes: NoProbesOpt = False,
    probes: ProbesOpt = False,
    reasons: ReasonsOpt = False,
    table: TableOpt = TableLayout.cells,
) -> None:
    """Queue a job; print its id, and on stderr why it waits when no live runner offers its
    benchmark (the job's ``waiting_for``; with --wait, also the comparison table).

    ``--baseline-ref main --candidate-ref HEAD --repo .`` benchmarks two revisions of a checkout:
    refs are resolved to commits here; the runner must allow the repository (--allow-repo).
    With --wait, exits 1 when a cell's verdict is in --fail-on or the job failed, 3 when no verdict
    could be had (module docstring).
    """
    gate_on = parse_fail_on(fail_on)
    refs = baseline_ref is not None or candidate_ref is not None  # the runner imports the revisions
    workload = _workload_spec(spec_path)
    if workload is not None and refs:
        raise fail(f"{spec_path}: kind: a workload spec names its commands; --baseline-ref/--candidate-ref "
                   "are for benchmark specs", EXIT_BAD_INPUT)  # fmt: skip
    spec = workload or apply_refs(
        read_spec(spec_path, check_benchmark=not refs), spec_path, repo, baseline_ref, candidate_ref
    )
    if no_probes:
        spec = without_probes(spec)
    with client_for(server, token) as client:
        try:
            job = client.submit(spec)
            typer.echo(str(job.id))
            if not wait:  # --wait says it while it waits (wait_and_show)
                waiting = client.get_job(job.id).waiting_for
                if waiting:
                    typer.echo(f"job {job.id}: {waiting}", err=True)
            if wait and workload is not None:
                from kernelab.runners.cli.workload import show_workload_job

                if job.waiting_for:
                    typer.echo(f"job {job.id}: {job.waiting_for}", err=True)
                try:
                    settled = client.wait(job.id, timeout_s=timeout_s)
                except TimeoutError as exc:
                    raise fail(str(exc), EXIT_NO_VERDICT) from None
                raise typer.Exit(show_workload_job(client, settled, gate_on, json_path=json_path))
            if wait:
                raise typer.Exit(
                    wait_and_show(
                        client,
                        job,
                        timeout_s=timeout_s,
                        fail_on=gate_on,
                        json_path=json_path,
                        probes=probes,
                        reasons=reasons,
                        table=table,
                    )
                )
        except KernelabAPIError as exc:
            raise fail(
                f"{spec_path}: {exc.detail}" if exc.status_code == 422 else str(exc),
                EXIT_BAD_INPUT if exc.status_code == 422 else EXIT_NO_VERDICT,
            ) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}", EXIT_NO_VERDICT) from None


def report(
    job_id: Annotated[int, typer.Argument(help="job id")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    markdown: Annotated[bool, typer.Option("--markdown", help="Markdown for a pull request")] = False,
    fail_on: FailOnOpt = DEFAULT_FAIL_ON,
    output_format: Annotated[
        ReportFormat,
        typer.Option(
            "--format",
            help="table, markdown, or github (job summary to $GITHUB_STEP_SUMMARY, annotations, "
            "dashboard link)",
        ),
    ] = ReportFormat.table,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the Comparison JSON here")] = None,
    probes: ProbesOpt = False,
    reasons: ReasonsOpt = False,
    table: TableOpt = TableLayout.cells,
) -> None:
    """Print a job's comparison table (or its Markdown, or a GitHub Actions summary). Exits 1 when
    a cell's verdict is in --fail-on or the job failed, 2 for an unknown job, 3 while it has no
    verdict (module docstring)."""
    gate_on = parse_fail_on(fail_on)
    render = None
    if output_format is ReportFormat.github:
        from kernelab.runners.cli.github import write_github

        render = partial(write_github, fail_on=gate_on, link=f"{server.rstrip('/')}/jobs/{job_id}")
    with client_for(server, token) as client:
        try:
            job = client.get_job(job_id)
            if job.kind == "workload":
                from kernelab.runners.cli.workload import show_workload_job

                if output_format is ReportFormat.github:
                    raise fail(f"job {job_id}: --format github is for benchmark jobs", EXIT_BAD_INPUT)
                as_md = markdown or output_format is ReportFormat.markdown
                raise typer.Exit(show_workload_job(client, job, gate_on, json_path=json_path, markdown=as_md))
            raise typer.Exit(
                show_job(
                    client,
                    job,
                    gate_on,
                    markdown=markdown or output_format is ReportFormat.markdown,
                    render=render,
                    json_path=json_path,
                    probes=probes,
                    reasons=reasons,
                    table=table,
                )
            )
        except KernelabAPIError as exc:
            raise fail(str(exc), EXIT_BAD_INPUT if exc.status_code == 404 else EXIT_NO_VERDICT) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}", EXIT_NO_VERDICT) from None
