"""The attack: with ``KERNELAB_MAX_CONNECTIONS=50``, 60 sockets that sent the head
of ``POST /login`` (``Content-Length: 4000``) and then one byte every 5 s held every connection
with no token: ``/healthz`` answered 503 for the whole attack. The header timeout did not cover
bodies; the body floor rate (``kernelab.service.server.connection_guard``) closes them.

A real ``kernelab serve`` (SQLite, one worker) with a 10-connection limit and a 2 s body window;
15 slow sign-in bodies; ``/healthz`` on fresh connections must be answered 200 again within a few
windows, the slow sockets closed by the server, and a body that arrives at a normal pace (chunks
of 16 KiB, faster than the floor) still accepted.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

LIMIT = 10  # KERNELAB_MAX_CONNECTIONS of the server
SLOW = 15  # slow sockets, more than the limit
WINDOW_S = 2.0  # KERNELAB_BODY_TIMEOUT_S
TOKEN = "slow-body-admin-token-0123456789abcdef"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    env = {"KERNELAB_ADMIN_TOKEN": TOKEN, "KERNELAB_MAX_CONNECTIONS": str(LIMIT),
           "KERNELAB_BODY_TIMEOUT_S": str(WINDOW_S)}  # fmt: skip
    with serve_process(tmp_path, env) as (_, url, _log):
        yield int(url.rsplit(":", 1)[1])


def _health(port: int) -> str:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
            answer = sock.recv(64)
    except OSError as exc:
        return type(exc).__name__
    return answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/1.1 ") else "closed"


def _closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_slow_sign_in_bodies_cannot_hold_every_connection(server: int) -> None:
    port = server
    head = (b"POST /login HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-www-form-urlencoded\r\n"
            b"Content-Length: 4000\r\n\r\ntoken=")  # fmt: skip
    slow = []
    for _ in range(SLOW):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(head)
        slow.append(sock)
    time.sleep(0.5)
    assert _health(port) != "200"  # the attack works for now: every connection is held
    answers = []
    deadline = time.monotonic() + 6 * WINDOW_S
    while time.monotonic() < deadline:
        for sock in slow:
            try:
                sock.sendall(b"x")  # one byte per socket every 0.5 s: far below the floor
            except OSError:
                pass
        answers.append(_health(port))
        if answers[-1] == "200" and all(_closed(s) for s in slow):
            break
        time.sleep(0.5)
    closed = sum(_closed(s) for s in slow)
    for sock in slow:
        sock.close()
    assert answers[-1] == "200", answers
    assert closed == SLOW, f"{closed} of {SLOW} slow sockets closed by the server; answers {answers}"


def test_a_body_at_a_normal_pace_is_read_whole(server: int) -> None:
    # 48 KiB in 16 KiB chunks, one per 0.5 s: three windows' worth of the floor, over 1.5 s
    body = b"x" * (48 * 1024)
    with socket.create_connection(("127.0.0.1", server), timeout=10) as sock:
        sock.sendall(b"POST /api/v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")  # fmt: skip
        for i in range(0, len(body), 16 * 1024):
            sock.sendall(body[i : i + 16 * 1024])
            time.sleep(0.5)
        answer = sock.recv(64)
    assert answer.startswith(b"HTTP/1.1 422"), answer  # read whole, then refused as not JSON
