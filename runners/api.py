"""The Python API: ``kernelab.compare`` and ``kernelab.measure``, the engine of ``kernelab run``
called from a script, a notebook or a test.

Both build a ``kernelab.JobSpec``, run it with ``kernelab.runners.job.run_job`` in this process
(the same interleaved rounds, correctness checks, timed checks and verdict rules as ``kernelab
run`` and the runner; node-health probes off unless ``probes=True``) and return a ``Result``: the
``kernelab.service.contract.schemas.Comparison`` that ``kernelab run --json`` writes, which prints as the
table (``str``), renders as HTML in a notebook (``_repr_html_``) and gives the pull-request
Markdown (``to_markdown``).

Unlike ``kernelab run`` the measurement shares this process: ``timeout_s`` is not enforced, and
Triton kernels must be decorated in the mode the device needs (on a CPU set
``TRITON_INTERPRET=1`` before triton is first imported; ``kernelab.kernels._device``).
"""

from __future__ import annotations

import html
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from pydantic import PrivateAttr

from kernelab.kernels.base import Benchmark, BenchmarkError
from kernelab.kernels.define import DefinedBenchmark, benchmark
from kernelab.kernels.preflight import as_reduction
from kernelab.kernels.tolerances import Reduction
from kernelab.service.contract.schemas import (
    VERDICT_CATALOGUE,
    Comparison,
    JobResult,
    JobSpec,
    ProbeSpec,
    Verdict,
    Work,
)

BASELINE = "baseline"
CANDIDATE = "candidate"
PROBES_OFF = ProbeSpec.off().model_dump(
    include={"copy_bandwidth", "all_reduce", "nvml", "matmul_peak", "canary"}
)
"""``JobSpec.probes`` with every probe off (the API's default: a notebook wants the comparison)."""
DEFAULT_FAIL_ON: frozenset[Verdict] = frozenset(e.name for e in VERDICT_CATALOGUE if e.gate == "default")
"""``Result.failing``'s default: the verdicts ``--fail-on`` names by default (``VerdictEntry.gate``)."""


class Result(Comparison):
    """A ``Comparison`` (same fields, same JSON) that prints as ``kernelab run``'s table.

    ``result``: the raw ``JobResult`` (every sample), not part of the JSON.
    """

    _raw: JobResult | None = PrivateAttr(default=None)

    def __init__(self, comparison: Comparison, result: JobResult | None = None):
        super().__init__(**comparison.model_dump())
        self._raw = result

    @property
    def result(self) -> JobResult | None:
        """The raw ``JobResult`` this comparison was computed from (every sample, the checks)."""
        return self._raw

    def __str__(self) -> str:
        from kernelab.service.judge.report import format_table

        return format_table(self)

    def to_markdown(self) -> str:
        """The pull-request Markdown of ``kernelab run --markdown`` (``kernelab.service.judge.report``)."""
        from kernelab.service.judge.report import to_markdown

        return to_markdown(self)

    def _repr_html_(self) -> str:
        """The table as HTML for Jupyter (IPython's rich display protocol): a ``<pre>`` block."""
        return f'<pre class="kernelab-comparison">{html.escape(str(self))}</pre>'

    def verdicts(self) -> list[Verdict]:
        """Each cell's verdict, in cell order."""
        return [cell.verdict for cell in self.cells]

    def failing(self, fail_on: Iterable[Verdict] = DEFAULT_FAIL_ON) -> list[str]:
        """Labels of the cells whose verdict is in ``fail_on`` (``kernelab run --fail-on``), plus
        ``"job"`` when the job itself failed (every cell failed)."""
        gate = set(fail_on)
        out = [cell.label for cell in self.cells if cell.verdict in gate]
        if self._raw is not None and self._raw.error:
            out.append("job")
        return out


def _fresh_like(value: Any, generator: torch.Generator) -> Any:
    """A tensor of ``value``'s shape, dtype and device holding ``value``'s elements in a random
    order (same distribution of values: an index tensor stays in range, a positive one positive);
    anything else as is."""
    if not isinstance(value, torch.Tensor) or value.numel() < 2:
        return value.clone() if isinstance(value, torch.Tensor) else value
    flat = value.detach().reshape(-1)
    order = torch.randperm(flat.numel(), generator=generator).to(flat.device)
    return flat[order].reshape(value.shape).clone()


