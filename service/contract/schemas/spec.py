"""The job specification: what a user submits (``JobSpec`` and its parts)."""

from __future__ import annotations

import itertools
import math
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from kernelab.service.contract.schemas.types import (
    MAX_ATOL,
    MAX_INPUT_SCALE,
    MAX_RTOL,
    MAX_SEED,
    MIN_INPUT_SCALE,
    AtDoor,
    DeviceType,
    Name,
    ParamValue,
    Text,
    _Strict,
    at_door,
    storable_text,
)

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
    AfterValidator(storable_text),
    AfterValidator(_benchmark_ref),
    Field(description="registry name (e.g. 'matmul') or 'module.path:ClassName'"),
]
"""A spec's ``benchmark``: a registry name or a ``module.path:ClassName`` reference, checked for
form only (``kernelab.kernels.get_benchmark`` resolves it where the benchmark code is imported: the
CLI and the runner, never the server)."""


_GIT_REF = r"^[A-Za-z0-9._/@{}^~+-]+$"  # a branch, tag or sha; no spaces, ':' or shell characters


class SourceSpec(_Strict):
    """Where one side's code comes from: a git repository at one revision (``SideSpec.source``).

    ``repo`` is a local path or a URL that the runner's allow-list must name (runner option
    ``--allow-repo`` / ``KERNELAB_ALLOWED_REPOS``); ``ref`` a branch, tag or commit sha (``kernelab
    submit --baseline-ref`` puts the sha there and the branch name in ``branch``); ``subdir`` the
    folder, relative to the repository root, that goes first on ``sys.path``; ``install`` commands
    run once per revision in that folder (no shell; ``{python}`` is the runner's interpreter,
    ``{site}`` a per-revision folder also put on ``sys.path``, e.g. ``"{python} -m pip install
    --no-deps --target {site} ."``). Raises (422): a ref starting with ``-``, an absolute or ``..``
    subdir.
    """

    repo: Annotated[Text, Field(min_length=1), AtDoor(max_length=1000)]
    ref: Annotated[Text, Field(min_length=1, pattern=_GIT_REF), AtDoor(max_length=250)]
    branch: Annotated[Text, AtDoor(max_length=250)] = Field(
        default="", description="label for the history per branch"
    )
    subdir: Annotated[Text, AtDoor(max_length=500)] = ""
    install: list[Annotated[Text, AtDoor(max_length=4000)]] = Field(default_factory=list, max_length=20)

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


