"""The benchmark interface and its registry.

A benchmark declares *what* is measured, never *how*: parameters (a pydantic model, so the server
can validate a spec without a GPU), variants, inputs made on a device, a reference computed in
float64, and the work (FLOPs, bytes read, bytes written) one launch does. The runner's engine
(``kernelab.runners.engine``) decides how to time it.

This module must import without torch: the server validates specs with it. Benchmarks import
torch and triton lazily, inside their methods.

Registering your own benchmark:

* name it in a spec as ``"mypkg.bench:MyBenchmark"`` (a ``Benchmark`` subclass or instance), or
* expose it in your distribution's ``kernelab.benchmarks`` entry-point group::

      [project.entry-points."kernelab.benchmarks"]
      mybench = "mypkg.bench:MyBenchmark"
"""

from __future__ import annotations

import importlib
import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from functools import cache
from importlib.metadata import entry_points
from typing import Annotated, Any, ClassVar, Generic, TypeVar, cast

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from kernelab.kernels.tolerances import Reduction
from kernelab.service.contract.schemas import (
    BENCHMARK_OBJECT_REF,
    JobSpec,
    ParamValue,
    Work,
    benchmark_ref_problem,
    param_loc,
)

ENTRY_POINT_GROUP = "kernelab.benchmarks"


class BenchmarkError(Exception):
    """A benchmark cannot be found, imported or configured. ``loc`` names the spec field."""

    def __init__(self, message: str, loc: tuple[str | int, ...] = ("benchmark",)):
        super().__init__(message)
        self.loc = loc


# Largest integer parameter: shapes index tensors with int32 arithmetic in Triton kernels and reach
# cuBLAS as int32 dimensions, and a larger value only fails later, deep inside a launch.
MAX_INT_PARAM = 2**31 - 1


class Params(BaseModel):
    """Base for a benchmark's parameter model: unknown parameters are errors, and every integer
    parameter must fit in int32 (``MAX_INT_PARAM``); raises ``pydantic.ValidationError`` naming the
    field otherwise."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _fits_int32(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT_PARAM:
            raise ValueError(f"must be at most {MAX_INT_PARAM} (int32)")
        return value


def _check_power_of_two(value: int) -> int:
    if value <= 0 or value & (value - 1):
        raise ValueError(f"must be a power of two, got {value}")
    return value


POWERS_OF_TWO = [1 << k for k in range(31)]  # every power of two within int32 (MAX_INT_PARAM)

PowerOfTwo = Annotated[
    int, AfterValidator(_check_power_of_two), Field(json_schema_extra={"enum": POWERS_OF_TWO})
]
"""A positive power-of-two ``int`` parameter (Triton block sizes, ``num_warps``); its JSON Schema
lists the powers of two within int32, so a server holding only the schema refuses 3 too."""


class ParamsJsonSchema(GenerateJsonSchema):
    """pydantic's JSON Schema generator, with ``Params``' int32 bound (``MAX_INT_PARAM``) on every
    integer that declares no tighter one: the schema a runner advertises
    (``kernelab.service.contract.adverts``) then refuses what ``Params._fits_int32`` refuses."""

    def int_schema(self, schema: core_schema.IntSchema) -> JsonSchemaValue:
        value = super().int_schema(schema)
        value.setdefault("maximum", MAX_INT_PARAM)
        value.setdefault("minimum", -MAX_INT_PARAM)
        return value


def params_json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (Draft 2020-12) of a benchmark's parameter model, for validation
    (``mode="validation"``, ``ParamsJsonSchema``)."""
    return model.model_json_schema(schema_generator=ParamsJsonSchema, mode="validation")


# Inside ``Benchmark`` the name ``Params`` is each subclass's own model; annotations use this alias.
ParamsModel = Params

P = TypeVar("P", bound=ParamsModel)
"""A benchmark's own parameter model: ``class MyBenchmark(Benchmark[MyParams])``."""


