"""A running job's progress, as its runner's heartbeats carry it (``schemas.JobProgress``).

The measuring code reports ``progress(cell index, cell count, message)`` (``kernelab.runners.
pipeline.run_cells``, the engine's rounds, ``run_job``'s probes); the worker prints each as a
``progress: [i/n] message`` line (``kernelab.runners.worker``); the daemon's supervisor reads them
(``parse_line``) into a ``ProgressTracker``, whose ``snapshot`` goes with every lease heartbeat.

The phase is the message's first word, from the fixed vocabulary the pipeline writes
(``PHASE_WORDS``); a message with another first word (a side's own note) keeps the phase.
ETA: the mean wall time of the cells finished so far times the cells left (a cell's time is
bounded by the spec's ``warmup_ms`` and ``budget_ms`` plus its checks, so cells of one sweep take
similar times; the first cell also pays the imports and compiles, so the ETA errs long).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

from kernelab.service.contract.schemas import JobProgress
from kernelab.service.contract.schemas.adverts import ProgressPhase
from kernelab.service.contract.units import format_seconds

PHASE_WORDS: dict[str, ProgressPhase] = {
    "fetching": "fetching",
    "cell": "starting",
    "preparing": "preparing",
    "correctness": "correctness",
    "warm-up": "warm-up",
    "measuring": "measuring",
    "round": "measuring",
    "checks": "checks",
    "done:": "cell-done",
    "static": "static-metrics",
}
"""First word of a progress message -> phase (``probes before``/``probes after`` by ``phase_of``)."""
_LINE = re.compile(r"progress: \[(\d+)/(\d+)\] (.*)")
MESSAGE_CHARS = 500  # JobProgress.message's bound
ProgressCallback = Callable[[int, int, str], None]
"""``progress(cell index (0-based), cell count, message)``: how the measuring code reports a step
(``run_job``, ``measure_cells``, ``run_revision_job``; a measuring child's ``progress:`` lines)."""


def phase_of(message: str) -> ProgressPhase | None:
    """The phase a progress ``message`` starts (None: a message that names none)."""
    words = message.split(maxsplit=2)
    if not words:
        return None
    if words[0] == "probes" and len(words) > 1 and words[1] in ("before", "after"):
        return "probes-before" if words[1] == "before" else "probes-after"
    return PHASE_WORDS.get(words[0])


def parse_line(line: str) -> tuple[int, int, str] | None:
    """``(cell index, cell count, message)`` of a worker's ``progress: [i/n] message`` line (``i``
    1-based there, 0-based here); None for any other line."""
    match = _LINE.fullmatch(line.rstrip("\n"))
    if match is None:
        return None
    return int(match[1]) - 1, int(match[2]), match[3]


class ProgressTracker:
    """The latest progress of one job, fed from the worker's lines, read by the heartbeat thread
    (thread-safe). ``clock``: seconds, monotonic (``time.monotonic``)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._t0 = clock()
        self._first_cell_at: float | None = None
        self._cell, self._cells, self._done = 0, 0, 0
        self._phase: ProgressPhase | None = None
        self._message = ""

    def update(self, index: int, count: int, message: str) -> None:
        """Record one progress report of cell ``index`` (0-based) of ``count``."""
        phase = phase_of(message)
        with self._lock:
            if self._first_cell_at is None and phase == "starting":
                self._first_cell_at = self._clock()
            self._cell, self._cells = max(0, index), max(0, count)
            if phase == "cell-done":
                self._done = max(self._done, index + 1)
            self._phase = phase or self._phase
            self._message = " ".join(message.split())[:MESSAGE_CHARS]

    def snapshot(self) -> JobProgress | None:
        """The progress now (None before the first report)."""
        with self._lock:
            if self._phase is None:
                return None
            now = self._clock()
            eta = None
            if self._done and self._first_cell_at is not None and self._phase != "probes-after":
                per_cell = (now - self._first_cell_at) / self._done
                eta = per_cell * max(0, self._cells - self._done)
            return JobProgress(
                cell=min(self._cell, self._cells), cells=self._cells, cells_done=min(self._done, self._cells),
                phase=self._phase, message=self._message, elapsed_s=max(0.0, now - self._t0), eta_s=eta,
            )  # fmt: skip


def describe(progress: JobProgress) -> str:
    """One line for a person: ``cell 3/8 · measuring · 2 done · ETA 41 s · round 12: ratio ...``."""
    parts = [f"cell {min(progress.cell + 1, progress.cells)}/{progress.cells}", progress.phase]
    parts.append(f"{progress.cells_done} done")
    if progress.eta_s is not None:
        parts.append(f"ETA {format_seconds(progress.eta_s)}")
    line = " · ".join(parts)
    return f"{line} · {progress.message}" if progress.message else line
