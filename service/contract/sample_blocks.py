"""Columnar storage of raw samples: one ``sample_blocks`` row per cell holds the cell's
``SampleColumns`` arrays as little-endian bytes (conbench keeps a result's raw data as an array
column of the result row). 600,000 samples are 1,000 rows, not 600,000.

Encoding of each column (``n`` values, sample ``i`` at index ``i``, the order the runner took them):

=====================  =========  ===================================================
column                 dtype      null
=====================  =========  ===================================================
``variant``            ``u1``     0 = baseline, 1 = candidate
``round``              ``<i4``
``position``           ``<i4``
``duration_ns``        ``<f8``    ns per launch
``launches``           ``<i4``
``sm_clock_mhz``       ``<f8``    NaN (the wire refuses NaN, so NaN only means null)
``clock_event_reasons````<i8``    -1 (the wire refuses negative bitmasks)
``temperature_c``      ``<f8``    NaN
``power_w``            ``<f8``    NaN
``throttled``          ``u1``     0/1
=====================  =========  ===================================================

A nullable column is stored as SQL NULL when every sample's value is null (a CPU runner reads no
clocks): 22 bytes per sample instead of 54. Pure numpy; no database access here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kernelab.service.contract.samples import (
    NULL_FLOAT_COLUMNS,
    NULL_REASONS,
    SAMPLE_DTYPES,
    SAMPLE_FIELDS,
    SampleColumns,
    Side,
    memory_dtype,
)

VARIANT_CODES: dict[str, int] = {"baseline": 0, "candidate": 1}
_VARIANT_NAMES: tuple[Side, Side] = ("baseline", "candidate")
DTYPES: dict[str, str] = SAMPLE_DTYPES
"""numpy dtype of each stored column (``SAMPLE_FIELDS`` order): the dtypes of the wire's base64
columns and of ``SampleColumns`` in memory (``kernelab.service.contract.samples``)."""
_NULL_COLUMNS = (*NULL_FLOAT_COLUMNS, "clock_event_reasons")


class CorruptBlockError(ValueError):
    """A stored block's bytes do not hold ``n`` values of a column's dtype."""


def _all_null(values: np.ndarray) -> bool:
    return bool(np.isnan(values).all()) if values.dtype.kind == "f" else bool((values == NULL_REASONS).all())


def encode(samples: SampleColumns) -> dict[str, Any]:
    """The stored columns of one cell's samples: ``{"n": int, column: bytes | None}`` for every
    name of ``SAMPLE_FIELDS`` (encoding in the module docstring): each array's bytes in its
    stored dtype, no per-value work. ``samples`` must be validated (``SampleColumns``)."""
    out: dict[str, Any] = {"n": len(samples)}
    for name in SAMPLE_FIELDS:
        values = getattr(samples, name)
        if name in _NULL_COLUMNS and _all_null(values):
            out[name] = None
            continue
        if values.dtype == np.bool_:
            values = values.view(np.uint8)
        out[name] = np.ascontiguousarray(values, dtype=DTYPES[name]).tobytes()
    return out


def _array(block: Mapping[Any, Any], name: str) -> np.ndarray:
    """Column ``name`` of ``block`` as a read-only numpy array of ``n`` values."""
    n = block["n"]
    data = block[name]
    dtype = np.dtype(DTYPES[name])
    if len(data) != n * dtype.itemsize:
        raise CorruptBlockError(f"sample block column {name}: {len(data)} bytes, expected {n} x {dtype}")
    return np.frombuffer(data, dtype=dtype)


def decode(block: Mapping[Any, Any]) -> SampleColumns:
    """``SampleColumns`` from a stored block (a mapping with ``n`` and every ``SAMPLE_FIELDS``
    column, e.g. a row's ``_mapping``): read-only views of the stored bytes, a column stored as
    SQL NULL as an array of nulls. Values are not validated again (they were on ingest).
    Raises ``CorruptBlockError`` when a column's byte length is not ``n`` values."""
    n = block["n"]
    columns: dict[str, np.ndarray] = {}
    for name in SAMPLE_FIELDS:
        if block[name] is None:
            fill = NULL_REASONS if name == "clock_event_reasons" else np.nan
            columns[name] = np.full(n, fill, dtype=memory_dtype(name))
            continue
        values = _array(block, name)
        columns[name] = values.view(np.bool_) if name == "throttled" else values
    return SampleColumns.unchecked(columns)


def arrays(block: Mapping[Any, Any], first: int = 0, end: int | None = None) -> dict[str, np.ndarray | None]:
    """Samples ``[first, end)`` of a stored block as numpy arrays, one per ``SAMPLE_FIELDS`` name
    (``end=None``: to ``n``): read-only views of the stored bytes, in the stored dtype and null
    encoding (module docstring), shape ``(end - first,)``; None for a column stored as SQL NULL
    (every sample null). Raises ``CorruptBlockError`` like ``decode``."""
    return {name: None if block[name] is None else _array(block, name)[first:end] for name in DTYPES}