class SideSpec(_Strict):
    """One side of the comparison: a named variant of the benchmark and parameter overrides.

    ``params`` override the cell's parameters for this side only, so "two parameter sets of one
    benchmark" (e.g. two tile sizes of the Triton matmul) is a baseline and a candidate that name the
    same variant with different ``params``. ``source`` (optional) takes this side's code from a git
    revision instead of the installed packages (see ``SourceSpec``).
    """

    variant: Annotated[Text, Field(min_length=1), AtDoor(max_length=200)]
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
        "sides and 5 kept samples per side (kernelab.service.judge.verdicts.MIN_ROUNDS, MIN_SAMPLES)",
    )
    max_rounds: int = Field(default=10_000, ge=2, le=1_000_000)
    samples_per_round: int = Field(
        default=1, ge=1, le=1_000, description="samples of each variant per round (ABBA uses 2 rounds of A,B)"
    )
    order: Literal["abba", "random"] = "abba"
    seed: Annotated[int, Field(ge=0), AtDoor(le=MAX_SEED)] = Field(
        default=0,
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
    exclude_throttled: bool = Field(
        default=True,
        description="leave out samples taken while throttled (below 75% of the expected SM clock, or a "
        "throttle clock-event reason such as sw_power_cap). Unset, it is true for state 'cold' and false "
        "for state 'sustained', where the power-capped clock is the state asked for; the throttled flag "
        "is shown either way",
    )
    min_time_ms: float = Field(
        default=500.0,
        ge=0,
        le=600_000,
        description="timed device time (both variants) before the CI may stop sampling (nvbench "
        "--min-time); budget_ms still caps",
    )
    stop_rule: Literal["decided", "target-ci"] = Field(
        default="decided",
        description="'decided': after min_time_ms, stop once the CI is narrower than target_ci_pct or "
        "already decides the verdict (faster, slower or same at threshold_pct, with a margin); "
        "'target-ci': only once it is narrower than target_ci_pct (kernelab.runners.engine)",
    )
    timer: Literal["auto", "cuda-event", "cuda-graph", "perf_counter"] = Field(
        default="auto",
        description="'auto': CUDA-graph replay on a GPU (cuda-event for a callable that cannot be "
        "captured), perf_counter on a CPU",
    )

    cross_check: bool = Field(
        default=True,
        description="also time every cell briefly with the other GPU method (CUDA events behind a spin "
        "kernel vs CUDA-graph replay); a disagreement beyond cross_check_pct is flagged "
        "timer-disagreement (kernelab.service.judge.verdicts.cross_check_summary)",
    )
    cross_check_pct: float = Field(
        default=5.0,
        gt=0,
        le=100,
        description="how far (percent, beyond both methods' IQR/median) the two methods may differ on a "
        "side, and the two ratios from each other",
    )
    cross_check_rounds: int = Field(
        default=10, ge=5, le=10_000, description="ABBA rounds of the cross-check (one sample per side each)"
    )
    placement: Literal["rotate", "fixed"] = Field(
        default="rotate",
        description="'rotate': each side is prepared on several input sets allocated alike (input_sets, "
        "as many as fit in half the free device memory and let the rounds cover every assignment "
        "twice in half of budget_ms), and the sets rotate between the sides every three rounds, so a "
        "buffer-placement effect falls on both sides alike and the CI spans what is left of it; "
        "'fixed': each side times one set (the least memory)",
    )
    input_sets: int = Field(
        default=8,
        ge=2,
        le=16,
        description="placement 'rotate': the most input sets per side. Output buffers of the same "
        "kernel at different addresses differ by up to 0.4% on an H200 (docs/results/"
        "2026-12-03-h200-placement.md); with 4 or more sets the ratio's CI covers that spread, with 2 "
        "a change must show in both assignments",
    )
    state: Literal["cold", "sustained"] = Field(
        default="cold",
        description="the power state the samples are taken in. 'cold': each sample as it comes, after "
        "the L2 flush and the host's gap between samples (a kernel of a millisecond or more is timed "
        "near the GPU's top clock); 'sustained': the warm-up lasts at least 1 s "
        "(kernelab.runners.engine.SUSTAINED_WARMUP_MS) and every timed sample follows sustain_ms of "
        "untimed samples of the same side, so the GPU stays loaded and runs at the clock its power "
        "limit allows, as in a training step (docs/results/2026-12-02-h200-timing-artefacts.md)",
    )
    sustain_ms: float = Field(
        default=20.0,
        gt=0,
        le=10_000,
        description="state 'sustained': untimed back-to-back samples of the same side before each timed one",
    )
    energy: bool = Field(
        default=False,
        description="also measure joules per launch per side from the device's energy counter (NVML "
        "total energy, which updates about every 100 ms on an H200): energy_blocks blocks per side of "
        "energy_block_ms each, ABBA, after the rounds (kernelab.runners.engine.energy_check)",
    )
    energy_blocks: int = Field(default=4, ge=2, le=100, description="energy blocks per side")
    energy_block_ms: float = Field(
        default=500.0, ge=100, le=60_000, description="length of one energy block (several counter updates)"
    )

    @model_validator(mode="before")
    @classmethod
    def _throttle_rule_follows_state(cls, data: Any) -> Any:
        """``exclude_throttled`` unset: true unless ``state`` is 'sustained' (the value is then
        written into the spec, so a stored spec reads the same on every day)."""
        if isinstance(data, dict) and "exclude_throttled" not in data:
            return {**data, "exclude_throttled": data.get("state") != "sustained"}
        return data

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

    @classmethod
    def off(cls) -> ProbeSpec:
        """Every probe off, the in-process copy canary included (``kernelab run --no-probes``,
        ``kernelab submit --no-probes``, the Python API's default)."""
        return cls(copy_bandwidth=False, all_reduce=False, nvml=False, matmul_peak=False, canary=False)


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
    target: Annotated[Text, Field(pattern=r"^sm_\d{2,3}a?$"), AtDoor(max_length=16)] | None = Field(
        default=None, description="e.g. sm_90a"
    )


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

ParamName = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(storable_text)]
"""A parameter's name (a field of a benchmark's ``Params``)."""
_MaxKeys = AtDoor(max_length=MAX_PARAM_KEYS)
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
    against its advertised schema on the server (``kernelab.service.server.offers.check_spec``), by the
    benchmark itself where it is imported (``kernelab.kernels.validate_spec``).
    """

    name: Name = ""
    benchmark: BenchmarkRef
    baseline: SideSpec
    candidate: SideSpec
    params: ParamMap = Field(default_factory=dict)
    sweep: SweepGrid = Field(default_factory=dict)
    sweep_by_device: Annotated[dict[DeviceType, SweepGrid], AtDoor(max_length=2)] = Field(
        default_factory=dict
    )
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


def param_loc(spec: JobSpec, field: str, device_type: str, side: str) -> tuple[str, ...]:
    """Where in ``spec`` the value of parameter ``field`` of one cell of ``side`` on
    ``device_type`` came from (``("baseline", "params", "N")``, ``("sweep_by_device", "cpu",
    "N")``, ``("sweep", "N")``, ``("params", "N")``), for an error's ``loc``."""
    if field in getattr(spec, side).params:
        return (side, "params", field)
    if field in spec.sweep_by_device.get(device_type, {}):  # type: ignore[call-overload]
        return ("sweep_by_device", device_type, field)
    if field in spec.sweep:
        return ("sweep", field)
    if field in spec.params:
        return ("params", field)
    return ("params", field) if field else ("params",)
