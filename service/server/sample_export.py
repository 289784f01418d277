"""Raw samples as the text of ``GET /jobs/{id}/samples``: a JSON array of objects or CSV, written
column-wise per stored sample block instead of one ``json.dumps``/``csv.writer`` call per sample.

A block's rows share a layout: constant pieces (keys, separators, the cell's index and
``params``, every column whose text is the same for all the block's rows, e.g. an all-null clock
column) between per-row value texts. Each column is turned into texts once, from its numpy
array (``sample_blocks.arrays``): floats by ``float.__repr__`` (what ``json.dumps`` and
``csv.writer`` write: the shortest text that round-trips), integers by ``str``, codes by a table.
The rows of a block are then one ``str.join`` over the interleaved pieces. The text is the same,
byte for byte, as ``json.dumps(row, allow_nan=False)`` per row joined by ``","`` inside ``[...]``,
or ``csv.DictWriter(lineterminator="\\n")`` with ``params`` as ``json.dumps(params,
sort_keys=True)`` (the tests compare both with ``crud.iter_sample_rows``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelab.service.contract import sample_blocks
from kernelab.service.server.crud import SAMPLE_COLUMNS, BlockSlice

Piece = str | list[str]
"""Part of every row of a block: one text for all rows, or the text of each row (m items)."""
_SMALL_RANGE = 4096  # integer columns spanning fewer values are turned into texts through a table


@dataclass(frozen=True)
class _Texts:
    """How one format writes a null, the two variants and the two ``throttled`` values."""

    null: str
    variants: tuple[str, str]
    booleans: tuple[str, str]


_JSON = _Texts(null="null", variants=('"baseline"', '"candidate"'), booleans=("false", "true"))
_CSV = _Texts(null="", variants=("baseline", "candidate"), booleans=("False", "True"))


def _codes(codes: np.ndarray, table: tuple[str, str]) -> Piece:
    """Texts of u1 ``codes`` (shape ``(m,)``, values 0/1): ``table[code]``."""
    lo, hi = int(codes.min()), int(codes.max())
    if lo == hi:
        return table[lo]
    return np.array(table, dtype=object)[codes].tolist()


def _null_at(texts: list[str], mask: np.ndarray, null: str) -> Piece:
    """``texts`` with ``null`` where ``mask`` (bool, shape ``(m,)``) is set; one ``null`` for all."""
    if mask.all():
        return null
    for i in np.flatnonzero(mask).tolist():
        texts[i] = null
    return texts


def _ints(values: np.ndarray, null: str | None) -> Piece:
    """Texts of an integer column (shape ``(m,)``) by ``str``; with ``null`` given, negative
    values are nulls (``clock_event_reasons``: -1)."""
    lo, hi = int(values.min()), int(values.max())
    if null is not None and lo < 0:
        return _null_at(list(map(str, values.tolist())), values < 0, null)
    if lo == hi:
        return str(lo)
    if hi - lo < _SMALL_RANGE:  # round, position, launches: a table lookup per value
        table = np.array([str(v) for v in range(lo, hi + 1)], dtype=object)
        return table[values - lo].tolist()
    return list(map(str, values.tolist()))


def _floats(values: np.ndarray, null: str) -> Piece:
    """Texts of a float64 column (shape ``(m,)``, NaN = null): ``float.__repr__`` per value."""
    texts = list(map(float.__repr__, values.tolist()))
    nan = np.isnan(values)
    return _null_at(texts, nan, null) if nan.any() else texts


def _columns(part: BlockSlice, texts: _Texts) -> dict[str, Piece]:
    """The text of every ``SAMPLE_FIELDS`` column of ``part`` in format ``texts``."""
    out: dict[str, Piece] = {}
    for name, values in sample_blocks.arrays(part.block, part.first, part.end).items():
        if values is None:
            out[name] = texts.null
        elif name == "variant":
            out[name] = _codes(values, texts.variants)
        elif name == "throttled":
            out[name] = _codes((values != 0).view(np.uint8), texts.booleans)
        elif values.dtype.kind == "f":
            out[name] = _floats(values, texts.null)
        else:
            out[name] = _ints(values, texts.null if name == "clock_event_reasons" else None)
    return out


def _rows(pieces: list[Piece], m: int) -> str:
    """The ``m`` rows of a block, concatenated: row ``i`` is the concatenation of ``pieces``, a
    text taken as is, a list by its ``i``-th item."""
    merged: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, str) and merged and isinstance(merged[-1], str):
            merged[-1] += piece
        else:
            merged.append(piece)
    k = len(merged)
    flat: list[str] = [""] * (m * k)
    for j, piece in enumerate(merged):
        flat[j::k] = [piece] * m if isinstance(piece, str) else piece
    return "".join(flat)


def json_rows(part: BlockSlice) -> str:
    """The JSON objects of the rows of ``part``, each preceded by ``","``: ``m`` times
    ``"," + json.dumps(row, allow_nan=False)``, ``row`` as ``crud.iter_sample_rows`` yields it."""
    values: dict[str, Piece] = {
        "cell_index": json.dumps(part.cell_index),
        "params": json.dumps(part.params, allow_nan=False),
        **_columns(part, _JSON),
    }
    pieces: list[Piece] = []
    for i, name in enumerate(SAMPLE_COLUMNS):
        pieces += [("{" if i == 0 else ", ") + json.dumps(name) + ": ", values[name]]
    return _rows([",", *pieces, "}"], part.end - part.first)


def _csv_line(fields: Iterable[Any]) -> str:
    """One CSV line (``csv.writer`` quoting, ``"\\n"`` terminated)."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()