def _inputs_maker(inputs: Any, base_seed: int) -> Callable[[Any, Any, int], dict[str, Any]]:
    """``make_inputs(p, device, seed)`` from ``compare``'s ``inputs`` (its docstring)."""
    if callable(inputs):
        return lambda p, device, seed: inputs(device, seed)
    if not isinstance(inputs, Mapping) or not all(isinstance(k, str) for k in inputs):
        raise BenchmarkError("inputs must be a dict of name -> tensor or a function (device, seed) -> dict")
    given = dict(inputs)

    def make(p: Any, device: Any, seed: int) -> dict[str, Any]:
        if seed == base_seed:  # copies: kernelab refills its inputs in place
            return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in given.items()}
        generator = torch.Generator().manual_seed(seed)
        return {k: _fresh_like(v, generator) for k, v in given.items()}

    return make


def _check_fits(label: str, fn: Callable[..., Any], inputs: Mapping[str, Any]) -> None:
    """Raise ``BenchmarkError`` when ``fn(**inputs)`` cannot bind (``inspect.Signature.bind``):
    names the callable, its parameters and the inputs' names. A callable without a readable
    signature (some builtins) is let through."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(**inputs)
    except TypeError as exc:
        raise BenchmarkError(
            f"{label} {getattr(fn, '__name__', type(fn).__name__)}{sig} does not fit the inputs "
            f"({', '.join(inputs) or 'none'}): {exc}"
        ) from None


def _device_of(inputs: Any) -> str:
    if isinstance(inputs, Mapping):
        for value in inputs.values():
            if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                return "cuda"
        return "cpu"
    return "auto"


def _as_work(work: Any) -> Callable[[Any, str], Work]:
    if work is None:
        return lambda p, variant: Work()
    if callable(work):
        return lambda p, variant: work(variant)  # type: ignore[no-any-return]
    value = (
        work if isinstance(work, Work) else Work.model_validate({k: float(v) for k, v in dict(work).items()})
    )
    return lambda p, variant: value


def compare(
    baseline: Callable[..., Any],
    candidate: Callable[..., Any],
    *,
    inputs: Mapping[str, Any] | Callable[[torch.device, int], dict[str, Any]],
    reference: Callable[..., Any] | None = None,
    work: Work | Mapping[str, float] | Callable[[str], Work] | None = None,
    reduction: int | Reduction | None = None,
    name: str = "compare",
    measurement: Mapping[str, Any] | None = None,
    correctness: Mapping[str, Any] | None = None,
    probes: bool = False,
    device: str = "auto",
    progress: Callable[[int, int, str], None] | None = None,
) -> Result:
    """Measure ``candidate`` against ``baseline`` as ``kernelab run`` does and return the ``Result``.

    ``baseline``, ``candidate``: ``fn(**inputs) -> Tensor``, one launch each call. ``inputs``: a
    dict of name -> tensor (the device is theirs; the timed checks refill them with the same
    values in another order), or ``fn(device, seed) -> dict`` drawing fresh random inputs (every
    seed the same shapes and dtypes). ``reference``: ``fn(**inputs) -> Tensor``, the exact answer
    in float64; None compares both with the baseline's output (then "correct" means "agrees with
    the baseline within the dtype's tolerances"). ``work``: a ``kernelab.Work`` of one launch, a
    mapping of its fields, or ``fn(side) -> Work`` (side ``"baseline"``/``"candidate"``); None:
    no throughput. ``reduction``: the terms summed into each output element (``K`` of a matmul,
    or a ``kernelab.Reduction``; ``Benchmark.reduction``), so that the tolerance grows with it;
    None for no reduction. ``measurement``, ``correctness``: fields of ``JobSpec.measurement`` and
    ``JobSpec.correctness`` (``budget_ms``, ``order``, ``rtol``, ...). ``probes``: run the node
    probes before and after. ``device``: ``"auto"`` (the inputs' device), ``"cpu"`` or ``"cuda"``.

    Raises ``kernelab.BenchmarkError`` for unusable arguments or callables that do not fit (with a
    dict ``inputs``, ``baseline``, ``candidate`` and ``reference`` must each accept them by name:
    ``inspect.Signature.bind``), before anything is measured; ``pydantic.ValidationError`` (naming
    the field) for a bad measurement or correctness field; ``RuntimeError`` for ``"cuda"`` without
    a GPU. A callable that raises or returns a wrong answer gives a ``failed`` or ``incorrect``
    cell, never an exception.
    """
    for label, fn in (("baseline", baseline), ("candidate", candidate)):
        if not callable(fn):
            raise BenchmarkError(f"{label} must be a callable fn(**inputs), got {type(fn).__name__}")
    if isinstance(inputs, Mapping):
        sides: list[tuple[str, Callable[..., Any] | None]] = [
            ("baseline", baseline),
            ("candidate", candidate),
            ("reference", reference),
        ]
        for side, side_fn in sides:
            if side_fn is not None:
                _check_fits(side, side_fn, inputs)
    seed = int((measurement or {}).get("seed", 0))
    bench = benchmark(name)
    bench.inputs(_inputs_maker(inputs, seed))
    bench.variant(BASELINE)(lambda p, **kw: baseline(**kw))
    bench.variant(CANDIDATE)(lambda p, **kw: candidate(**kw))
    if reference is not None:
        bench.reference(lambda p, **kw: reference(**kw))
    else:
        bench.reference(lambda p, **kw: _as_float64(baseline(**kw)))
    work_of = _as_work(work)
    bench.work(lambda p, variant: work_of(p, variant))
    if reduction is not None:
        as_reduction(bench, reduction)  # a bad one is refused before anything is measured
        bench.reduction(lambda p: reduction)
    return measure(
        bench,
        BASELINE,
        CANDIDATE,
        measurement=measurement,
        correctness=correctness,
        probes=probes,
        device=_device_of(inputs) if device == "auto" else device,
        progress=progress,
    )


def _as_float64(out: Any) -> Any:
    return out.detach().to(torch.float64) if isinstance(out, torch.Tensor) else out


def measure(
    bench: Benchmark[Any] | str,
    baseline: str | Mapping[str, Any],
    candidate: str | Mapping[str, Any],
    *,
    params: Mapping[str, Any] | None = None,
    sweep: Mapping[str, list[Any]] | None = None,
    measurement: Mapping[str, Any] | None = None,
    correctness: Mapping[str, Any] | None = None,
    probes: bool = False,
    device: str = "auto",
    name: str = "",
    progress: Callable[[int, int, str], None] | None = None,
) -> Result:
    """Measure two variants of a benchmark (a ``kernelab.Benchmark``, a function-form one from
    ``kernelab.benchmark``, or a spec's ``benchmark`` reference) over ``sweep`` and return the
    ``Result``.

    ``baseline``/``candidate``: a variant name or a ``JobSpec`` side (``{"variant": ..., "params":
    {...}}``); ``params``, ``sweep``, ``measurement``, ``correctness``, ``device`` and ``name`` are
    the ``JobSpec`` fields. Raises ``pydantic.ValidationError`` for a bad field,
    ``kernelab.BenchmarkError`` for an unknown benchmark or variant or one whose methods do not
    fit (``kernelab.kernels.preflight``), before anything is measured.
    """
    from kernelab.kernels.base import get_benchmark
    from kernelab.runners.job import run_job
    from kernelab.service.judge.stats import compare as compare_result

    obj = get_benchmark(bench) if isinstance(bench, str) else bench
    sides = {
        side: {"variant": value} if isinstance(value, str) else dict(value)
        for side, value in (("baseline", baseline), ("candidate", candidate))
    }
    for side, value in sides.items():
        if value.get("variant") not in obj.variants:
            raise BenchmarkError(
                f"unknown {side} variant {value.get('variant')!r} of {obj.name!r}; "
                f"known: {', '.join(obj.variants)}",
                loc=(side, "variant"),
            )
    spec = JobSpec.model_validate(
        {
            "name": name or obj.name,
            "benchmark": bench if isinstance(bench, str) else _spec_name(obj),
            **sides,
            "params": dict(params or {}),
            "sweep": dict(sweep or {}),
            "measurement": dict(measurement or {}),
            "correctness": dict(correctness or {}),
            "probes": {} if probes else PROBES_OFF,
            "device": device,
        }
    )
    result = run_job(spec, isolate=False, bench=obj, progress=progress)
    return Result(compare_result(result), result)


def _spec_name(bench: Benchmark[Any]) -> str:
    """What a spec of ``bench`` names it: ``module:attribute`` when its module holds it, else its
    name (a benchmark made in a notebook or a test function)."""
    import sys

    module = sys.modules.get(type(bench).__module__)
    for attr, value in vars(module).items() if module is not None else ():
        if value is bench or value is type(bench):
            ref = f"{module.__name__}:{attr}"  # type: ignore[union-attr]
            from kernelab.service.contract.schemas import benchmark_ref_problem

            if benchmark_ref_problem(ref) is None:
                return ref
    return bench.name if bench.name.isidentifier() else "benchmark"


__all__ = ["DefinedBenchmark", "Result", "compare", "measure"]
