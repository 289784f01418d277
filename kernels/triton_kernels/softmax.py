"""Fused row softmax in Triton: ``out[i, :] = softmax(x[i, :])`` for a row-major (M, N) input.

One program handles a block of ``BLOCK_M`` rows. When a row fits one tile (``N <= BLOCK_N``) it is
read once, reduced and written once (the fused kernel of the Triton tutorial "02-fused-softmax");
otherwise the kernel streams the row in ``BLOCK_N`` tiles twice: an online pass that keeps the
running maximum and the rescaled running sum (Milakov & Gimelshein, "Online normalizer calculation
for softmax", 2018), then a pass that writes ``exp(x - max) / sum``. Arithmetic is float32
whatever the input dtype; the output is stored in the output buffer's dtype.

Numerical stability: the row maximum is subtracted before ``exp``. Rows past ``M`` in the last
block are clamped to row ``M - 1`` for loading (so no NaN is ever computed) and masked on store;
columns past ``N`` load ``-inf`` (``exp(-inf) = 0``) and are masked on store.

Import through ``kernelab.kernels._device.import_triton_kernels`` (the interpreter rule).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl


@triton.jit
def softmax_kernel(
    out_ptr,
    x_ptr,
    M,
    N,
    stride_xm,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    load_rows = tl.minimum(rows, M - 1).to(tl.int64)
    x_rows = x_ptr + load_rows[:, None] * stride_xm
    o_rows = out_ptr + rows.to(tl.int64)[:, None] * stride_om
    cols = tl.arange(0, BLOCK_N)
    if SINGLE_TILE:
        col_ok = cols < N
        x = tl.load(x_rows + cols[None, :], mask=col_ok[None, :], other=-float("inf")).to(tl.float32)
        num = tl.exp(x - tl.max(x, axis=1)[:, None])
        y = num / tl.sum(num, axis=1)[:, None]
        out_mask = row_ok[:, None] & col_ok[None, :]
        tl.store(o_rows + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:
        row_max = tl.full((BLOCK_M,), -float("inf"), tl.float32)
        row_sum = tl.zeros((BLOCK_M,), tl.float32)
        for start in range(0, N, BLOCK_N):
            c = start + cols
            x = tl.load(x_rows + c[None, :], mask=(c < N)[None, :], other=-float("inf")).to(tl.float32)
            new_max = tl.maximum(row_max, tl.max(x, axis=1))
            row_sum = row_sum * tl.exp(row_max - new_max) + tl.sum(tl.exp(x - new_max[:, None]), axis=1)
            row_max = new_max
        for start in range(0, N, BLOCK_N):
            c = start + cols
            col_ok = c < N
            x = tl.load(x_rows + c[None, :], mask=col_ok[None, :], other=-float("inf")).to(tl.float32)
            y = tl.exp(x - row_max[:, None]) / row_sum[:, None]
            out_mask = row_ok[:, None] & col_ok[None, :]
            tl.store(o_rows + c[None, :], y.to(out_ptr.dtype.element_ty), mask=out_mask)


KERNELS = (softmax_kernel,)


def make_softmax(
    x: torch.Tensor, out: torch.Tensor, *, BLOCK_M: int, BLOCK_N: int, num_warps: int
) -> Callable[[], torch.Tensor]:
    """Compile the kernel for ``x`` (M, N) and return a closure that writes ``softmax(x)`` to ``out``.

    ``x`` and ``out``: (M, N), same device, unit stride along N; ``out`` may differ in dtype.
    ``BLOCK_M``/``BLOCK_N`` are powers of two. Compilation happens here (``warmup``), not in the
    closure; under the interpreter there is nothing to compile. Raises ``ValueError`` for
    mismatched shapes or a non-unit column stride.
    """
    if x.dim() != 2 or out.shape != x.shape:
        raise ValueError(
            f"softmax needs 2-D x and out of one shape, got {tuple(x.shape)} and {tuple(out.shape)}"
        )
    if x.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError("softmax needs unit stride along N")
    M, N = x.shape
    grid = (triton.cdiv(M, BLOCK_M),)
    args = (out, x, M, N, x.stride(0), out.stride(0))
    meta = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "SINGLE_TILE": N <= BLOCK_N, "num_warps": num_warps}
    softmax_kernel.warmup(*args, grid=grid, **meta)
    launch = softmax_kernel[grid]

    def run() -> torch.Tensor:
        launch(*args, **meta)
        return out

    return run
