"""Pydantic schemas shared by the server, the runner and the CLI.

This module imports pydantic (and ``jsonschema``, to check an advertised schema) only: ``runners/``
may import it, never the ORM or the database.
Schemas are split per direction (``JobCreate`` in, ``JobPublic`` out) as in
fastapi/full-stack-fastapi-template. Units are in field names (``duration_ns``, ``sm_clock_mhz``).

The shape of a job, end to end::

    JobSpec  --POST /api/v1/jobs-->  server queue  --claim-->  runner
    runner: probes(before) -> for each sweep cell: interleaved rounds of baseline/candidate
            -> correctness check -> probes(after)  ==> JobResult --POST results--> server
    server: stores raw samples; kernelab.service.stats turns a JobResult into a Comparison on read.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from functools import lru_cache
from typing import Annotated, Any, ClassVar, Literal

import jsonschema
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kernelab.service import clock_events
from kernelab.service.samples import MAX_DURATION_NS as MAX_DURATION_NS  # re-exported: the wire contract
from kernelab.service.samples import SAMPLE_FIELDS as SAMPLE_FIELDS
from kernelab.service.samples import Sample as Sample
from kernelab.service.samples import SampleColumns, Variant, empty_samples

TimingVerdict = Literal["faster", "slower", "same", "inconclusive"]
"""What the timing alone says of a cell (``kernelab.service.verdicts.timing_verdict``)."""
Verdict = Literal[
    "failed",
    "incorrect",
    "nondeterministic",
    "implausible",
    "inconclusive",
    "faster",
    "slower",
    "same",
]
"""A cell's verdict, highest precedence first (``kernelab.service.verdicts``): correctness outranks speed."""
DeviceType = Literal["cpu", "cuda"]
JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
# Flags that travel with every number; their meaning is ``kernelab.service.verdicts.FLAG_NOTES``.
Flag = Literal[
    "noisy",
    "throttled",
    "contended",
    "degraded-node",
    "node-changed",
    "implausible",
    "incorrect",
    "less-accurate",
    "nondeterministic",
    "timer-mismatch",
    "tampered",
    "failed",
]
Severity = Literal["error", "warning", "info"]

# --------------------------------------------------------------------------------------------------
# The types every inbound schema uses: text, timestamps, JSON objects, finite numbers
# --------------------------------------------------------------------------------------------------

TEXT_MAX_CHARS = 1_000_000
"""Longest inbound text field, characters (fields with a column of their own have tighter bounds)."""


def _refuse_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("text cannot contain the NUL character (U+0000)")
    return value


Text = Annotated[str, StringConstraints(max_length=TEXT_MAX_CHARS), AfterValidator(_refuse_nul)]
"""Inbound text: a str of at most ``TEXT_MAX_CHARS`` characters without U+0000. PostgreSQL's text
and JSON types cannot store NUL (SQLite can): refusing it here makes the answer a 422 whose ``loc``
names the field, the same on both databases, instead of a database error that names none."""


