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
* 1 (``EXIT_FAILED``): a cell's verdict is in ``--fail-on`` (default ``failed,incorrect,slower``; the
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
``python -m kernelab.runners.cli``), importing a command's module only when it runs
(``COMMANDS``).
"""

from __future__ import annotations

import importlib
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from kernelab.runners.cli.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_NO_VERDICT", "EXIT_OK", "app", "gate"]

COMMANDS: dict[str, tuple[str, str]] = {
    "init": ("kernelab.runners.cli.init", "init"),
    "run": ("kernelab.runners.cli.local", "run"),
    "validate": ("kernelab.runners.cli.local", "validate"),
    "probe": ("kernelab.runners.cli.local", "probe"),
    "static": ("kernelab.runners.cli.local", "static"),
    "submit": ("kernelab.runners.cli.jobs", "submit"),
    "report": ("kernelab.runners.cli.jobs", "report"),
    "history": ("kernelab.runners.cli.history", "history"),
    "jobs": ("kernelab.runners.cli.manage", "jobs"),
    "cancel": ("kernelab.runners.cli.manage", "cancel"),
    "rerun": ("kernelab.runners.cli.manage", "rerun"),
    "bisect": ("kernelab.runners.cli.bisect", "bisect"),
    "compare-jobs": ("kernelab.runners.cli.history", "compare_jobs"),
    "token": ("kernelab.runners.cli.tokens", "token_app"),
    "runner": ("kernelab.runners.cli.daemon", "runner"),
    "serve": ("kernelab.runners.cli.server", "serve"),
    "compare-worker": ("kernelab.runners.cli.server", "compare_worker"),
    "up": ("kernelab.runners.cli.server", "up"),
}
"""Every subcommand, in ``--help`` order: name -> (module, attribute: a typer command function or
a ``typer.Typer`` group). A command's module is imported when the command is invoked (or
``--help`` lists them all), so ``kernelab --version`` and each command pay only for what they use:
the click pattern of lazily loaded subcommands (click documentation, "Complex Applications")."""


def _load(name: str) -> Any:  # a click command of typer's (typer 0.29 vendors click)
    module, attribute = COMMANDS[name]
    target = getattr(importlib.import_module(module), attribute)
    if isinstance(target, typer.Typer):
        command: Any = typer.main.get_group(target)
    else:
        single = typer.Typer()
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class LazyCommands(TyperGroup):
    """typer's group whose subcommands (``COMMANDS``) are imported on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return [*COMMANDS, *(name for name in super().list_commands(ctx) if name not in COMMANDS)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name in COMMANDS and cmd_name not in self.commands:
            self.commands[cmd_name] = _load(cmd_name)
        return super().get_command(ctx, cmd_name)


app = typer.Typer(
    name="kernelab",
    help="Benchmark GPU kernels honestly: interleaved A/B measurement, node-health probes, verdicts.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=LazyCommands,
)


def __getattr__(name: str) -> Any:  # PEP 562: ``gate`` loads the output module on first use
    if name == "gate":
        from kernelab.runners.cli.output import gate

        return gate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _reads_config(command: Any) -> bool:
    """Whether ``command`` (a click command or group) takes the file's ``server`` or ``token``."""
    if hasattr(command, "commands"):
        return True
    return any(p.name in ("server", "token") for p in command.params)


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

    invoked = getattr(ctx.command, "commands", {}).get(ctx.invoked_subcommand or "")
    if invoked is not None and not _reads_config(invoked):
        return  # run, validate, init, ...: a broken file is no concern of a command that never reads it
    try:
        values = load_config()
    except ConfigError as exc:
        typer.echo(f"config: {exc}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    if values and hasattr(ctx.command, "commands"):  # the invoked command is loaded by now
        ctx.default_map = default_map(ctx.command, values)