class Benchmark(ABC, Generic[P]):
    """One benchmark: parameters, variants, inputs, reference, declared work.

    Generic over its parameter model ``P``: subclass ``Benchmark[MyParams]``, set ``name``,
    ``Params = MyParams`` and ``variants`` (names, in display order), and implement the abstract
    methods, whose ``params`` are then ``MyParams``. Instances are stateless.
    """

    name: ClassVar[str]
    # Should be ``type[P]``, but a ClassVar cannot mention a type variable; subclasses set it to
    # the same model they pass as ``P`` (``parse_params`` relies on that).
    Params: ClassVar[type[ParamsModel]]
    variants: ClassVar[tuple[str, ...]]
    description: ClassVar[str] = ""

    @abstractmethod
    def make_inputs(self, params: P, device: Any, seed: int) -> dict[str, Any]:
        """Fresh random inputs on ``device`` (a ``torch.device``); never zeros. Not timed.

        Draw them from a ``torch.Generator`` seeded with ``seed``
        (``kernelab.kernels._device.seeded_generator`` and ``kernelab.kernels._device.randn``) so a cell is
        reproducible and baseline and candidate see the same data. Every seed must give tensors of
        the same shapes and dtypes: the checked samples (``kernelab.runners.sides``) draw inputs with other
        seeds and copy them into the tensors the prepared callable reads.
        """

    @abstractmethod
    def prepare(self, variant: str, params: P, inputs: dict[str, Any]) -> Callable[[], Any]:
        """Return a zero-argument callable that launches ``variant`` once and returns its output.

        All allocation and compilation that can happen outside the timed closure happens here;
        the output buffer may be preallocated and reused. The callable must compute from the
        current values of ``inputs``' tensors on every call: kernelab refills them in place with
        fresh values between checked samples, so a result derived from the values here (a cached
        answer, or a copy such as ``.contiguous()`` of a non-contiguous input) reads as wrong.
        Raises ``BenchmarkError`` for an unknown variant.
        """

    @abstractmethod
    def reference(self, params: P, inputs: dict[str, Any]) -> Any:
        """The exact result in float64 (a ``torch.Tensor``), on the CPU or the inputs' device."""

    @abstractmethod
    def work(self, params: P, variant: str) -> Work:
        """Work one launch of ``variant`` does at ``params`` (FLOPs, bytes read, bytes written)."""

    def tolerances(self, params: P) -> tuple[float, float]:
        """``(rtol, atol)`` for rounding the result to its dtype: ``params.dtype``'s defaults
        (``kernelab.kernels.tolerances.default_tolerances``; float32 without a ``dtype``). Override it
        for arithmetic that needs other values; a declared ``reduction`` is added to them either way
        (``kernelab.kernels.preflight.tolerance_of``)."""
        from kernelab.kernels.tolerances import default_tolerances

        return default_tolerances(str(getattr(params, "dtype", "float32")))

    def reduction(self, params: P) -> Reduction | int | None:
        """The reduction behind each output element: how many terms are summed into one (an int,
        or a ``kernelab.Reduction`` that also names the accumulation dtype and any rounding on
        the way), or None when there is none (an elementwise kernel; the default).

        Its allowance grows the tolerance with the length (``kernelab.kernels.tolerances``), so an
        honest kernel of that length passes in its dtype: declare it for a matmul (K), a
        convolution (C * kernel volume), a softmax or norm (the row length), an attention (keys
        + head dimension). Without it a float32 sum of 1000 terms fails the float32 defaults.
        """
        return None

    def batch_slice(
        self, params: P, inputs: dict[str, Any], start: int, stop: int
    ) -> tuple[P, dict[str, Any]] | None:
        """Parameters and inputs of rows ``[start, stop)`` of the batch, or None (not batched).

        Used by the batch-invariance check (``kernelab.runners.checks``): the output of the slice must
        equal rows ``[start, stop)`` of the full output's first dimension. The default is None:
        the benchmark has no batch dimension.
        """
        return None

    def batch_rows(self, params: P) -> int:
        """Rows of the batch dimension (the output's first dimension); 0 when not batched."""
        return 0

    def output_axes(self, params: P) -> tuple[tuple[str, int | None], ...]:
        """Logical axes of the output for "where is it wrong" summaries: ``(name, tile)`` pairs.

        One pair per output dimension, in order; ``tile`` is the kernel's tile along that axis
        (bad indices are then also reported modulo the tile) or None. ``kernelab.runners.checks`` reshapes
        the output to these axes when their count differs from the output's rank and their sizes
        come from ``output_shape``. The default names dimensions ``dim0``, ``dim1``, ... untiled.
        """
        return ()

    def output_shape(self, params: P) -> tuple[int, ...]:
        """The output viewed on ``output_axes`` (``()``: the output's own shape)."""
        return ()

    def parse_params(self, values: Mapping[str, ParamValue]) -> P:
        """Validate one cell's parameters into ``Params``. Raises ``pydantic.ValidationError``."""
        return cast(P, self.Params.model_validate(dict(values)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} variants={list(self.variants)}>"


def _instantiate(obj: Any, ref: str) -> Benchmark[Any]:
    """The ``Benchmark`` that ``obj`` (what ``ref`` names) is: an instance, or a concrete subclass
    constructed without arguments. Raises ``BenchmarkError`` for anything else (a function, a
    module, an abstract class such as ``kernelab.kernels.base:Benchmark``, a constructor that raises)."""
    if isinstance(obj, Benchmark):
        return _declared(obj, ref)
    if not (isinstance(obj, type) and issubclass(obj, Benchmark)):
        raise BenchmarkError(f"{ref!r} is not a kernelab.kernels.Benchmark subclass or instance")
    if inspect.isabstract(obj):
        missing = ", ".join(sorted(getattr(obj, "__abstractmethods__", ())))
        raise BenchmarkError(f"{ref!r} is an abstract benchmark class (it does not define {missing})")
    try:
        bench = obj()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # user code: any failure (SystemExit too) is the benchmark failing to load
        raise BenchmarkError(f"{ref!r} cannot be constructed: {_one_line(exc)}") from exc
    return _declared(bench, ref)


def _declared(bench: Benchmark[Any], ref: str) -> Benchmark[Any]:
    """``bench`` if it declares what ``validate_spec`` reads (``name`` a str, ``variants`` a tuple or
    list of str, ``Params`` a pydantic model); ``BenchmarkError`` naming what is missing otherwise."""
    name = getattr(bench, "name", None)
    variants = getattr(bench, "variants", None)
    params = getattr(bench, "Params", None)
    if not isinstance(name, str):
        problem = "no 'name' (a str)"
    elif not (isinstance(variants, tuple | list) and variants and all(isinstance(v, str) for v in variants)):
        problem = "no 'variants' (a tuple of names)"
    elif not (isinstance(params, type) and issubclass(params, BaseModel)):
        problem = "no 'Params' (a pydantic model)"
    else:
        return bench
    raise BenchmarkError(f"{ref!r} is not a usable benchmark: it declares {problem}")


def _one_line(exc: BaseException) -> str:
    """``'TypeError: message'``, first line only and at most 300 characters (user code's errors can
    be long)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}".rstrip(": ")


@cache
def _entry_point_benchmarks() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


_BUILTINS = {
    "softmax": "kernelab.kernels.softmax:SoftmaxBenchmark",
    "matmul": "kernelab.kernels.matmul:MatmulBenchmark",
    "conv3d": "kernelab.kernels.conv3d:Conv3dBenchmark",
    "bi_matmul": "kernelab.kernels.bi_matmul:BatchInvariantMatmulBenchmark",
    "chunked_attention": "kernelab.kernels.chunked_attention:ChunkedAttentionBenchmark",
}


def builtin_reference(name: str) -> str | None:
    """The ``module:object`` of built-in benchmark ``name`` (``"matmul"`` ->
    ``"kernelab.kernels.matmul:MatmulBenchmark"``), or None when ``name`` is not a built-in."""
    return _BUILTINS.get(name)


def available_benchmarks() -> list[str]:
    """Names that resolve without a ``module:object`` reference: built-ins and entry points."""
    return sorted(set(_BUILTINS) | set(_entry_point_benchmarks()))


def load_object(ref: str) -> Any:
    """Import ``'package.module:attr'`` (``attr`` may be dotted: ``'mod:Outer.Inner'``).

    Raises ``BenchmarkError`` naming the reference when it is not of that form (dotted Python
    identifiers on both sides, ``kernelab.service.contract.schemas.BENCHMARK_OBJECT_REF``: no relative import,
    no
    empty segment; no ``__main__`` module, none of the standard library:
    ``kernelab.service.contract.schemas.benchmark_ref_problem``), when the module cannot be imported (any
    exception
    its import raises but ``KeyboardInterrupt``, e.g. a ``SyntaxError``, a ``RuntimeError`` of its
    own or a ``SystemExit``, is reported on one line), or when it lacks the attribute.
    """
    problem = benchmark_ref_problem(ref)
    if problem is not None or not BENCHMARK_OBJECT_REF.match(ref):
        raise BenchmarkError(problem or f"{ref[:100]!r} is not of the form 'module:object'")
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # user code runs on import: any failure (SystemExit too) is "cannot import"
        raise BenchmarkError(f"cannot import module {module_name!r}: {_one_line(exc)}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise BenchmarkError(f"module {module_name!r} has no attribute {attr!r}") from exc
    return obj


def get_benchmark(ref: str) -> Benchmark[Any]:
    """Resolve a spec's ``benchmark`` field to a ``Benchmark`` instance.

    ``ref`` is a registered name (built-in or from the ``kernelab.benchmarks`` entry points) or a
    ``module:object`` reference. Raises ``BenchmarkError`` (loc ``("benchmark",)``) when it is
    unknown, malformed, fails to import or to construct, or names something that is not a concrete
    benchmark (``load_object``, ``_instantiate``); never another exception.
    """
    if ":" in ref:
        return _instantiate(load_object(ref), ref)
    if ref in _BUILTINS:
        return _instantiate(load_object(_BUILTINS[ref]), ref)
    ep = _entry_point_benchmarks().get(ref)
    if ep is None:
        known = ", ".join(available_benchmarks())
        raise BenchmarkError(f"unknown benchmark {ref!r}; known: {known}")
    try:
        obj = ep.load()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the distribution's code runs on import (SystemExit too)
        raise BenchmarkError(f"benchmark {ref!r} failed to import: {_one_line(exc)}") from exc
    return _instantiate(obj, ref)


def validate_spec(spec: JobSpec) -> list[dict[str, Any]]:
    """Check a spec against its benchmark; return a list of pydantic-style error dicts.

    Each error is ``{"loc": (...), "msg": str, "type": str}`` with ``loc`` naming the spec field
    (e.g. ``("sweep", "M")`` or ``("baseline", "variant")``). An empty list means valid. Checks:
    the benchmark resolves, both variants exist, every cell's parameters (merged with each side's
    overrides) validate on every device type.
    """
    if spec.baseline.source is not None or spec.candidate.source is not None:
        return _validate_sourced(spec)
    errors: list[dict[str, Any]] = []
    try:
        bench = get_benchmark(spec.benchmark)
    except BenchmarkError as exc:
        return [{"loc": exc.loc, "msg": str(exc), "type": "value_error"}]
    for side in ("baseline", "candidate"):
        vs = getattr(spec, side)
        if vs.variant not in bench.variants:
            errors.append(
                {
                    "loc": (side, "variant"),
                    "msg": f"unknown variant {vs.variant!r} of {bench.name!r}; "
                    f"known: {', '.join(bench.variants)}",
                    "type": "value_error",
                }
            )
    seen: set[tuple[str, ...]] = set()
    for device_type in ("cpu", "cuda"):
        for cell in spec.cells(device_type):  # type: ignore[arg-type]
            for side in ("baseline", "candidate"):
                merged = {**cell, **getattr(spec, side).params}
                try:
                    bench.parse_params(merged)
                except ValidationError as exc:
                    for err in exc.errors():
                        field = str(err["loc"][0]) if err["loc"] else ""
                        loc = param_loc(spec, field, device_type, side)
                        key = (*map(str, loc), err["msg"])
                        if key not in seen:
                            seen.add(key)
                            errors.append({"loc": loc, "msg": err["msg"], "type": err["type"]})
    return errors


def _validate_sourced(spec: JobSpec) -> list[dict[str, Any]]:
    """What can be checked of a spec whose code comes from git revisions, without that code.

    The benchmark lives in the revisions, which only the runner fetches, so variants and
    parameters are checked there (a mismatch fails the job with a message naming the field). Here:
    the benchmark must be a ``module:object`` reference or a built-in name (an entry-point name
    belongs to an installed distribution, not to a revision).
    """
    ref = spec.benchmark
    if ":" in ref:
        msg = benchmark_ref_problem(ref) or ""
        if not msg and BENCHMARK_OBJECT_REF.match(ref):
            return []
    elif ref in _BUILTINS:
        return []
    else:
        msg = (
            f"with a source revision, name the benchmark as 'module:object' (or a built-in: "
            f"{', '.join(sorted(_BUILTINS))}); {ref!r} is neither"
        )
    return [{"loc": ("benchmark",), "msg": msg, "type": "value_error"}]
