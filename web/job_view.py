"""What the job page shows of a stored result, built once per result and kept per process.

A stored result never changes and its comparison (``results.comparison``, without node-health
flags) is stored once, so the parsed comparison, the samples figure and each cell's timeline
figure are cached per result, keyed by ``(result id, received_at)``. Node-health flags come from
the result's stored judgement (``kernelab.service.server.node_health.job_judgement``: judged once, re-judged
only
when asked), read on every render; the comparison with them is cached under the flags and notes it
got, so an explicit re-judgement shows at once.

The cache lives on the app (``JobPageCache.of(app)``): one per process and per database, bounded
to the ``PAGE_CACHE_RESULTS`` most recently shown results. Nothing here computes statistics that
are not stored: a comparison is computed by a compare worker (``kernelab.service.server.compare_worker``);
until it is stored the page says "comparing…".
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from markupsafe import Markup
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    VERDICT_CATALOGUE,
    CellComparison,
    Comparison,
    CorrectnessResult,
    JobResult,
    Side,
    TimedCheck,
    VerdictEntry,
)
from kernelab.service.judge.report import cross_check_line, energy_line
from kernelab.service.server import crud, models, node_health
from kernelab.service.server.core.config import Settings
from kernelab.web import figures

PAGE_CACHE_RESULTS = 16  # results whose page data a process keeps (a 1,000-cell one: ~10 MB)
TIMELINES_PER_RESULT = 64  # timeline figures kept per result (one per cell shown)
VIEWS_PER_RESULT = 4  # node-health states kept per result
CELLS_PER_PAGE = 100  # rows of the before/after table per page
CellOrder = Literal["worst", "index", "slowest", "fastest", "flagged"]
DEFAULT_ORDER: CellOrder = "worst"
CELL_ORDERS: dict[CellOrder, str] = {
    "worst": "worst first",
    "index": "sweep order",
    "slowest": "slowest first",
    "fastest": "fastest first",
    "flagged": "flagged first",
}
"""Orders of the before/after table (query ``order``) and their link texts: ``worst`` (the default)
puts the cells a gate fails on first, problem verdicts (failed, incorrect, ...) in catalogue order
then slower cells, then undecided ones, then the rest (same, faster), each group after the problems
by Δ % descending; ``slowest`` sorts by
Δ % descending (the candidate's worst regression first), ``fastest`` ascending, cells without a
Δ last; ``flagged`` puts cells with a flag, an error or a failed correctness check first."""

_cache_lock = threading.Lock()


@dataclass(frozen=True)
class ResultRow:
    """The columns of a job's ``results`` row the page needs, without the comparison JSON."""

    id: int
    received_at: datetime
    has_comparison: bool
    error: str | None
    node_name: str  # the hostname the result (and its probe reports) is filed under


def result_row(*, session: Session, job_id: int) -> ResultRow | None:
    """``ResultRow`` of ``job_id``'s stored result; None when the job has no result. One query that
    reads neither the comparison JSON nor any sample."""
    row = session.execute(
        select(models.Result.id, models.Result.received_at, models.Result.comparison.is_not(None),
               models.Result.error, models.Result.node_name).where(models.Result.job_id == job_id)
    ).first()  # fmt: skip
    return None if row is None else ResultRow(row[0], row[1], bool(row[2]), row[3], row[4])


@dataclass
class JobView:
    """A comparison with its node-health flags and what the page derives from it (all cells)."""

    comparison: Comparison
    drawable: list[int]  # indices of the cells with at least one sample, sweep order
    flagged: int  # cells with a flag, an error or a failed correctness check
    _orders: dict[str, list[CellComparison]] = field(default_factory=dict)
    sweep: dict[Any, Any] = field(default_factory=dict)  # kernelab.web.sweep_view's figures of it

    def ordered(self, order: CellOrder) -> list[CellComparison]:
        """The cells in ``order`` (``CELL_ORDERS``), computed once per order."""
        if order not in self._orders:
            self._orders[order] = _sorted_cells(self.comparison.cells, order)
        return self._orders[order]


def _flagged(cell: CellComparison) -> bool:
    return bool(cell.flags or cell.error or any(not c.passed for c in cell.correctness.values()))


def _worst_group(entry: VerdictEntry) -> int:
    """0: a problem verdict; 1: a decided verdict the default gate fails on (slower); 2: undecided;
    3: the rest (same, faster)."""
    if entry.kind == "problem":
        return 0
    if entry.gate == "default":
        return 1
    return 2 if entry.kind == "undecided" else 3


# problems among themselves in catalogue order (failed before incorrect ...); every other group by Δ %
_WORST_RANK = {
    e.name: (_worst_group(e), i if e.kind == "problem" else 0) for i, e in enumerate(VERDICT_CATALOGUE)
}


def _sorted_cells(cells: Sequence[CellComparison], order: CellOrder) -> list[CellComparison]:
    if order == "worst":
        return sorted(
            cells, key=lambda c: (_WORST_RANK[c.verdict], c.delta_pct is None, -(c.delta_pct or 0.0))
        )
    if order == "index":
        return list(cells)
    if order == "flagged":
        return sorted(cells, key=lambda c: not _flagged(c))  # stable: sweep order inside each group
    sign = -1.0 if order == "slowest" else 1.0
    return sorted(cells, key=lambda c: (c.delta_pct is None, sign * (c.delta_pct or 0.0)))


@dataclass
class ResultEntry:
    """Everything cached for one stored result (see the module docstring)."""

    base: Comparison | None = None
    n_samples: int | None = None
    samples_json: Markup | None = None
    timelines: OrderedDict[int, Markup] = field(default_factory=OrderedDict)
    views: OrderedDict[tuple[tuple[str, ...], tuple[str, ...]], JobView] = field(default_factory=OrderedDict)


class JobPageCache:
    """A bounded LRU of ``ResultEntry`` by ``(result id, received_at)``; safe across the threads
    that run sync routes. Values are built outside the lock: two requests may build the same one
    at once, and the later store wins (they are equal)."""

    def __init__(self, results: int = PAGE_CACHE_RESULTS):
        self.results = results
        self._entries: OrderedDict[tuple[int, datetime], ResultEntry] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of(cls, app: Any) -> JobPageCache:
        """The cache of ``app`` (a Starlette app; made on first use, kept in ``app.state``)."""
        with _cache_lock:
            cache = getattr(app.state, "job_page_cache", None)
            if cache is None:
                cache = cls()
                app.state.job_page_cache = cache
            return cache

    def entry(self, row: ResultRow) -> ResultEntry:
        """The entry of ``row``'s result (new and empty on a miss); marks it most recently used."""
        key = (row.id, row.received_at)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = ResultEntry()
                while len(self._entries) > self.results:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(key)
            return entry

    def __repr__(self) -> str:
        return f"<JobPageCache results={len(self._entries)}/{self.results}>"


def _remember(store: OrderedDict[Any, Any], key: Any, value: Any, limit: int) -> None:
    with _cache_lock:
        store[key] = value
        store.move_to_end(key)
        while len(store) > limit:
            store.popitem(last=False)


def job_view(
    *,
    session: Session,
    job_id: int,
    entry: ResultEntry,
    settings: Settings,
    base: Comparison | None = None,
) -> JobView:
    """The comparison of ``job_id``'s result with node-health flags applied now, as a ``JobView``.

    The base comparison comes from ``entry``, else ``base`` (the caller's ``crud.base_comparison``:
    the stored one), else is read with ``crud.base_comparison``. The flags and notes are the
    result's stored node-health judgement (``node_health.job_judgement``: judged once, against the
    bands as of the measurement). Raises ``LookupError`` when no comparison is stored.
    """
    if entry.base is None:
        entry.base = base if base is not None else crud.base_comparison(session=session, job_id=job_id)
        if entry.base is None:  # the result vanished, or is still being compared
            raise LookupError(f"job {job_id} has no stored comparison")
    base = entry.base
    judgement = node_health.job_judgement(session=session, job_id=job_id, settings=settings)
    flags = judgement.flags if judgement is not None else []
    comparison = node_health.with_health(base, flags, judgement.reasons if judgement else [],
                                         judgement.notes if judgement else [])  # fmt: skip
    key = (tuple(flags), tuple(comparison.notes))
    view = entry.views.get(key)
    if view is None:
        drawable = [c.index for c in comparison.cells if c.baseline.n + c.baseline.dropped_throttled
                    + c.candidate.n + c.candidate.dropped_throttled]  # fmt: skip
        view = JobView(comparison, drawable, sum(1 for c in comparison.cells if _flagged(c)))
        _remember(entry.views, key, view, VIEWS_PER_RESULT)
    return view


def timeline_json(
    *,
    session: Session,
    job_id: int,
    entry: ResultEntry,
    comparison: Comparison,
    cell: int,
    load: Callable[[], JobResult | None] | None = None,
) -> Markup:
    """The timeline figure JSON of cell ``cell`` (``figures.timeline_figure_dict``; labels and
    title from ``comparison``), cached per result. On a miss the samples are those of the cell of
    ``load()`` when given (a result read whole anyway), else read with ``crud.load_cell_samples``.
    Raises ``LookupError`` when the result or the cell is gone."""
    cached = entry.timelines.get(cell)
    if cached is not None:
        return cached
    if load is not None:
        result = load()
        samples = None if result is None else next((c.samples for c in result.cells if c.index == cell), None)
    else:
        samples = crud.load_cell_samples(session=session, job_id=job_id, cell_index=cell)
    label = next((c.label for c in comparison.cells if c.index == cell), None)
    if samples is None or label is None:
        raise LookupError(f"job {job_id} has no result cell {cell}")
    labels: dict[Side, str] = {"baseline": comparison.baseline_label,
                                  "candidate": comparison.candidate_label}  # fmt: skip
    figure = figures.timeline_figure_dict(samples, labels=labels, title=figures.timeline_title(cell, label))
    text = figures.figure_json(figure)
    _remember(entry.timelines, cell, text, TIMELINES_PER_RESULT)
    return text


@dataclass(frozen=True)
class CellPage:
    """One page of the before/after table: ``cells`` are rows ``offset .. offset + len(cells)`` of
    ``total`` in ``order``; ``flagged`` counts the flagged cells of the whole sweep. ``checked``,
    ``static`` and ``timed`` are the rows of the correctness, ISA and checked-samples tables of
    the page's cells (``timed``: ``(cell, side, TimedCheck)`` for each sample checked through the
    timer, ``CellComparison.timed_checks``)."""

    cells: list[CellComparison]
    order: CellOrder
    offset: int
    limit: int
    total: int
    flagged: int
    checked: Sequence[tuple[CellComparison, str, CorrectnessResult]]  # rows of the correctness table
    static: list[CellComparison]  # cells of this page with an ISA comparison
    timed: Sequence[tuple[CellComparison, str, TimedCheck]] = ()  # checked samples through the timer
    cross: Sequence[
        tuple[CellComparison, str]
    ] = ()  # (cell, report.cross_check_line) of the timer cross-check
    energy: Sequence[tuple[CellComparison, str]] = ()  # (cell, report.energy_line)

    @property
    def previous(self) -> int | None:
        return max(self.offset - self.limit, 0) if self.offset > 0 else None

    @property
    def next(self) -> int | None:
        return self.offset + self.limit if self.offset + self.limit < self.total else None


def cell_page(view: JobView, order: CellOrder, offset: int, limit: int | None = None) -> CellPage:
    """Rows ``offset .. offset + limit`` (default ``CELLS_PER_PAGE``) of the cells in ``order``; an
    offset past the end shows the last page. The correctness and ISA tables list the cells of the
    same page."""
    limit = limit or CELLS_PER_PAGE
    ordered = view.ordered(order)
    total = len(ordered)
    offset = min(offset, max(total - 1, 0) // limit * limit)
    cells = ordered[offset : offset + limit]
    checked = [
        (cell, variant, check) for cell in cells for variant, check in cell.correctness.items()
        if check.repeats is not None or check.determinism is not None or check.batch_invariance is not None
        or check.vs_baseline is not None
    ]  # fmt: skip
    timed = [
        (cell, side, check)
        for cell in cells
        for side, checks in cell.timed_checks.items()
        for check in checks
    ]
    cross = [(cell, line) for cell in cells if (line := cross_check_line(cell)) is not None]
    energy = [(cell, line) for cell in cells if (line := energy_line(cell)) is not None]
    return CellPage(
        cells,
        order,
        offset,
        limit,
        total,
        view.flagged,
        checked,
        [c for c in cells if c.static],
        timed,
        cross,
        energy,
    )
