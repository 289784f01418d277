"""SoftmaxBenchmark: every variant matches the float64 reference under the Triton interpreter."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kernelab.kernels import BenchmarkError, get_benchmark
from kernelab.kernels._device import import_triton_kernels
from kernelab.kernels.check import check_output, poison_
from kernelab.kernels.preflight import tolerance_of
from kernelab.kernels.softmax import FLOPS_PER_ELEMENT, SoftmaxParams, launch_config
from kernelab.kernels.tolerances import Tolerance

CPU = torch.device("cpu")


def _run(variant: str, **values: Any) -> tuple[torch.Tensor, torch.Tensor, SoftmaxParams]:
    bench = get_benchmark("softmax")
    params = bench.parse_params(values)
    inputs = bench.make_inputs(params, CPU, seed=1)
    fn = bench.prepare(variant, params, inputs)
    out = poison_(fn())  # the closure returns its preallocated buffer: poison it, run again
    assert fn() is out
    return out, bench.reference(params, inputs), params


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("variant", "blocks"),
    [
        ("torch", {}),
        ("unfused", {}),  # the CPU demo's baseline: four PyTorch operations
        ("triton", {}),  # one tile per row: N=200 -> BLOCK_N=256, 8 rows per program
        ("triton", {"BLOCK_M": 16, "BLOCK_N": 64}),  # rows streamed in 4 tiles (online softmax)
    ],
)
def test_matches_reference(variant: str, blocks: dict[str, int], dtype: str) -> None:
    out, ref, params = _run(variant, M=61, N=200, dtype=dtype, **blocks)  # M not a multiple of BLOCK_M
    assert out.dtype == getattr(torch, dtype) and out.shape == (61, 200)
    res = check_output(out, ref, tolerance_of(get_benchmark("softmax"), params))
    assert res.passed, res.message
    assert res.cosine_similarity > 0.9999


def test_unwritten_rows_show_as_nan_and_fail() -> None:
    bench = get_benchmark("softmax")
    params = bench.parse_params({"M": 64, "N": 200})
    x = bench.make_inputs(params, CPU, seed=0)["x"]
    out = poison_(torch.empty_like(x))
    kernels = import_triton_kernels("kernelab.kernels.triton_kernels.softmax", CPU)
    kernels.make_softmax(x[:-3], out[:-3], BLOCK_M=8, BLOCK_N=256, num_warps=4)()  # forgets 3 rows
    res = check_output(out, bench.reference(params, {"x": x}), Tolerance(rtol=1.3e-6, atol=1e-5))
    assert not res.passed
    assert res.nonfinite == 3 * 200
    assert "bad rows 3/64: 61, 62, 63" in res.message


def test_wrong_normalisation_fails() -> None:
    out, ref, params = _run("triton", M=8, N=33)
    tolerance = tolerance_of(get_benchmark("softmax"), params)
    assert check_output(out, ref, tolerance).passed
    assert not check_output(out * 1.001, ref, tolerance).passed


def test_inputs_are_seeded_normal() -> None:
    bench = get_benchmark("softmax")
    params = bench.parse_params({"M": 32, "N": 64, "dtype": "bfloat16"})
    a, b = bench.make_inputs(params, CPU, 3)["x"], bench.make_inputs(params, CPU, 3)["x"]
    assert a.dtype == torch.bfloat16 and torch.equal(a, b)
    assert not torch.equal(a, bench.make_inputs(params, CPU, 4)["x"])
    assert a.count_nonzero() == a.numel()


@pytest.mark.parametrize(("dtype", "itemsize"), [("float32", 4), ("float16", 2), ("bfloat16", 2)])
def test_work(dtype: str, itemsize: int) -> None:
    bench = get_benchmark("softmax")
    params = bench.parse_params({"M": 1000, "N": 333, "dtype": dtype})
    for variant in bench.variants:
        work = bench.work(params, variant)
        assert work.bytes_read == work.bytes_written == 1000 * 333 * itemsize
        assert work.flops == FLOPS_PER_ELEMENT * 1000 * 333


def test_launch_config_defaults_and_overrides() -> None:
    assert launch_config(SoftmaxParams(M=64, N=200)) == {"BLOCK_M": 8, "BLOCK_N": 256, "num_warps": 4}
    assert launch_config(SoftmaxParams(M=3, N=5)) == {"BLOCK_M": 4, "BLOCK_N": 8, "num_warps": 4}
    assert launch_config(SoftmaxParams(M=4096, N=100_000)) == {"BLOCK_M": 1, "BLOCK_N": 8192, "num_warps": 8}
    explicit = SoftmaxParams(M=64, N=200, BLOCK_M=2, BLOCK_N=512, num_warps=16)
    assert launch_config(explicit) == {"BLOCK_M": 2, "BLOCK_N": 512, "num_warps": 16}


def test_unknown_variant_raises() -> None:
    bench = get_benchmark("softmax")
    params = bench.parse_params({"M": 2, "N": 2})
    with pytest.raises(BenchmarkError, match="unknown variant 'cudnn'") as info:
        bench.prepare("cudnn", params, bench.make_inputs(params, CPU, 0))
    assert info.value.loc == ("variant",)
