"""``kernelab token create|list|revoke`` against a real ``kernelab serve`` (uvicorn subprocess, temp
SQLite file): the created token works and is listed, a revoked one gets 401, and every refusal
(bad admin token, missing scope, unknown id, unreachable server, bad scope) is one line on stderr
with a non-zero exit status and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from kernelab.runners.cli import app
from kernelab.runners.local import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def _token(url: str, token: str, *args: str):  # type: ignore[no-untyped-def]
    """``kernelab token ARGS`` in-process, server and token from the environment as a user sets them."""
    env = {"KERNELAB_SERVER": url, "KERNELAB_TOKEN": token}
    return CliRunner().invoke(app, ["token", *args], env=env)


def _refused(result, *needles: str) -> None:  # type: ignore[no-untyped-def]
    """Exit status 1, one line on stderr holding each needle, nothing on stdout, no traceback."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert isinstance(result.exception, SystemExit)  # typer.Exit, not an escaped error
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and all(n in lines[0] for n in needles), result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr


def _status(url: str, token: str) -> int:
    return httpx.get(f"{url}/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code


def test_create_list_revoke(server: tuple[str, str]) -> None:
    url, admin = server
    created = _token(url, admin, "create", "--name", "ci-bot", "--scope", "submit")
    assert created.exit_code == 0, created.stderr
    secret = created.stdout.strip()
    assert len(created.stdout.splitlines()) == 1 and "shown only now" in created.stderr
    assert _status(url, secret) == 200  # submit implies read

    listing = _token(url, admin, "list")
    assert listing.exit_code == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()]
    assert rows[0][:3] == ["ID", "NAME", "SCOPES"]
    mine = [r for r in rows[1:] if r[1] == "ci-bot"]
    assert len(mine) == 1 and mine[0][2] == "submit"
    assert secret not in listing.stdout  # only digests are kept; nothing secret is listed

    revoked = _token(url, admin, "revoke", mine[0][0])
    assert revoked.exit_code == 0 and "revoked at" in revoked.stdout, revoked.stderr
    assert _status(url, secret) == 401
    live = _token(url, admin, "list", "--live")
    assert "ci-bot" not in live.stdout and "ci-bot" in _token(url, admin, "list").stdout
    again = _token(url, admin, "revoke", mine[0][0])  # revoking twice is not an error
    assert again.exit_code == 0, again.stderr


def test_refusals_are_one_line(server: tuple[str, str]) -> None:
    url, admin = server
    _refused(_token(url, "not-a-token", "list"), "token list", "HTTP 401", "invalid or revoked token")
    reader = _token(url, admin, "create", "--name", "reader", "--scope", "read").stdout.strip()
    _refused(_token(url, reader, "create", "--name", "x", "--scope", "admin"), "HTTP 403", "admin")
    _refused(_token(url, admin, "revoke", "987654"), "HTTP 404", "token 987654 does not exist")
    _refused(_token(url, admin, "create", "--name", "", "--scope", "read"), "HTTP 422", "name")
    bad_scope = _token(url, admin, "create", "--name", "x", "--scope", "root")
    assert bad_scope.exit_code == 2 and "root" in bad_scope.stderr  # a usage error, before any request
    # a runner token is a registered runner's (tests/runners/test_cli_probe_post.py uses one)
    _refused(_token(url, reader, "create", "--name", "probe-x", "--scope", "runner"), "HTTP 403", "admin")
    no_token = CliRunner().invoke(app, ["token", "list", "--server", url], env={"KERNELAB_TOKEN": ""})
    assert no_token.exit_code == 2 and "no token" in no_token.stderr


def test_unreachable_server_as_a_real_process(tmp_path: Path) -> None:
    """The installed entry point, as a user runs it: a closed port is one line, exit status 1."""
    closed = f"http://127.0.0.1:{free_port()}"
    env = {**os.environ, "KERNELAB_SERVER": closed, "KERNELAB_TOKEN": "some-admin-token-0123456789"}
    proc = subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", "token", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "token list: server unreachable" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_server_url_without_http_fails_at_once() -> None:
    """``--server not-a-url``: one line naming the URL, exit status 1, not retried (the message
    of retried failures ends "after N retries")."""
    result = CliRunner().invoke(app, ["token", "list", "--server", "not-a-url"],
                                env={"KERNELAB_TOKEN": "some-admin-token-0123456789"})  # fmt: skip
    _refused(result, "server unreachable", "'not-a-url'", "http")
    assert "retries" not in result.stderr
