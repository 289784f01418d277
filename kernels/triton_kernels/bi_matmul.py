"""Batch-invariant matmul in Triton: ``C = A @ B``, every element a function of its row and column.

Contract (after the seed ``seeds/004``'s deterministic GEMM): one fixed launch configuration for
every M; K consumed in ascending ``BLOCK_K`` tiles inside fixed ``CHUNK_K`` chunks, each chunk
accumulated in float32 from zero and the chunk partials added ascending in float32; one rounding
to C's dtype; no split-K, no atomics, nothing that depends on M or on which rows share a tile.
Rows past M read row 0 (``% M``: valid memory, results discarded); the K tail is masked to 0.

Import through ``kernelab.kernels._device.import_triton_kernels`` (the interpreter rule).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def bi_matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for c0 in range(0, K, CHUNK_K):
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(c0, c0 + CHUNK_K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            k_ok = offs_k < K
            a = tl.load(
                a_ptr + rows[:, None] * stride_am + offs_k[None, :] * stride_ak, mask=k_ok[None, :], other=0.0
            )
            b = tl.load(
                b_ptr + offs_k[:, None] * stride_bk + cols[None, :] * stride_bn, mask=k_ok[:, None], other=0.0
            )
            if UPCAST:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            part = tl.dot(a, b, part, input_precision="ieee")
        acc = acc + part
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


KERNELS = (bi_matmul_kernel,)


def make_bi_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    CHUNK_K: int,
    num_warps: int,
    num_stages: int,
) -> Callable[[], torch.Tensor]:
    """Compile and return a closure writing ``a @ b`` into ``c``; ``a`` (M, K), ``b`` (K, N), ``c`` (M, N).

    ``CHUNK_K`` must be a multiple of ``BLOCK_K``. Raises ``ValueError`` for shapes that do not fit.
    """
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2 or tuple(c.shape) != (M, N):
        raise ValueError(
            f"matmul shapes do not fit: a {tuple(a.shape)}, b {tuple(b.shape)}, c {tuple(c.shape)}"
        )
    if CHUNK_K % BLOCK_K:
        raise ValueError(f"CHUNK_K={CHUNK_K} is not a multiple of BLOCK_K={BLOCK_K}")
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    meta = {
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K,
        "CHUNK_K": CHUNK_K,
        "UPCAST": isinstance(bi_matmul_kernel, InterpretedFunction) and a.dtype == torch.bfloat16,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }
    bi_matmul_kernel.warmup(*args, grid=grid, **meta)
    launch = bi_matmul_kernel[grid]

    def run() -> torch.Tensor:
        launch(*args, **meta)
        return c

    return run
