"""The raw samples of one cell as numpy arrays, from the engine to the stored blocks and the stats.

``SampleColumns`` holds one numpy array per column (``SAMPLE_DTYPES``: the dtypes and null markers
of the stored ``sample_blocks``), so the samples keep one form from the runner's engine to the
server's statistics and are parsed once at each boundary. It is a pydantic model: a field of type
``SampleColumns`` (``CellResult.samples``) validates every wire form below straight into arrays,
and writes the compact form in JSON.

Wire forms (what ``POST /jobs/{id}/results`` takes in ``cells[i].samples``):

* **base64 columns** (written by runners since ``RESULT_SCHEMA_VERSION`` 2)::

      {"encoding": "base64", "n": 600,
       "variant": {"dtype": "u1", "data": "AAEBAA..."}, "round": {"dtype": "<i4", "data": "..."},
       "position": {...}, "duration_ns": {"dtype": "<f8", "data": "..."}, ...}

  each column the standard base64 (RFC 4648 section 4) of ``n`` little-endian values of its
  ``SAMPLE_DTYPES`` dtype, the dtype named beside it (checked: another dtype is a 422 naming
  ``<column>.dtype``; a byte length that is not ``n`` values is a 422 naming ``<column>.data``).
  Nulls as stored: NaN in ``sm_clock_mhz``/``temperature_c``/``power_w``, -1 in
  ``clock_event_reasons``. ``launches``, ``throttled`` and the four context columns may be left
  out (1, false, null for every sample). Values are checked with numpy, with the bounds of
  ``Sample`` (a 422 naming ``<column>.<index>`` of the first bad value).
  Size: 4/3 of the raw bytes (54 a sample with the GPU context columns, 17 without): a result of
  1,000 cells x 300 ABBA rounds (600,000 samples) is 43 MB with the context columns and 14 MB
  without, against 51 and 22 MB as JSON lists, and parses in half the time
  (``docs/results/2026-12-01-data-moves.md``).
* **JSON list columns** (runners before version 2): ``{"variant": ["baseline", ...], "round":
  [0, ...], ...}``, each value validated as a ``Sample`` field, then turned into arrays.
* **rows** (the oldest form): a JSON array of ``Sample`` objects.

Python use: ``len(cols)``; the arrays ``cols.duration_ns`` (float64), ``cols.variant`` (uint8: 0
baseline, 1 candidate), ...; ``cols.rows()`` -> ``list[Sample]``; ``SampleColumns.from_rows``;
``SampleColumns.from_arrays`` (validates, as the engine does once per cell);
``cols.select(mask)``. Arrays read back from the wire or the database are read-only views.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    SerializationInfo,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails, PydanticCustomError

Side = Literal["baseline", "candidate"]
VARIANT_NAMES: tuple[Side, Side] = ("baseline", "candidate")
"""``variant`` code -> name: 0 is the baseline, 1 the candidate."""

_INT32_MAX = 2**31 - 1  # round, position and launches are int32
_INT64_MAX = 2**63 - 1  # clock_event_reasons is int64
MAX_DURATION_NS = 86_400e9
"""Longest time per launch a sample may hold, ns: one day, ``JobSpec.timeout_s``'s upper bound. No
launch of a job lasts longer than the job may run, so a larger value is not a measurement; refusing
it at the door (422 naming the sample) keeps the statistics of every stored result finite (a median
of two samples of 9e307 ns overflows float64)."""
_Int32 = Annotated[int, Strict(), Field(ge=0, le=_INT32_MAX)]
_Launches = Annotated[int, Strict(), Field(ge=1, le=_INT32_MAX)]
_Reasons = Annotated[int, Strict(), Field(ge=0, le=_INT64_MAX, description="NVML bitmask")]
_Duration = Annotated[float, Strict(), Field(ge=0, le=MAX_DURATION_NS, allow_inf_nan=False)]
_Finite = Annotated[float, Strict(), Field(allow_inf_nan=False)]
_FiniteNonNeg = Annotated[float, Strict(), Field(ge=0, allow_inf_nan=False)]
_Bool = Annotated[bool, Strict()]


class Sample(BaseModel):
    """One timed sample of one variant (a row of ``SampleColumns``).

    ``duration_ns`` is the time of one launch: the timed window divided by ``launches``, at most
    ``MAX_DURATION_NS``. Context fields are None where the platform cannot read them (CPU, no
    NVML); ``clock_event_reasons`` is the NVML mask (``kernelab.service.contract.clock_events``), which the
    server
    reads itself: a sample whose mask holds a throttle reason counts as throttled whatever
    ``throttled`` says. Raises (422, ``loc`` naming the field): an unknown field (a ``unit`` the
    server would ignore changes what every number means), a float that is not finite, a number
    posted as ``true`` or ``"1e3"``; ``round``, ``position`` and ``launches`` fit in int32.
    """

    model_config = ConfigDict(extra="forbid")

    variant: Side
    round: _Int32 = Field(description="interleaving round number")
    position: _Int32 = Field(description="position of this sample inside its round")
    duration_ns: _Duration
    launches: _Launches = 1
    sm_clock_mhz: _FiniteNonNeg | None = None
    clock_event_reasons: _Reasons | None = None
    temperature_c: _Finite | None = None
    power_w: _FiniteNonNeg | None = None
    throttled: _Bool = False


SAMPLE_FIELDS: tuple[str, ...] = tuple(Sample.model_fields)
"""The columns of ``SampleColumns`` (and fields of ``Sample``), in wire and storage order."""
SAMPLE_DTYPES: dict[str, str] = {
    "variant": "u1", "round": "<i4", "position": "<i4", "duration_ns": "<f8", "launches": "<i4",
    "sm_clock_mhz": "<f8", "clock_event_reasons": "<i8", "temperature_c": "<f8", "power_w": "<f8",
    "throttled": "u1",
}  # fmt: skip
"""numpy dtype of each column on the wire and in storage (little-endian; ``u1`` for the variant
code and the 0/1 of ``throttled``). In memory ``throttled`` is ``bool`` (same bytes)."""
NULL_FLOAT_COLUMNS = ("sm_clock_mhz", "temperature_c", "power_w")
"""Columns whose null is NaN (the wire refuses NaN as a value, so NaN only means null)."""
NULL_REASONS = -1
"""The null of ``clock_event_reasons`` (the wire refuses negative bitmasks)."""
_MEMORY_DTYPES = {**SAMPLE_DTYPES, "throttled": "bool"}
_FILL: dict[str, Any] = {
    "launches": 1, "sm_clock_mhz": math.nan, "clock_event_reasons": NULL_REASONS,
    "temperature_c": math.nan, "power_w": math.nan, "throttled": False,
}  # fmt: skip
"""Columns a client may leave out, and the value every sample then gets (as stored)."""
_REQUIRED = ("variant", "round", "position", "duration_ns")
MAX_SAMPLES = _INT32_MAX
"""Most samples of one cell (``n`` and the sample indices are int32; a request's size, 64 MiB by
default, bounds it far below)."""
_MAX_B64_CHARS = 4 * (8 * MAX_SAMPLES // 3 + 1)  # base64 of MAX_SAMPLES values of 8 bytes
_SAMPLE_ROWS = TypeAdapter(Annotated[list[Sample], Field(max_length=MAX_SAMPLES)])


class SampleListColumns(BaseModel):
    """The JSON-list wire form (runners before ``RESULT_SCHEMA_VERSION`` 2) and the row form: the
    values validated as ``Sample`` fields, error ``loc`` ending in column name and index."""

    model_config = ConfigDict(extra="forbid")

    variant: list[Side] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="one per sample: defines n"
    )
    round: list[_Int32] = Field(default_factory=list, max_length=MAX_SAMPLES)
    position: list[_Int32] = Field(default_factory=list, max_length=MAX_SAMPLES)
    duration_ns: list[_Duration] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="ns per launch"
    )
    launches: list[_Launches] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="left out: 1 per sample"
    )
    sm_clock_mhz: list[_FiniteNonNeg | None] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="left out: null"
    )
    clock_event_reasons: list[_Reasons | None] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="left out: null"
    )
    temperature_c: list[_Finite | None] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="left out: null"
    )
    power_w: list[_FiniteNonNeg | None] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="left out: null"
    )
    throttled: list[_Bool] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="left out: false"
    )

    @model_validator(mode="before")
    @classmethod
    def _from_row_form(cls, data: Any) -> Any:
        if isinstance(data, list):  # one object per sample: validate as rows, then transpose
            rows = _SAMPLE_ROWS.validate_python(data)
            return {name: [getattr(r, name) for r in rows] for name in SAMPLE_FIELDS}
        return data

    @model_validator(mode="after")
    def _one_value_per_sample(self) -> SampleListColumns:
        n = len(self.variant)
        given = set(self.model_fields_set)
        for name in SAMPLE_FIELDS[1:]:
            got = len(getattr(self, name))
            if name not in given and name in _REQUIRED and n:
                raise ValueError(f"samples.{name} is missing ({n} samples in samples.variant)")
            if name in given and got != n:
                raise ValueError(
                    f"samples.{name} has {got} values but samples.variant has {n}: every column "
                    "holds one value per sample"
                )
        return self

    def arrays(self) -> dict[str, np.ndarray]:
        """The columns in the in-memory encoding (``SampleColumns``)."""
        n = len(self.variant)
        given = self.model_fields_set
        out: dict[str, np.ndarray] = {
            "variant": np.fromiter(map(_VARIANT_CODE.__getitem__, self.variant), np.uint8, count=n),
            "round": np.array(self.round, dtype=np.int32),
            "position": np.array(self.position, dtype=np.int32),
            "duration_ns": np.array(self.duration_ns, dtype=np.float64),
        }
        for name in SAMPLE_FIELDS[4:]:
            values = getattr(self, name)
            if name not in given:
                out[name] = np.full(n, _FILL[name], dtype=_MEMORY_DTYPES[name])
            elif name == "clock_event_reasons":
                out[name] = np.array([NULL_REASONS if v is None else v for v in values], dtype=np.int64)
            else:  # None -> NaN for the float columns
                out[name] = np.array(values, dtype=_MEMORY_DTYPES[name])
        return out


_VARIANT_CODE: dict[str, int] = {"baseline": 0, "candidate": 1}


def _b64(value: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("base64_decode", "not standard base64 (RFC 4648 section 4)") from None


class Base64Column(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dtype: str = Field(max_length=8, description="numpy dtype of the values, e.g. '<f8'")
    data: str = Field(max_length=_MAX_B64_CHARS, description="standard base64 of n little-endian values")


class SampleBase64Columns(BaseModel):
    """The base64 wire form (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")

    encoding: Literal["base64"]
    n: int = Field(ge=0, le=_INT32_MAX, strict=True, description="samples in every column")
    variant: Base64Column
    round: Base64Column
    position: Base64Column
    duration_ns: Base64Column
    launches: Base64Column | None = None
    sm_clock_mhz: Base64Column | None = None
    clock_event_reasons: Base64Column | None = None
    temperature_c: Base64Column | None = None
    power_w: Base64Column | None = None
    throttled: Base64Column | None = None

    def arrays(self) -> dict[str, np.ndarray]:
        """Decoded columns (read-only views of the decoded bytes); raises ``ValidationError``
        naming ``<column>.dtype`` / ``<column>.data`` for a wrong dtype, base64 or length."""
        errors: list[InitErrorDetails] = []
        out: dict[str, np.ndarray] = {}
        absent = []
        for name in SAMPLE_FIELDS:
            column: Base64Column | None = getattr(self, name)
            dtype = np.dtype(SAMPLE_DTYPES[name])
            if column is None:
                absent.append(name)  # filled once n is vouched for by the columns sent
                continue
            if column.dtype != SAMPLE_DTYPES[name]:
                msg = f"the dtype of {name} is {SAMPLE_DTYPES[name]!r}"
                errors.append(_error((name, "dtype"), column.dtype, msg))
                continue
            try:
                raw = _b64(column.data)
            except PydanticCustomError as exc:
                errors.append(_error((name, "data"), column.data[:40], exc.message()))
                continue
            if len(raw) != self.n * dtype.itemsize:
                msg = f"{len(raw)} bytes, expected n = {self.n} values of {dtype.itemsize} bytes"
                errors.append(_error((name, "data"), column.data[:40], msg))
                continue
            out[name] = np.frombuffer(raw, dtype=dtype)
        if errors:
            raise ValidationError.from_exception_data("SampleColumns", errors)
        # ``n`` is now the length of the required columns' decoded data (bounded by the body): a
        # declared n with short columns never allocates n values.
        for name in absent:
            out[name] = np.full(self.n, _FILL[name], dtype=_MEMORY_DTYPES[name])
        out["throttled"] = _as_bool(out["throttled"])
        return out


def _as_bool(codes: np.ndarray) -> np.ndarray:
    """``u1`` 0/1 codes as a bool array (a view); other codes stay ``u1`` for ``_check`` to refuse."""
    if codes.dtype == np.bool_ or (codes.size and codes.max() > 1):
        return codes
    return codes.view(np.bool_)


def _error(loc: tuple[str | int, ...], value: Any, message: str) -> InitErrorDetails:
    return InitErrorDetails(type="value_error", loc=loc, input=value, ctx={"error": ValueError(message)})


def _first_bad(name: str, bad: np.ndarray, values: np.ndarray, why: str) -> InitErrorDetails | None:
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    return _error((name, i), values[i].item(), f"samples.{name}[{i}] {why}")


def _check(arrays: Mapping[str, np.ndarray]) -> list[InitErrorDetails]:
    """The bounds of ``Sample`` over whole columns: the first bad value of each column."""
    a = arrays

    def bad_nullable(values: np.ndarray) -> np.ndarray:  # neither null (NaN) nor finite and >= 0
        return ~(np.isnan(values) | ((values >= 0) & np.isfinite(values)))

    checks = [
        ("variant", a["variant"] > 1, "is not a variant code (0 baseline, 1 candidate)"),
        ("round", a["round"] < 0, "is negative"),
        ("position", a["position"] < 0, "is negative"),
        ("duration_ns", ~((a["duration_ns"] >= 0) & (a["duration_ns"] <= MAX_DURATION_NS)),
         f"is not a time per launch in 0 .. {MAX_DURATION_NS:g} ns (finite)"),
        ("launches", a["launches"] < 1, "is below 1"),
        ("sm_clock_mhz", bad_nullable(a["sm_clock_mhz"]), "is not a finite clock >= 0 (NaN is null)"),
        ("clock_event_reasons", a["clock_event_reasons"] < NULL_REASONS, "is not a bitmask (-1 is null)"),
        ("temperature_c", np.isinf(a["temperature_c"]), "is not finite (NaN is null)"),
        ("power_w", bad_nullable(a["power_w"]), "is not a finite power >= 0 (NaN is null)"),
        ("throttled", a["throttled"].view(np.uint8) > 1, "is not 0 or 1"),
    ]  # fmt: skip
    found = [_first_bad(name, bad, a[name], why) for name, bad, why in checks]
    return [e for e in found if e is not None]


def _no_values(name: str) -> np.ndarray:
    return np.empty(0, dtype=_MEMORY_DTYPES[name])


class SampleColumns(BaseModel):
    """The raw samples of one cell, column by column, as numpy arrays: sample ``i`` is the
    ``i``-th value of every array (the order the runner took them).

    Arrays, shape ``(n,)``: ``variant`` uint8 (0 baseline, 1 candidate), ``round``/``position``/
    ``launches`` int32, ``duration_ns`` float64 (ns per launch), ``sm_clock_mhz``/
    ``temperature_c``/``power_w`` float64 (NaN: not read), ``clock_event_reasons`` int64 (-1: not
    read), ``throttled`` bool. Validates every wire form of the module docstring; JSON dumps write
    the base64 form (columns holding only their default left out: a CPU runner's samples carry no
    clocks), Python dumps (``model_dump()``) the JSON-list form. Raises (``ValidationError``, 422
    on the server): a column whose length is not n (the message names it), an unknown column, any
    value ``Sample`` refuses (the error's ``loc`` ends in column name and index).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

    # The defaults only type ``SampleColumns()`` (no samples): ``_parse`` builds every column.
    variant: np.ndarray = Field(default_factory=lambda: _no_values("variant"))
    round: np.ndarray = Field(default_factory=lambda: _no_values("round"))
    position: np.ndarray = Field(default_factory=lambda: _no_values("position"))
    duration_ns: np.ndarray = Field(default_factory=lambda: _no_values("duration_ns"))
    launches: np.ndarray = Field(default_factory=lambda: _no_values("launches"))
    sm_clock_mhz: np.ndarray = Field(default_factory=lambda: _no_values("sm_clock_mhz"))
    clock_event_reasons: np.ndarray = Field(default_factory=lambda: _no_values("clock_event_reasons"))
    temperature_c: np.ndarray = Field(default_factory=lambda: _no_values("temperature_c"))
    power_w: np.ndarray = Field(default_factory=lambda: _no_values("power_w"))
    throttled: np.ndarray = Field(default_factory=lambda: _no_values("throttled"))

    @model_validator(mode="wrap")
    @classmethod
    def _parse(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> SampleColumns:
        if isinstance(data, SampleColumns):
            return data
        if isinstance(data, Mapping) and "encoding" in data:
            arrays = SampleBase64Columns.model_validate(data).arrays()
            errors = _check(arrays)
            if errors:
                raise ValidationError.from_exception_data(cls.__name__, errors)
        else:
            arrays = SampleListColumns.model_validate(data).arrays()
        parsed: SampleColumns = handler(arrays)  # isinstance checks only; fills ``self`` in __init__
        return parsed

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        """The wire forms: base64 columns, JSON-list columns or rows (module docstring)."""
        return {
            "anyOf": [
                handler(SampleBase64Columns.__pydantic_core_schema__),
                handler(SampleListColumns.__pydantic_core_schema__),
                handler(_SAMPLE_ROWS.core_schema),
            ],
            "description": "raw samples of one cell: base64 columns (written since schema_version 2), "
            "JSON-list columns or one object per sample",
        }

    @model_serializer(mode="plain")
    def _dump(self, info: SerializationInfo) -> dict[str, Any]:
        return self.to_base64() if info.mode_is_json() else self.to_lists()

    def __len__(self) -> int:
        return len(self.variant)

    def __eq__(self, other: object) -> bool:
        """Same samples: every column equal value for value (NaN equals NaN: both are null)."""
        if not isinstance(other, SampleColumns):
            return NotImplemented
        return all(
            np.array_equal(getattr(self, n), getattr(other, n), equal_nan=getattr(self, n).dtype.kind == "f")
            for n in SAMPLE_FIELDS
        )

    __hash__ = None  # type: ignore[assignment]

    def _array(self, name: str) -> np.ndarray:
        """Column ``name`` as an array of its in-memory dtype (a copy only when it is not one)."""
        return np.asarray(getattr(self, name), dtype=_MEMORY_DTYPES[name])

    def _defaulted(self, name: str) -> bool:
        """True when column ``name`` may be left out (every sample holds its default)."""
        if name not in _FILL:
            return False
        values = self._array(name)
        fill = _FILL[name]
        return bool(np.isnan(values).all()) if isinstance(fill, float) else bool((values == fill).all())

    def to_base64(self) -> dict[str, Any]:
        """The base64 wire form (module docstring), defaulted columns left out."""
        out: dict[str, Any] = {"encoding": "base64", "n": len(self)}
        for name in SAMPLE_FIELDS:
            if len(self) and self._defaulted(name):
                continue
            data = np.ascontiguousarray(self._array(name))
            raw = (
                data.view(np.uint8)
                if data.dtype == np.bool_
                else data.astype(SAMPLE_DTYPES[name], copy=False)
            )
            out[name] = {
                "dtype": SAMPLE_DTYPES[name],
                "data": base64.b64encode(raw.tobytes()).decode("ascii"),
            }
        return out

    def to_lists(self) -> dict[str, list[Any]]:
        """The JSON-list wire form (``None`` for nulls), defaulted columns left out."""
        out: dict[str, list[Any]] = {}
        for name in SAMPLE_FIELDS:
            if self._defaulted(name):
                continue
            out[name] = self._values(name)
        return out

    def _values(self, name: str) -> list[Any]:
        values = self._array(name)
        if name == "variant":
            return [VARIANT_NAMES[c] for c in values.tolist()]
        as_list: list[Any] = values.tolist()
        if name in NULL_FLOAT_COLUMNS:
            return [None if v != v else v for v in as_list]  # NaN != NaN: the null marker
        if name == "clock_event_reasons":
            return [None if v < 0 else v for v in as_list]
        return as_list

    def rows(self) -> list[Sample]:
        """The samples as ``Sample`` objects, in order (not validated again)."""
        columns = [self._values(name) for name in SAMPLE_FIELDS]
        return [
            Sample.model_construct(**dict(zip(SAMPLE_FIELDS, values, strict=True)))
            for values in zip(*columns, strict=True)
        ]

    @classmethod
    def from_rows(cls, rows: Iterable[Sample]) -> SampleColumns:
        """Columns of already validated ``Sample`` objects, in their order."""
        rows = list(rows)
        columns: dict[str, Any] = {name: [getattr(r, name) for r in rows] for name in SAMPLE_FIELDS}
        return cls.model_construct(None, **SampleListColumns.model_construct(None, **columns).arrays())

    @classmethod
    def from_arrays(cls, **columns: np.ndarray) -> SampleColumns:
        """Validated columns from arrays in the in-memory encoding (class docstring), converted to
        its dtypes; ``launches``, ``throttled`` and the context columns may be left out. Raises
        ``ValidationError``: a missing required column or an unknown one, a length that is not
        ``len(variant)``, a value out of ``Sample``'s bounds (``loc`` column and index)."""
        unknown = set(columns) - set(SAMPLE_FIELDS)
        missing = [name for name in _REQUIRED if name not in columns]
        if unknown or missing:
            what = f"unknown columns {sorted(unknown)}" if unknown else f"missing columns {missing}"
            raise ValidationError.from_exception_data(cls.__name__, [_error((), None, what)])
        n = len(columns["variant"])
        arrays: dict[str, np.ndarray] = {}
        errors = []
        for name in SAMPLE_FIELDS:
            given = columns.get(name)
            if given is None:
                arrays[name] = np.full(n, _FILL[name], dtype=_MEMORY_DTYPES[name])
                continue
            if len(given) != n:
                errors.append(_error((name,), len(given), f"samples.{name} has {len(given)} values, not {n}"))
                continue
            arrays[name] = np.asarray(given, dtype=_MEMORY_DTYPES[name])
        if not errors:
            errors = _check(arrays)
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return cls.model_construct(None, **arrays)

    @classmethod
    def unchecked(cls, arrays: Mapping[str, np.ndarray]) -> SampleColumns:
        """Columns known to be valid (filtered from valid columns, read back from storage), in the
        in-memory encoding, not validated again: every name of ``SAMPLE_FIELDS``, arrays of one
        length. Raises KeyError for a missing column."""
        return cls.model_construct(None, **{name: arrays[name] for name in SAMPLE_FIELDS})

    def select(self, keep: np.ndarray) -> SampleColumns:
        """The samples where ``keep`` ((n,) bool) is True, in order."""
        return self.unchecked({name: getattr(self, name)[keep] for name in SAMPLE_FIELDS})


def empty_samples() -> SampleColumns:
    """A ``SampleColumns`` of no samples (the default of ``CellResult.samples``)."""
    return SampleColumns.unchecked({name: _no_values(name) for name in SAMPLE_FIELDS})


def memory_dtype(name: str) -> np.dtype[Any]:
    """In-memory dtype of column ``name`` (``SAMPLE_DTYPES``, with ``throttled`` as bool)."""
    return np.dtype(_MEMORY_DTYPES[name])
