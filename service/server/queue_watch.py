"""Where long-polling claims wait: one queue read per server process and wake-up, not one per runner.

A claim that finds no job registers a waiter here (``QueueWatch.wait``). While any waiter exists,
one asyncio task of the process reads ``queue.claimable`` (one indexed query, however many
runners wait) and wakes as many waiters as there are claimable jobs their device can run, the
longest-waiting first. A woken waiter tries one claim; when another process took the job first it
waits again. With no waiter the task ends, so an idle server queries nothing.

The task reads the queue when the database says a job became queued, and at the latest every
``poll_s`` seconds (a lease that ran out makes a job claimable without any write):

* PostgreSQL: a trigger of ``jobs`` (migration ``0020_queue_notify``) sends
  ``NOTIFY kernelab_queue`` when a row is inserted or updated with ``status = 'queued'``;
  PostgreSQL delivers it when the writing transaction commits, to every listening session. Each
  server process keeps one ``LISTEN kernelab_queue`` connection (psycopg's ``notifies()``), so a
  submit through any process, the CLI or SQL wakes waiting claims in every process.
* SQLite: every connection of a server process has TEMP triggers that call a function of the
  process (``kernelab.service.server.core.db``); after the writing session commits, the process's
  watches read the queue. This covers one server process (``kernelab up``, ``kernelab serve``
  with one worker); a job written by another process is seen within ``poll_s``.

From a submit's answer to a waiting claim's answer: p50 13-15 ms, p99 about 60 ms, with 200
simulated runners, the server and PostgreSQL on one 2-core machine (``benchmarks/server_load.py``,
``docs/results/2026-12-04-server-load-wakeup.md``; the 0.25 s poll alone gave p50 80 ms). Sources: PostgreSQL
manual, "NOTIFY" and "LISTEN"; psycopg 3, "Asynchronous notifications".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from fastapi.concurrency import run_in_threadpool
from sqlalchemy import event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kernelab.service.server import queue
from kernelab.service.server.core import db

log = logging.getLogger(__name__)

CHANNEL = "kernelab_queue"
"""The PostgreSQL notification channel of the ``jobs`` trigger (migration ``0020_queue_notify``)."""
HEAD_START_KEYS = 4  # a notification wakes the longest waiter of at most this many keys at once
LISTEN_RETRY_S = (0.5, 5.0)  # reconnect back-off of a lost LISTEN connection: first, longest

_WATCHES: weakref.WeakSet[QueueWatch] = weakref.WeakSet()  # this process's watches (SQLite pokes)


@event.listens_for(Session, "after_commit")
def _after_commit(_session: Session) -> None:
    """A SQLite transaction of this process that queued a job committed: every watch reads the
    queue now (``db.QUEUE_CHANGED`` is set by the TEMP triggers of ``db.make_engine``)."""
    if db.QUEUE_CHANGED.is_set():
        db.QUEUE_CHANGED.clear()
        for watch in list(_WATCHES):
            watch.poke()


WatchKey = tuple[str | None, tuple[tuple[str, str], ...] | None]
"""What a waiting claimer can take: its device type and its advertised ``(benchmark, schema
digest)`` pairs (None: any benchmark; ``kernelab.service.server.offers``)."""


@dataclass(eq=False)
class _Waiter:
    key: WatchKey
    woken: asyncio.Event = field(default_factory=asyncio.Event)


class QueueWatch:
    """The waiting claimers of one process and the task that wakes them.

    ``factory``: the app's session factory. ``poll_s``: seconds between two reads of the queue
    while someone waits (``KERNELAB_CLAIM_POLL_S``). Use from the event loop it was built on.
    """

    def __init__(self, factory: sessionmaker[Session], *, poll_s: float):
        self.factory = factory
        self.poll_s = float(poll_s)
        self.loop = asyncio.get_running_loop()
        self.polls = 0  # reads of the queue so far (for tests and debugging)
        self.notified = 0  # wake-ups from the database (NOTIFY or a SQLite trigger) so far
        self.listening = False  # a PostgreSQL LISTEN connection is open
        self._waiters: list[_Waiter] = []  # arrival order
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._kick = asyncio.Event()  # read the queue now (a notification, or closing)
        self._listener: asyncio.Task[None] | None = None
        engine = factory.kw.get("bind")
        if engine is not None and engine.dialect.name == "postgresql":
            conninfo = engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
            self._listener = asyncio.create_task(self._listen(conninfo), name="kernelab-queue-listen")
        _WATCHES.add(self)

    def __repr__(self) -> str:
        return (f"<QueueWatch waiting={len(self._waiters)} polls={self.polls} notified={self.notified} "
                f"listening={self.listening} poll_s={self.poll_s:g}>")  # fmt: skip

    @property
    def waiting(self) -> int:
        """How many claimers wait right now."""
        return len(self._waiters)

    async def wait(self, key: WatchKey | str | None, timeout_s: float) -> bool:
        """Wait until a job a runner of ``key`` (device type and advertised benchmarks, or a
        device type alone: any benchmark) can run is claimable (True), or at most ``timeout_s``
        seconds (False). True is a hint, not a promise: another claimer may win."""
        if self._closing.is_set():
            return False
        waiter = _Waiter(key if isinstance(key, tuple) else (key, None))
        self._waiters.append(waiter)
        if self._task is None:
            self._task = asyncio.create_task(self._poll(), name="kernelab-queue-watch")
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await waiter.woken.wait()
        except TimeoutError:
            pass
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        return waiter.woken.is_set() and not self._closing.is_set()

    def poke(self) -> None:
        """The queue changed: read it now instead of at the next ``poll_s`` tick. Safe from any
        thread; a no-op once the watch's event loop is closed."""
        try:
            self.loop.call_soon_threadsafe(self._notify)
        except RuntimeError:  # the loop is closed (an app whose server stopped)
            pass

    def _notify(self) -> None:
        """A job became queued: wake the longest waiter of each waiting key now, ahead of the read
        (which then wakes as many more as there are jobs); a waiter that finds no job waits again."""
        self.notified += 1
        self._kick.set()
        heads: dict[WatchKey, _Waiter] = {}
        for waiter in self._waiters:
            if len(heads) == HEAD_START_KEYS:
                break
            heads.setdefault(waiter.key, waiter)
        for waiter in heads.values():
            self._waiters.remove(waiter)
            waiter.woken.set()

    async def aclose(self) -> None:
        """Stop: waiting claims return (``wait`` answers False), the LISTEN connection closes and
        the poll task ends after its read in flight, if any, so no connection outlives the app's
        engine."""
        self._closing.set()
        self._kick.set()
        _WATCHES.discard(self)
        for waiter in self._waiters:
            waiter.woken.set()
        if self._listener is not None:
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        if self._task is not None:
            await self._task

    async def _listen(self, conninfo: str) -> None:
        """Hold ``LISTEN kernelab_queue`` and poke on every notification; reconnect after a lost
        connection (the database restarted): meanwhile the ``poll_s`` reads go on."""
        import psycopg  # the PostgreSQL driver; only a PostgreSQL server gets here

        retry_s = LISTEN_RETRY_S[0]
        while not self._closing.is_set():
            try:
                connection: Any = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
                async with connection:
                    await connection.execute(f"LISTEN {CHANNEL}")
                    self.listening, retry_s = True, LISTEN_RETRY_S[0]
                    self._kick.set()  # read once: a job queued before LISTEN took effect
                    async for _ in connection.notifies():
                        self._notify()
            except (psycopg.Error, OSError) as exc:
                log.warning("queue watch: LISTEN %s failed (%s); polling every %g s meanwhile",
                            CHANNEL, exc, self.poll_s)  # fmt: skip
            finally:
                self.listening = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), retry_s)
            retry_s = min(retry_s * 2, LISTEN_RETRY_S[1])

    def _read(self, wanted: dict[WatchKey, int]) -> dict[WatchKey, int]:
        """How many claimable jobs there are for each waiting key, up to the number of its
        waiters (one indexed query per distinct key: device types times the fleet's distinct
        advertisements, a handful)."""
        with self.factory() as session:
            return {
                key: queue.claimable(session, device_type=key[0], offers=key[1], limit=n)
                for key, n in wanted.items()
            }

    async def _poll(self) -> None:
        try:
            while self._waiters and not self._closing.is_set():
                with contextlib.suppress(TimeoutError):  # poll_s, or less: a notification, closing
                    await asyncio.wait_for(self._kick.wait(), self.poll_s)
                self._kick.clear()  # a notification during the read below sets it again
                if not self._waiters or self._closing.is_set():
                    break
                wanted = Counter(w.key for w in self._waiters)
                try:
                    found = await run_in_threadpool(self._read, dict(wanted))
                except SQLAlchemyError as exc:  # the database is down: waiters time out; try next tick
                    log.warning("queue watch: reading the queue failed: %s", exc)
                    continue
                self.polls += 1
                self._wake(found)
        finally:
            self._task = None

    def _wake(self, found: dict[WatchKey, int]) -> None:
        """Wake, per key, as many of its longest-waiting claimers as jobs were found."""
        for key, n in found.items():
            chosen = [w for w in self._waiters if w.key == key][:n]
            for waiter in chosen:
                self._waiters.remove(waiter)
                waiter.woken.set()
