"""``kernelab serve --workers N`` listens on a socket whose accepted connections get
``TCP_NODELAY`` (uvicorn's own multi-worker socket does not, and each keep-alive response then
waited ~40 ms for the client's delayed ACK)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from kernelab.runners.local import free_port
from kernelab.service.server.serve import APP, NoDelayConfig

pytestmark = pytest.mark.timeout(60)


def test_multi_worker_listener_gives_accepted_connections_tcp_nodelay() -> None:
    port = free_port()
    config = NoDelayConfig(APP, factory=True, host="127.0.0.1", port=port, workers=2)
    listener = config.bind_socket()
    assert listener.proto == socket.IPPROTO_TCP

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        accepted: asyncio.Future[int] = loop.create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        server = await loop.create_server(Probe, sock=listener)  # as each uvicorn worker does
        try:
            _, writer = await asyncio.open_connection(*listener.getsockname()[:2])
            value = await asyncio.wait_for(accepted, 10)
            writer.close()
            return value
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(accepted_nodelay()) != 0
