"""Raw samples of a stored result, read in blocks and in rows (exports, figures)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelab.service.contract import sample_blocks
from kernelab.service.contract.schemas import (
    SAMPLE_FIELDS,
    SampleColumns,
)
from kernelab.service.server.models import Cell, Result, SampleBlock

SAMPLE_COLUMNS = (
    "cell_index", "params", "variant", "round", "position", "duration_ns", "launches",
    "sm_clock_mhz", "clock_event_reasons", "temperature_c", "power_w", "throttled",
)  # fmt: skip
"""Columns of ``iter_sample_rows`` and of ``GET /jobs/{id}/samples`` (CSV header order)."""


_BLOCK_COLUMNS = [SampleBlock.n, *(getattr(SampleBlock, name) for name in SAMPLE_FIELDS)]


def count_samples(*, session: Session, job_id: int) -> int:
    """How many raw samples the job's result holds (0 without a result)."""
    return session.scalar(
        select(func.coalesce(func.sum(SampleBlock.n), 0)).join(Cell, Cell.id == SampleBlock.cell_id)
        .join(Result, Result.id == Cell.result_id).where(Result.job_id == job_id)
    ) or 0  # fmt: skip


def _block_slices(
    session: Session, job_id: int, offset: int, limit: int | None
) -> list[tuple[int, int, int]]:
    """``(block id, first, end)``: the sample positions of each block (cell index order) that
    fall in rows ``[offset, offset + limit)`` of the job's samples."""
    sizes = session.execute(
        select(SampleBlock.id, SampleBlock.n).join(Cell, Cell.id == SampleBlock.cell_id)
        .join(Result, Result.id == Cell.result_id).where(Result.job_id == job_id)
        .order_by(Cell.cell_index)
    )  # fmt: skip
    stop = None if limit is None else offset + limit
    out, start = [], 0
    for block_id, n in sizes:
        first = max(offset - start, 0)
        end = n if stop is None else min(stop - start, n)
        if first < end:
            out.append((block_id, first, end))
        start += n
        if stop is not None and start >= stop:
            break
    return out


SampleBatch = list[tuple[int, int, int]]
"""``(block id, first, end)`` of the sample blocks one query reads (``read_sample_batch``)."""


class BlockSlice(NamedTuple):
    """Samples ``[first, end)`` of one cell's stored block (``first < end <= block["n"]``)."""

    cell_index: int
    params: dict[str, Any]
    block: Mapping[Any, Any]
    """``n`` and every ``SAMPLE_FIELDS`` column as stored (``sample_blocks`` encoding)."""
    first: int
    end: int


def sample_batches(
    *, session: Session, job_id: int, batch: int = 5000, offset: int = 0, limit: int | None = None
) -> list[SampleBatch]:
    """Where the rows ``[offset, offset + limit)`` of a job's samples (``limit=None``: to the end;
    the order of ``iter_sample_rows``) are: one ``SampleBatch`` per query of about ``batch``
    samples (a block's samples at least), in order. Reads block sizes only, not samples."""
    slices = _block_slices(session, job_id, offset, limit)
    batches: list[SampleBatch] = []
    while slices:
        chunk: SampleBatch = []
        taken = 0
        while slices and (not chunk or taken + slices[0][2] - slices[0][1] <= batch):
            chunk.append(slices.pop(0))
            taken += chunk[-1][2] - chunk[-1][1]
        batches.append(chunk)
    return batches


def read_sample_batch(*, session: Session, batch: SampleBatch) -> list[BlockSlice]:
    """The ``BlockSlice`` of every block of ``batch`` (one query), in the batch's order."""
    rows = session.execute(
        select(SampleBlock.id, Cell.cell_index, Cell.params, *_BLOCK_COLUMNS)
        .join(Cell, Cell.id == SampleBlock.cell_id)
        .where(SampleBlock.id.in_([block_id for block_id, _, _ in batch]))
    )
    by_id = {r.id: r for r in rows}
    return [
        BlockSlice(by_id[block_id].cell_index, by_id[block_id].params, by_id[block_id]._mapping, first, end)
        for block_id, first, end in batch
    ]


def iter_sample_blocks(
    *, session: Session, job_id: int, batch: int = 5000, offset: int = 0, limit: int | None = None
) -> Iterator[BlockSlice]:
    """The raw samples of a job's result as ``BlockSlice``s, streamed in cell index order: the
    rows ``[offset, offset + limit)`` of the order of ``iter_sample_rows`` (``limit=None``: to the
    end), reading blocks of about ``batch`` samples per query."""
    for part in sample_batches(session=session, job_id=job_id, batch=batch, offset=offset, limit=limit):
        yield from read_sample_batch(session=session, batch=part)


def iter_sample_rows(
    *, session: Session, job_id: int, batch: int = 5000, offset: int = 0, limit: int | None = None
) -> Iterator[dict[str, Any]]:
    """Raw samples of a job's result as flat dicts with ``SAMPLE_COLUMNS`` keys, streamed (cell
    index order, then posting order), reading blocks of about ``batch`` samples per query.
    ``params`` is the cell's parameter dict; ``duration_ns`` is nanoseconds per launch.
    ``offset``/``limit`` select a page of that order (``limit=None``: to the end). One dict per
    sample: ``kernelab.service.server.sample_export`` writes the download's text per block instead (this is
    its
    row-by-row reference in the tests)."""
    for part in iter_sample_blocks(session=session, job_id=job_id, batch=batch, offset=offset, limit=limit):
        rows = sample_blocks.decode(part.block).rows()[part.first : part.end]
        cell = {"cell_index": part.cell_index, "params": part.params}
        for sample in rows:
            yield {**cell, **{name: getattr(sample, name) for name in SAMPLE_FIELDS}}


def load_cell_samples(*, session: Session, job_id: int, cell_index: int) -> SampleColumns | None:
    """The raw samples of one cell of the job's stored result (posting order), reading that cell's
    block alone; an empty ``SampleColumns`` for a cell without samples, None when the job has no
    result or the result no cell ``cell_index``. (For pages that draw one cell of a large sweep:
    ``load_result(sample_cells=...)`` rebuilds every cell.)"""
    found = session.execute(
        select(Cell.id, SampleBlock.id.label("block_id"), *_BLOCK_COLUMNS).select_from(Cell)
        .join(Result, Result.id == Cell.result_id)
        .join(SampleBlock, SampleBlock.cell_id == Cell.id, isouter=True)
        .where(Result.job_id == job_id, Cell.cell_index == cell_index)
    ).first()  # fmt: skip
    if found is None:
        return None
    return SampleColumns() if found.block_id is None else sample_blocks.decode(found._mapping)
