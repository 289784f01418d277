"""MatmulBenchmark: both variants match the float64 reference under the Triton interpreter."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from kernelab.kernels import BenchmarkError, get_benchmark
from kernelab.kernels.check import check_output, poison_
from kernelab.kernels.matmul import MatmulParams
from kernelab.kernels.preflight import tolerance_of

CPU = torch.device("cpu")
SHAPE = {"M": 64, "N": 48, "K": 40}  # no dimension a multiple of 32: every edge is masked


def _check(variant: str, **values: Any) -> Any:
    bench = get_benchmark("matmul")
    params = bench.parse_params({**SHAPE, **values})
    inputs = bench.make_inputs(params, CPU, seed=2)
    fn = bench.prepare(variant, params, inputs)
    out = poison_(fn())
    assert fn() is out and out.shape == (params.M, params.N) and out.dtype == inputs["a"].dtype
    return check_output(out, bench.reference(params, inputs), tolerance_of(bench, params)), out


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("variant", "config"),
    [
        ("torch", {}),
        ("triton", {}),  # default 128/128/32 tile: one program, K tail masked
        ("triton", {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 3}),  # 12 programs, ragged group
    ],
)
def test_matches_reference(variant: str, config: dict[str, int], dtype: str) -> None:
    res, _ = _check(variant, dtype=dtype, **config)
    assert res.passed, res.message
    assert res.cosine_similarity > 0.9999


def test_tile_configurations_agree_in_float32() -> None:
    # The same K blocking accumulates the K blocks in the same order whatever BLOCK_M, BLOCK_N and
    # GROUP_M are. Under the Triton interpreter each block product is numpy's matmul, whose BLAS
    # orders the 16 products inside a block by the block's shape (bitwise equal on one CPU model,
    # not on an AMD EPYC with numpy 2.4 / OpenBLAS): equal to float32 rounding, not bitwise.
    _, a = _check("triton", BLOCK_M=16, BLOCK_N=32, BLOCK_K=16, GROUP_M=1)
    _, b = _check("triton", BLOCK_M=32, BLOCK_N=16, BLOCK_K=16, GROUP_M=4)
    assert not torch.equal(a, torch.zeros_like(a))
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-5)


def test_a_wrong_product_fails() -> None:
    bench = get_benchmark("matmul")
    params = bench.parse_params(SHAPE)
    inputs = bench.make_inputs(params, CPU, seed=0)
    out = bench.prepare("triton", params, {"a": inputs["a"], "b": inputs["b"].roll(1, dims=0)})()
    res = check_output(out, bench.reference(params, inputs), tolerance_of(bench, params))
    assert not res.passed and res.cosine_similarity < 0.5


def test_work_is_the_traffic_floor() -> None:
    bench = get_benchmark("matmul")
    params = bench.parse_params({"M": 4096, "N": 2048, "K": 1024, "dtype": "bfloat16"})
    work = bench.work(params, "triton")
    assert work.flops == 2 * 4096 * 2048 * 1024
    assert work.bytes_read == (4096 * 1024 + 1024 * 2048) * 2
    assert work.bytes_written == 4096 * 2048 * 2
    assert bench.work(params, "torch") == work


def test_the_reduction_is_k_float32_sums_with_tf32_and_16_bit_partials() -> None:
    bench = get_benchmark("matmul")
    plain = bench.reduction(MatmulParams(M=1, N=1, K=4096))
    assert (plain.length, plain.accumulate, plain.inputs, plain.partials) == (4096, "float32", None, None)
    assert plain.torch_op == "matmul"  # torch's own float32 setting decides its inputs
    assert bench.reduction(MatmulParams(M=1, N=1, K=64, input_precision="tf32")).inputs == "tf32"
    assert bench.reduction(MatmulParams(M=1, N=1, K=64, input_precision="tf32x3")).inputs is None
    assert bench.reduction(MatmulParams(M=1, N=1, K=2050, dtype="float16")).partials == "float16"
    tolerance = tolerance_of(bench, MatmulParams(M=1, N=1, K=4096))
    assert (tolerance.rtol, tolerance.atol) == (1.3e-6, 1e-5)  # torch.testing's float32 pair
    assert tolerance.growth("float32") == pytest.approx(6 * math.sqrt(4096) * 2**-24)
    assert tolerance.growth("float32", "tf32") == pytest.approx(6 * (math.sqrt(4096) * 2**-24 + 2**-11))


def test_tf32_is_refused_for_the_torch_variant() -> None:
    bench = get_benchmark("matmul")
    params = bench.parse_params({**SHAPE, "input_precision": "tf32"})
    with pytest.raises(BenchmarkError, match="applies to the 'triton' variant only"):
        bench.prepare("torch", params, bench.make_inputs(params, CPU, 0))


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"M": 0}, "M"),
        ({"K": -4}, "K"),
        ({"BLOCK_M": 48}, "BLOCK_M"),
        ({"BLOCK_K": 8}, "BLOCK_K"),
        ({"num_warps": 3}, "num_warps"),
        ({"num_stages": 0}, "num_stages"),
        ({"GROUP_M": 0}, "GROUP_M"),
        ({"dtype": "float64"}, "dtype"),
        ({"BLOCK_M": 1024, "BLOCK_N": 2048}, "BLOCK_N"),
    ],
)
def test_invalid_parameters_name_the_field(values: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as info:
        MatmulParams.model_validate({**SHAPE, **values})
    assert [e["loc"] for e in info.value.errors()] == [(field,)]
