"""The built-in benchmarks compiled for a CUDA GPU: every variant matches its reference.

This session's process imported triton in interpreter mode (conftest), and the mode of a process
is fixed by its first ``import triton`` (``kernelab.kernels._device``). So the GPU cells run in a child
process that configures triton for CUDA first, as the runner's job process does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kernelab.kernels._device import TRITON_INTERPRET_ENV

_SCRIPT = """
import json, sys
from kernelab.kernels._device import configure_triton_env
configure_triton_env("cuda")
import torch
from kernelab.kernels import get_benchmark
from kernelab.kernels.preflight import tolerance_of
from kernelab.kernels.check import check_output, poison_

cells = json.loads(sys.argv[1])
for name, variant, values in cells:
    bench = get_benchmark(name)
    params = bench.parse_params(values)
    inputs = bench.make_inputs(params, torch.device("cuda"), seed=0)
    fn = bench.prepare(variant, params, inputs)
    out = poison_(fn())
    out = fn()
    torch.cuda.synchronize()
    res = check_output(out, bench.reference(params, inputs), tolerance_of(bench, params))
    print(json.dumps({"cell": [name, variant, values], "passed": res.passed, "message": res.message}))
"""

_SOFTMAX = [(4096, 1000), (333, 77), (1024, 20_000)]  # the last streams rows in 8192-wide tiles
_MATMUL = [(1024, 1024, 1024), (1000, 777, 2050)]
_DTYPES = ["float32", "float16", "bfloat16"]


def _cells() -> list[tuple[str, str, dict[str, object]]]:
    cells: list[tuple[str, str, dict[str, object]]] = []
    for dtype in _DTYPES:
        for variant in ("torch", "triton"):
            cells += [("softmax", variant, {"M": m, "N": n, "dtype": dtype}) for m, n in _SOFTMAX]
            cells += [("matmul", variant, {"M": m, "N": n, "K": k, "dtype": dtype}) for m, n, k in _MATMUL]
        small_tiles = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 4, "num_stages": 3}
        cells.append(("matmul", "triton", {"M": 1000, "N": 777, "K": 2050, "dtype": dtype, **small_tiles}))
        streamed = {"BLOCK_M": 1, "BLOCK_N": 256}
        cells.append(("softmax", "triton", {"M": 4096, "N": 1000, "dtype": dtype, **streamed}))
    cells.append(("matmul", "triton", {"M": 1024, "N": 1024, "K": 4096, "input_precision": "tf32"}))
    return cells


@pytest.mark.gpu
def test_builtin_benchmarks_are_correct_on_cuda() -> None:
    env = {k: v for k, v in os.environ.items() if k != TRITON_INTERPRET_ENV}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(_cells())],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(results) == len(_cells())
    failed = [r for r in results if not r["passed"]]
    assert not failed, failed
