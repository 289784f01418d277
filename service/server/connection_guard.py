"""``GuardedH11Protocol``: uvicorn's h11 protocol with a connection limit and a request-head
timeout, so idle or slow connections cannot use up the server's file descriptors.

Under ``ulimit -n 256``, 400 idle TCP connections make a bare uvicorn's ``accept()`` fail with
EMFILE (``Too many open files``, logged some 460,000 times in 90 s) and ``/healthz`` go unanswered
until the client closes them: uvicorn arms no timer on a connection before its first request (its
keep-alive timer starts after a response), and ``limit_concurrency`` is checked only when a
request arrives, so a connection that sends nothing is never refused or closed.

* **Connection limit** (``max_connections``, per worker process): a connection accepted while
  that many are open is answered ``503`` with ``Retry-After`` at once and closed, so its file
  descriptor is released immediately; the limit is kept below the process's ``RLIMIT_NOFILE``
  by ``kernelab.service.server.serve.connection_budget``, so ``accept()`` itself never runs out.
* **Request-head timeout** (``header_timeout_s``): a connection whose request line and headers
  have not all arrived within that many seconds of its first byte (or of its opening) is closed,
  whether it sends nothing or trickles bytes (slowloris). Idle keep-alive connections stay under
  uvicorn's ``timeout_keep_alive``.
* **Request-body floor rate** (``body_timeout_s``, ``body_min_bytes``): while a request's body is
  still arriving, every ``body_timeout_s`` seconds at least ``body_min_bytes`` more of it must have
  arrived, or the connection is closed (the app's ``receive`` then reports a disconnect). Without
  it, with ``KERNELAB_MAX_CONNECTIONS=50``, 60 sockets that send the head of ``POST /login`` with
  ``Content-Length: 4000`` and then one byte every 5 s hold every connection, without a token,
  and ``/healthz`` answers 503 throughout. A window in which uvicorn has paused
  reading (the app has not taken the bytes it has) does not count against the client.

Selected with ``uvicorn.Config(http="kernelab.service.server.connection_guard:GuardedH11Protocol")``; the four
numbers are attributes of the config (``kernelab.service.server.serve.ServeConfig``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT_S = 10.0  # a request head takes well under a second on any real link
DEFAULT_BODY_TIMEOUT_S = 10.0  # the floor rate's window, seconds
DEFAULT_BODY_MIN_BYTES = 16 * 1024
"""Bytes a body still arriving must bring per ``DEFAULT_BODY_TIMEOUT_S`` window: 1.6 KiB/s, far
below any link a runner or a browser posts on (a 64 MiB body at that floor takes 11 hours), and
more than the sign-in form's whole 4 KiB, so an unauthenticated body gets one window at most."""
BUSY_RETRY_AFTER_S = 1  # Retry-After of the 503 past the connection limit, seconds
_BUSY_BODY = b"the server has too many open connections; retry shortly\n"
BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"retry-after: " + str(BUSY_RETRY_AFTER_S).encode() + b"\r\nconnection: close\r\n"
    b"content-length: " + str(len(_BUSY_BODY)).encode() + b"\r\n\r\n" + _BUSY_BODY
)


class GuardedH11Protocol(H11Protocol):
    """``H11Protocol`` plus the connection limit, request-head timeout and body floor rate of the
    module doc."""

    def __init__(self, config: Any, server_state: Any, app_state: dict[str, Any],
                 _loop: asyncio.AbstractEventLoop | None = None) -> None:  # fmt: skip
        super().__init__(config, server_state, app_state, _loop)
        self.max_connections: int | None = getattr(config, "max_connections", None)
        self.header_timeout_s: float = getattr(config, "header_timeout_s", DEFAULT_HEADER_TIMEOUT_S)
        self.body_timeout_s: float = getattr(config, "body_timeout_s", DEFAULT_BODY_TIMEOUT_S)
        self.body_min_bytes: int = getattr(config, "body_min_bytes", DEFAULT_BODY_MIN_BYTES)
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_cycle: object | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_cycle: object | None = None
        self._body_bytes = 0  # bytes received since the body window began

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        super().connection_made(transport)  # type: ignore[arg-type]
        if self.max_connections is not None and len(self.connections) > self.max_connections:
            self.logger.warning("refused a connection: %d open, the limit is %d", len(self.connections) - 1,
                                self.max_connections)  # fmt: skip
            self.transport.write(BUSY_RESPONSE)
            self.transport.close()
            return
        self._arm()

    def _arm(self) -> None:
        self._head_cycle = self.cycle
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def _body_pending(self) -> bool:
        """Whether the body of the request whose window runs is still arriving."""
        cycle = self.cycle
        return (
            cycle is not None
            and cycle is self._body_cycle
            and bool(cycle.more_body)
            and not cycle.response_complete
        )

    def _arm_body(self) -> None:
        self._body_cycle = self.cycle
        self._body_bytes = 0
        self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_window_ended)

    def _disarm_body(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_window_ended(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or not self._body_pending():
            return
        if self._body_bytes < self.body_min_bytes and not self.flow.read_paused:
            self.logger.warning("closed a connection whose request body arrived too slowly: %d bytes in "
                                "%.1f s (at least %d are needed)", self._body_bytes, self.body_timeout_s,
                                self.body_min_bytes)  # fmt: skip
            self.transport.close()
            return
        self._arm_body()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and (self.cycle is None or self.cycle.response_complete):
            self._arm()  # the first bytes of the next request on a kept-alive connection
        self._body_bytes += len(data)
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._head_cycle:
            self._disarm()  # a request's head arrived whole: the app has it now
            self._disarm_body()
            if self.cycle is not None and self.cycle.more_body:
                self._arm_body()  # its body is still to come

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_body()
        super().connection_lost(exc)