def csv_rows(part: BlockSlice) -> str:
    """The CSV lines of the rows of ``part`` (``SAMPLE_COLUMNS`` order, ``"\\n"`` terminated),
    as ``csv.DictWriter`` writes ``crud.iter_sample_rows``'s rows with ``params`` JSON-encoded
    (sorted keys). The sample columns' texts (numbers, ``baseline``/``candidate``, ``True``/
    ``False``, empty for null) never need quoting."""
    cell = _csv_line([part.cell_index, json.dumps(part.params, sort_keys=True)])[:-1]
    columns = _columns(part, _CSV)
    pieces: list[Piece] = [cell]
    for name in SAMPLE_COLUMNS[2:]:
        pieces += [",", columns[name]]
    return _rows([*pieces, "\n"], part.end - part.first)


def _chunks(texts: Iterable[str], chunk_chars: int) -> Iterator[str]:
    """``texts`` joined into chunks of at least ``chunk_chars`` characters (the last may be shorter)."""
    parts: list[str] = []
    size = 0
    for text in texts:
        parts.append(text)
        size += len(text)
        if size >= chunk_chars:
            yield "".join(parts)
            parts.clear()
            size = 0
    if parts:
        yield "".join(parts)


def json_chunks(parts: Iterable[BlockSlice], chunk_chars: int = 2**20) -> Iterator[str]:
    """A JSON array of the rows of ``parts``, in chunks of about ``chunk_chars`` characters (a
    block's rows at least): ``"["``, the rows separated by ``","``, ``"]"``."""
    yield "["
    first = True
    for chunk in _chunks(map(json_rows, parts), chunk_chars):
        yield chunk[1:] if first else chunk  # no "," before the first row
        first = False
    yield "]"


def csv_chunks(parts: Iterable[BlockSlice], chunk_chars: int = 2**20) -> Iterator[str]:
    """The header line and the CSV lines of the rows of ``parts``, in chunks of about
    ``chunk_chars`` characters (a block's rows at least)."""
    yield _csv_line(SAMPLE_COLUMNS)
    yield from _chunks(map(csv_rows, parts), chunk_chars)
