"""Default tolerances: the dtype's pair mirrors torch.testing and the FP8 formats' own spacing; a
declared reduction grows it so that honest matmuls pass in their dtype and wrong ones still fail."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from pydantic import ValidationError
from torch.testing._comparison import _DTYPE_PRECISIONS

from kernelab.kernels.check import check_output
from kernelab.kernels.matmul import MatmulBenchmark, MatmulParams
from kernelab.kernels.preflight import tolerance_of
from kernelab.kernels.tolerances import (
    Reduction,
    Tolerance,
    default_tolerances,
    normalize_dtype_name,
    unit_roundoff,
)


@pytest.mark.parametrize("name", ["float64", "float32", "float16", "bfloat16"])
def test_matches_torch_testing_assert_close_defaults(name: str) -> None:
    assert default_tolerances(name) == _DTYPE_PRECISIONS[getattr(torch, name)]


def test_tf32_is_held_to_float16_tolerances() -> None:
    assert default_tolerances("tf32") == default_tolerances("float16")
    assert default_tolerances("tf32")[0] > default_tolerances("float32")[0]


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"])
def test_fp8_rtol_is_the_spacing_above_one_and_atol_the_smallest_normal(name: str) -> None:
    dtype = getattr(torch, name)
    one = torch.ones(1, dtype=dtype)
    next_above_one = float((one.view(torch.uint8) + 1).view(dtype).float())
    rtol, atol = default_tolerances(name)
    assert rtol == next_above_one - 1.0
    assert atol == torch.finfo(dtype).smallest_normal


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("fp16", "float16"),
        ("half", "float16"),
        ("torch.bfloat16", "bfloat16"),
        ("BF16", "bfloat16"),
        ("fp32", "float32"),
        ("double", "float64"),
        ("e4m3", "float8_e4m3fn"),
    ],
)
def test_aliases(alias: str, canonical: str) -> None:
    assert normalize_dtype_name(alias) == canonical
    assert default_tolerances(alias) == default_tolerances(canonical)


def test_integers_are_exact_and_unknown_names_raise() -> None:
    assert default_tolerances("int32") == (0.0, 0.0)
    with pytest.raises(ValueError, match="no default tolerances for dtype 'float128'; known: float64"):
        default_tolerances("float128")


# -- the reduction allowance on real matmuls (CPU) ----------------------------------------------

KS = (1000, 2048, 4096)
SEEDS = range(8)
CPU = torch.device("cpu")
TILE = 32  # the K-tile a wrong kernel drops


def _case(k: int, seed: int, dtype: str = "float32", scale: float = 1.0) -> tuple[Any, Any, Any]:
    """``MatmulBenchmark``'s 128x128 cell at K: its tolerance, inputs (times ``scale``, a power of
    two: exact) and float64 reference."""
    bench = MatmulBenchmark()
    params = MatmulParams(M=128, N=128, K=k, dtype=dtype)  # type: ignore[arg-type]
    inputs = {name: t * scale for name, t in bench.make_inputs(params, CPU, seed).items()}
    return tolerance_of(bench, params), inputs, bench.reference(params, inputs)


def _sequential(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` one term of K at a time in float32, each product and sum rounded: the honest
    summation order with the largest errors (BLAS blocks and trees make smaller ones)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype)
    for k in range(a.shape[1]):
        acc = acc + a[:, k : k + 1] * b[k : k + 1, :]
    return acc


@pytest.mark.timeout(240)
@pytest.mark.parametrize("k", KS)
def test_an_honest_float32_matmul_passes_where_the_old_default_failed(k: int) -> None:
    """An honest float32 product of K = 1000..4096 passes at the default over every seed, by
    ``torch.matmul`` and by a sequential sum, and the float32 pair of ``torch.testing`` that a
    benchmark without a declared reduction was held to (rtol 1.3e-6, atol 1e-5) fails them.

    Measured on this CPU (Xeon, torch 2.13, one thread; ``benchmarks/reduction_errors.py``, 256x256
    outputs, 20 seeds): the largest relative error over elements with ``|ref| >= rms(ref)`` was
    2.1e-6 / 2.0e-6 / 1.9e-6 (torch.matmul, K = 1000 / 2048 / 4096) and 3.4e-6 / 5.0e-6 / 7.1e-6
    (sequential); the old pair failed 34095 / 73004 / 110324 of 1.3M elements (torch.matmul); the
    default used at most 22% / 13% / 8% (torch.matmul) and 19% / 25% / 27% (sequential) of its
    ``atol + rtol |ref|``. On an H200, cuBLAS failed the old pair on 4 of 10**6 elements at 2.4e-6.
    """
    old_failures = 0
    for seed in SEEDS:
        tolerance, inputs, ref = _case(k, seed)
        for kernel in (torch.matmul, _sequential) if seed < 2 else (torch.matmul,):
            out = kernel(inputs["a"], inputs["b"])
            result = check_output(out, ref, tolerance)
            assert result.passed, result.message
            old_failures += not check_output(out, ref, Tolerance(rtol=1.3e-6, atol=1e-5)).passed
    assert old_failures > 0


@pytest.mark.timeout(240)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_an_honest_16_bit_matmul_with_float32_accumulation_passes(dtype: str) -> None:
    """``torch.matmul`` of 16-bit matrices (float32 accumulation inside) passes at every K and seed.

    Measured on this CPU (as above, 20 seeds): errors up to 0.8 units of the output's roundoff
    times ``|ref| + rms(ref)`` (partial sums kept in the output's dtype), the default used at
    most 8% (bfloat16) and 10% (float16); the dtype's pair of ``torch.testing`` alone failed 0-1
    bfloat16 and 50-278 float16 elements per K.
    """
    for k in KS:
        for seed in range(4):
            tolerance, inputs, ref = _case(k, seed, dtype)
            result = check_output(torch.matmul(inputs["a"], inputs["b"]), ref, tolerance)
            assert result.passed, result.message


def _drop_last_k_tile(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a[:, :-TILE] @ b[:-TILE, :]


def _bfloat16_math(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.bfloat16() @ b.bfloat16()).float()


def _k_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Every element K ulps off: a sum whose K roundings all went one way, the error that the
    deterministic bound ``gamma_K |a| |b|`` allows and the probabilistic sqrt(K) one does not."""
    return (a @ b) * (1.0 + a.shape[1] * torch.finfo(torch.float32).eps)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("kernel", [_drop_last_k_tile, _bfloat16_math, _k_ulps])
def test_wrong_float32_matmuls_still_fail(k: int, kernel: Any) -> None:
    for seed in range(3):
        tolerance, inputs, ref = _case(k, seed)
        out = kernel(inputs["a"], inputs["b"])
        result = check_output(out, ref, tolerance)
        assert not result.passed, f"{kernel.__name__} K={k} seed {seed}: {result.message}"
        assert f"sqrt({k}) 2^-24 [float32 sums of {k}]" in result.message
    if kernel is _k_ulps:  # within Higham's deterministic bound gamma_K |a| . |b|: only sqrt(K) fails it
        u = 2.0**-24
        magnitude = inputs["a"].double().abs() @ inputs["b"].double().abs()
        assert bool(((out.double() - ref).abs() <= k * u / (1 - k * u) * magnitude).all())


@pytest.mark.parametrize("scale", [2.0**-10, 2.0**10])
def test_the_tolerance_scales_with_the_inputs(scale: float) -> None:
    """``correctness.input_scale`` moves outputs and their errors alike, and the tolerance with
    them (``rms(ref)``). The former fixed matmul atol (1e-5 + 6 u K / sqrt(2), for unit-normal
    inputs) passed a dropped K-tile at 2**-10 and failed an honest product at 2**10."""
    k = 1024
    fixed = Tolerance(rtol=1.3e-6, atol=1e-5 + 6 * 2.0**-24 * k / math.sqrt(2))
    tolerance, inputs, ref = _case(k, seed=0, scale=scale)
    honest, dropped = torch.matmul(inputs["a"], inputs["b"]), _drop_last_k_tile(inputs["a"], inputs["b"])
    assert check_output(honest, ref, tolerance).passed
    assert not check_output(dropped, ref, tolerance).passed
    if scale < 1:
        assert check_output(dropped, ref, fixed).passed
    else:
        assert not check_output(honest, ref, fixed).passed


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` (float32) rounded to TF32 (10 explicit mantissa bits, round to nearest even)."""
    bits = x.view(torch.int32)
    bias = 0xFFF + ((bits >> 13) & 1)
    return ((bits + bias) & ~0x1FFF).view(torch.float32)


@pytest.fixture
def mkldnn_matmul_precision() -> Iterator[None]:
    """Restore ``torch.backends.mkldnn.matmul.fp32_precision`` after the test."""
    before = torch.backends.mkldnn.matmul.fp32_precision
    yield
    torch.backends.mkldnn.matmul.fp32_precision = before


@pytest.mark.usefixtures("mkldnn_matmul_precision")
def test_a_tf32_product_passes_where_tf32_is_allowed_and_fails_where_float32_is_asked() -> None:
    k = 2048
    _, inputs, ref = _case(k, seed=1)
    out = _tf32(inputs["a"]) @ _tf32(inputs["b"])
    assert check_output(
        out, ref, Tolerance(rtol=1.3e-6, atol=1e-5, reduction=Reduction(length=k, inputs="tf32"))
    ).passed
    by_torch = Tolerance(rtol=1.3e-6, atol=1e-5, reduction=Reduction(length=k, torch_op="matmul"))
    torch.backends.mkldnn.matmul.fp32_precision = "ieee"
    strict = check_output(out, ref, by_torch)
    assert not strict.passed and "tf32" not in strict.tolerance
    torch.backends.mkldnn.matmul.fp32_precision = "tf32"  # what set_float32_matmul_precision("high") sets
    allowed = check_output(out, ref, by_torch)
    assert allowed.passed, allowed.message
    assert "2^-11 [tf32 inputs: torch.backends.mkldnn.matmul.fp32_precision='tf32']" in allowed.tolerance


def test_a_reduction_grows_rtol_and_atol_by_its_allowance() -> None:
    reduction = Reduction(length=1000, accumulate="fp32", partials="bf16")
    assert (reduction.accumulate, reduction.partials) == ("float32", "bfloat16")
    tolerance = Tolerance(rtol=1.6e-2, atol=1e-5, source="x", reduction=reduction)
    g = 6 * (math.sqrt(1000) * 2.0**-24 + 2.0**-8)
    assert tolerance.growth("bfloat16") == pytest.approx(g)
    assert tolerance.bounds(3.0, "bfloat16") == pytest.approx((1.6e-2 + g, 1e-5 + 3.0 * g))
    assert tolerance.growth("int32") == 0.0 and Tolerance(rtol=0, atol=0).growth("float32") == 0.0
    assert unit_roundoff("tf32") == unit_roundoff("float16") == 2.0**-11 and unit_roundoff("bool") == 0.0


@pytest.mark.parametrize(
    ("fields", "field"),
    [({"length": 0}, "length"), ({"length": 8, "accumulate": "float128"}, "accumulate"),
     ({"length": 8, "inputs": "tf31"}, "inputs"), ({"length": 8, "torch_op": "fft"}, "torch_op"),
     ({"length": 8, "K": 8}, "K")],
)  # fmt: skip
def test_a_bad_reduction_names_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        Reduction.model_validate(fields)
    assert [e["loc"] for e in info.value.errors()] == [(field,)]
