"""Connection drill: under ``ulimit -n 256``, 400 idle connections stopped the server (``Too many
open files``). A real ``kernelab serve`` runs with RLIMIT_NOFILE 256 (``resource.setrlimit`` in
``preexec_fn``); the drill opens 400 idle TCP connections to it, then asks ``/healthz`` on fresh
connections while they are open, after the header timeout, and after they are closed. The server
must answer (200, or 503 past its connection limit), recover, and never exit.

The tally is printed (``-s``) and recorded in ``docs/results/2026-12-01-connection-drill.md``.
"""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import serve_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NOFILE = 256  # the attack's `ulimit -n 256`
IDLE = 400  # idle connections the attack opened
HEADER_TIMEOUT_S = 3.0  # the drill server's KERNELAB_HEADER_TIMEOUT_S (short, to keep the drill short)
TOKEN = "drill-admin-token-0123456789abcdef"


def _limit_files() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    env = {"KERNELAB_ADMIN_TOKEN": TOKEN, "KERNELAB_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)}
    with serve_process(tmp_path, env, preexec_fn=_limit_files) as served:
        yield served


def _health(port: int, timeout_s: float = 5.0) -> str:
    """One ``GET /healthz`` on a fresh connection: its status code, or what went wrong."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: drill\r\nConnection: close\r\n\r\n")
            answer = sock.recv(64)
    except TimeoutError:
        return "timeout"
    except OSError as exc:
        return type(exc).__name__
    return answer.split(b" ")[1].decode() if answer.startswith(b"HTTP/1.1 ") else "closed"


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (read to EOF: a 503 answer, then the close, counts)."""
    sock.setblocking(False)
    try:
        while sock.recv(4096):
            pass
        return True  # EOF
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_idle_connections_past_the_file_limit_do_not_stop_the_server(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc, url, log_path = server
    port = int(url.rsplit(":", 1)[1])
    idle: list[socket.socket] = []
    connect_errors: Counter[str] = Counter()
    for _ in range(IDLE):
        try:
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError as exc:
            connect_errors[type(exc).__name__] += 1
    time.sleep(0.5)
    during = Counter(_health(port) for _ in range(5))
    time.sleep(HEADER_TIMEOUT_S + 2)
    closed_by_server = sum(_closed_by_server(s) for s in idle)
    after_timeout = Counter(_health(port) for _ in range(5))
    for s in idle:
        s.close()
    time.sleep(1.0)
    after_close = Counter(_health(port) for _ in range(5))
    alive = proc.poll() is None
    emfile = log_path.read_text(errors="replace").count("Too many open files")
    tally = {"nofile": NOFILE, "idle_opened": len(idle), "connect_errors": dict(connect_errors),
             "healthz_while_open": dict(during),
             "idle_closed_by_server_after_header_timeout": closed_by_server,
             "healthz_after_header_timeout": dict(after_timeout), "healthz_after_close": dict(after_close),
             "server_alive": alive, "emfile_log_lines": emfile}  # fmt: skip
    print("connection drill tally:", json.dumps(tally))
    (tmp_path / "tally.json").write_text(json.dumps(tally))
    assert alive, log_path.read_text()[-3000:]
    assert set(during) <= {"200", "503"} and during["200"] + during["503"] == 5, tally
    assert closed_by_server == len(idle), tally  # no connection stays open without sending a request
    assert after_timeout == {"200": 5} and after_close == {"200": 5}, tally
    assert emfile == 0, tally


def test_a_slowloris_request_head_is_cut_off(server) -> None:  # type: ignore[no-untyped-def]
    """A client that sends its request head one byte at a time never completes it: the header
    timeout counts from the first byte, so trickling bytes does not keep the connection."""
    _proc, url, _log = server
    port = int(url.rsplit(":", 1)[1])
    head = b"GET /healthz HTTP/1.1\r\nHost: drill\r\nX-Slow: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        started = time.monotonic()
        closed = False
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            if _closed_by_server(sock):
                closed = True
                break
            sock.setblocking(True)
            sock.settimeout(2)
            time.sleep(0.1)
        assert closed, "the server kept a connection whose request head never completed"
        assert time.monotonic() - started < HEADER_TIMEOUT_S + 2
