"""``kernelab token create|list|rotate|revoke``: an administrator's commands for API tokens."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from typing import Annotated

import typer

from kernelab.runners.cli.common import DEFAULT_SERVER, ServerOpt, TokenOpt, client_for, fail
from kernelab.runners.client import KernelabAPIError, KernelabUnavailable

token_app = typer.Typer(
    help="Manage API tokens on a server (needs an admin token): create, list, rotate, revoke.",
    no_args_is_help=True,
)
TOKEN_RETRIES = 1  # an operator at a terminal: say "unreachable" after one retry, not after ~15 s


class TokenScope(StrEnum):
    """Scopes a token can be created with; a ``runner`` token is a registered runner's
    (``POST /runners/register``), bound to the node of its first probe report or result."""

    read = "read"
    submit = "submit"
    admin = "admin"
    runner = "runner"


@contextmanager
def _one_line_errors(what: str) -> Iterator[None]:
    """Turn the client's errors into one line on stderr and exit status 1 (no traceback)."""
    try:
        yield
    except KernelabAPIError as exc:
        raise fail(f"{what}: HTTP {exc.status_code}: {exc.detail}") from None
    except KernelabUnavailable as exc:
        raise fail(f"{what}: server unreachable: {exc}") from None


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option("--name", help="who or what holds the token, e.g. ci")],
    scope: Annotated[TokenScope, typer.Option("--scope", help="admin implies submit implies read")],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
) -> None:
    """Create a token; print it once on stdout (the server keeps only its hash).

    ``--scope runner`` registers runner NAME and prints its token, which speaks for one node (the
    node of its first probe report: ``KERNELAB_TOKEN=... kernelab probe --post`` on that node);
    registering the name of an existing runner again revokes that runner's tokens."""
    if scope is TokenScope.runner:
        with client_for(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors("token create"):
            registered = client.register(name)
        typer.echo(registered.token)
        typer.echo(
            f"runner {registered.runner_id} {registered.name!r} (runner): token shown only now, store it; "
            "it is bound to the node of its first probe report or result",
            err=True,
        )
        return
    with client_for(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors("token create"):
        issued = client.create_token(name, [scope.value])
    typer.echo(issued["token"])
    typer.echo(f"token {issued['id']} {issued['name']!r} ({', '.join(issued['scopes'])}): shown only now, "
               "store it", err=True)  # fmt: skip


@token_app.command("list")
def token_list(
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
    live: Annotated[bool, typer.Option("--live", help="leave out revoked tokens")] = False,
) -> None:
    """List tokens (id, name, scopes, runner, created, revoked); never their secrets."""
    with client_for(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors("token list"):
        rows = client.list_tokens(live_only=live)
    table = [("ID", "NAME", "SCOPES", "RUNNER", "CREATED", "REVOKED")] + [
        (str(r["id"]), r["name"], ",".join(r["scopes"]), str(r["runner_id"] or ""), r["created_at"][:19],
         (r["revoked_at"] or "")[:19])
        for r in rows
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


@token_app.command("rotate")
def token_rotate(
    token_id: Annotated[int, typer.Argument(help="token id (kernelab token list)", min=1)],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
) -> None:
    """Replace a token: a new one with the same name, scopes and runner is printed once on stdout and
    the old one is revoked. For a runner's token, start the runner with ``--token NEW``."""
    what = f"token rotate {token_id}"
    with client_for(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors(what):
        # not idempotent: a retry after the server rotated would answer 409 (old token revoked)
        issued = dict(client.request("POST", f"/tokens/{token_id}/rotate", idempotent=False).json())
    typer.echo(issued["token"])
    runner = f", runner {issued['runner_id']}" if issued.get("runner_id") else ""
    typer.echo(f"token {issued['id']} {issued['name']!r} ({', '.join(issued['scopes'])}{runner}) replaces "
               f"token {token_id}, now revoked: shown only now, store it", err=True)  # fmt: skip


@token_app.command("revoke")
def token_revoke(
    token_id: Annotated[int, typer.Argument(help="token id (kernelab token list)", min=1)],
    server: ServerOpt = DEFAULT_SERVER,
    token: TokenOpt = "",
) -> None:
    """Revoke a token: its next request gets 401. Revoking a revoked token is not an error."""
    what = f"token revoke {token_id}"
    with client_for(server, token, retries=TOKEN_RETRIES) as client, _one_line_errors(what):
        row = client.revoke_token(token_id)
    typer.echo(f"token {row['id']} {row['name']!r} revoked at {row['revoked_at']}")
