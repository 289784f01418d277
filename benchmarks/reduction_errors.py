"""How much of the default tolerance honest matmuls use, and how the old defaults fared.

For each dtype (float32, bfloat16, float16) and K, multiplies SEEDS pairs of standard normal
(M, K) @ (K, N) matrices with ``torch.matmul`` on the device (and, for float32, with a sequential
float32 sum over K, the summation order with the largest errors) and compares each result with
the float64 product through ``kernelab.kernels.check.check_output``:

* ``max rel``: the largest ``|out - ref| / |ref|`` over elements with ``|ref| >= rms(ref)`` (near
  zero every relative error is large);
* ``old fails``: elements outside the dtype's ``torch.testing`` pair (what a benchmark without a
  declared reduction is held to, and every user benchmark was before reductions were declared);
* ``used``: the largest ``|out - ref| / (atol + rtol |ref|)`` under ``MatmulBenchmark``'s default
  tolerance (the declared reduction of K terms): 1.0 would be a failure;
* ``rtol``, ``atol/rms``: that tolerance's numbers (``atol`` in units of ``rms(ref)``).

    python benchmarks/reduction_errors.py [cpu|cuda] [SEEDS]

Prints one Markdown table. On a GPU, torch's float32 matmul setting is what the process has
(``torch.backends.cuda.matmul.fp32_precision``); set ``KERNELAB_TF32=1`` to turn TF32 on first.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from kernelab.kernels.check import check_output, mismatch_mask
from kernelab.kernels.matmul import MatmulBenchmark, MatmulParams
from kernelab.kernels.preflight import tolerance_of
from kernelab.kernels.tolerances import Tolerance, default_tolerances

M = N = 256
KS = (1000, 2048, 4096)


def sequential(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` summed over K one term at a time in ``a``'s dtype (each product and sum rounded)."""
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)
    for k in range(a.shape[1]):
        acc = acc + a[:, k : k + 1] * b[k : k + 1, :]
    return acc


def row(
    device: torch.device, dtype: str, k: int, seeds: int, kernel: Callable[..., torch.Tensor]
) -> list[str]:
    bench = MatmulBenchmark()
    params = MatmulParams(M=M, N=N, K=k, dtype=dtype)  # type: ignore[arg-type]
    tolerance = tolerance_of(bench, params)
    old = Tolerance(rtol=default_tolerances(dtype)[0], atol=default_tolerances(dtype)[1])
    worst_rel = used = 0.0
    old_fails = 0
    rtol = atol_per_rms = 0.0
    for seed in range(seeds):
        inputs = bench.make_inputs(params, device, seed)
        ref = bench.reference(params, inputs)
        out = kernel(inputs["a"], inputs["b"])
        res = check_output(out, ref, tolerance)
        assert res.passed, res.message
        err, mag = (out.double() - ref).abs(), ref.abs()
        rms = float(ref.square().mean().sqrt())
        worst_rel = max(worst_rel, float((err / mag)[mag >= rms].max()))
        used = max(used, float((err / (res.atol + res.rtol * mag)).max()))
        old_fails += int(mismatch_mask(out, ref, old).sum())
        rtol, atol_per_rms = res.rtol or 0.0, (res.atol or 0.0) / rms
    return [dtype, str(k), kernel.__name__, str(seeds), f"{worst_rel:.3g}", str(old_fails), f"{used:.3g}",
            f"{rtol:.3g}", f"{atol_per_rms:.3g}"]  # fmt: skip


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.matmul(a, b)


def main(device_name: str, seeds: int) -> None:
    device = torch.device(device_name)
    if device.type == "cpu":
        torch.set_num_threads(1)  # a shared machine; the summation order of one thread
    if os.environ.get("KERNELAB_TF32") == "1":
        torch.backends.cuda.matmul.fp32_precision = "tf32"  # type: ignore[attr-defined]
    rows = []
    for dtype in ("float32", "bfloat16", "float16"):
        kernels = [matmul, sequential] if dtype == "float32" else [matmul]
        for k in KS:
            for kernel in kernels:
                rows.append(row(device, dtype, k, seeds if kernel is matmul else max(1, seeds // 4), kernel))
                print(" | ".join(rows[-1]), file=sys.stderr, flush=True)
    header = ["dtype", "K", "kernel", "seeds", "max rel", "old fails", "used", "rtol", "atol/rms"]
    print(f"{M}x{N} outputs on {device}, torch {torch.__version__}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cpu", int(sys.argv[2]) if len(sys.argv) > 2 else 10)
