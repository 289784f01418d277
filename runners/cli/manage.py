"""Commands that manage a server's jobs: ``jobs`` (list, filtered), ``cancel JOB``, ``rerun JOB``.

Scopes (``docs/operations.md``, "Managing jobs"): listing needs a read token; cancelling and
re-running need a submit token, for any job (tokens are a team's or a CI's, not a person's).
Exit 0 on success, 2 for an unknown job or a bad option, 1 for a refused request (a finished
job cannot be cancelled: 409) or an unreachable server."""

from __future__ import annotations

from collections.abc import Sequence
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


NAME_WIDTH = 40  # a longer job name is cut with "…" in ``kernelab jobs``


def _job_state(job: JobPublic) -> str:
    """The last column of ``kernelab jobs``: a running job's progress, the verdict counts, or the
    first line of its error or of why it waits."""
    if job.status == "running" and job.progress is not None:
        return describe(job.progress)
    if job.summary:
        return ", ".join(f"{n} {v}" for v, n in job.summary.items())
    text = job.error or job.waiting_for or ""
    return text.splitlines()[0][:80] if text else ""


def job_table(jobs: Sequence[JobPublic]) -> list[str]:
    """``kernelab jobs``'s lines: a header and one row per job (id, status, benchmark, name with
    ``(re-run of #N)``, node, verdicts or progress), each column as wide as its widest entry (a
    name cut at ``NAME_WIDTH`` characters), the last one unpadded."""
    header = ["id", "status", "benchmark", "name", "node", "verdicts / progress"]
    rows = [header]
    for job in jobs:
        name = (job.name or "-") + (f" (re-run of #{job.rerun_of})" if job.rerun_of else "")
        if len(name) > NAME_WIDTH:
            name = name[: NAME_WIDTH - 1] + "…"
        rows.append([str(job.id), job.status, job.benchmark, name, job.node or "-", _job_state(job)])
    widths = [max(len(r[k]) for r in rows) for k in range(len(header) - 1)]
    return [
        "  ".join(
            [r[0].rjust(widths[0]), *(v.ljust(w) for v, w in zip(r[1:-1], widths[1:], strict=True)), r[-1]]
        ).rstrip()
        for r in rows
    ]


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
    for line in job_table(page.data):
        typer.echo(line)
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
