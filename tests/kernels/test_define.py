"""The function form (``kernelab.benchmark``) and the mistakes ``kernels/preflight.py`` finds before
anything is measured: each one line naming the file and the method."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import BaseModel

import kernelab
from kernelab.kernels.preflight import as_reduction, as_work, check_benchmark, check_work, tolerance_of
from kernelab.service.contract.schemas import JobSpec

HERE = Path(__file__).name
FAST = {"budget_ms": 60, "min_time_ms": 0}


def _scale(calls: list[str] | None = None, work: Any = None) -> kernelab.DefinedBenchmark:
    bench = kernelab.benchmark("scale", params={"n": 256, "dtype": "float32"})

    @bench.inputs
    def inputs(p, device, seed):
        g = torch.Generator(device).manual_seed(seed)
        return {"x": torch.randn(p.n, generator=g, device=device, dtype=getattr(torch, p.dtype))}

    @bench.variant("mul")
    def mul(p, x):
        if calls is not None:
            calls.append("mul")
        return x * 2

    @bench.prepared("add")
    def add(p, x):
        out = torch.empty_like(x)
        return lambda: torch.add(x, x, out=out)

    @bench.reference
    def reference(p, x):
        return x.double() * 2

    @bench.work
    def declared(p, variant):
        return (
            work if work is not None else kernelab.Work(flops=p.n, bytes_read=4 * p.n, bytes_written=4 * p.n)
        )

    return bench


class ScaleParams(kernelab.Params):
    n: int = 256
    dtype: str = "float32"


class Scale(kernelab.Benchmark[ScaleParams]):
    name = "scale"
    Params = ScaleParams
    variants = ("mul", "add")

    def make_inputs(self, params, device, seed):
        g = torch.Generator(device).manual_seed(seed)
        return {"x": torch.randn(params.n, generator=g, device=device)}

    def prepare(self, variant, params, inputs):
        x = inputs["x"]
        out = torch.empty_like(x)
        return (lambda: x * 2) if variant == "mul" else (lambda: torch.add(x, x, out=out))

    def reference(self, params, inputs):
        return inputs["x"].double() * 2

    def work(self, params, variant):
        return kernelab.Work(flops=params.n, bytes_read=4 * params.n, bytes_written=4 * params.n)


def _shape(value: Any) -> Any:
    """The JSON's structure: keys, nested (a list of objects by its first), without what the
    measurement decides: the values, the flags and reasons a loaded machine adds to a cell, and the
    summary (keyed by the verdicts the cells reached)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items() if k not in ("probes", "flags", "reasons", "summary")}
    if isinstance(value, list):
        return [_shape(value[0])] if value and isinstance(value[0], dict) else "list"
    return "value"


def test_function_form_and_class_form_give_the_same_json() -> None:
    sweep = {"n": [128, 256]}
    by_function = kernelab.measure(_scale(), "mul", "add", sweep=sweep, measurement=FAST)
    by_class = kernelab.measure(Scale(), "mul", "add", sweep=sweep, measurement=FAST)
    a, b = json.loads(by_function.model_dump_json()), json.loads(by_class.model_dump_json())
    assert [c["params"] for c in a["cells"]] == [c["params"] for c in b["cells"]] == [{"n": 128}, {"n": 256}]
    assert by_function.result is not None and by_class.result is not None
    assert [c.work for c in by_function.result.cells] == [c.work for c in by_class.result.cells]
    assert all(c["error"] is None and c["verdict"] != "incorrect" for c in a["cells"])
    assert _shape(a) == _shape(b)


def test_params_from_a_dict_validate_naming_the_field() -> None:
    bench = _scale()
    assert bench.parse_params({"n": 8}).dtype == "float32"
    with pytest.raises(Exception, match="n"):
        bench.parse_params({"n": "many"})
    with pytest.raises(Exception, match="extra"):
        bench.parse_params({"m": 8})


def test_a_missing_part_is_named_with_where_the_benchmark_was_defined() -> None:
    bench = kernelab.benchmark("half", params={"n": 4})
    line = bench.defined_at
    with pytest.raises(
        kernelab.BenchmarkError, match=r"@half\.inputs, @half\.reference, @half\.work, @half\.variant"
    ) as exc:
        check_benchmark(bench)
    assert str(exc.value).startswith(line) and HERE in line


