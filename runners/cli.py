"""The ``kernelab`` command line: ``up``, ``serve``, ``runner``, ``submit``, ``run``, ``probe``, ``report``.

Every command that reads a spec reports a bad file as ``FILE:LINE: field: message`` and exits 2;
unreachable servers and refused requests are one-line messages with exit status 1, never
tracebacks. Server URL and token come from ``--server``/``--token`` or ``KERNELAB_SERVER`` /
``KERNELAB_TOKEN``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from runners.client import TERMINAL_JOB_STATUS, KernelabAPIError, KernelabClient, KernelabUnavailable
from runners.specfile import SpecFileError, load_spec
from service.schemas import Comparison, JobPublic, JobSpec

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

app = typer.Typer(
    name="kernelab",
    help="Benchmark GPU kernels honestly: interleaved A/B measurement, node-health probes, verdicts.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

ServerOpt = Annotated[str, typer.Option("--server", envvar="KERNELAB_SERVER", help="server root URL")]
TokenOpt = Annotated[
    str, typer.Option("--token", envvar="KERNELAB_TOKEN", help="bearer token", show_default=False)
]
SpecArg = Annotated[Path, typer.Argument(help="job spec, YAML or JSON", show_default=False)]
DEFAULT_SERVER = "http://127.0.0.1:8000"
DEFAULT_WORK_DIR = Path.home() / ".kernelab"
DEFAULT_DATA_DIR = Path("kernelab-data")


def _fail(message: str, code: int = EXIT_FAILED) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def read_spec(path: Path) -> JobSpec:
    """Load ``path`` or exit 2 with one ``FILE:LINE: field: message`` line per problem."""
    try:
        return load_spec(path)
    except SpecFileError as exc:
        raise _fail(exc.render(), EXIT_BAD_INPUT) from None


def _client(server: str, token: str) -> KernelabClient:
    if not token:
        raise _fail("no token: pass --token or set KERNELAB_TOKEN", EXIT_BAD_INPUT)
    return KernelabClient(server, token)


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise


def _print_cell_progress(index: int, total: int, message: str) -> None:
    typer.echo(f"  [{index + 1}/{total}] {message}", err=True)


def print_comparison(comparison: Comparison) -> None:
    """Print the before/after table and each probe report of a ``Comparison``."""
    from service.report import format_table

    typer.echo(format_table(comparison))
    if comparison.probes:
        from runners.probes.format import format_probe_report

        for report in comparison.probes:
            typer.echo("")
            typer.echo(format_probe_report(report, comparison.node))


def wait_and_show(
    client: KernelabClient, job: JobPublic, *, timeout_s: float, progress_log: Path | None = None
) -> int:
    """Wait for ``job`` to finish, echoing status changes (and new progress lines of
    ``progress_log``, a runner log file); print its comparison. Returns the exit status."""
    offset, partial = 0, b""

    def on_change(j: JobPublic) -> None:
        typer.echo(f"job {j.id}: {j.status}" + (f" on {j.node}" if j.node else ""), err=True)

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
    seen = None
    while True:
        job = client.get_job(job.id)
        if job.status != seen:
            seen = job.status
            on_change(job)
        relay_progress()
        if job.status in TERMINAL_JOB_STATUS:
            break
        if time.monotonic() > deadline:
            raise _fail(f"job {job.id} still {job.status} after {timeout_s:.0f} s")
        time.sleep(0.5)
    if job.status != "succeeded":
        typer.echo(f"job {job.id} {job.status}" + (f": {job.error}" if job.error else ""), err=True)
        return EXIT_FAILED
    print_comparison(client.comparison(job.id))
    return 0


# -------------------------------------------------------------------------------------------------
# local, no server


@app.command()
def run(
    spec_path: SpecArg,
    json_path: Annotated[Path | None, typer.Option("--json", help="write the Comparison JSON here")] = None,
    markdown_path: Annotated[Path | None, typer.Option("--markdown", help="write Markdown here")] = None,
    result_path: Annotated[Path | None, typer.Option("--result", help="write the raw JobResult JSON")] = None,
) -> None:
    """Run a job on this machine (no server) and print the comparison table."""
    spec = read_spec(spec_path)
    from kernels import BenchmarkError
    from runners.job import run_job
    from service.stats import compare

    typer.echo(f"running {spec.benchmark}: {spec.baseline.variant} vs {spec.candidate.variant}", err=True)
    try:
        result = run_job(spec, progress=_print_cell_progress)
    except (BenchmarkError, RuntimeError) as exc:  # e.g. device: cuda on a machine without CUDA
        raise _fail(f"{spec_path}: cannot run: {exc}") from None
    comparison = compare(result)
    if result_path is not None:
        result_path.write_text(result.model_dump_json(indent=2), encoding="utf-8")
    if json_path is not None:
        json_path.write_text(comparison.model_dump_json(indent=2), encoding="utf-8")
    if markdown_path is not None:
        from service.report import to_markdown

        markdown_path.write_text(to_markdown(comparison), encoding="utf-8")
    print_comparison(comparison)
    if result.error:
        raise _fail(f"job error: {result.error}")


@app.command()
def probe(
    json_path: Annotated[Path | None, typer.Option("--json", help="write the ProbeReport JSON here")] = None,
) -> None:
    """Probe this node's health (copy bandwidth, all-reduce, telemetry) and print the readings."""
    from runners.probes import node_info, run_probes
    from runners.probes.format import format_probe_report
    from service.schemas import ProbeSpec

    report = run_probes(ProbeSpec(), "adhoc")
    node = node_info()
    if json_path is not None:
        json_path.write_text(report.model_dump_json(indent=2), encoding="utf-8")
    typer.echo(format_probe_report(report, node))


