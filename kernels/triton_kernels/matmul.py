"""Tiled matmul in Triton: ``C = A @ B`` with A (M, K), B (K, N), C (M, N), any strides.

Each program computes one ``BLOCK_M x BLOCK_N`` tile of C, accumulating ``BLOCK_K`` slices of the
K dimension in float32 with ``tl.dot``, and stores the tile in C's dtype. Program ids are swizzled
in groups of ``GROUP_M`` tile-rows so that programs running together reuse the same tiles of B in
L2 (the "L2 cache optimizations" of the Triton tutorial "03-matrix-multiplication").

Edges: rows of A past M and columns of B past N are read wrapped (``% M``, ``% N``: valid memory,
results discarded), the K tail is masked to zero, and the store is masked to the (M, N) bounds.
``INPUT_PRECISION`` is ``tl.dot``'s ``input_precision``: ``"ieee"`` (exact float32 products),
``"tf32"`` or ``"tf32x3"``; it only changes float32 inputs.

``UPCAST_BF16`` works around the Triton interpreter (3.9), whose ``tl.dot`` multiplies the raw
bits of bfloat16 tiles (numpy has no bfloat16): under the interpreter bfloat16 tiles are widened to
float32 before the dot. That is exact (a product of two 8-bit mantissas fits float32's 24) and
therefore the same arithmetic as the GPU's bfloat16 dot with float32 accumulation. Compiled
kernels never widen.

Import through ``kernelab.kernels._device.import_triton_kernels`` (the interpreter rule).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def matmul_kernel(
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
    GROUP_M: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
    UPCAST_BF16: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pids_per_group = GROUP_M * num_pid_n
    first_pid_m = (pid // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m % M).to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N).to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if UPCAST_BF16:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n.to(tl.int64)[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


KERNELS = (matmul_kernel,)


def make_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    GROUP_M: int,
    num_warps: int,
    num_stages: int,
    input_precision: str = "ieee",
) -> Callable[[], torch.Tensor]:
    """Compile the kernel and return a closure that writes ``a @ b`` into ``c`` and returns ``c``.

    ``a``: (M, K), ``b``: (K, N), ``c``: (M, N), one device; block sizes are powers of two >= 16
    (``tl.dot``'s minimum). Compilation happens here (``warmup``), not in the closure; under the
    interpreter there is nothing to compile. Raises ``ValueError`` for mismatched shapes.
    """
    (M, K), (K2, N) = a.shape, b.shape
    if K != K2 or tuple(c.shape) != (M, N):
        raise ValueError(
            f"matmul shapes do not fit: a {tuple(a.shape)}, b {tuple(b.shape)}, c {tuple(c.shape)}"
        )
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    meta = {
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K,
        "GROUP_M": GROUP_M,
        "INPUT_PRECISION": input_precision,
        "UPCAST_BF16": isinstance(matmul_kernel, InterpretedFunction) and a.dtype == torch.bfloat16,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }
    matmul_kernel.warmup(*args, grid=grid, **meta)
    launch = matmul_kernel[grid]

    def run() -> torch.Tensor:
        launch(*args, **meta)
        return c

    return run
