"""``kernelab bisect --repo . --good A --bad B SPEC``: the first commit between A and B that made
SPEC's benchmark slower, one revision A/B job per step on the server's runners
(``kernelab.runners.bisect`` has the rules; every step is recorded on the server, whose page
``/bisects/{id}`` shows them as they come).

Exit 0 when the first bad commit is found; 3 when the bisect stopped without an answer (a step
undecided twice, the ends not slower, the server unreachable); 2 for bad input (the spec, a ref
that does not resolve, a good end that is no ancestor of the bad one)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from kernelab.runners.bisect import BisectError, Bisection, commit_range, judge, step_record, steps_needed
from kernelab.runners.cli.common import (
    DEFAULT_SERVER,
    EXIT_BAD_INPUT,
    EXIT_NO_VERDICT,
    EXIT_OK,
    RepoOpt,
    ServerOpt,
    SpecArg,
    TokenOpt,
    client_for,
    fail,
    read_spec,
)
from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable, is_settled
from kernelab.runners.progress import describe
from kernelab.service.contract.schemas import BisectCreate, BisectFinish, Comparison, JobPublic

POLL_S = 1.0  # how often a step's job is read while it runs


def _wait(client: KernelabClient, job: JobPublic, timeout_s: float) -> JobPublic | None:
    """``job`` once finished and compared, echoing its progress; None after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    shown: tuple[object, ...] | None = None
    while True:
        job = client.get_job(job.id)
        if job.progress is not None:
            p = job.progress
            if (p.cell, p.cells_done, p.phase) != shown:
                shown = (p.cell, p.cells_done, p.phase)
                typer.echo("    " + describe(p), err=True)
        if is_settled(job):
            return job
        if time.monotonic() > deadline:
            return None
        time.sleep(POLL_S)


def bisect(
    spec_path: SpecArg,
    good: Annotated[
        str, typer.Option("--good", help="a revision of --repo that is fast (the baseline of every step)")
    ],
    bad: Annotated[str, typer.Option("--bad", help="a later revision of --repo that is slower")],
    repo: RepoOpt = ".",
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    timeout_s: Annotated[
        float, typer.Option("--timeout-s", help="how long one step's job may take, seconds")
    ] = 3600.0,
) -> None:
    """Find the first commit between --good and --bad that made SPEC slower: revision A/B jobs of
    midpoints against the good end (log2 n steps), an undecided step run once more, then stopped
    where it could not decide; prints the first bad commit with each step's verdict, ratio and CI."""
    from kernelab.runners.revisions import RevisionError, normalize_repo, with_revisions

    spec = read_spec(spec_path, check_benchmark=False)
    try:
        good_sha, bad_sha, commits = commit_range(normalize_repo(repo), good, bad)
    except (BisectError, RevisionError) as exc:
        raise fail(f"{spec_path}: {exc}", EXIT_BAD_INPUT) from None
    with client_for(server, token) as client:
        try:
            record = client.create_bisect(BisectCreate(
                name=spec.name, repo=normalize_repo(repo), good=good_sha, bad=bad_sha, good_ref=good,
                bad_ref=bad, commits=commits, spec=spec,
            ))  # fmt: skip
            typer.echo(f"bisect {record.id}: {len(commits)} commits after {good} ({good_sha[:12]}) up to "
                       f"{bad} ({bad_sha[:12]}): about {steps_needed(len(commits))} steps; "
                       f"{server.rstrip('/')}/bisects/{record.id}", err=True)  # fmt: skip
            search = Bisection(commits)
            step = 0
            while (commit := search.next()) is not None:
                step += 1
                role, attempt = search.role, search.attempt
                step_spec = with_revisions(spec, repo, good_sha, commit.sha)
                step_spec = step_spec.model_copy(
                    update={"name": f"bisect {record.id} step {step}: {commit.sha[:12]}"[:200]}
                )
                job = client.submit(step_spec)
                again = " (again)" if attempt > 1 else ""
                typer.echo(f"step {step}{again}: {commit.sha[:12]} {commit.subject} against the good end: "
                           f"job {job.id}", err=True)  # fmt: skip
                finished = _wait(client, job, timeout_s)
                if finished is None:
                    client.cancel(job.id)
                    finished = client.get_job(job.id)
                comparison: Comparison | None = None
                if finished.status == "succeeded" and finished.comparison_status == "ready":
                    comparison = client.comparison(job.id)
                j = judge(finished, comparison)
                client.add_bisect_step(record.id, step_record(job.id, commit.sha, role, attempt, j))
                typer.echo(f"  -> {j.outcome}: {j.reason}", err=True)
                search.record(j.outcome, j.reason)
            first = search.first_bad
            if first is not None:
                found = f"first bad commit: {first.sha[:12]} {first.subject}"
                client.finish_bisect(
                    record.id, BisectFinish(status="found", first_bad=first.sha, message=found)
                )
                typer.echo(f"first bad commit: {first.sha} {first.subject}")
                raise typer.Exit(EXIT_OK)
            why = search.stopped or "stopped"
            client.finish_bisect(record.id, BisectFinish(status="stopped", message=why[:4000]))
            raise fail(f"bisect {record.id} stopped: {why}", EXIT_NO_VERDICT)
        except RevisionError as exc:
            raise fail(f"{spec_path}: {exc}", EXIT_BAD_INPUT) from None
        except KernelabAPIError as exc:
            raise fail(
                f"{spec_path}: {exc.detail}" if exc.status_code == 422 else str(exc), EXIT_NO_VERDICT
            ) from None
        except KernelabUnavailable as exc:
            raise fail(f"server unreachable: {exc}", EXIT_NO_VERDICT) from None
