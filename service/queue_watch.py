"""Where long-polling claims wait: one database poll per server process, not one per runner.

A claim that finds no job registers a waiter here (``QueueWatch.wait``). While any waiter exists,
one asyncio task of the process reads ``queue.claimable`` every ``poll_s`` seconds (one indexed
query, however many runners wait) and wakes as many waiters as there are claimable jobs their
device can run, the longest-waiting first. A woken waiter tries one claim; when another process
took the job first it waits again. With no waiter the task ends, so an idle server queries nothing.

The cost is ``processes / poll_s`` queries per second instead of ``waiting runners / poll_s``
claim transactions (200 idle runners at a 0.25 s poll were 800 transactions/s); a job submitted
while runners wait is claimed within about ``poll_s``. Works the same on SQLite and PostgreSQL
and with any number of uvicorn workers, since every process watches the database itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field

from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kernelab.service import queue

log = logging.getLogger(__name__)


WatchKey = tuple[str | None, tuple[tuple[str, str], ...] | None]
"""What a waiting claimer can take: its device type and its advertised ``(benchmark, schema
digest)`` pairs (None: any benchmark; ``kernelab.service.offers``)."""


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
        self._waiters: list[_Waiter] = []  # arrival order
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()

    def __repr__(self) -> str:
        return f"<QueueWatch waiting={len(self._waiters)} polls={self.polls} poll_s={self.poll_s:g}>"

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

    async def aclose(self) -> None:
        """Stop: waiting claims return (``wait`` answers False) and the poll task ends after its
        read in flight, if any, so no pooled connection outlives the app's engine."""
        self._closing.set()
        for waiter in self._waiters:
            waiter.woken.set()
        if self._task is not None:
            await self._task

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
                with contextlib.suppress(TimeoutError):  # sleep poll_s, or less when closing
                    await asyncio.wait_for(self._closing.wait(), self.poll_s)
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