def _nul_free(value: Any) -> bool:
    """Whether no text in ``value`` (a str, or dicts/lists of them, keys included) holds U+0000."""
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, dict):
        return all(_nul_free(k) and _nul_free(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_nul_free(v) for v in value)
    return True


def _json_safe(value: dict[str, Any]) -> dict[str, Any]:
    if not _nul_free(value):
        raise ValueError("text cannot contain the NUL character (U+0000)")
    if not _finite_tree(value):
        raise ValueError("numbers must be finite (no NaN or Infinity)")
    return value


def _finite_tree(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite_tree(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_finite_tree(v) for v in value)
    return True


JsonObject = Annotated[dict[Text, Any], AfterValidator(_json_safe)]
"""An inbound free-form JSON object (e.g. an NVML process entry): keys and nested text as ``Text``
(no U+0000), nested numbers finite."""


def as_utc(value: datetime) -> datetime:
    """``value`` (aware) in UTC: 07:00+05:00 is 02:00+00:00. Raises ``ValueError`` for a naive one."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("a timestamp needs a time zone (e.g. '2026-12-01T07:00:00Z' or '+05:00')")
    return value.astimezone(UTC)


UtcDatetime = Annotated[
    AwareDatetime,
    AfterValidator(as_utc),
    Field(description="ISO 8601 with a zone (Z or +hh:mm), converted to UTC; a zone-less timestamp is a 422"),
]
"""Every timestamp kernelab takes or gives: ISO 8601 *with* a zone (``Z`` or ``+hh:mm``), converted
to UTC at the door (``07:00+05:00`` is stored and shown as ``02:00 UTC``). A zone-less timestamp is
refused with a 422 naming the field (``timezone_aware``): ISO 8601 reads it as local time of an
unknown zone, and guessing UTC would shift a runner that sends local time by hours."""

Finite = Annotated[float, Field(allow_inf_nan=False)]
"""A float that is not NaN or infinite (JSON has neither; PostgreSQL's JSON type refuses them)."""
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
"""A finite JSON number: ``true`` and ``"1e3"`` are refused, not read as 1.0 and 1000.0."""
Count = Annotated[int, Strict()]
"""A JSON integer: ``true``, ``2.0`` and ``"2"`` are refused."""

MAX_INT_VALUE = 2**63 - 1
"""Largest magnitude of an integer parameter value, sweep value or seed: int64, the widest integer
that torch (tensor shapes, ``torch.Generator.manual_seed``), numpy and both databases hold. A
benchmark's own ``Params`` narrows its parameters further (``kernelab.kernels.base.MAX_INT_PARAM``, int32)."""


MAX_SEED = 2**62
"""Largest ``seed``: the seeds the runner derives from it (``seed + i``, ``seed + 7919 (k + 1)``)
stay within int64, which ``torch.Generator.manual_seed`` takes."""

MAX_RTOL = 1.0
"""Largest ``correctness.rtol``: at ``rtol = 1`` an output of all zeros already passes
(``|0 - ref| <= rtol * |ref|``), so a looser one checks nothing (turn the check off with
``correctness.enabled: false`` instead)."""
MAX_ATOL = 1e6
"""Largest ``correctness.atol``: far above any tolerance a benchmark of ours needs (the matmul's
K-scaled atol stays below 1 for K up to 2**31), and finite; a larger one, like ``1e308``, accepts
every finite output and so checks nothing."""
MIN_INPUT_SCALE = 2.0**-10
MAX_INPUT_SCALE = 2.0**10
"""Bounds of ``correctness.input_scale`` (about 0.001 .. 1024). Inputs are drawn standard normal
(``|x| < 8`` in practice) and multiplied by the scale in the input's dtype: up to 2**10 they stay
below 2**13, far inside float16's finite range (65504), and down to 2**-10 typical inputs stay
above float16's smallest normal (2**-14, IEEE 754 binary16) instead of flushing to subnormals or
zero. ``1e308`` overflowed every input to ``inf`` and ``5e-324`` rounded every input to 0, so the
correctness check compared nothing; both were accepted at the door and failed on the runner."""

STORED: dict[str, Any] = {"stored": True}
"""Validation context for data read back from the database (``JobSpec.model_validate(row.spec,
context=STORED)``): the bounds a newer version applies at the door (``at_door``) are not applied
again to what an older version stored, so nothing stored makes a later read fail; everything a
stored value needs to be used (types, finiteness) is still checked."""


def at_door(info: ValidationInfo | None) -> bool:
    """True unless ``info``'s context is ``STORED``: a door-only bound applies."""
    return not (info is not None and isinstance(info.context, dict) and info.context.get("stored"))


def _int64(value: Any, info: ValidationInfo) -> Any:
    if (
        at_door(info)
        and isinstance(value, int)
        and not isinstance(value, bool)
        and abs(value) > MAX_INT_VALUE
    ):
        raise ValueError(f"an integer must be within +-{MAX_INT_VALUE} (int64)")
    return value


ParamValue = Annotated[int | Finite | Text | bool, AfterValidator(_int64)]
"""One parameter value: an integer within int64 (``MAX_INT_VALUE``: a larger one would be refused
only on the runner, by every cell), a finite float, text or a boolean."""


class _Strict(BaseModel):
    """Base for inbound schemas a person writes (specs, requests): unknown fields are an error that
    names the field; numbers are finite. Text fields are ``Text`` (no U+0000)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Posted(BaseModel):
    """Base for what a runner posts (results, probe reports): every float is finite (NaN/Infinity:
    422 naming the field). Unknown fields are ignored, so a newer runner can post to an older
    server, except in samples (``Sample``, ``SampleColumns``), where a unit or a field the server
    does not know would change what a number means."""

    model_config = ConfigDict(allow_inf_nan=False)


# --------------------------------------------------------------------------------------------------
# Job specification (what a user submits)
# --------------------------------------------------------------------------------------------------


_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_DOTTED = rf"{_IDENT}(?:\.{_IDENT})*"
BENCHMARK_OBJECT_REF = re.compile(rf"^{_DOTTED}:{_DOTTED}$")
"""``module.path:Object``: dotted Python identifiers on both sides (no relative import, no empty
segment), as in an entry point's object reference (PyPA entry points specification)."""
BENCHMARK_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
"""A registry name (built-in or entry point): letters, digits, ``_ . + -`` (the characters the PyPA
entry points specification recommends for names)."""


def benchmark_ref_problem(ref: str) -> str | None:
    """Why ``ref`` is not a well-formed benchmark reference (a registry name or a ``module:object``
    of dotted identifiers), or None when it is. Form only: nothing is imported.

    A ``module:object`` reference is also refused when its module path has a ``__main__`` part
    (a program's entry, run by its import: ``venv.__main__`` created a virtualenv and raised
    ``SystemExit``) or starts with a module of Python's standard
    library (``sys.stdlib_module_names``: no benchmark lives there, and some run programs on import,
    such as ``antigravity`` or ``this``)."""
    if ":" in ref:
        if not BENCHMARK_OBJECT_REF.match(ref):
            return (
                f"{ref[:100]!r} is not of the form 'module:object' (dotted Python identifiers on both "
                "sides: no relative import, no empty segment, no spaces)"
            )
        parts = ref.partition(":")[0].split(".")
        if "__main__" in parts:
            return f"{ref[:100]!r} names a '__main__' module (a program, not a benchmark): it is not imported"
        if parts[0] in sys.stdlib_module_names:
            return (
                f"{ref[:100]!r} names a module of Python's standard library ({parts[0]!r}), where no "
                "benchmark lives: it is not imported"
            )
    elif not BENCHMARK_NAME.match(ref):
        return (
            f"{ref[:100]!r} is neither a benchmark name (letters, digits, '_.+-') nor a "
            "'module:object' reference"
        )
    return None


def _benchmark_ref(value: str, info: ValidationInfo) -> str:
    problem = benchmark_ref_problem(value) if at_door(info) else None
    if problem is not None:
        raise ValueError(problem)
    return value


BenchmarkRef = Annotated[
    str,
    StringConstraints(min_length=1, max_length=500),
    AfterValidator(_refuse_nul),
    AfterValidator(_benchmark_ref),
    Field(description="registry name (e.g. 'matmul') or 'module.path:ClassName'"),
]
"""A spec's ``benchmark``: a registry name or a ``module.path:ClassName`` reference, checked for
form only (``kernelab.kernels.get_benchmark`` resolves it where the benchmark code is imported: the
CLI and the runner, never the server)."""


_GIT_REF = r"^[A-Za-z0-9._/@{}^~+-]+$"  # a branch, tag or sha; no spaces, ':' or shell characters


class SourceSpec(_Strict):
    """Where one side's code comes from: a git repository at one revision (``VariantSpec.source``).

    ``repo`` is a local path or a URL that the runner's allow-list must name (runner option
    ``--allow-repo`` / ``KERNELAB_ALLOWED_REPOS``); ``ref`` a branch, tag or commit sha (``kernelab
    submit --baseline-ref`` puts the sha there and the branch name in ``branch``); ``subdir`` the
    folder, relative to the repository root, that goes first on ``sys.path``; ``install`` commands
    run once per revision in that folder (no shell; ``{python}`` is the runner's interpreter,
    ``{site}`` a per-revision folder also put on ``sys.path``, e.g. ``"{python} -m pip install
    --no-deps --target {site} ."``). Raises (422): a ref starting with ``-``, an absolute or ``..``
    subdir.
    """

    repo: Text = Field(min_length=1, max_length=1000)
    ref: Text = Field(min_length=1, max_length=250, pattern=_GIT_REF)
    branch: Text = Field(default="", max_length=250, description="label for the history per branch")
    subdir: Text = Field(default="", max_length=500)
    install: list[Text] = Field(default_factory=list, max_length=20)

    @field_validator("ref")
    @classmethod
    def _not_an_option(cls, v: str) -> str:
        if v.startswith("-"):
            raise ValueError("a git ref cannot start with '-'")
        return v

    @field_validator("subdir")
    @classmethod
    def _relative_subdir(cls, v: str) -> str:
        parts = v.replace("\\", "/").split("/")
        if v.startswith("/") or ".." in parts:
            raise ValueError("subdir must be a relative path inside the repository (no '..')")
        return v.strip("/")


class VariantSpec(_Strict):
    """One side of the comparison: a named variant of the benchmark and parameter overrides.

    ``params`` override the cell's parameters for this side only, so "two parameter sets of one
    benchmark" (e.g. two tile sizes of the Triton matmul) is a baseline and a candidate that name the
    same variant with different ``params``. ``source`` (optional) takes this side's code from a git
    revision instead of the installed packages (see ``SourceSpec``).
    """

    variant: Text = Field(min_length=1, max_length=200)
    params: ParamMap = Field(default_factory=dict)
    source: SourceSpec | None = None


class MeasurementSpec(_Strict):
    """How to measure. Durations are milliseconds, as in ``triton.testing.do_bench``."""

    warmup_ms: float = Field(default=25.0, ge=0, le=60_000)
    budget_ms: float = Field(default=2_000.0, gt=0, le=600_000, description="time budget per cell")
    min_rounds: int = Field(
        default=5,
        ge=2,
        le=100_000,
        description="rounds before the adaptive stop may end; a verdict needs at least 5 rounds holding both "
        "sides and 5 kept samples per side (kernelab.service.verdicts.MIN_ROUNDS, MIN_SAMPLES)",
    )
    max_rounds: int = Field(default=10_000, ge=2, le=1_000_000)
    samples_per_round: int = Field(
        default=1, ge=1, le=1_000, description="samples of each variant per round (ABBA uses 2 rounds of A,B)"
    )
    order: Literal["abba", "random"] = "abba"
    seed: Annotated[int, AfterValidator(lambda v, info: _at_most(v, MAX_SEED, info))] = Field(
        default=0,
        ge=0,
        description="seeds the inputs (torch.Generator.manual_seed), the round order and the bootstrap; at "
        "most 2**62, so the seeds the runner derives from it (seed + i, seed + 7919 (k + 1)) stay in int64",
    )
    l2_flush: bool = Field(default=True, description="flush L2 before each sample (cold mode)")
    target_ci_pct: float = Field(
        default=1.0, gt=0, le=100, description="stop once the ratio's CI half-width is below this"
    )
    threshold_pct: float = Field(
        default=1.0, gt=0, le=100, description="smallest change that counts as faster/slower"
    )
    exclude_throttled: bool = True
    min_time_ms: float = Field(
        default=500.0,
        ge=0,
        le=600_000,
        description="timed device time (both variants) before the CI may stop sampling (nvbench "
        "--min-time); budget_ms still caps",
    )
    timer: Literal["auto", "cuda-event", "cuda-graph", "perf_counter"] = Field(
        default="auto",
        description="'auto': CUDA-graph replay on a GPU (cuda-event for a callable that cannot be "
        "captured), perf_counter on a CPU",
    )

    @model_validator(mode="after")
    def _rounds_ordered(self) -> MeasurementSpec:
        if self.max_rounds < self.min_rounds:
            raise ValueError("max_rounds must be >= min_rounds")
        return self


class ProbeSpec(_Strict):
    """Which node-health probes run before and after the job."""

    copy_bandwidth: bool = True
    all_reduce: bool = True
    nvml: bool = True
    mode: Literal["quick", "full"] = Field(
        default="quick",
        description="quick: all-reduce at 8 B, 1 MiB, 64 MiB over all GPUs (before/after each job); "
        "full: 8 B ... 256 MiB, sub-groups, peer copy for every GPU pair",
    )
    cuda_graph: bool = Field(
        default=False, description="also time the all-reduce as one CUDA-graph replay (full mode)"
    )
    matmul_peak: bool = Field(
        default=True, description="bf16 matmul TFLOP/s once per process (CUDA only), for plausibility"
    )
    canary: bool = Field(
        default=True,
        description="CUDA: a device copy timed in the measuring process before the benchmark is imported "
        "and after every cell; a cell after which it moved by more than 15% is node-changed",
    )


class CorrectnessSpec(_Strict):
    """Correctness checks against the benchmark's higher-precision reference."""

    enabled: bool = True
    rtol: Annotated[float, AfterValidator(lambda v, info: _float_within(v, 0.0, MAX_RTOL, info))] | None = (
        Field(default=None, gt=0, description="None: dtype-aware default; at most 1 (MAX_RTOL)")
    )
    atol: Annotated[float, AfterValidator(lambda v, info: _float_within(v, 0.0, MAX_ATOL, info))] | None = (
        Field(default=None, ge=0, description="None: dtype-aware default; at most 1e6 (MAX_ATOL)")
    )
    # Checks of kernelab.runners.checks; each is off or minimal by default.
    repeats: int = Field(default=1, ge=1, le=100_000, description="poisoned runs compared with the reference")
    inputs: Literal["fixed", "fresh"] = Field(
        default="fixed", description="repeats reuse the cell's inputs or draw fresh ones (seed + i)"
    )
    determinism_runs: int = Field(
        default=0, ge=0, le=100_000, description="runs on the same inputs compared bitwise (0: off)"
    )
    batch_invariance: bool = Field(
        default=False, description="rows computed alone, in a small and the full batch: bitwise equal"
    )
    bitwise_vs_baseline: bool = Field(
        default=False, description="the candidate's output must equal the baseline's bitwise"
    )
    input_scale: Annotated[
        float, AfterValidator(lambda v, info: _float_within(v, MIN_INPUT_SCALE, MAX_INPUT_SCALE, info))
    ] = Field(
        default=1.0,
        gt=0,
        description="multiply floating inputs (1: unscaled; 0.5 can hide races); 2**-10 .. 2**10",
    )
    timed_checks: bool = Field(
        default=True,
        description="check the output of the timed method too: after the first and the last round, one "
        "sample per side through the timer on fresh inputs, its output verified "
        "(kernelab.runners.sides); off "
        "only leaves the eager check, which a kernel wrong under CUDA-graph replay passes",
    )


class StaticMetricsSpec(_Strict):
    """Static metrics of the compiled Triton kernels of both sides (``kernelab.runners.static_metrics``).

    ``target`` names the GPU the kernels are compiled for ahead of time: ``sm_80``, ``sm_90a``
    (``sm_90`` is compiled as ``sm_90a``, as Triton does), ``sm_100a``...; None means the runner's own
    GPU (a CPU runner then records an error instead of metrics).
    """

    enabled: bool = False
    target: Text | None = Field(default=None, pattern=r"^sm_\d{2,3}a?$", description="e.g. sm_90a")


def _float_within(value: float, low: float, high: float, info: ValidationInfo) -> float:
    """``value`` within ``low .. high`` at the door (pydantic's own errors for ``ge``/``le``)."""
    if at_door(info) and value < low:
        raise PydanticCustomError(
            "greater_than_equal", "Input should be greater than or equal to {ge}", {"ge": low}
        )
    if at_door(info) and value > high:
        raise PydanticCustomError(
            "less_than_equal", "Input should be less than or equal to {le}", {"le": high}
        )
    return value


def _at_most(value: Any, bound: int, info: ValidationInfo) -> Any:
    """``value`` (an int, or a mapping: its number of keys) at most ``bound`` at the door."""
    if isinstance(value, int):
        if at_door(info) and value > bound:  # pydantic's own error for ``le``
            raise PydanticCustomError(
                "less_than_equal", "Input should be less than or equal to {le}", {"le": bound}
            )
    elif at_door(info) and len(value) > bound:
        raise ValueError(f"{len(value)} keys; at most {bound}")
    return value


def _at_least_one(value: list[Any], info: ValidationInfo) -> list[Any]:
    if at_door(info) and not value:
        raise ValueError("a sweep lists at least one value for each parameter")
    return value


MAX_CELLS = 4096
"""Most cells a sweep may have on one device type: each is measured (seconds of budget) and stored
with its raw samples, and the runner's and the server's per-cell work grows with the count."""
MAX_PARAM_KEYS = 64
"""Most keys of one ``params`` mapping or one sweep grid: every cell holds them all, so this bounds
a spec's expansion to ``MAX_CELLS`` cells of a few ``MAX_PARAM_KEYS`` keys (a benchmark's
parameter model has about ten fields; ``kernelab.kernels.matmul`` has nine)."""

ParamName = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_refuse_nul)]
"""A parameter's name (a field of a benchmark's ``Params``)."""
_MaxKeys = AfterValidator(lambda v, info: _at_most(v, MAX_PARAM_KEYS, info))
ParamMap = Annotated[dict[ParamName, ParamValue], _MaxKeys]
SweepGrid = Annotated[
    dict[ParamName, Annotated[list[ParamValue], Field(max_length=MAX_CELLS), AfterValidator(_at_least_one)]],
    _MaxKeys,
]
"""A sweep grid: parameter name -> the values it takes (at least one; the cells are the product)."""


def cell_count(grid: Mapping[str, Sequence[Any]]) -> int:
    """Number of cells of ``grid`` (name -> list of values): the product of the list lengths,
    computed without building a cell (1 for an empty grid: the cell of ``params`` alone)."""
    return math.prod(len(values) for values in grid.values())


class JobSpec(_Strict):
    """A benchmark job: one benchmark, a baseline and a candidate, a sweep of cells.

    ``sweep`` is a grid: the cells are the cartesian product of its lists, each merged over
    ``params``. ``sweep_by_device`` replaces keys of the grid on one device type, so one spec can
    run large shapes on a GPU and small ones on a CPU (the Triton interpreter is slow).

    Raises (pydantic ``ValidationError``, HTTP 422 on the server): unknown fields, empty sweep
    lists, more than ``MAX_CELLS`` cells on a device type (counted as the product of the list
    lengths before any cell is built, so a 700-byte spec of 10**10 cells costs microseconds and
    names ``sweep`` or ``sweep_by_device``), a ``benchmark`` that is neither a name nor a
    ``module:object`` reference of identifiers. Parameter values are validated per benchmark:
    against its advertised schema on the server (``kernelab.service.offers.check_spec``), by the
    benchmark itself where it is imported (``kernelab.kernels.validate_spec``).
    """

    name: Text = Field(default="", max_length=200)
    benchmark: BenchmarkRef
    baseline: VariantSpec
    candidate: VariantSpec
    params: ParamMap = Field(default_factory=dict)
    sweep: SweepGrid = Field(default_factory=dict)
    sweep_by_device: dict[DeviceType, SweepGrid] = Field(default_factory=dict)
    measurement: MeasurementSpec = Field(default_factory=MeasurementSpec)
    probes: ProbeSpec = Field(default_factory=ProbeSpec)
    correctness: CorrectnessSpec = Field(default_factory=CorrectnessSpec)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout_s: float = Field(default=1800.0, gt=0, le=86_400)
    static_metrics: StaticMetricsSpec = Field(default_factory=StaticMetricsSpec)

    # mode="before": counted on the input, before its up to 64 x 4,096 values are validated (0.4 s
    # on the event loop for a 4.5 MB spec of three such grids); list lengths do not change after.
    @field_validator("sweep", mode="before")
    @classmethod
    def _sweep_cells(cls, v: Any) -> Any:
        _refuse_over_max_cells(v, "")
        return v

    @field_validator("sweep_by_device", mode="before")
    @classmethod
    def _device_cells(cls, v: Any, info: ValidationInfo) -> Any:
        # without a valid sweep, the overrides alone (their count is a lower bound of the merged one)
        sweep = info.data.get("sweep", {})
        if not isinstance(v, Mapping):  # a type error, reported by validation
            return v
        for dev, overrides in v.items():
            if isinstance(overrides, Mapping):
                _refuse_over_max_cells({**sweep, **overrides}, f" on {str(dev)[:10]}")
        return v

    def cells(self, device_type: DeviceType) -> list[dict[str, ParamValue]]:
        """The sweep's cells for ``device_type``, in a stable order: list of parameter dicts."""
        grid = dict(self.sweep)
        grid.update(self.sweep_by_device.get(device_type, {}))
        keys = list(grid)
        out = []
        for combo in itertools.product(*(grid[k] for k in keys)):
            cell = dict(self.params)
            cell.update(zip(keys, combo, strict=True))
            out.append(cell)
        return out or [dict(self.params)]

    def cell_count(self, device_type: DeviceType) -> int:
        """``len(self.cells(device_type))``, computed without building the cells."""
        return cell_count({**self.sweep, **self.sweep_by_device.get(device_type, {})})

    def cell(self, device_type: DeviceType, index: int) -> dict[str, ParamValue]:
        """``self.cells(device_type)[index]`` (0 <= index < ``cell_count``), built alone: the
        index read in mixed radix over the grid's list lengths, the last key fastest, as
        ``itertools.product`` orders them. Raises ``IndexError`` outside that range."""
        grid = {**self.sweep, **self.sweep_by_device.get(device_type, {})}
        if not 0 <= index < cell_count(grid):
            raise IndexError(f"cell {index} of {cell_count(grid)} on {device_type}")
        picked: dict[str, ParamValue] = {}
        for key in reversed(list(grid)):
            index, digit = divmod(index, len(grid[key]))
            picked[key] = grid[key][digit]
        return {**self.params, **{k: picked[k] for k in grid}}


_COUNT_CAP = 10**18  # a cell count past this is reported as "more than 10**18"


def _refuse_over_max_cells(grid: Any, where: str) -> None:
    """Raise ``ValueError`` when ``grid`` (a sweep grid as input: name -> list) has more than
    ``MAX_CELLS`` cells, counted as the product of its list lengths (stopping past
    ``_COUNT_CAP``). Input of another shape is left to type validation."""
    if not isinstance(grid, Mapping):
        return
    n = 1
    for values in grid.values():
        if not isinstance(values, list | tuple):
            return
        n *= len(values)
        if n > _COUNT_CAP:
            break
    if n > MAX_CELLS:
        count = str(n) if n <= _COUNT_CAP else "more than 10**18"
        parts = [f"{str(k)[:40]} {len(v)}" for k, v in list(grid.items())[:8] if isinstance(v, list | tuple)]
        product = " x ".join(parts) + (" x ..." if len(grid) > 8 else "")
        raise ValueError(f"the sweep has {count} cells{where} ({product}); at most {MAX_CELLS}")


# --------------------------------------------------------------------------------------------------
# Results (what a runner posts)
# --------------------------------------------------------------------------------------------------


class Work(_Posted):
    """Work one launch does, declared by the benchmark: used for throughput and plausibility.
    Finite JSON numbers >= 0 (``true``, ``"1e3"``, NaN: 422)."""

    flops: float = Field(default=0.0, ge=0, strict=True)
    bytes_read: float = Field(default=0.0, ge=0, strict=True)
    bytes_written: float = Field(default=0.0, ge=0, strict=True)


class _Metrics(_Posted):
    """Base of the correctness checks' results: a metric posted as NaN or +-Infinity (a norm of an
    output full of NaN, an overflowing difference) is stored as None, and its field name is listed
    in ``nonfinite_metrics``; ``kernelab.service.verdicts`` tells it with the reason ``metric-not-finite``.
    The number describes a broken output, which is the measurement: refusing it would lose the
    result of the very kernel it condemns. Fields listed in ``_NULLABLE`` get this treatment; any
    other non-finite float is refused (``_Posted``)."""

    _NULLABLE: ClassVar[tuple[str, ...]] = ()

    nonfinite_metrics: list[Text] = Field(
        default_factory=list, description="metrics posted as NaN or Infinity, stored as null"
    )

    @model_validator(mode="before")
    @classmethod
    def _nonfinite_to_null(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        bad = [k for k in cls._NULLABLE if isinstance(v := data.get(k), float) and not math.isfinite(v)]
        if not bad:
            return data
        listed = data.get("nonfinite_metrics") or []
        return {**data, **dict.fromkeys(bad, None),
                "nonfinite_metrics": list(dict.fromkeys([*listed, *bad]))}  # fmt: skip


class CorrectnessResult(_Metrics):
    """One variant's output compared with the reference (float64)."""

    _NULLABLE = ("rel_error", "max_abs_error", "cosine_similarity", "rtol", "atol")

    passed: bool
    rel_error: float | None = Field(default=None, description="||out-ref|| / ||ref||")
    max_abs_error: float | None = None
    cosine_similarity: float | None = None
    rtol: float | None = None
    atol: float | None = None
    nonfinite: int = Field(default=0, ge=0, description="NaN/Inf elements in the output")
    dtype: Text | None = Field(default=None, description="the output's dtype, e.g. 'float32'")
    message: Text = ""
    # Results of kernelab.runners.checks; None where the check did not run.
    where: Text = Field(default="", description="bad elements in the output's logical coordinates")
    repeats: RepeatCheck | None = None
    determinism: DeterminismCheck | None = None
    batch_invariance: BatchInvarianceCheck | None = None
    vs_baseline: BitwiseComparison | None = Field(
        default=None, description="candidate only: bitwise comparison with the baseline's output"
    )


class RepeatCheck(_Metrics):
    """``runs`` poisoned runs against the reference: how often and how the failure shows."""

    _NULLABLE = ("worst_rel_error", "worst_max_abs_error", "bad_set_jaccard")

    runs: int = Field(ge=0)
    inputs: Literal["fixed", "fresh"] = "fixed"
    failures: int = Field(default=0, ge=0)
    worst_rel_error: float | None = None
    worst_max_abs_error: float | None = None
    failure_errors_identical: bool | None = Field(
        default=None, description="True: every failure had the same rel. error and bad elements (a clobber)"
    )
    bad_set_jaccard: float | None = Field(
        default=None, description="mean Jaccard of consecutive failures' bad-element sets (fixed inputs)"
    )
    where: Text = ""


class DeterminismCheck(_Metrics):
    """``runs`` runs on the same inputs compared bitwise with the first run."""

    _NULLABLE = ("max_abs_difference", "bad_set_jaccard")

    runs: int = Field(ge=0)
    deterministic: bool
    differing_runs: int = Field(default=0, ge=0, description="runs whose bytes differ from run 0")
    max_differing_elements: int = Field(default=0, ge=0)
    max_abs_difference: float | None = None
    bad_set_jaccard: float | None = Field(
        default=None, description="mean Jaccard of consecutive differing runs' element sets (1: fixed)"
    )
    where: Text = ""


class BatchInvarianceCheck(_Metrics):
    """Rows computed alone, in a small batch and in the full batch, compared bitwise."""

    _NULLABLE = ("max_abs_difference",)

    batch_rows: int = Field(ge=0, description="rows of the full batch")
    rows_checked: int = Field(ge=0)
    invariant: bool
    mismatched_rows: dict[Text, int] = Field(
        default_factory=dict, description="'alone' / 'small' -> rows not bitwise equal to the full batch"
    )
    mismatched_elements: int = Field(default=0, ge=0)
    max_abs_difference: float | None = None
    message: Text = ""


class BitwiseComparison(_Metrics):
    """Two outputs of one shape compared byte for byte."""

    _NULLABLE = ("max_abs_difference",)

    identical: bool
    differing_elements: int = Field(default=0, ge=0)
    max_abs_difference: float | None = None
    where: Text = ""


class ContentionReading(_Posted):
    """Who else used the GPU, read at one moment of a cell's measurement (NVML).

    ``processes``: one entry per process seen on the GPU (compute processes and processes with
    SM-utilisation samples since the previous reading): ``{"pid", "own", "used_memory_bytes",
    "sm_util_pct"}``, ``own`` True for the measuring process, values None where NVML refuses.
    """

    round: int = Field(ge=0, description="rounds completed when read")
    processes: list[JsonObject] = Field(default_factory=list)


class Reason(_Posted):
    """Why a verdict or a number is what it is: a machine-readable ``code`` (the catalogue is
    ``kernelab.service.verdicts.REASONS``), one sentence for a person, the side it concerns (None: the cell
    or job) and a severity (``error``: decides the verdict; ``warning``/``info``: told, not
    decisive). The shape of nvbench_compare's ``DecisionReason``."""

    code: Text = Field(min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")
    message: Text = Field(max_length=2_000)
    side: Variant | None = None
    severity: Severity = "error"


class TimedCheck(_Posted):
    """One checked sample of one side: the output of the timed method, verified.

    The runner refills the inputs in place with fresh values (``seed``), poisons the output,
    takes one sample exactly as the timing does (``timer``: a CUDA-graph replay, a CUDA-event
    window, a ``perf_counter`` window), and checks what came out: the output at the window's end
    against the reference, the output at rest against the output at the window's end (work that
    ran on after the window), the inputs' fingerprint before and after (a call that modified its
    inputs), threads the call left running, device work still queued after the window.
    ``findings`` holds the failures as ``Reason`` codes (``kernelab.service.verdicts.REASONS``).
    """

    timer: Text = Field(max_length=64)
    round: int = Field(ge=0, description="rounds completed when the check ran")
    seed: int = Field(ge=0)
    launches: int = Field(default=1, ge=1)
    duration_ns: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="ns per launch")
    passed: bool
    correctness: CorrectnessResult | None = None
    findings: list[Reason] = Field(default_factory=list)


StaticVerdict = Literal["identical", "different", "only-baseline", "only-candidate"]


class KernelLoopStats(_Posted):
    """An innermost loop of a kernel's machine code: byte offsets (SASS) or instruction indices."""

    start_offset: int = Field(ge=0)
    end_offset: int = Field(ge=0)
    instructions: int = Field(ge=0)
    by_class: dict[Text, int] = Field(default_factory=dict)


class KernelStatic(_Posted):
    """Static metrics of one compiled kernel (``kernelab.runners.static_metrics``).

    ``isa``: ``sass`` (from the cubin with nvdisasm/cuobjdump) or ``ptx`` (fallback: no registers).
    ``spill_stores``/``spill_loads`` count local-memory store/load instructions (``STL``/``LDL``);
    ``stack_bytes`` is local memory per thread; ``shared_bytes`` static + dynamic per block;
    occupancy is the CUDA Occupancy Calculator's, from registers, shared memory and warps.
    ``code_sha256`` digests the machine code (encodings; no names, no absolute addresses).
    """

    name: Text
    isa: Literal["sass", "ptx", "amdgcn"]
    target: Text
    num_warps: int | None = None
    num_stages: int | None = None
    registers: int | None = Field(default=None, ge=0, description="per thread")
    spill_stores: int | None = Field(default=None, ge=0)
    spill_loads: int | None = Field(default=None, ge=0)
    stack_bytes: int | None = Field(default=None, ge=0, description="local memory per thread")
    shared_bytes: int | None = Field(default=None, ge=0, description="per block")
    occupancy_blocks_per_sm: int | None = Field(default=None, ge=0)
    occupancy_pct: float | None = Field(default=None, ge=0, le=100)
    instructions: int = Field(ge=0)
    predicated: int = Field(default=0, ge=0, description="instructions under a guard predicate")
    by_class: dict[Text, int] = Field(default_factory=dict)
    by_opcode: dict[Text, int] = Field(default_factory=dict)
    loops: list[KernelLoopStats] = Field(default_factory=list, description="innermost loops")
    code_sha256: Text = ""


class StaticChange(_Posted):
    """Instructions added (``+``) or removed (``-``) by the candidate, per opcode and code region
    (``prologue``, ``loop``, ``epilogue``, ``between`` loops, ``body`` when loop-free)."""

    sign: Literal["+", "-"]
    opcode: Text
    count: int = Field(ge=1)
    region: Text


class KernelDiff(_Posted):
    """Baseline vs candidate for one kernel: deltas are candidate - baseline."""

    name: Text
    verdict: StaticVerdict
    baseline: KernelStatic | None = None
    candidate: KernelStatic | None = None
    class_delta: dict[Text, int] = Field(default_factory=dict)
    opcode_delta: dict[Text, int] = Field(default_factory=dict)
    resource_delta: dict[Text, float] = Field(default_factory=dict)
    changes: list[StaticChange] = Field(default_factory=list)
    summary: Text = ""


class StaticComparison(_Posted):
    """Static comparison of one cell's kernels; ``identical`` when every kernel's code is equal."""

    target: Text = ""
    verdict: Literal["identical", "different"] | None = None
    kernels: list[KernelDiff] = Field(default_factory=list)
    error: Text | None = None


class CellResult(_Posted):
    """All raw data measured for one sweep cell."""

    index: int = Field(ge=0)
    params: dict[Text, ParamValue]
    baseline_params: dict[Text, ParamValue] = Field(default_factory=dict)
    candidate_params: dict[Text, ParamValue] = Field(default_factory=dict)
    work: dict[Variant, Work] = Field(default_factory=dict)
    samples: SampleColumns = Field(
        default_factory=empty_samples,
        description="raw samples: base64 columns (the JSON-list columns and the row form are accepted)",
    )
    correctness: dict[Variant, CorrectnessResult] = Field(default_factory=dict)
    error: Text | None = Field(default=None, description="set when the cell could not be measured")
    timers: dict[Variant, Text] = Field(
        default_factory=dict, description="timer that measured each variant (a graph fallback shows)"
    )
    contention: list[ContentionReading] = Field(default_factory=list)
    static: StaticComparison | None = None
    timed_checks: dict[Variant, list[TimedCheck]] = Field(
        default_factory=dict, description="checked samples through the timer, per side"
    )
    findings: list[Reason] = Field(
        default_factory=list,
        description="what the runner found about the cell's measurement (timer fallback, empty graph, "
        "patched timer, node changed during the job, ...); codes in kernelab.service.verdicts.REASONS",
    )
    phase_s: dict[str, float] = Field(
        default_factory=dict,
        description="wall time of the cell's phases on the runner, s: prepare, correctness, measure "
        "(the rounds), checks (the checked samples), device_work, canary",
    )


class CopyBandwidthReading(_Posted):
    """Device-local copy: bytes read + bytes written over time."""

    device_index: int = Field(ge=0)
    size_bytes: int = Field(ge=0)
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, read + written")


class MatmulPeakReading(_Posted):
    """Dense matmul rate of one GPU: the plausibility guard's FLOP/s bound (2*M*N*K per launch)."""

    device_index: int = Field(ge=0)
    dtype: Text
    m: int = Field(ge=1)
    n: int = Field(ge=1)
    k: int = Field(ge=1)
    launches: int = Field(ge=1)
    time_us: float = Field(ge=0, description="per launch")
    tflops: float = Field(ge=0, description="TFLOP/s = 1e12 FLOP/s")


class AllReduceReading(_Posted):
    """One all-reduce size, timed as nccl-tests times it. busbw = algbw * 2(n-1)/n."""

    backend: Text
    world_size: int = Field(ge=1)
    ranks: list[int] = Field(default_factory=list, description="device indices in the group")
    size_bytes: int = Field(ge=0)
    time_us: float = Field(ge=0)
    algbw_gbps: float = Field(ge=0)
    busbw_gbps: float = Field(ge=0)
    correct: bool = True
    cuda_graph: bool = Field(default=False, description="timed as one CUDA-graph replay of the ops")
    timed_by: Literal["host-clock", "cuda-events"] = Field(
        default="host-clock",
        description="host clock around the ops + one sync (nccl-tests), or CUDA events behind a spin "
        "kernel (kernelab.runners.probes.all_reduce)",
    )


class PeerCopyReading(_Posted):
    """Copy from GPU ``src_device`` to GPU ``dst_device``: bytes moved (once) over time.

    ``peer_access`` is ``torch.cuda.can_device_access_peer``; without it the copy is staged through
    host memory by the driver and its bandwidth is measured all the same.
    """

    src_device: int = Field(ge=0)
    dst_device: int = Field(ge=0)
    peer_access: bool
    size_bytes: int = Field(ge=0)
    time_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(ge=0, description="GB/s = 1e9 bytes/s, bytes copied once")


class GpuTelemetry(_Posted):
    """NVML snapshot of one GPU. None means "not readable here", never zero."""

    device_index: int = Field(ge=0)
    name: Text = ""
    uuid: Text = ""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    max_sm_clock_mhz: float | None = None
    clock_event_reasons: int | None = Field(
        default=None,
        ge=0,
        strict=True,
        description="NVML clock-event-reasons mask (kernelab.service.clock_events)",
    )
    clock_event_reason_names: list[Text] = Field(
        default_factory=list,
        description="the mask's reasons, decoded by the server (posted names that contradict the mask "
        "are replaced; names without a mask are kept for display and never judged)",
    )
    temperature_c: float | None = None
    memory_temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    ecc_volatile_uncorrected: int | None = None
    other_processes: list[JsonObject] = Field(default_factory=list)

    @model_validator(mode="after")
    def _names_from_mask(self) -> GpuTelemetry:
        if self.clock_event_reasons is not None:
            self.clock_event_reason_names = clock_events.decode(self.clock_event_reasons)
        return self


class ProbeReport(_Posted):
    """Node-health readings taken at one moment (before or after a job, or on demand)."""

    phase: Literal["before", "after", "adhoc"] = "adhoc"
    taken_at: UtcDatetime
    wall_s: float = Field(default=0.0, ge=0, description="how long the probe took")
    copy_bandwidth: list[CopyBandwidthReading] = Field(default_factory=list)
    all_reduce: list[AllReduceReading] = Field(default_factory=list)
    telemetry: list[GpuTelemetry] = Field(default_factory=list)
    peer_copy: list[PeerCopyReading] = Field(default_factory=list)
    mode: Literal["quick", "full"] = "quick"
    notes: list[Text] = Field(default_factory=list, description="probes skipped and why")
    matmul_peak: list[MatmulPeakReading] = Field(default_factory=list)
    nvml_status: Text = Field(default="absent", description="'ok', 'absent' or the error")
    errors: dict[Text, Text] = Field(default_factory=dict, description="probe name -> error text")


class RevisionInfo(_Posted):
    """One side's code as measured: the revision it came from and the software it ran with.

    ``repo``/``ref``/``branch``/``subdir`` echo the ``SourceSpec`` (all empty when the side used
    the installed code); ``sha`` is the full commit id checked out; ``versions`` maps ``torch``,
    ``triton``, ``cuda``, ``driver``, ``python`` to what the side's worker process saw (None:
    absent).
    """

    repo: Text = ""
    ref: Text = ""
    branch: Text = ""
    subdir: Text = ""
    sha: Text = ""
    versions: dict[Text, Text | None] = Field(default_factory=dict)


class RevisionsInfo(_Posted):
    """Both sides' revisions of an A/B job across source revisions (``NodeInfo.revisions``).

    ``diff_stat`` is ``git diff --stat`` from the baseline's commit to the candidate's (empty when
    the sides come from different repositories or one uses the installed code); ``diff_shortstat``
    its one-line summary ("2 files changed, 5 insertions(+), 1 deletion(-)").
    """

    baseline: RevisionInfo
    candidate: RevisionInfo
    diff_stat: Text = ""
    diff_shortstat: Text = ""


class NodeInfo(_Posted):
    """What the node is: hardware and software fingerprint of a result."""

    hostname: Text = Field(min_length=1, max_length=255, description="the node's name (results.node_name)")
    device_type: DeviceType
    device_name: Text = ""
    device_count: int = Field(default=0, ge=0)
    l2_bytes: int | None = None
    driver_version: Text | None = None
    cuda_version: Text | None = None
    torch_version: Text | None = None
    triton_version: Text | None = None
    python_version: Text = ""
    triton_interpret: bool = False
    revisions: RevisionsInfo | None = Field(
        default=None, description="set for a job whose sides came from git revisions"
    )


RESULT_SCHEMA_VERSION = 2
"""Version of a ``JobResult`` document (a POST body, a runner's spool file, ``kernelab run
--result``), written as its first key ``schema_version`` by every writer (versioned result files
as nvbench's ``nvbench_json/version.py``). 1: no ``schema_version`` key, samples as JSON-list
columns or rows. 2: samples as base64 columns (``kernelab.service.samples``). A reader takes
every version up to its own (an older document is read into the current model: upgraded) and
refuses a newer one (``schema_version_newer``, a 422 naming ``schema_version`` on the server)."""


def _known_schema_version(value: int) -> int:
    if value > RESULT_SCHEMA_VERSION:
        raise PydanticCustomError(
            "schema_version_newer",
            "schema_version {version} is newer than this reader knows (at most {known}): upgrade it",
            {"version": value, "known": RESULT_SCHEMA_VERSION},
        )
    return value


SchemaVersion = Annotated[int, Strict(), Field(ge=1), AfterValidator(_known_schema_version)]


class ResultHeader(BaseModel):
    """The keys of a ``JobResult`` document a runner reads before it posts the document's bytes
    unchanged (``kernelab.runners.spool``): other keys are ignored, not validated. A document
    without ``schema_version`` is of version 1. Raises ``ValidationError`` for a document that
    is not a JSON object, or (``schema_version_newer``) of a version newer than
    ``RESULT_SCHEMA_VERSION``."""

    schema_version: SchemaVersion = 1
    job_id: int | None = None


class JobResult(_Posted):
    """Everything a runner measured for one job: posted whole, stored whole or not at all.

    ``idempotency_key`` makes a retried post harmless: the server stores the first and answers
    later posts with the same key by pointing at it. ``schema_version``: ``RESULT_SCHEMA_VERSION``
    (a document without it is of version 1 and is read as this version).
    """

    schema_version: SchemaVersion = Field(
        default=RESULT_SCHEMA_VERSION, description="version of this document (1 when left out)"
    )
    idempotency_key: Text = Field(min_length=8, max_length=200)
    job_id: int | None = None
    spec: JobSpec
    node: NodeInfo
    timer: Text = Field(max_length=64, description="'cuda-event' or 'perf_counter'")
    started_at: UtcDatetime
    finished_at: UtcDatetime
    cells: list[CellResult]
    probes: list[ProbeReport] = Field(default_factory=list)
    error: Text | None = None


# --------------------------------------------------------------------------------------------------
# Statistics (computed by kernelab.service.stats from a JobResult)
# --------------------------------------------------------------------------------------------------


class VariantStats(BaseModel):
    """Robust summary of one variant's kept samples, nanoseconds per launch."""

    n: int
    dropped_throttled: int = 0
    median_ns: float | None = None
    min_ns: float | None = None
    q1_ns: float | None = None
    q3_ns: float | None = None
    iqr_ns: float | None = None
    mean_ns: float | None = None


class CellComparison(BaseModel):
    """Before/after for one cell: ratio = candidate median / baseline median (< 1 is faster)."""

    index: int
    params: dict[str, ParamValue]
    label: str
    baseline: VariantStats
    candidate: VariantStats
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    delta_pct: float | None = Field(default=None, description="(ratio - 1) * 100")
    hl_shift_ns: float | None = Field(default=None, description="Hodges-Lehmann candidate - baseline")
    hl_ci_low_ns: float | None = None
    hl_ci_high_ns: float | None = None
    p_value: float | None = Field(default=None, description="Mann-Whitney U, two-sided")
    p_adjusted: float | None = Field(default=None, description="Benjamini-Hochberg over the sweep")
    mde_pct: float | None = Field(default=None, description="minimum detectable effect, percent")
    verdict: Verdict
    timing_verdict: TimingVerdict | None = Field(
        default=None,
        description="what the timing alone says; the verdict outranks it (kernelab.service.verdicts)",
    )
    reasons: list[Reason] = Field(
        default_factory=list,
        description=(
            "why the verdict is what it is, deciding reason first (kernelab.service.verdicts.REASONS)"
        ),
    )
    flags: list[Flag] = Field(default_factory=list)
    correctness: dict[Variant, CorrectnessResult] = Field(default_factory=dict)
    timed_checks: dict[Variant, list[TimedCheck]] = Field(default_factory=dict)
    throughput: dict[str, float] = Field(default_factory=dict, description="e.g. candidate_tflops")
    error: str | None = None
    static: StaticComparison | None = None
    timers: dict[Variant, str] = Field(default_factory=dict, description="timer kind per variant")


class Comparison(BaseModel):
    """A job's before/after comparison, as JSON (``GET /api/v1/jobs/{id}/comparison``)."""

    job_id: int | None = None
    name: str = ""
    benchmark: str
    baseline_label: str
    candidate_label: str
    threshold_pct: float
    timer: str
    node: NodeInfo
    cells: list[CellComparison]
    probes: list[ProbeReport] = Field(default_factory=list)
    flags: list[Flag] = Field(default_factory=list, description="job-level flags")
    summary: dict[str, int] = Field(default_factory=dict, description="verdict -> count")
    notes: list[str] = Field(default_factory=list, description="e.g. why the result is excluded")
    reasons: list[Reason] = Field(
        default_factory=list, description="job-level findings (e.g. the node changed during the job)"
    )
    method_version: int = Field(
        default=1,
        description="version of the verdict rules that computed this comparison "
        "(kernelab.service.verdicts.METHOD_VERSION); a stored comparison of an older version is recomputed",
    )


# --------------------------------------------------------------------------------------------------
# API payloads
# --------------------------------------------------------------------------------------------------


class JobPublic(BaseModel):
    id: int
    name: str
    benchmark: str
    status: JobStatus
    spec: JobSpec
    attempts: int
    max_attempts: int
    created_at: UtcDatetime
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    node: str | None = None
    error: str | None = None
    summary: dict[str, int] = Field(default_factory=dict)
    comparison_status: Literal["none", "comparing", "ready", "failed"] = Field(
        default="none",
        description="the comparison of the job's result: none (no result), comparing (queued for or "
        "being computed by a compare worker), ready (GET /jobs/{id}/comparison answers it), failed",
    )
    comparison_error: str | None = Field(default=None, description="why the comparison failed")
    waiting_for: str | None = Field(
        default=None,
        description="set while the job is queued and no live runner advertises its benchmark: why it waits",
    )


class JobsPage(BaseModel):
    data: list[JobPublic]
    count: int


AttemptOutcome = Literal["running", "succeeded", "failed", "expired", "cancelled"]
"""How one claim of a job ended (``models.ATTEMPT_OUTCOMES``); ``running`` while it holds the lease."""


class AttemptPublic(BaseModel):
    """One claim of a job by a runner (a row of ``job_attempts``)."""

    attempt: int = Field(description="1 for the first claim, counting up")
    runner: str | None = Field(default=None, description="runner name; null if the runner was deleted")
    claimed_at: UtcDatetime
    ended_at: UtcDatetime | None = None
    outcome: AttemptOutcome
    error: str | None = None


class AttemptsPage(BaseModel):
    data: list[AttemptPublic]
    count: int


class RunnerRegister(_Strict):
    name: Annotated[Text, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:-]+$")]
    node: NodeInfo | None = None


class RunnerRegistered(BaseModel):
    runner_id: int
    name: Text
    token: Text = Field(description="per-runner bearer token; shown once, stored hashed")


class RunnerIdentity(BaseModel):
    """``GET /runners/me``: the runner a runner token belongs to and the node it is bound to
    (None: not bound yet; ``kernelab.service.runner_identity``)."""

    runner_id: int
    name: Text
    node_name: Text | None = None


# --------------------------------------------------------------------------------------------------
# Benchmark advertisements (what a runner can run; kernelab.service.adverts checks specs against them)
# --------------------------------------------------------------------------------------------------

MAX_ADVERTS = 64  # benchmarks one runner may advertise
MAX_NAMES = 8  # spec strings one advertised benchmark answers to (name, module:object, ...)
MAX_VARIANTS = 64
MAX_SCHEMA_BYTES = 64_000  # one Params schema as compact JSON (the built-ins' are under 2 kB)
MAX_ADVERTS_BYTES = 512_000  # a whole advertisement as compact JSON

AdvertName = Annotated[Text, Field(min_length=1, max_length=500)]


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON of ``value`` (what advertisement digests hash)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@lru_cache(maxsize=1024)
def _schema_problem(schema_json: str) -> str | None:
    """Why a schema (compact JSON) is no valid Draft 2020-12 JSON Schema, or None. Cached: a
    fleet's runners advertise the same schemas, and checking one against the metaschema costs
    ~30 ms."""
    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        return f"not a valid JSON Schema at {where}: {exc.message[:300]}"
    return None


class BenchmarkAdvert(_Strict):
    """One benchmark a runner can run.

    ``names``: every ``JobSpec.benchmark`` string that resolves to it on that runner (a built-in's
    name and its ``module:object``; an entry point's name and its object reference; a configured
    ``module:object``). ``params_schema``: the JSON Schema (Draft 2020-12) of one cell's
    parameters. ``code_version``: the distribution's version and a hash of the module's source
    (None in the advertisements that ship with the server). Raises ``pydantic.ValidationError``
    naming the field for a schema that is not a valid JSON Schema or is over
    ``MAX_SCHEMA_BYTES``."""

    names: list[AdvertName] = Field(min_length=1, max_length=MAX_NAMES)
    variants: list[Annotated[Text, Field(min_length=1, max_length=200)]] = Field(
        min_length=1, max_length=MAX_VARIANTS
    )
    params_schema: JsonObject
    code_version: Text | None = Field(default=None, max_length=200)
    description: Text = Field(default="", max_length=2000)

    @field_validator("params_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        size = len(canonical_json(schema).encode())
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"the schema is {size} bytes as JSON; at most {MAX_SCHEMA_BYTES}")
        problem = _schema_problem(canonical_json(schema))
        if problem is not None:
            raise ValueError(problem)
        return schema

    @property
    def schema_sha256(self) -> str:
        """SHA-256 hex of the schema as compact, key-sorted JSON: two adverts with the same digest
        accept the same specs."""
        return hashlib.sha256(canonical_json(self.params_schema).encode()).hexdigest()


class RunnerAdverts(_Strict):
    """A runner's whole advertisement (``ClaimRequest.benchmarks``): at most ``MAX_ADVERTS``
    benchmarks, ``MAX_ADVERTS_BYTES`` in all, no ``benchmark`` name advertised twice."""

    benchmarks: list[BenchmarkAdvert] = Field(max_length=MAX_ADVERTS)

    @model_validator(mode="after")
    def _bounded(self) -> RunnerAdverts:
        size = len(self.canonical().encode())
        if size > MAX_ADVERTS_BYTES:
            raise ValueError(f"the advertisement is {size} bytes as JSON; at most {MAX_ADVERTS_BYTES}")
        seen: set[str] = set()
        for i, advert in enumerate(self.benchmarks):
            for name in advert.names:
                if name in seen:
                    raise ValueError(f"benchmarks[{i}]: {name!r} is advertised twice")
                seen.add(name)
        return self

    def canonical(self) -> str:
        """Compact, key-sorted JSON of the advertisement (what ``sha256`` hashes)."""
        return canonical_json(self.model_dump(mode="json"))

    @property
    def sha256(self) -> str:
        """SHA-256 hex of ``canonical()``: the server rewrites its stored copy only on a change."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def by_name(self) -> dict[str, BenchmarkAdvert]:
        """Every advertised ``benchmark`` string -> its advert."""
        return {name: advert for advert in self.benchmarks for name in advert.names}


class ClaimRequest(_Strict):
    """A claim: long-poll up to ``wait_s``; the job's lease lasts ``lease_s``.

    ``benchmarks``: the runner's advertisement (``kernelab.runners.adverts``); the server routes
    only jobs of advertised benchmarks whose spec fits the advertised schema to this runner.
    Sent whole on a runner's first claim; later claims send only ``benchmarks_sha256``
    (``RunnerAdverts.sha256``), and a server that does not hold that digest answers 409
    ``advert_required`` naming ``benchmarks``, so the runner sends it whole again. A claim
    with neither (a runner older than advertisements) is routed any job, as before."""

    wait_s: float = Field(default=0.0, ge=0, le=60, description="long-poll for up to this long")
    lease_s: float = Field(default=120.0, ge=5, le=3600)
    benchmarks: RunnerAdverts | None = None
    benchmarks_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None


class JobClaim(BaseModel):
    job_id: int
    attempt: int
    spec: JobSpec
    lease_expires_at: UtcDatetime


class LeasePublic(BaseModel):
    """A heartbeat's answer: the job's lease now ends at ``lease_expires_at`` (UTC); ``attempt``
    is the attempt the lease belongs to (1-based)."""

    job_id: int
    attempt: int
    lease_expires_at: UtcDatetime


class Heartbeat(_Strict):
    lease_s: float = Field(default=120.0, ge=5, le=3600)


class JobFailure(_Strict):
    error: Text = Field(min_length=1, max_length=20_000)
    retry: bool = False


class ResultAccepted(BaseModel):
    job_id: int
    result_id: int
    duplicate: bool = False


# --------------------------------------------------------------------------------------------------
# Node health (kernelab.service.health)
# --------------------------------------------------------------------------------------------------


class HealthBand(BaseModel):
    """A probe figure's healthy band on one node (``scope`` "node") or GPU model ("fleet <model>").

    ``median``/``low``/``high`` over ``n`` healthy probes, in ``unit``; ``limit`` is where the figure
    leaves the band (below it when ``better`` is "higher", above it when "lower").
    """

    figure: str
    unit: str
    better: Literal["higher", "lower"]
    median: float
    low: float
    high: float
    n: int = Field(ge=1)
    limit: float
    scope: str = "node"


class HealthReason(BaseModel):
    """Why a probe report is not healthy: ``code`` (e.g. ``copy-outside-band``, ``other-tenant``),
    the result flag it implies, and a sentence naming the GPU or figure."""

    code: str
    flag: Literal["degraded-node", "contended"]
    message: str
    figure: str | None = None
    device_index: int | None = None
    value: float | None = None
    limit: float | None = None


class NodeHealth(BaseModel):
    """A node's health now, from its latest probe report (``GET /api/v1/nodes/{name}``)."""

    status: Literal["healthy", "degraded", "contended", "unknown"]
    model: str | None = Field(default=None, description="GPU model whose fleet band applies")
    taken_at: UtcDatetime | None = Field(default=None, description="the latest probe report's time")
    reasons: list[HealthReason] = Field(default_factory=list)
    bands: list[HealthBand] = Field(default_factory=list)
    flags: list[Flag] = Field(default_factory=list)
    healthy_probes: int = Field(default=0, ge=0, description="reports that taught the node's band")
    message: str = ""


class HealthJudgementPublic(BaseModel):
    """A result's stored node-health judgement (``GET``/``POST /api/v1/jobs/{id}/health``): judged
    at ``judged_at`` against the node's and the fleet's bands as of ``as_of`` (the job's last probe),
    by ``trigger`` ``ingest`` (the compare worker after ingest, or the first read) or ``rejudge`` (asked
    for explicitly). The latest judgement holds; its ``flags`` and ``notes`` are the comparison's."""

    trigger: Literal["ingest", "rejudge"]
    judged_at: UtcDatetime
    as_of: UtcDatetime
    flags: list[Flag] = Field(default_factory=list)
    reasons: list[HealthReason] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class HealthJudgements(BaseModel):
    """Every judgement of a result, oldest first; ``current`` is the last."""

    current: HealthJudgementPublic
    data: list[HealthJudgementPublic]


# --------------------------------------------------------------------------------------------------
# History (kernelab.service.history)
# --------------------------------------------------------------------------------------------------

ChangeReason = Literal["first-point", "fingerprint-changed", "excluded"]
"""Why a history point has no ``change_pct`` (``kernelab.service.history.CHANGE_MEANING``)."""
Excluded = Literal["node-flagged", "problem-verdict"]
"""Why history views leave a point out by default (``kernelab.service.history.EXCLUDED_MEANING``)."""


class HistoryPoint(BaseModel):
    """One point of a benchmark's history (``kernelab.service.history``): one side of one cell of one
    result. ``median_ns``: ns per launch of its kept samples; ``change_pct``: (median / previous
    shown median of its line with the same driver - 1) x 100, None with ``change_reason``."""

    job_id: int | None
    measured_at: UtcDatetime
    side: Variant
    code: str = Field(description="branch of a revision side, else variant (params)")
    sha: str = ""
    cell: str
    cell_index: int
    gpu_model: str
    driver: str | None = None
    timer: str
    state: Literal["cold", "warm"]
    median_ns: float
    n: int
    verdict: str
    node: str
    excluded: Excluded | None = None
    change_pct: float | None = None
    change_reason: ChangeReason | None = None


class Series(BaseModel):
    """One line of the history: points of one code and cell on one GPU model, timer and state."""

    code: str
    cell: str
    gpu_model: str
    timer: str
    state: Literal["cold", "warm"]
    points: list[HistoryPoint]

    @property
    def name(self) -> str:
        return f"{self.code} · {self.cell} · {self.gpu_model} · {self.timer}/{self.state}"


class HistoryPage(BaseModel):
    """``GET /api/v1/history``: a benchmark's lines over its ``limit`` latest results."""

    benchmark: str
    include_excluded: bool
    results: int = Field(description="results read (the latest, up to limit)")
    excluded: dict[str, int] = Field(default_factory=dict, description="points left out, per reason")
    series: list[Series]
