"""``kernelab runner``: the runner daemon (``kernelab.runners.daemon``) started from the command
line, with its token moved off the command line first."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelab.runners.cli.common import (
    DEFAULT_SERVER,
    DEFAULT_WORK_DIR,
    EXIT_BAD_INPUT,
    AllowRepoOpt,
    ServerOpt,
    TokenOpt,
    client_for,
    fail,
    setup_logging,
)
from kernelab.runners.client import KernelabAPIError, KernelabUnavailable
from kernelab.runners.daemon.supervisor import HEARTBEAT_S


def runner(
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    name: Annotated[str, typer.Option(help="runner/node name")] = socket.gethostname(),
    once: Annotated[bool, typer.Option("--once", help="drain the queue, then exit")] = False,
    poll_s: Annotated[float, typer.Option("--poll-s", help="claim long-poll, seconds")] = 20.0,
    lease_s: Annotated[float, typer.Option("--lease-s", help="lease length, seconds")] = 120.0,
    heartbeat_s: Annotated[
        float,
        typer.Option(
            "--heartbeat-s",
            min=0.5,
            help="heartbeat period, seconds (at most lease/3): how soon a job's progress shows and a "
            "cancelled job stops",
        ),
    ] = HEARTBEAT_S,
    grace_s: Annotated[float, typer.Option("--grace-s", help="SIGTERM grace for the running job")] = 60.0,
    work_dir: Annotated[Path, typer.Option("--work-dir", help="token, spool, scratch")] = DEFAULT_WORK_DIR,
    log_level: Annotated[str, typer.Option("--log-level")] = "INFO",
    allow_repo: AllowRepoOpt = None,
    probe_pool: Annotated[
        str,
        typer.Option(
            "--probe-pool",
            help="keep all-reduce probe ranks alive between probes: auto (2+ GPUs), on, off",
        ),
    ] = "auto",
    job_env: Annotated[
        list[str] | None,
        typer.Option(
            "--job-env",
            metavar="NAME",
            help="environment variable job code may see besides the built-in "
            "allow-list (repeatable; names that look like credentials are refused); docs/security.md",
        ),
    ] = None,
    job_isolation: Annotated[
        str,
        typer.Option(
            "--job-isolation",
            help="auto: run jobs in a private namespace hiding the work dir when the "
            "machine allows it (else warn); namespace: require it; none: never",
        ),
    ] = "auto",
    job_hide: Annotated[
        list[Path] | None,
        typer.Option(
            "--job-hide",
            metavar="DIR",
            help="a folder job code must not see besides the work dir "
            "(repeatable; e.g. a server's data dir on the same machine)",
        ),
    ] = None,
    workloads: Annotated[
        bool,
        typer.Option(
            "--workloads/--no-workloads",
            help="also claim workload jobs (kind: workload, whole programs under torchrun; "
            "docs/workloads.md)",
        ),
    ] = False,
    rdzv_host: Annotated[
        str,
        typer.Option(
            "--rdzv-host",
            help="the address other nodes reach this one at, for the c10d rendezvous it hosts as "
            "node rank 0 of a multi-node workload",
        ),
    ] = "127.0.0.1",
    benchmark: Annotated[
        list[str] | None,
        typer.Option(
            "--benchmark",
            metavar="MODULE:OBJECT",
            help="a benchmark this runner offers besides the built-ins and the installed "
            "kernelab.benchmarks entry points (repeatable); the server routes its jobs here",
        ),
    ] = None,
    spool_fallback: Annotated[
        list[Path] | None,
        typer.Option(
            "--spool-fallback",
            metavar="DIR",
            help="where a result held in memory (the work dir's disk full) is written at shutdown "
            "when the server cannot take it (repeatable, tried in order; best on another disk); "
            "posted at the next start. Last resort: stderr",
        ),
    ] = None,
    status_port: Annotated[
        int | None,
        typer.Option(
            "--status-port",
            min=0,
            max=65535,
            help="serve /status (JSON) and /metrics (Prometheus) on this port (0: a free one, logged)",
        ),
    ] = None,
    status_host: Annotated[
        str, typer.Option("--status-host", help="the address --status-port listens on")
    ] = "127.0.0.1",
) -> None:
    """Run the runner daemon: claim jobs, run them in a child process, post results.

    The daemon advertises the benchmarks it offers with its claims (built-ins, entry points,
    ``--benchmark`` refs; described in an isolated child process), and the server routes it only
    jobs of those benchmarks (``kernelab.service.server.offers``).

    A token given as ``--token`` is moved out of the command line (any process can read
    ``/proc/PID/cmdline``): the daemon starts again with it in ``KERNELAB_TOKEN`` only, which its
    non-dumpable process keeps from same-user processes. Prefer ``KERNELAB_TOKEN`` or the saved
    token file in the first place (docs/security.md).
    """
    _token_out_of_argv(token)
    # A SIGTERM while the daemon starts (imports, node fingerprint, registration) stops it cleanly
    # (exit 0, nothing claimed) instead of killing it: the daemon's own handlers take over in run().
    started: list[Any] = []
    early_stop = threading.Event()

    def _stop_early(_signum: int, _frame: object) -> None:
        early_stop.set()
        for daemon_ in started:
            daemon_.stop()

    signal.signal(signal.SIGTERM, _stop_early)
    from kernelab.runners.daemon import AdvertError, RunnerDaemon, RunnerTokenMismatchError
    from kernelab.runners.jobns import IsolationError, set_non_dumpable
    from kernelab.runners.revisions import AllowList, RevisionError

    setup_logging(log_level)
    if not set_non_dumpable():  # same-uid job code must not read this process's environ or memory
        typer.echo(
            "runner: warning: prctl(PR_SET_DUMPABLE, 0) refused: same-uid processes can read "
            "this daemon's /proc/<pid>/environ",
            err=True,
        )
    try:  # an entry in a refused form stops the start, not every revision job later
        AllowList.from_env(allow_repo or [])
    except RevisionError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT) from None
    client = client_for(server, token)
    try:
        daemon = RunnerDaemon(
            client,
            name,
            once=once,
            poll_s=poll_s,
            lease_s=lease_s,
            heartbeat_s=heartbeat_s,
            work_dir=work_dir,
            grace_s=grace_s,
            allowed_repos=allow_repo or [],
            probe_pool=probe_pool,
            job_env_names=job_env or [],
            job_isolation=job_isolation,
            job_hide=job_hide or [],
            benchmarks=benchmark or [],
            workloads=workloads,
            rdzv_host=rdzv_host,
            fallback_dirs=spool_fallback or [],
            status_port=status_port,
            status_host=status_host,
        )
    except ValueError as exc:
        client.close()
        raise fail(str(exc), EXIT_BAD_INPUT) from None
    started.append(daemon)
    if early_stop.is_set():
        daemon.stop()
    try:
        daemon.run()
    except KernelabAPIError as exc:
        raise fail(f"runner {name}: {exc}") from None
    except KernelabUnavailable as exc:
        raise fail(f"runner {name}: server unreachable: {exc}") from None
    except (RunnerTokenMismatchError, IsolationError) as exc:
        raise fail(str(exc)) from None
    except AdvertError as exc:
        raise fail(str(exc), EXIT_BAD_INPUT) from None
    except OSError as exc:  # the --status-port cannot be bound
        raise fail(f"runner {name}: {exc}") from None
    finally:
        daemon.close()
        client.close()
    typer.echo(repr(daemon), err=True)
    if daemon.on_stderr:
        raise fail(
            f"runner {name}: {daemon.on_stderr} measured result(s) could be written only to stderr "
            "(lines starting with 'kernelab-result-json: '): save them into the spool to post them"
        )


def _token_out_of_argv(token: str) -> None:
    """Re-``exec`` this command without ``--token`` on its command line, the token in
    ``KERNELAB_TOKEN`` (``runner``'s docstring). Returns when the token is not on the command line."""
    argv = sys.argv[1:]
    if not token or not any(a == "--token" or a.startswith("--token=") for a in argv):
        return
    rest: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--token":
            skip = True
        elif not arg.startswith("--token="):
            rest.append(arg)
    os.execve(
        sys.executable,
        [sys.executable, "-P", "-m", "kernelab.runners.cli", *rest],
        {**os.environ, "KERNELAB_TOKEN": token},
    )
