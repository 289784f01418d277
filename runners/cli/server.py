"""Commands that run a server: ``serve`` (the API and dashboard) and ``up`` (a server on SQLite,
a local runner and the demo job)."""

from __future__ import annotations

import inspect
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kernelab.runners.cli.common import (
    DEFAULT_DATA_DIR,
    EXIT_NO_VERDICT,
    ProbesOpt,
    TableLayout,
    TableOpt,
    fail,
    read_spec,
    without_probes,
)
from kernelab.runners.cli.output import wait_and_show
from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable

if TYPE_CHECKING:
    from kernelab.runners.local import LocalStack

WORKER_HEALTHCHECK_S = 120  # uvicorn --workers: seconds a busy worker may miss a health ping
# Idle HTTP keep-alive, s: longer than a runner's quietest gap (daemon heartbeat lease_s/3 = 40 s),
# so the server never closes a runner's connection just as the runner sends on it (with uvicorn's
# 5 s default, heartbeats 10 s apart race the close and fail with ReadError).
KEEP_ALIVE_S = 75
# s after the local runner logged that it serves (its first claim carries its advertisement): a job
# still waiting then waits for a benchmark the runner does not offer (kernelab up --spec)
ADVERTISED_S = 5.0


def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port", min=1, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
    database_url: Annotated[
        str | None, typer.Option("--database-url", envvar="KERNELAB_DATABASE_URL", help="SQLAlchemy URL")
    ] = None,
    compare_workers: Annotated[
        int,
        typer.Option(
            "--compare-workers",
            min=0,
            envvar="KERNELAB_COMPARE_WORKERS",
            help="compare worker processes beside the API "
            "(0: none here, e.g. when `kernelab compare-worker` runs on other hosts)",
        ),
    ] = 1,
) -> None:
    """Upgrade the database to the current schema, then serve the API and dashboard, with
    ``--compare-workers`` compare worker processes beside it (the comparisons of stored results are
    computed there, never in an API worker; a stop does not wait for one)."""
    import uvicorn
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError

    from kernelab.service.server.core.config import Settings
    from kernelab.service.server.core.db import upgrade_told

    if database_url:
        os.environ["KERNELAB_DATABASE_URL"] = database_url
    settings = Settings()
    try:
        typer.echo(upgrade_told(settings.database_url), err=True)
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:  # malformed, unknown driver, bad port
        reason = str(exc).splitlines()[0]
        raise fail(f"--database-url: not a database URL SQLAlchemy can use: {reason}") from None
    except OperationalError as exc:  # unreachable, refused, no such database: one line, no traceback
        raise fail(f"database unreachable: {str(exc.orig).strip().splitlines()[0]}") from None
    extra: dict[str, Any] = {}
    if "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:
        # A large result body is parsed on the worker's event loop (seconds for a 1,000-cell sweep);
        # uvicorn's default 5 s worker health check would kill the worker mid-ingest.
        extra["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_S
    from kernelab.service.server import serve as server
    from kernelab.service.server.compare_worker import WorkerProcesses

    # uvicorn re-raises a SIGTERM it handled once it has shut down: as KeyboardInterrupt (suppressed by
    # server.run), the compare workers below are stopped too instead of left running.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    comparers = WorkerProcesses(compare_workers)
    comparers.start()
    try:
        server.run(workers=workers, host=host, port=port, log_level=settings.log_level.lower(),
                   timeout_keep_alive=KEEP_ALIVE_S, max_connections=settings.max_connections,
                   header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s,
                   body_min_bytes=settings.body_min_bytes, **extra)  # fmt: skip
    finally:
        comparers.stop()


def compare_worker(
    database_url: Annotated[
        str | None, typer.Option("--database-url", envvar="KERNELAB_DATABASE_URL", help="SQLAlchemy URL")
    ] = None,
    burst: Annotated[bool, typer.Option("--burst", help="compute what is queued, then exit")] = False,
) -> None:
    """Compute the comparisons of stored results (queued ``compare`` tasks) until SIGTERM/Ctrl-C:
    `kernelab serve` runs one; a fleet runs more on any host that reaches the database. On start
    it queues the comparisons that are missing or judged by older verdict rules."""
    from kernelab.service.server import compare_worker as worker

    if database_url:
        os.environ["KERNELAB_DATABASE_URL"] = database_url
    worker.main(burst=burst)


def up(
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1", min=1, max=65535)] = 8000,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="database, token, logs")] = DEFAULT_DATA_DIR,
    spec_path: Annotated[
        Path | None,
        typer.Option("--spec", help="demo job (default: softmax; on a CPU softmax_cpu, then softmax)"),
    ] = None,
    exit_after: Annotated[bool, typer.Option("--exit", help="stop once the demo job is shown")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="wait for each demo job, s")] = 900.0,
    probes: ProbesOpt = False,
    table: TableOpt = TableLayout.cells,
) -> None:
    """Server on SQLite + a local runner + the demo job(s): prints the dashboard's URL and the token
    as soon as the server answers, then each demo's table (with --probes the probes' full tables
    before it) and what it shows, then the URL again while it serves (with --exit: that the server
    has stopped).

    The demo (``kernelab.runners.local.demo_specs``): with a CUDA GPU, eager PyTorch vs the fused
    Triton softmax; on a CPU, the unfused softmax vs ``torch.softmax`` (both native: a true ratio),
    then the Triton kernel checked for correctness, its interpreted time not compared."""
    from kernelab.runners.local import LocalStack, ServerStartError, demo_specs

    if spec_path is not None:
        specs = [(read_spec(spec_path), "")]
    else:
        import torch

        has_cuda = bool(torch.cuda.is_available())
        specs = [(read_spec(path), note) for path, note in demo_specs(has_cuda)]
        if not has_cuda:  # a shared CPU's copy bandwidth would flag the node: not what the demo is about
            specs = [(without_probes(spec), note) for spec, note in specs]
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
    stack = LocalStack(data_dir, port)
    code, started = 0, False
    try:
        token = stack.start()
        started = True
        typer.echo(f"server     {stack.url}  (database {stack.database_path}, logs in {stack.data_dir})")
        _echo_access(stack.url, token, stack.token_path)
        with KernelabClient(stack.url, token) as client:
            for spec, note in specs:
                logged = stack.runner_log.stat().st_size if stack.runner_log.exists() else 0
                job = client.submit(spec)
                typer.echo(f"demo job {job.id}: {spec.name or spec.benchmark}", err=True)
                _wait_for_local_runner(stack, client, job.id)
                shown = wait_and_show(
                    client,
                    job,
                    timeout_s=timeout_s,
                    progress_log=stack.runner_log,
                    progress_from=logged,
                    probes=probes,
                    table=table,
                )
                code = max(code, shown)
                if note:
                    typer.echo(note)
        typer.echo("")
        if not exit_after:
            _echo_access(stack.url, token, stack.token_path)
            typer.echo("serving; Ctrl-C to stop", err=True)
            stack.wait()
    except KeyboardInterrupt:
        typer.echo("stopping", err=True)
    except ServerStartError as exc:
        raise fail(str(exc)) from None
    except (KernelabAPIError, KernelabUnavailable) as exc:
        raise fail(str(exc)) from None
    finally:
        stack.stop()
        if exit_after and started:  # also after a failure: the URL printed above is dead now
            typer.echo(
                f"server stopped (--exit): {stack.url} no longer answers; `kernelab up --data-dir "
                f"{stack.data_dir}` serves these jobs again (same database and token)"
            )
    raise typer.Exit(code)


