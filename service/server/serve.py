"""Running ``kernelab.app:create_app`` under uvicorn: connection limits, and one fix for
``--workers N``.

Connections (400 idle connections under ``ulimit -n 256`` would stop a bare uvicorn): uvicorn
runs ``kernelab.service.server.connection_guard.GuardedH11Protocol``, which refuses connections past
``max_connections`` (503 and close, at once) and closes a connection whose request head has not
arrived within ``header_timeout_s``; ``connection_budget`` keeps the limit (and the listen backlog) within the
file descriptors the process may open, after raising its soft ``RLIMIT_NOFILE`` to the hard limit.

``--workers N``: uvicorn binds the listening socket of a multi-worker server itself, with
``proto=0``; accepted connections inherit that, and asyncio sets ``TCP_NODELAY`` only on sockets
whose ``proto`` is ``IPPROTO_TCP``. Nagle's algorithm then stayed on: a response's body segment
waited for the client's delayed ACK of its header segment, ~40 ms on Linux, on every keep-alive
request that followed another one (uvicorn issue #3149; measured here with 200 runners and 4
workers: claim p50 62 ms instead of 20). ``NoDelayConfig.bind_socket`` re-wraps the bound
descriptor with ``IPPROTO_TCP``. The classes live at module level because uvicorn pickles the
config into each worker process.
"""

from __future__ import annotations

import contextlib
import logging
import resource
import socket
import sys
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

from kernelab.service.server.connection_guard import (
    DEFAULT_BODY_MIN_BYTES,
    DEFAULT_BODY_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
)

APP = "kernelab.app:create_app"
PROTOCOL = "kernelab.service.server.connection_guard:GuardedH11Protocol"
FD_RESERVE = 64
"""File descriptors kept for everything but client connections (listening socket, database pool
of 5 + 10 overflow connections, SQLite's WAL and shared-memory files, logs, worker pipes,
imports): the server holds about 25 when idle."""
STARTUP_FAILURE = 3  # uvicorn's exit status when the app did not start
MIN_BACKLOG = 16  # smallest listen backlog (connections the kernel queues before accept)
MAX_BACKLOG = 2048  # uvicorn's default backlog
ACCEPT_BATCHES = 3
"""Accept batches of ``backlog`` sockets that can be in flight at once in a burst: a refused
connection's descriptor is freed a few event-loop turns after its accept (measured with the
drill in ``tests/service/test_connection_drill.py``: with 1 batch, EMFILE still occurred)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionBudget:
    """How the open-file limit is shared: ``max_connections`` open client connections per
    process, and the ``backlog`` of the listening socket."""

    max_connections: int
    backlog: int


def connection_budget(wanted: int) -> ConnectionBudget:
    """The connection limit and listen backlog for ``wanted`` connections, within the soft
    ``RLIMIT_NOFILE`` (first raised to the hard limit where it is lower; an unprivileged
    process may).

    asyncio accepts up to ``backlog`` connections in one go before any of them reaches
    ``GuardedH11Protocol.connection_made`` (``BaseSelectorEventLoop._accept_connection``), so the
    descriptors needed are ``max_connections + ACCEPT_BATCHES * backlog + FD_RESERVE``:
    ``backlog`` is an eighth of the limit (between ``MIN_BACKLOG`` and uvicorn's default 2048) and
    ``max_connections`` what remains, at most ``wanted`` and at least 1. Logs a warning when the
    limit is lowered."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft == resource.RLIM_INFINITY:
        return ConnectionBudget(wanted, MAX_BACKLOG)
    backlog = max(MIN_BACKLOG, min(MAX_BACKLOG, soft // 8))
    limit = max(1, min(wanted, soft - FD_RESERVE - ACCEPT_BATCHES * backlog))
    if limit < wanted:
        log.warning("max_connections lowered from %d to %d: this process may open %d files (ulimit -n); "
                    "listen backlog %d", wanted, limit, soft, backlog)  # fmt: skip
    return ConnectionBudget(limit, backlog)


class ServeConfig(uvicorn.Config):
    """``uvicorn.Config`` with ``GuardedH11Protocol`` and its settings as attributes."""

    def __init__(self, app: Any, *, max_connections: int | None = None,
                 header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, body_min_bytes: int = DEFAULT_BODY_MIN_BYTES,
                 **options: Any):  # fmt: skip
        super().__init__(app, http=PROTOCOL, **options)
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.body_min_bytes = body_min_bytes


class NoDelayConfig(ServeConfig):
    """``ServeConfig`` whose bound TCP socket reports ``IPPROTO_TCP`` (see the module doc)."""

    def bind_socket(self) -> socket.socket:
        sock = super().bind_socket()
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
            sock.set_inheritable(True)
        return sock


def run(*, workers: int, max_connections: int = 1000, header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, body_min_bytes: int = DEFAULT_BODY_MIN_BYTES,
        **options: Any) -> None:  # fmt: skip
    """Serve ``APP`` (a factory) with ``workers`` processes; ``options`` go to ``uvicorn.Config``.

    ``max_connections``: open connections per worker process (more are answered 503 and closed;
    lowered by ``connection_budget``, which also sets the listen backlog). ``header_timeout_s``:
    seconds a connection may take to send a request head. ``body_timeout_s``, ``body_min_bytes``:
    a body still arriving must bring that many bytes per that many seconds. One worker: a ``uvicorn.Server``
    (asyncio binds that socket itself, with ``IPPROTO_TCP``); several: uvicorn's
    ``Multiprocess`` supervisor on a ``NoDelayConfig`` socket. Returns when the server stops
    (Ctrl-C / SIGTERM); exits with status 3 when the app did not start (as ``uvicorn.run``).
    uvicorn's access log is off unless ``access_log=True`` is passed: the app logs every request.
    """
    # One log line per request: the app's request log (``kernelab.service.server.observability``: method,
    # path without query, status, duration) says what uvicorn's access line says, and more.
    options.setdefault("access_log", False)
    budget = connection_budget(max_connections)
    guard: dict[str, Any] = {"max_connections": budget.max_connections, "header_timeout_s": header_timeout_s,
                             "body_timeout_s": body_timeout_s, "body_min_bytes": body_min_bytes,
                             "backlog": budget.backlog}  # fmt: skip
    if workers == 1:
        server = uvicorn.Server(ServeConfig(APP, factory=True, **guard, **options))
        with contextlib.suppress(KeyboardInterrupt):
            server.run()
        if not server.started:
            sys.exit(STARTUP_FAILURE)
        return
    config = NoDelayConfig(APP, factory=True, workers=workers, **guard, **options)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is a normal stop
        Multiprocess(config, sockets=[config.bind_socket()]).run()
