"""Commands that manage a server's jobs: ``jobs`` (list, filtered), ``cancel JOB``, ``rerun JOB``.

Scopes (``docs/operations.md``, "Managing jobs"): listing needs a read token; cancelling and
re-running need a submit token, for any job (tokens are a team's or a CI's, not a person's).
Exit 0 on success, 2 for an unknown job or a bad option, 1 for a refused request (a finished
job cannot be cancelled: 409) or an unreachable server."""

from __future__ import annotations

from typing import Annotated

import typer

from kernelab.runners.cli.common import (
    DEFAULT_SERVER,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    ServerOpt,
    TokenOpt,
    client_for,
    fail,
)
from kernelab.runners.client import KernelabAPIError, KernelabUnavailable
from kernelab.runners.progress import describe
from kernelab.service.contract.schemas import JobPublic, JobStatus

STATUSES: tuple[str, ...] = JobStatus.__args__  # type: ignore[attr-defined]
JobArg = Annotated[int, typer.Argument(help="job id", min=1)]


def _refused(exc: KernelabAPIError) -> typer.Exit:
    return fail(str(exc), EXIT_BAD_INPUT if exc.status_code in (404, 422) else EXIT_FAILED)


def job_line(job: JobPublic) -> str:
    """One row of ``kernelab jobs``: id, status, benchmark, name, node, verdicts or progress."""
    if job.status == "running" and job.progress is not None:
        state = describe(job.progress)
    elif job.summary:
        state = ", ".join(f"{n} {v}" for v, n in job.summary.items())
    else:
        state = (
            (job.error or job.waiting_for or "").splitlines()[0][:80]
            if (job.error or job.waiting_for)
            else ""
        )
    rerun = f" (re-run of #{job.rerun_of})" if job.rerun_of else ""
    head = f"{job.id:>6}  {job.status:<9}  {job.benchmark:<24}"
    return f"{head}  {job.name or '-'}{rerun}  {job.node or '-'}  {state}".rstrip()


def jobs(
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    status: Annotated[
        str | None, typer.Option("--status", help=f"only jobs in this status: {', '.join(STATUSES)}")
    ] = None,
    benchmark: Annotated[str | None, typer.Option("--benchmark", help="only jobs of this benchmark")] = None,
    limit: Annotated[
        int, typer.Option("--limit", min=1, max=500, help="at most this many, newest first")
    ] = 20,
) -> None:
    """List jobs, newest first: id, status, benchmark, name, node, and the verdict counts (a
    running job: its progress)."""
    if status is not None and status not in STATUSES:
        raise fail(
            f"--status: {status!r} is no job status; choose from {', '.join(STATUSES)}", EXIT_BAD_INPUT
        )
    with client_for(server, token) as client:
        try:
            page = client.list_jobs(limit=limit, status=status, benchmark=benchmark)
        except KernelabAPIError as exc:
            raise _refused(exc) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}") from None
    typer.echo(f"{'id':>6}  {'status':<9}  {'benchmark':<24}  name  node  verdicts/progress")
    for job in page.data:
        typer.echo(job_line(job))
    typer.echo(f"{len(page.data)} of {page.count} jobs", err=True)


def cancel(job_id: JobArg, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = "") -> None:
    """Cancel a queued or running job (its runner stops it at the next heartbeat)."""
    with client_for(server, token) as client:
        try:
            job = client.cancel(job_id)
        except KernelabAPIError as exc:
            raise _refused(exc) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}") from None
    typer.echo(f"job {job.id} cancelled")


def rerun(job_id: JobArg, server: ServerOpt = DEFAULT_SERVER, token: TokenOpt = "") -> None:
    """Queue a job's spec again as a new job; prints the new job's id."""
    with client_for(server, token) as client:
        try:
            job = client.rerun(job_id)
        except KernelabAPIError as exc:
            raise _refused(exc) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}") from None
    typer.echo(str(job.id))
    typer.echo(f"job {job.id} queued: a re-run of job {job_id}", err=True)
