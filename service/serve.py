"""Running ``service.app:create_app`` under uvicorn, with one fix for ``--workers N``.

uvicorn binds the listening socket of a multi-worker server itself, with ``proto=0``; accepted
connections inherit that, and asyncio sets ``TCP_NODELAY`` only on sockets whose ``proto`` is
``IPPROTO_TCP``. Nagle's algorithm then stayed on: a response's body segment waited for the
client's delayed ACK of its header segment, ~40 ms on Linux, on every keep-alive request that
followed another one (uvicorn issue #3149; measured here with 200 runners and 4 workers: claim
p50 62 ms instead of 20). ``NoDelayConfig.bind_socket`` re-wraps the bound descriptor with
``IPPROTO_TCP``. The class lives at module level because uvicorn pickles the config into each
worker process.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

import uvicorn
from uvicorn.supervisors import Multiprocess

APP = "service.app:create_app"


class NoDelayConfig(uvicorn.Config):
    """``uvicorn.Config`` whose bound TCP socket reports ``IPPROTO_TCP`` (see the module doc)."""

    def bind_socket(self) -> socket.socket:
        sock = super().bind_socket()
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock = socket.socket(sock.family, sock.type, socket.IPPROTO_TCP, fileno=sock.detach())
            sock.set_inheritable(True)
        return sock


def run(*, workers: int, **options: Any) -> None:
    """Serve ``APP`` (a factory) with ``workers`` processes; ``options`` go to ``uvicorn.Config``.

    One worker: ``uvicorn.run`` as is (asyncio binds that socket itself, with ``IPPROTO_TCP``).
    Several: uvicorn's ``Multiprocess`` supervisor on a ``NoDelayConfig`` socket. Returns when the
    server stops (Ctrl-C / SIGTERM).
    """
    if workers == 1:
        uvicorn.run(APP, factory=True, **options)
        return
    config = NoDelayConfig(APP, factory=True, workers=workers, **options)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run: Ctrl-C is a normal stop
        Multiprocess(config, sockets=[config.bind_socket()]).run()