def test_a_wrong_signature_names_the_file_and_function() -> None:
    bench = _scale()

    @bench.inputs
    def inputs(p, device):  # no seed
        return {}

    with pytest.raises(
        kernelab.BenchmarkError, match=rf"{HERE}:\d+: inputs\(p, device\) \(@scale.inputs\) cannot be called"
    ):
        check_benchmark(bench)


def test_a_class_method_with_the_wrong_signature_is_named() -> None:
    class Bad(Scale):
        def prepare(self, variant, params):  # type: ignore[override]
            return lambda: None

    with pytest.raises(
        kernelab.BenchmarkError,
        match=rf"{HERE}:\d+: Bad.prepare\(variant, params\) cannot be called as "
        r"prepare\(variant, params, inputs\)",
    ):
        check_benchmark(Bad())


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ({"flops": 1, "bytes": 8}, "unknown field.*bytes"),
        ({"flops": -1.0}, "flops"),
        ((1.0, 2.0, 3.0), "tuple"),
        ({"flops": "1e9"}, "flops"),
    ],
)
def test_work_mistakes_are_found_before_measuring(returned: Any, message: str) -> None:
    calls: list[str] = []
    bench = _scale(calls, work=returned)
    with pytest.raises(
        kernelab.BenchmarkError, match=rf"{HERE}:\d+: declared \(@scale.work\) returned.*{message}"
    ):
        kernelab.measure(bench, "mul", "add", measurement=FAST)
    assert calls == []  # nothing was launched


def test_work_as_a_mapping_of_its_fields_is_a_work() -> None:
    bench = _scale(work={"flops": 3, "bytes_read": 4})
    assert as_work(bench, {"flops": 3, "bytes_read": 4}) == kernelab.Work(flops=3.0, bytes_read=4.0)
    spec = JobSpec.model_validate(
        {"benchmark": "scale", "baseline": {"variant": "mul"}, "candidate": {"variant": "add"}}
    )
    check_work(bench, spec, "cpu")
    result = kernelab.measure(bench, "mul", "add", measurement=FAST)
    assert result.result is not None and result.result.cells[0].work["baseline"].flops == 3.0


def test_inputs_that_are_no_dict_fail_the_cell_naming_the_method() -> None:
    bench = _scale()

    @bench.inputs
    def inputs(p, device, seed):
        return [torch.ones(4)]

    result = kernelab.measure(bench, "mul", "add", measurement=FAST)
    error = result.cells[0].error or ""
    assert "make_inputs" in error and "return a dict" in error


def _matmul_bench(reduction: Any = None) -> kernelab.DefinedBenchmark:
    """A user's float32 matmul in the function form: ``torch.matmul`` against itself."""
    bench = kernelab.benchmark("gemm", params={"K": 1024})

    @bench.inputs
    def inputs(p, device, seed):
        g = torch.Generator(device).manual_seed(seed)
        return {"a": torch.randn(64, p.K, generator=g), "b": torch.randn(p.K, 64, generator=g)}

    @bench.variant("torch")
    def mm(p, a, b):
        return a @ b

    @bench.variant("again")
    def again(p, a, b):
        return torch.matmul(a, b)

    @bench.reference
    def reference(p, a, b):
        return a.double() @ b.double()

    @bench.work
    def work(p, variant):
        return kernelab.Work(flops=2 * 64 * 64 * p.K)

    if reduction is not None:

        @bench.reduction
        def terms(p):
            return reduction(p)

    return bench


def test_a_declared_reduction_lets_an_honest_float32_matmul_pass() -> None:
    """Without a declared reduction the float32 pair of torch.testing marks an honest K = 1024
    product wrong on this CPU, out loud and saying why; with ``@bench.reduction`` it passes."""
    plain = kernelab.measure(_matmul_bench(), "torch", "again", measurement=FAST)
    assert plain.verdicts() == ["incorrect"]
    why = [r.message for r in plain.cells[0].reasons if r.code == "wrong-output"]
    assert why and all("(float32 defaults of torch.testing); no reduction declared" in m for m in why)
    declared = kernelab.measure(_matmul_bench(lambda p: p.K), "torch", "again", measurement=FAST)
    assert declared.verdicts() != ["incorrect"]
    check = declared.result.cells[0].correctness["candidate"] if declared.result else None
    assert check is not None and check.passed and "[float32 sums of 1024]" in check.tolerance


