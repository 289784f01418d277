"""The ``kernelab`` command line: ``up``, ``serve``, ``runner``, ``submit``, ``run``, ``validate``,
``probe``, ``report``, ``history``, ``compare-jobs``, ``jobs``, ``cancel``, ``rerun``, ``bisect``,
``token create|list|rotate|revoke``, ``init`` (a new benchmark's scaffold); ``--version``;
shell completion (``--install-completion``); a configuration file for server and token
(``config``).

Every command that reads a spec reports a bad file as ``FILE:LINE: field: message`` and exits 2;
unreachable servers and refused requests are one-line messages, never tracebacks. Server URL and
token come from ``--server``/``--token`` or ``KERNELAB_SERVER`` / ``KERNELAB_TOKEN``.

``run``, ``submit --wait`` and ``report`` end with an exit status a CI can gate on:

* 0 (``EXIT_OK``): the job succeeded and no cell's verdict is in ``--fail-on``;
* 1 (``EXIT_FAILED``): a cell's verdict is in ``--fail-on`` (default ``failed,incorrect``; the
  cells are named on stderr), or the job failed (every cell failed, a revision that did not build
  or import, the runner's error), whatever ``--fail-on`` says;
* 2 (``EXIT_BAD_INPUT``): a bad spec, option (``--fail-on`` naming no such verdict) or job id;
* 3 (``EXIT_NO_VERDICT``): no verdict could be had: the server was unreachable or refused the
  request, ``--wait`` timed out, the job was cancelled.

The other commands exit 1 on an unreachable server or a refused request.

One module per role: ``common`` (exit statuses, options, the client, a spec file), ``output``
(the table and the ``--fail-on`` gate), ``local`` (``run``, ``validate``, ``probe``, ``static``:
no server), ``jobs`` (``submit``, ``report``: a server's client),
``history`` (``history``, ``compare-jobs``), ``manage`` (``jobs``, ``cancel``, ``rerun``), ``bisect``
(``bisect``: revision jobs over a commit range), ``tokens`` (``token ...``: an
administrator's), ``daemon`` (``runner``: the runner daemon), ``server`` (``serve``, ``up``).
This module joins them into the typer ``app`` (the ``kernelab`` entry point and
``python -m kernelab.runners.cli``).
"""

from __future__ import annotations

from typing import Annotated

import typer

from kernelab.runners.cli.bisect import bisect
from kernelab.runners.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK
from kernelab.runners.cli.daemon import runner
from kernelab.runners.cli.history import compare_jobs, history
from kernelab.runners.cli.init import init
from kernelab.runners.cli.jobs import report, submit
from kernelab.runners.cli.local import probe, run, static, validate
from kernelab.runners.cli.manage import cancel, jobs, rerun
from kernelab.runners.cli.output import gate
from kernelab.runners.cli.server import compare_worker, serve, up
from kernelab.runners.cli.tokens import token_app

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_NO_VERDICT", "EXIT_OK", "app", "gate"]

app = typer.Typer(
    name="kernelab",
    help="Benchmark GPU kernels honestly: interleaved A/B measurement, node-health probes, verdicts.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from kernelab import __version__

        typer.echo(f"kernelab {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def main(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="print kernelab's version and exit"),
    ] = False,
) -> None:
    """Benchmark GPU kernels honestly: interleaved A/B measurement, node-health probes, verdicts.

    Server and token: --server/--token, KERNELAB_SERVER/KERNELAB_TOKEN, or the configuration file
    (KERNELAB_CONFIG, default ~/.config/kernelab/config.toml).
    """
    from kernelab.runners.cli.config import ConfigError, default_map, load_config

    try:
        values = load_config()
    except ConfigError as exc:
        typer.echo(f"config: {exc}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if values and hasattr(ctx.command, "commands"):
        ctx.default_map = default_map(ctx.command, values)


# in this order in --help
for command in (init, run, validate, probe, static, submit, report, history, jobs, cancel, rerun, bisect):
    app.command()(command)
app.command("compare-jobs")(compare_jobs)
app.add_typer(token_app, name="token")
app.command()(runner)
app.command()(serve)
app.command("compare-worker")(compare_worker)
app.command()(up)
