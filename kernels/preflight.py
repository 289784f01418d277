"""Benchmark mistakes found before anything is measured, each one line naming the file and method.

``check_benchmark(bench)``: every method kernelab calls can be called the way kernelab calls it
(``make_inputs(params, device, seed)``, ``prepare(variant, params, inputs)``,
``reference(params, inputs)``, ``work(params, variant)``); a function-form benchmark
(``kernelab.kernels.define``) has all its decorated parts. ``check_work(bench, spec, device_type)``:
``work`` returns a ``kernelab.Work`` for every cell and side (it is otherwise called only after a
cell's whole measurement; ``as_work`` takes a mapping of its fields too), and ``tolerances`` and
``reduction`` give a usable tolerance (``as_tolerances``, ``as_reduction``). ``check_inputs`` and
``check_prepared`` check what ``make_inputs`` and ``prepare`` return. Each raises
``kernelab.kernels.BenchmarkError``; the message starts with ``FILE:LINE: Class.method``.
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from kernelab.kernels.base import Benchmark, BenchmarkError
from kernelab.kernels.tolerances import Reduction, Tolerance, normalize_dtype_name
from kernelab.service.contract.schemas import JobSpec, Work

CALLS: dict[str, tuple[str, ...]] = {
    "make_inputs": ("params", "device", "seed"),
    "prepare": ("variant", "params", "inputs"),
    "reference": ("params", "inputs"),
    "work": ("params", "variant"),
}
"""How the engine calls each method of a ``Benchmark`` (positional arguments, by name)."""


def where(fn: Any) -> str:
    """``FILE:LINE`` where function ``fn`` (or a bound method's function) is defined, else ``?``."""
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "?"


def _label(bench: Benchmark[Any], method: str) -> str:
    fn = getattr(type(bench), method, None)
    if (
        method in ("reference", "work", "tolerances", "reduction")
        and getattr(bench, "defined_at", None) is not None
    ):
        user = getattr(bench, f"_{method}", None)
        if user is not None:
            return f"{where(user)}: {getattr(user, '__name__', method)} (@{bench.name}.{method})"
    return f"{where(fn)}: {type(bench).__name__}.{method}"


def check_benchmark(bench: Benchmark[Any]) -> None:
    """Raise ``BenchmarkError`` when a method kernelab calls cannot take the arguments it is given
    (``CALLS``), or a function-form benchmark lacks a part (module docstring)."""
    missing = getattr(bench, "missing", None)
    if callable(missing) and missing():
        parts = ", ".join(f"@{bench.name}.{m}" for m in missing())
        raise BenchmarkError(f"{getattr(bench, 'defined_at', '?')}: benchmark {bench.name!r} lacks {parts}")
    for part, args in getattr(bench, "parts", dict)().items():  # a function-form benchmark
        fn, name = part
        try:
            inspect.signature(fn).bind(*args)
        except TypeError as exc:
            raise BenchmarkError(
                f"{where(fn)}: {fn.__name__}{inspect.signature(fn)} (@{bench.name}.{name}) cannot be "
                f"called as {fn.__name__}({', '.join(args)}): {exc}"
            ) from None
    for method, args in CALLS.items():
        fn = getattr(bench, method, None)
        if not callable(fn):
            raise BenchmarkError(f"{_label(bench, method)} is not a method; kernelab calls {method}{args}")
        try:
            inspect.signature(fn).bind(*args)
        except TypeError as exc:
            raise BenchmarkError(
                f"{_label(bench, method)}{inspect.signature(fn)} cannot be called as "
                f"{method}({', '.join(args)}): {exc}"
            ) from None
        except ValueError:  # no signature (a builtin): nothing to check
            continue


def check_work(bench: Benchmark[Any], spec: JobSpec, device_type: str) -> None:
    """Call ``bench.work(params, variant)`` for each side of every cell of ``spec`` on
    ``device_type`` whose parameters validate (the others fail as their cell) and raise
    ``BenchmarkError`` when it raises or returns anything but a ``kernelab.Work``, or when the
    cell's tolerance cannot be made (``kernelab.kernels.preflight.tolerance_of``)."""
    seen: set[tuple[str, str]] = set()
    for cell in spec.cells(device_type):  # type: ignore[arg-type]
        for side in (spec.baseline, spec.candidate):
            try:
                params = bench.parse_params({**cell, **side.params})
            except ValidationError:
                continue
            key = (repr(params), side.variant)
            if key in seen:
                continue
            seen.add(key)
            try:
                value = bench.work(params, side.variant)
            except BenchmarkError:
                raise
            except Exception as exc:
                raise BenchmarkError(
                    f"{_label(bench, 'work')} raised {type(exc).__name__}: {exc} "
                    f"(variant {side.variant!r}, params {dict(cell)})"
                ) from None
            as_work(bench, value)
            _check_tolerance(bench, spec, params)


def _check_tolerance(bench: Benchmark[Any], spec: JobSpec, params: Any) -> None:
    """``tolerance_of`` for one cell's parameters: ``BenchmarkError`` naming the method when
    ``tolerances`` or ``reduction`` raises or returns something unusable."""
    try:
        tolerance_of(bench, params, rtol=spec.correctness.rtol, atol=spec.correctness.atol)
    except BenchmarkError:
        raise
    except Exception as exc:
        raise BenchmarkError(
            f"{_label(bench, 'tolerances')} or {_label(bench, 'reduction')} raised "
            f"{type(exc).__name__}: {exc} (params {params!r})"
        ) from None


def as_work(bench: Benchmark[Any], value: Any) -> Work:
    """``value`` (what ``bench.work`` returned) as a ``Work``: a ``Work``, or a mapping that
    validates as one (``{"flops": 1e9, "bytes_read": 4e6}``). Raises ``BenchmarkError`` naming the
    method and the field otherwise (an unknown key, a negative or non-numeric value, a tuple)."""
    if isinstance(value, Work):
        return value
    if isinstance(value, Mapping):
        unknown = [str(k) for k in value if k not in Work.model_fields]
        if unknown:
            raise BenchmarkError(
                f"{_label(bench, 'work')} returned {_short(dict(value))}: unknown field(s) "
                f"{', '.join(unknown)}; fields: {', '.join(Work.model_fields)} (numbers >= 0)"
            )
        try:
            return Work.model_validate({k: _number(v) for k, v in value.items()})
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(map(str, err["loc"])) or "work"
            raise BenchmarkError(
                f"{_label(bench, 'work')} returned {_short(dict(value))}: {field}: {err['msg']}; fields: "
                "flops, bytes_read, bytes_written (numbers >= 0)"
            ) from None
    raise BenchmarkError(
        f"{_label(bench, 'work')} returned {type(value).__name__} {_short(value)}; return "
        "kernelab.Work(flops=..., bytes_read=..., bytes_written=...)"
    )


def declares(bench: Any, method: str) -> bool:
    """True when ``bench`` defines ``method`` itself (a subclass's own, or a function-form
    benchmark's decorated part) rather than inheriting ``Benchmark``'s default."""
    own = getattr(bench, "declared", None)
    if callable(own):
        return bool(own(method))
    return getattr(type(bench), method, None) is not getattr(Benchmark, method, None)


def tolerance_of(
    bench: Any, params: Any, *, rtol: float | None = None, atol: float | None = None
) -> Tolerance:
    """The ``Tolerance`` of ``bench``'s output at ``params``: ``rtol``/``atol`` as given (a spec's
    ``correctness``), else ``bench.tolerances(params)``, with their source; and the reduction
    ``bench.reduction(params)`` declares (none for a benchmark without that method: one written
    for an older kernelab). Raises ``BenchmarkError`` naming the method when either returns
    something unusable (``as_tolerances``, ``as_reduction``). The names it uses are bound when
    this module is imported: a revision's own ``kernelab.kernels``, mounted later
    (``kernelab.runners.revision_worker``), does not replace them.
    """
    own_rtol, own_atol = as_tolerances(bench, bench.tolerances(params))
    if not declares(bench, "tolerances"):
        source = f"{normalize_dtype_name(str(getattr(params, 'dtype', 'float32')))} defaults of torch.testing"
    elif callable(getattr(bench, "declared", None)):  # the function form
        source = f"@{bench.name}.tolerances"
    else:
        source = f"{type(bench).__name__}.tolerances()"
    given = [name for name, v in (("rtol", rtol), ("atol", atol)) if v is not None]
    if given:
        spec = f"the spec's correctness.{'/'.join(given)}"
        source = spec if len(given) == 2 else f"{spec}, {'atol' if rtol is not None else 'rtol'}: {source}"
    method = getattr(bench, "reduction", None)
    reduction = as_reduction(bench, method(params)) if callable(method) else None
    return Tolerance(
        rtol=own_rtol if rtol is None else rtol,
        atol=own_atol if atol is None else atol,
        source=source,
        reduction=reduction,
    )


def as_tolerances(bench: Benchmark[Any], value: Any) -> tuple[float, float]:
    """``value`` (what ``bench.tolerances`` returned) as ``(rtol, atol)``: two finite numbers
    >= 0. Raises ``BenchmarkError`` naming the method otherwise."""
    if isinstance(value, tuple | list) and len(value) == 2:
        if all(isinstance(v, numbers.Real) and not isinstance(v, bool) for v in value):
            rtol, atol = float(value[0]), float(value[1])
            if math.isfinite(rtol) and math.isfinite(atol) and rtol >= 0 and atol >= 0:
                return rtol, atol
    raise BenchmarkError(
        f"{_label(bench, 'tolerances')} returned {_short(value)}; return (rtol, atol), two finite "
        "numbers >= 0"
    )


def as_reduction(bench: Benchmark[Any], value: Any) -> Reduction | None:
    """``value`` (what ``bench.reduction`` returned) as a ``Reduction``: None, a ``Reduction``, an
    int (its ``length``) or a mapping of its fields. Raises ``BenchmarkError`` naming the method
    and the field otherwise (a length below 1, an unknown dtype, a float, a string)."""
    if value is None or isinstance(value, Reduction):
        return value
    if isinstance(value, BaseModel):  # a Reduction of another copy of kernelab (a revision's)
        value = value.model_dump()
    try:
        if isinstance(value, numbers.Integral) and not isinstance(value, bool):
            return Reduction(length=int(value))
        if isinstance(value, Mapping):
            return Reduction.model_validate(dict(value))
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(map(str, err["loc"])) or "reduction"
        raise BenchmarkError(
            f"{_label(bench, 'reduction')} returned {_short(value)}: {field}: {err['msg']}"
        ) from None
    raise BenchmarkError(
        f"{_label(bench, 'reduction')} returned {type(value).__name__} {_short(value)}; return the number "
        "of terms summed into each output element (an int), a kernelab.Reduction or None"
    )


def check_inputs(bench: Benchmark[Any], value: Any) -> dict[str, Any]:
    """``value`` (what ``make_inputs`` returned) if it is a dict with str keys; ``BenchmarkError``."""
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise BenchmarkError(
            f"{_label(bench, 'make_inputs')} returned {type(value).__name__} {_short(value)}; "
            "return a dict of input name -> tensor"
        )
    return value


def check_prepared(bench: Benchmark[Any], variant: str, value: Any) -> Callable[[], Any]:
    """``value`` (what ``prepare`` returned) if it is callable; ``BenchmarkError`` otherwise."""
    if not callable(value):
        raise BenchmarkError(
            f"{_label(bench, 'prepare')} returned {type(value).__name__} for variant {variant!r}; "
            "return a zero-argument callable that launches the kernel once"
        )
    return value  # type: ignore[no-any-return]


def _number(value: Any) -> Any:
    """An ``int`` as ``float`` (``Work``'s fields are strict floats); anything else as is."""
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