def test_compare_takes_the_reduction_too() -> None:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 1024, generator=g), torch.randn(1024, 64, generator=g)
    kwargs: dict[str, Any] = dict(
        inputs={"a": a, "b": b}, reference=lambda a, b: a.double() @ b.double(), measurement=FAST
    )

    def mm(a, b):
        return torch.matmul(a, b)

    assert kernelab.compare(mm, lambda a, b: a @ b, **kwargs).verdicts() == ["incorrect"]
    assert kernelab.compare(mm, lambda a, b: a @ b, reduction=1024, **kwargs).verdicts() != ["incorrect"]
    with pytest.raises(kernelab.BenchmarkError, match="returned 0: length: Input should be greater"):
        kernelab.compare(mm, mm, reduction=0, **kwargs)


@pytest.mark.parametrize(
    ("returned", "message"),
    [(0, "returned 0: length: Input should be greater than or equal to 1"),
     (2.5, "returned float 2.5; return the number of terms"),
     ({"length": 8, "accumulate": "fp128"}, "accumulate: Value error, no default tolerances for dtype")],
)  # fmt: skip
def test_reduction_mistakes_are_found_before_measuring(returned: Any, message: str) -> None:
    bench = _matmul_bench(lambda p: returned)
    with pytest.raises(
        kernelab.BenchmarkError, match=rf"{HERE}:\d+: terms \(@gemm.reduction\) .*{re.escape(message)}"
    ):
        kernelab.measure(bench, "torch", "again", measurement=FAST)


class GemmParams(kernelab.Params):
    K: int = 64
    dtype: str = "bfloat16"


class OwnTolerances(Scale):
    Params = GemmParams  # type: ignore[assignment]

    def tolerances(self, params):
        return (0.5, 1e-3)

    def reduction(self, params):
        return kernelab.Reduction(length=params.K, partials=params.dtype)


def test_where_the_tolerance_comes_from() -> None:
    params = GemmParams()
    default = tolerance_of(Scale(), ScaleParams())
    assert (default.rtol, default.atol, default.reduction) == (1.3e-6, 1e-5, None)
    assert default.source == "float32 defaults of torch.testing"
    own = tolerance_of(OwnTolerances(), params)
    assert (own.rtol, own.atol, own.source) == (0.5, 1e-3, "OwnTolerances.tolerances()")
    assert own.reduction == kernelab.Reduction(length=64, partials="bfloat16")
    spec = tolerance_of(OwnTolerances(), params, rtol=1e-2)
    assert (spec.rtol, spec.atol) == (1e-2, 1e-3) and spec.reduction == own.reduction
    assert spec.source == "the spec's correctness.rtol, atol: OwnTolerances.tolerances()"
    both = tolerance_of(Scale(), ScaleParams(), rtol=1e-2, atol=0.0)
    assert both.source == "the spec's correctness.rtol/atol"
    function_form = _matmul_bench(lambda p: p.K)

    @function_form.tolerances
    def loose(p):
        return (1e-3, 1e-4)

    made = tolerance_of(function_form, function_form.parse_params({}))
    assert made.source == "@gemm.tolerances" and made.reduction == kernelab.Reduction(length=1024)


def test_tolerances_that_are_no_pair_are_named() -> None:
    bench = _matmul_bench()

    @bench.tolerances
    def bad(p):
        return {"rtol": 1e-3}

    with pytest.raises(
        kernelab.BenchmarkError, match=rf"{HERE}:\d+: bad \(@gemm.tolerances\) returned .*rtol, atol"
    ):
        kernelab.measure(bench, "torch", "again", measurement=FAST)


def test_a_reduction_that_raises_is_named_before_measuring() -> None:
    def boom(p):
        raise KeyError("K")

    with pytest.raises(kernelab.BenchmarkError, match=r"@gemm.reduction\) raised KeyError: 'K'"):
        kernelab.measure(_matmul_bench(boom), "torch", "again", measurement=FAST)


def test_a_reduction_of_another_kernelab_copy_is_read_by_its_fields() -> None:
    """A revision's benchmark returns its own copy's ``Reduction`` (``kernelab.runners.revision_worker``)."""

    class Reduction(BaseModel):  # what another copy of kernels/tolerances.py defines
        length: int
        accumulate: str = "float32"
        inputs: str | None = None
        partials: str | None = "bfloat16"
        torch_op: str | None = None

    made = as_reduction(Scale(), Reduction(length=96))
    assert made == kernelab.Reduction(length=96, partials="bfloat16")
