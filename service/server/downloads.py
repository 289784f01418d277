"""Streaming a large download without holding a pooled database connection, and at most a few
downloads at once per client.

A client that reads slowly (or stalls) keeps its response open for as long as it likes. The
response must then hold nothing the other requests need: ``fetched`` reads the data in short
sessions, one per batch, each closed *before* the batch is turned into text and handed to the
client, so a stalled reader holds a suspended generator and the text of one chunk, never a
connection (with a pool of 15 connections, 15 stalled readers held every connection and every
other request waited for the pool's timeout, then failed).

``DownloadSlots`` bounds the downloads one client (one token) runs at once in this process;
``SlotStreamingResponse`` takes a slot when it starts and gives it back when it ends, however it
ends (sent, client gone, error), so no slot is ever held by a response that was not served.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from sqlalchemy.orm import Session, sessionmaker
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Receive, Scope, Send

B = TypeVar("B")
T = TypeVar("T")


def fetched(
    factory: sessionmaker[Session], batches: Iterable[B], read: Callable[[Session, B], list[T]]
) -> Iterator[T]:
    """The items ``read(session, batch)`` returns for each of ``batches``, in order, each batch
    read in a session of its own that is closed before its first item is yielded."""
    for batch in batches:
        with factory() as session:
            items = read(session, batch)
        yield from items


class DownloadSlots:
    """At most ``per_client`` downloads at once per client key (a token id) in this process.

    Thread-safe (sync routes run in a thread pool). ``acquire`` and ``release`` pair up.
    """

    def __init__(self, per_client: int):
        self.per_client = int(per_client)
        self._active: Counter[Any] = Counter()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<DownloadSlots per_client={self.per_client} active={sum(self._active.values())}>"

    def active(self, client: Any) -> int:
        """How many downloads ``client`` runs now."""
        with self._lock:
            return self._active[client]

    def acquire(self, client: Any) -> bool:
        """Take a slot for ``client``; False when it already runs ``per_client`` downloads."""
        with self._lock:
            if self._active[client] >= self.per_client:
                return False
            self._active[client] += 1
            return True

    def release(self, client: Any) -> None:
        """Give back a slot taken by ``acquire``."""
        with self._lock:
            self._active[client] -= 1
            if self._active[client] <= 0:
                del self._active[client]


class SlotStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that runs only in one of ``client``'s ``slots``: taken when the
    response starts, given back once it has been served (body sent whole, client gone or sending
    failed). Without a free slot it answers 429 with ``Retry-After: retry_after_s`` instead."""

    def __init__(self, content: Any, *, slots: DownloadSlots, client: Any, retry_after_s: int, **kwargs: Any):
        super().__init__(content, **kwargs)
        self.slots, self.client, self.retry_after_s = slots, client, retry_after_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.slots.acquire(self.client):
            detail = f"this token already runs {self.slots.per_client} downloads; retry when one has ended"
            refused = JSONResponse({"detail": detail}, status_code=429,
                                   headers={"Retry-After": str(self.retry_after_s)})  # fmt: skip
            await refused(scope, receive, send)
            return
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slots.release(self.client)