def _echo_access(url: str, token: str, token_path: Path) -> None:
    typer.echo(f"dashboard  {url}/login  (sign in with the token below)")
    typer.echo(f"token      {token}  (admin; kept in {token_path})")


def _wait_for_local_runner(stack: LocalStack, client: KernelabClient, job_id: int) -> None:
    """While the job waits for a runner that offers its benchmark (``JobPublic.waiting_for``) and
    the local runner is starting (importing and advertising its benchmarks), say so once, instead
    of the server's "no live runner advertises it". Returns once the runner advertised (or the job
    left the queue), or ``ADVERTISED_S`` seconds after the runner logged that it serves while the
    job still waits (it does not offer the benchmark: ``wait_and_show`` then says the server's
    reason); raises ``typer.Exit`` (1, with the runner's log tail) when the runner exits, and (3)
    after ``RUNNER_START_TIMEOUT_S`` seconds."""
    from kernelab.runners.local import RUNNER_START_TIMEOUT_S

    deadline = time.monotonic() + RUNNER_START_TIMEOUT_S
    said, serving_since = False, None
    while True:
        job = client.get_job(job_id)
        if job.status != "queued" or not job.waiting_for:
            return
        exited = stack.runner_exited()
        if exited is not None:
            raise fail(exited)
        if serving_since is None and stack.runner_serving():
            serving_since = time.monotonic()
        if serving_since is not None and time.monotonic() - serving_since > ADVERTISED_S:
            return
        if time.monotonic() > deadline:
            raise fail(f"the local runner did not start within {RUNNER_START_TIMEOUT_S:.0f} s "
                       f"(its log: {stack.runner_log})", EXIT_NO_VERDICT)  # fmt: skip
        if not said:
            typer.echo(f"starting the local runner… (its log: {stack.runner_log})", err=True)
            said = True
        time.sleep(0.2)
