"""The ``kernelab`` configuration file: the server and token a user's commands talk to.

Read from ``$KERNELAB_CONFIG`` when set, else ``~/.config/kernelab/config.toml`` (the XDG base
directory; ``$XDG_CONFIG_HOME`` when set). TOML, for example::

    server = "https://kernelab.example.com"
    token = "kl_..."

A command-line option wins over an environment variable (``KERNELAB_SERVER``, ``KERNELAB_TOKEN``),
which wins over this file, which wins over the built-in default (click's order of value sources;
the file becomes each command's ``default_map``). It applies to every command of a server's client
(``submit``, ``report``, ``jobs``, ``history``, ``cancel``, ``rerun``, ``bisect``,
``compare-jobs``, ``probe``, ``token ...``: every command with a ``--server`` or ``--token``),
never to ``runner``, ``serve``, ``up`` or ``compare-worker`` (``NOT_CLIENT_COMMANDS``), whose
tokens are of another kind. A file that holds a token should be readable by its owner only
(``chmod 600``): ``load_config`` warns otherwise.
"""

from __future__ import annotations

import os
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

KEYS = ("server", "token")
NOT_CLIENT_COMMANDS = ("runner", "serve", "up", "compare-worker")
"""Commands that are not a server's client: their tokens are of another kind (a runner's)."""


class ConfigError(Exception):
    """The configuration file cannot be read or holds an unknown key or a non-string value."""


def config_path() -> Path:
    """``$KERNELAB_CONFIG``, else ``$XDG_CONFIG_HOME/kernelab/config.toml`` (default
    ``~/.config``)."""
    explicit = os.environ.get("KERNELAB_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "kernelab" / "config.toml"


def load_config(path: Path | None = None) -> dict[str, str]:
    """The ``server``/``token`` of the configuration file (``config_path()`` by default); ``{}``
    when there is none. Raises ``ConfigError`` naming the file for bad TOML, an unknown key or a
    value that is not a string; warns on stderr when a file holding a token is readable by others.
    """
    path = path or config_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if os.environ.get("KERNELAB_CONFIG"):
            raise ConfigError(f"{path}: no such file (KERNELAB_CONFIG)") from None
        return {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {', '.join(unknown)}; known: {', '.join(KEYS)}")
    for key, value in data.items():
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {key} must be a non-empty string")
    if "token" in data and path.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(f"warning: {path} holds a token and is readable by others (chmod 600 it)", file=sys.stderr)
    return dict(data)


def default_map(group: Any, values: dict[str, str]) -> dict[str, Any]:
    """click's ``default_map`` giving ``values`` to the ``server``/``token`` parameters of the
    commands of ``group`` (a click group: typer's or click's; sub-groups walked) but those in
    ``NOT_CLIENT_COMMANDS``."""

    def walk(command: Any) -> dict[str, Any]:
        commands = getattr(command, "commands", None)
        if isinstance(commands, dict):
            return {name: walk(sub) for name, sub in commands.items()}
        names = {p.name for p in command.params}
        return {k: v for k, v in values.items() if k in names}

    return {name: walk(cmd) for name, cmd in group.commands.items() if name not in NOT_CLIENT_COMMANDS}
