"""The function form of a benchmark: ``kernelab.benchmark(name, params=...)`` and decorators.

The class form (``kernelab.Benchmark``) and this form reach the same engine and give the same
JSON: a ``DefinedBenchmark`` *is* a ``Benchmark`` whose methods call the functions you decorate::

    import torch
    import kernelab

    scale = kernelab.benchmark("scale", params={"n": 4096, "dtype": "float32"})

    @scale.inputs
    def inputs(p, device, seed):
        g = torch.Generator(device).manual_seed(seed)
        return {"x": torch.randn(p.n, generator=g, device=device, dtype=getattr(torch, p.dtype))}

    @scale.variant("mul")
    def mul(p, x):
        return x * 2

    @scale.variant("add")
    def add(p, x):
        return x + x

    @scale.reference
    def reference(p, x):
        return x.double() * 2

    @scale.work
    def work(p, variant):
        size = 4 if p.dtype == "float32" else 2
        return kernelab.Work(flops=p.n, bytes_read=size * p.n, bytes_written=size * p.n)

A spec names it ``benchmark: "mybench:scale"`` (module ``mybench``, object ``scale``).

What each decorated function receives (``p`` is the cell's validated parameters, an instance of
the model built from ``params``):

* ``inputs(p, device, seed) -> dict[str, Tensor]``: fresh random inputs on ``device`` (a
  ``torch.device``); every seed must give the same shapes and dtypes (``Benchmark.make_inputs``);
* ``variant(name)``: ``fn(p, **inputs) -> Tensor``, called once per launch (keep allocation out of
  it, or use ``prepared``); ``prepared(name)``: ``fn(p, **inputs) -> Callable[[], Tensor]``,
  called once per cell outside the timing (``Benchmark.prepare``);
* ``reference(p, **inputs) -> Tensor``: the exact answer, float64;
* ``work(p, variant) -> kernelab.Work`` (or a mapping with ``flops``, ``bytes_read``,
  ``bytes_written``): what one launch does;
* ``tolerances(p) -> (rtol, atol)``: optional, the dtype's defaults otherwise;
* ``reduction(p) -> int | kernelab.Reduction | None``: optional, the terms summed into each output
  element (``Benchmark.reduction``): the tolerance grows with it, so that an honest sum of K terms
  passes in its dtype.

``params`` is a ``kernelab.Params`` subclass, or a mapping of field name to a default value (its
type is the value's type), to a type (a required field), or to ``(type, default)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

from pydantic import create_model

from kernelab.kernels.base import Benchmark, BenchmarkError, Params

F = TypeVar("F", bound=Callable[..., Any])


def params_model(name: str, params: type[Params] | Mapping[str, Any] | None) -> type[Params]:
    """The parameter model of ``params`` (module docstring): a ``Params`` subclass as given, or one
    built with ``pydantic.create_model`` from the mapping. Raises ``BenchmarkError`` otherwise."""
    if params is None:
        params = {}
    if isinstance(params, type):
        if not issubclass(params, Params):
            raise BenchmarkError(f"benchmark {name!r}: params must be a kernelab.Params subclass or a dict")
        return params
    if not isinstance(params, Mapping):
        raise BenchmarkError(f"benchmark {name!r}: params must be a kernelab.Params subclass or a dict")
    fields: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, tuple) and len(value) == 2:
            fields[key] = value
        elif isinstance(value, type) or getattr(value, "__origin__", None) is not None:
            fields[key] = (value, ...)
        else:
            fields[key] = (type(value), value)
    model: type[Params] = create_model(f"{name}_params", __base__=Params, **fields)
    return model


def _where(fn: Callable[..., Any]) -> str:
    """``file.py:LINE`` where ``fn`` is defined, or its qualified name."""
    try:
        code = fn.__code__
        return f"{code.co_filename}:{code.co_firstlineno}"
    except AttributeError:
        return getattr(fn, "__qualname__", repr(fn))


class DefinedBenchmark(Benchmark[Any]):
    """A benchmark assembled from decorated functions (module docstring). Make one with
    ``kernelab.benchmark``; each instance has a class of its own, so ``name``, ``Params`` and
    ``variants`` stay class attributes as in the class form."""

    def __init__(self) -> None:
        self._inputs: Callable[..., dict[str, Any]] | None = None
        self._reference: Callable[..., Any] | None = None
        self._work: Callable[..., Any] | None = None
        self._tolerances: Callable[..., tuple[float, float]] | None = None
        self._reduction: Callable[..., Any] | None = None
        self._variants: dict[str, tuple[Callable[..., Any], bool]] = {}
        self.defined_at = ""

    # -- decorators --------------------------------------------------------------------------

    def inputs(self, fn: F) -> F:
        """Decorate ``inputs(p, device, seed) -> dict`` (module docstring)."""
        self._inputs = fn
        return fn

    # ``reference``, ``work``, ``tolerances`` and ``reduction`` are both the decorators (one
    # function argument) and the ``Benchmark`` methods the engine calls (``(params, inputs)``,
    # ``(params, variant)``, ``(params)``): one name per concept, as the class form has.

    def reference(self, *args: Any) -> Any:  # type: ignore[override]
        """``@bench.reference`` on ``fn(p, **inputs) -> float64 tensor``; called by the engine
        as ``reference(params, inputs)``."""
        if len(args) == 1 and callable(args[0]):
            self._reference = args[0]
            return args[0]
        params, inputs = args
        return self._require(self._reference, "reference")(params, **inputs)

    def work(self, *args: Any) -> Any:  # type: ignore[override]
        """``@bench.work`` on ``fn(p, variant) -> kernelab.Work`` (or a mapping of its fields);
        called by the engine as ``work(params, variant)``. Raises ``BenchmarkError`` for anything
        that is no ``Work`` (``kernelab.kernels.preflight.as_work``)."""
        if len(args) == 1 and callable(args[0]):
            self._work = args[0]
            return args[0]
        params, variant = args
        from kernelab.kernels.preflight import as_work

        return as_work(self, self._require(self._work, "work")(params, variant))

    def tolerances(self, *args: Any) -> Any:  # type: ignore[override]
        """``@bench.tolerances`` on ``fn(p) -> (rtol, atol)``; called as ``tolerances(params)``
        (the dtype's defaults when none was decorated)."""
        if len(args) == 1 and callable(args[0]) and not isinstance(args[0], Params):
            self._tolerances = args[0]
            return args[0]
        (params,) = args
        if self._tolerances is None:
            return Benchmark.tolerances(self, params)
        return self._tolerances(params)

    def reduction(self, *args: Any) -> Any:  # type: ignore[override]
        """``@bench.reduction`` on ``fn(p) -> int | kernelab.Reduction | None``; called as
        ``reduction(params)`` (None, no reduction, when none was decorated)."""
        if len(args) == 1 and callable(args[0]) and not isinstance(args[0], Params):
            self._reduction = args[0]
            return args[0]
        (params,) = args
        return None if self._reduction is None else self._reduction(params)

    def declared(self, method: str) -> bool:
        """True when ``method`` (``"tolerances"``, ``"reduction"``, ...) was given a decorated
        function (``kernelab.kernels.preflight.declares``)."""
        return getattr(self, f"_{method}", None) is not None

    def variant(self, name: str) -> Callable[[F], F]:
        """Decorate ``fn(p, **inputs) -> Tensor``, called once per launch, as variant ``name``."""
        return partial(self._add_variant, name, prepared=False)  # type: ignore[return-value]

    def prepared(self, name: str) -> Callable[[F], F]:
        """Decorate ``fn(p, **inputs) -> Callable[[], Tensor]`` (allocation, compilation there,
        outside the timing) as variant ``name``."""
        return partial(self._add_variant, name, prepared=True)  # type: ignore[return-value]

    def _add_variant(self, name: str, fn: F, *, prepared: bool) -> F:
        if not isinstance(name, str) or not name:
            raise BenchmarkError(f"benchmark {self.name!r}: a variant's name must be a non-empty str")
        self._variants[name] = (fn, prepared)
        type(self).variants = tuple(self._variants)
        return fn

    # -- the Benchmark interface --------------------------------------------------------------

    def make_inputs(self, params: Any, device: Any, seed: int) -> dict[str, Any]:
        return self._require(self._inputs, "inputs")(params, device, seed)

    def prepare(self, variant: str, params: Any, inputs: dict[str, Any]) -> Callable[[], Any]:
        if variant not in self._variants:
            raise BenchmarkError(
                f"unknown variant {variant!r} of {self.name!r}; known: {', '.join(self._variants)}",
                loc=("variant",),
            )
        fn, prepared = self._variants[variant]
        if prepared:
            call = fn(params, **inputs)
            if not callable(call):
                raise BenchmarkError(
                    f"{_where(fn)}: the prepared variant {variant!r} ({fn.__name__}) returned "
                    f"{type(call).__name__}, not a zero-argument callable"
                )
            return call  # type: ignore[no-any-return]
        return partial(fn, params, **inputs)

    def _require(self, fn: Callable[..., Any] | None, what: str) -> Callable[..., Any]:
        if fn is None:
            raise BenchmarkError(
                f"{self.defined_at}: benchmark {self.name!r} has no {what} function: "
                f"decorate one with @{_attr_name(self)}.{what}"
            )
        return fn

    def parts(self) -> dict[tuple[Callable[..., Any], str], tuple[str, ...]]:
        """The decorated functions of a fixed call form, ``(fn, decorator) -> arguments``, for
        ``kernelab.kernels.preflight`` (variants and the reference take the inputs by name)."""
        out: dict[tuple[Callable[..., Any], str], tuple[str, ...]] = {}
        if self._inputs is not None:
            out[(self._inputs, "inputs")] = ("p", "device", "seed")
        if self._work is not None:
            out[(self._work, "work")] = ("p", "variant")
        if self._tolerances is not None:
            out[(self._tolerances, "tolerances")] = ("p",)
        if self._reduction is not None:
            out[(self._reduction, "reduction")] = ("p",)
        return out

    def missing(self) -> list[str]:
        """The decorators not used yet (``inputs``, ``reference``, ``work``, a ``variant``)."""
        out = [w for w, f in (("inputs", self._inputs), ("reference", self._reference)) if f is None]
        if self._work is None:
            out.append("work")
        if not self._variants:
            out.append("variant")
        return out


def _attr_name(bench: DefinedBenchmark) -> str:
    return bench.name if bench.name.isidentifier() else "bench"


def benchmark(
    name: str, *, params: type[Params] | Mapping[str, Any] | None = None, description: str = ""
) -> DefinedBenchmark:
    """A new benchmark called ``name`` with parameters ``params`` (module docstring), to be filled
    in with its decorators. Raises ``BenchmarkError`` for a name that is not a non-empty str or
    parameters that are neither a ``kernelab.Params`` subclass nor a mapping."""
    if not isinstance(name, str) or not name:
        raise BenchmarkError("a benchmark's name must be a non-empty str")
    model = params_model(name, params)
    cls = type(
        f"Benchmark_{name}",
        (DefinedBenchmark,),
        {
            "name": name,
            "Params": model,
            "variants": (),
            "description": description,
        },
    )
    bench: DefinedBenchmark = cls()
    caller = inspect.currentframe()
    frame = caller.f_back if caller is not None else None
    if frame is not None:
        bench.defined_at = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        cls.__module__ = str(frame.f_globals.get("__name__", __name__))
    return bench