# -------------------------------------------------------------------------------------------------
# talking to a server


@app.command()
def submit(
    spec_path: SpecArg,
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    wait: Annotated[bool, typer.Option("--wait", help="wait and print the comparison")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="how long --wait waits")] = 3600.0,
) -> None:
    """Queue a job; print its id (with --wait, also the comparison table)."""
    spec = read_spec(spec_path)
    with _client(server, token) as client:
        try:
            job = client.submit(spec)
            typer.echo(str(job.id))
            if wait:
                raise typer.Exit(wait_and_show(client, job, timeout_s=timeout_s))
        except KernelabAPIError as exc:
            raise _fail(f"{spec_path}: {exc.detail}" if exc.status_code == 422 else str(exc),
                        EXIT_BAD_INPUT if exc.status_code == 422 else EXIT_FAILED) from None
        except KernelabUnavailable as exc:
            raise _fail(f"server unreachable: {exc}") from None


@app.command()
def report(
    job_id: Annotated[int, typer.Argument(help="job id")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    markdown: Annotated[bool, typer.Option("--markdown", help="Markdown for a pull request")] = False,
) -> None:
    """Print a job's comparison table (or its Markdown)."""
    with _client(server, token) as client:
        try:
            if markdown:
                typer.echo(client.report_md(job_id))
            else:
                print_comparison(client.comparison(job_id))
        except KernelabAPIError as exc:
            raise _fail(str(exc)) from None
        except KernelabUnavailable as exc:
            raise _fail(f"server unreachable: {exc}") from None


@app.command()
def runner(
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    name: Annotated[str, typer.Option(help="runner/node name")] = socket.gethostname(),
    once: Annotated[bool, typer.Option("--once", help="drain the queue, then exit")] = False,
    poll_s: Annotated[float, typer.Option("--poll-s", help="claim long-poll, seconds")] = 20.0,
    lease_s: Annotated[float, typer.Option("--lease-s", help="lease length, seconds")] = 120.0,
    grace_s: Annotated[float, typer.Option("--grace-s", help="SIGTERM grace for the running job")] = 60.0,
    work_dir: Annotated[Path, typer.Option("--work-dir", help="token, spool, scratch")] = DEFAULT_WORK_DIR,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
) -> None:
    """Run the runner daemon: claim jobs, run them in a child process, post results."""
    from runners.daemon import Runner

    _setup_logging(log_level)
    client = _client(server, token)
    try:
        daemon = Runner(
            client, name, once=once, poll_s=poll_s, lease_s=lease_s, work_dir=work_dir, grace_s=grace_s
        )
    except ValueError as exc:
        client.close()
        raise _fail(str(exc), EXIT_BAD_INPUT) from None
    try:
        daemon.run()
    except KernelabAPIError as exc:
        raise _fail(f"runner {name}: {exc}") from None
    except KernelabUnavailable as exc:
        raise _fail(f"runner {name}: server unreachable: {exc}") from None
    finally:
        daemon.close()
        client.close()
    typer.echo(repr(daemon), err=True)


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="interface to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port", min=1, max=65535)] = 8000,
    workers: Annotated[int, typer.Option(help="uvicorn worker processes")] = 1,
    database_url: Annotated[
        str | None, typer.Option("--database-url", envvar="KERNELAB_DATABASE_URL", help="SQLAlchemy URL")
    ] = None,
) -> None:
    """Upgrade the database to the current schema, then serve the API and dashboard."""
    import uvicorn

    from service.core.config import Settings
    from service.core.db import upgrade

    if database_url:
        os.environ["KERNELAB_DATABASE_URL"] = database_url
    settings = Settings()
    upgrade(settings.database_url)
    uvicorn.run("service.app:create_app", factory=True, host=host, port=port, workers=workers,
                log_level=settings.log_level.lower())


@app.command()
def up(
    port: Annotated[int, typer.Option(help="TCP port on 127.0.0.1", min=1, max=65535)] = 8000,
    data_dir: Annotated[Path, typer.Option("--data-dir", help="database, token, logs")] = DEFAULT_DATA_DIR,
    spec_path: Annotated[Path | None, typer.Option("--spec", help="demo job (default: softmax)")] = None,
    exit_after: Annotated[bool, typer.Option("--exit", help="stop once the demo job is shown")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", help="wait for the demo job, s")] = 900.0,
) -> None:
    """Server on SQLite + a local runner + the demo job: prints the table, the URL and the token."""
    from runners.local import LocalStack, ServerStartError, example_spec_path

    spec = read_spec(spec_path or example_spec_path("softmax"))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops like Ctrl-C
    stack = LocalStack(data_dir, port)
    try:
        token = stack.start()
        typer.echo(f"server  {stack.url}  (database {stack.database_path}, logs in {stack.data_dir})")
        with KernelabClient(stack.url, token) as client:
            job = client.submit(spec)
            typer.echo(f"demo job {job.id}: {spec.name or spec.benchmark}", err=True)
            code = wait_and_show(client, job, timeout_s=timeout_s, progress_log=stack.runner_log)
        typer.echo("")
        typer.echo(f"dashboard  {stack.url}/login?token={token}")
        typer.echo(f"token      {token}  (admin; kept in {stack.token_path})")
        if exit_after:
            raise typer.Exit(code)
        typer.echo("serving; Ctrl-C to stop", err=True)
        stack.wait()
    except KeyboardInterrupt:
        typer.echo("stopping", err=True)
    except ServerStartError as exc:
        raise _fail(str(exc)) from None
    except (KernelabAPIError, KernelabUnavailable) as exc:
        raise _fail(str(exc)) from None
    finally:
        stack.stop()


if __name__ == "__main__":
    app()
