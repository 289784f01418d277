"""Columnar storage of raw samples: one ``sample_blocks`` row per cell holds the cell's
``SampleColumns`` as little-endian numpy arrays (conbench keeps a result's raw data as an array
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

from kernelab.service.schemas import SampleColumns, Variant

VARIANT_CODES: dict[str, int] = {"baseline": 0, "candidate": 1}
_VARIANT_NAMES: tuple[Variant, Variant] = ("baseline", "candidate")
DTYPES: dict[str, str] = {
    "variant": "u1", "round": "<i4", "position": "<i4", "duration_ns": "<f8", "launches": "<i4",
    "sm_clock_mhz": "<f8", "clock_event_reasons": "<i8", "temperature_c": "<f8", "power_w": "<f8",
    "throttled": "u1",
}  # fmt: skip
"""numpy dtype of each stored column (``SAMPLE_FIELDS`` order)."""
_NULL_FLOAT_COLUMNS = ("sm_clock_mhz", "temperature_c", "power_w")
_NULL_REASONS = -1


class CorruptBlockError(ValueError):
    """A stored block's bytes do not hold ``n`` values of a column's dtype."""


def _nullable_floats(values: list[float | None]) -> bytes | None:
    if values.count(None) == len(values):
        return None
    return np.array(values, dtype=np.float64).astype("<f8", copy=False).tobytes()  # None -> NaN


def encode(samples: SampleColumns) -> dict[str, Any]:
    """The stored columns of one cell's samples: ``{"n": int, column: bytes | None}`` for every
    name of ``SAMPLE_FIELDS`` (encoding in the module docstring). ``samples`` must be validated
    (``SampleColumns``): values out of range for a dtype raise ``OverflowError``."""
    n = len(samples)
    reasons = samples.clock_event_reasons
    out: dict[str, Any] = {
        "n": n,
        "variant": bytes(map(VARIANT_CODES.__getitem__, samples.variant)),
        "round": np.array(samples.round, dtype="<i4").tobytes(),
        "position": np.array(samples.position, dtype="<i4").tobytes(),
        "duration_ns": np.array(samples.duration_ns, dtype="<f8").tobytes(),
        "launches": np.array(samples.launches, dtype="<i4").tobytes(),
        "clock_event_reasons": None if reasons.count(None) == n else np.array(
            [_NULL_REASONS if r is None else r for r in reasons], dtype="<i8").tobytes(),
        "throttled": bytes(samples.throttled),  # bools are the ints 0 and 1
    }  # fmt: skip
    for name in _NULL_FLOAT_COLUMNS:
        out[name] = _nullable_floats(getattr(samples, name))
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
    column, e.g. a row's ``_mapping``). Values are not validated again (they were on ingest).
    Raises ``CorruptBlockError`` when a column's byte length is not ``n`` values."""
    n = block["n"]
    columns: dict[str, list[Any]] = {
        "variant": [_VARIANT_NAMES[code] for code in _array(block, "variant").tolist()],
        "round": _array(block, "round").tolist(),
        "position": _array(block, "position").tolist(),
        "duration_ns": _array(block, "duration_ns").tolist(),
        "launches": _array(block, "launches").tolist(),
        "throttled": _array(block, "throttled").astype(bool).tolist(),
    }
    for name in _NULL_FLOAT_COLUMNS:
        if block[name] is None:
            columns[name] = [None] * n
            continue
        values = _array(block, name)
        as_list: list[float | None] = values.tolist()
        if np.isnan(values).any():
            as_list = [None if v != v else v for v in as_list]  # NaN != NaN: the null marker
        columns[name] = as_list
    if block["clock_event_reasons"] is None:
        columns["clock_event_reasons"] = [None] * n
    else:
        reasons = _array(block, "clock_event_reasons")
        columns["clock_event_reasons"] = [None if r < 0 else r for r in reasons.tolist()]
    return SampleColumns.unchecked(columns)


def arrays(block: Mapping[Any, Any], first: int = 0, end: int | None = None) -> dict[str, np.ndarray | None]:
    """Samples ``[first, end)`` of a stored block as numpy arrays, one per ``SAMPLE_FIELDS`` name
    (``end=None``: to ``n``): read-only views of the stored bytes, in the stored dtype and null
    encoding (module docstring), shape ``(end - first,)``; None for a column stored as SQL NULL
    (every sample null). Raises ``CorruptBlockError`` like ``decode``."""
    return {name: None if block[name] is None else _array(block, name)[first:end] for name in DTYPES}
