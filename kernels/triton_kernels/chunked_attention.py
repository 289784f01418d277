"""Chunked-KV flash-attention forward in Triton, with a monolithic and a split schedule.

``out = softmax(q @ k^T * scale) @ v`` per (batch, head); q (B, H, S, D), k and v (B, H, L, D),
out (B, H, S, D); no mask; ``scale = 1/sqrt(D)``. The arithmetic path (after the seed
``seeds/004``'s chunked attention): keys in ``BLOCK_N`` blocks inside fixed ``CHUNK`` chunks;
each chunk's online softmax starts from the empty state (m = -inf, denom = 0, acc = 0); chunk states
are merged in ascending chunk order with the exact FlashAttention-2 rescale
(``m = max(m1, m2)``, ``denom = l1*e^(m1-m) + l2*e^(m2-m)``, ``acc`` likewise); one division at the
end. Both schedules call the same ``_chunk_state`` and ``_merge``:

* **monolithic**: one program per (query tile, batch*head) walks all chunks;
* **split**: one program per (query tile, batch*head, chunk) writes its chunk state (float32) to
  scratch, then a merge kernel folds the states in ascending order.

Storing and reloading a float32 state is exact, so the schedules are bitwise identical provided
the compiler contracts no multiply-add differently in the two kernels: they are compiled with
``enable_fp_fusion=False`` (the seed's "FP contraction disabled").

Import through ``kernelab.kernels._device.import_triton_kernels`` (the interpreter rule).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _chunk_state(
    q,
    k_base,
    v_base,
    kv_start,
    L,
    stride_kn,
    stride_vn,
    offs_d,
    d_ok,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    UPCAST: tl.constexpr,
):
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    denom = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for n0 in range(kv_start, kv_start + CHUNK, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < L
        kt = tl.load(
            k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None],
            mask=n_ok[None, :] & d_ok[:, None],
            other=0.0,
        )
        v = tl.load(
            v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_d[None, :],
            mask=n_ok[:, None] & d_ok[None, :],
            other=0.0,
        )
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale
        s = tl.where(n_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        denom = denom * alpha + tl.sum(p, 1)
        pv = p.to(v.dtype)
        if UPCAST:
            pv = pv.to(tl.float32)
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision="ieee")
        m = m_new
    return m, denom, acc


@triton.jit
def _merge(m1, l1, acc1, m2, l2, acc2):
    m = tl.maximum(m1, m2)
    a1 = tl.exp(m1 - m)
    a2 = tl.exp(m2 - m)
    return m, l1 * a1 + l2 * a2, acc1 * a1[:, None] + acc2 * a2[:, None]


@triton.jit
def _load_q(q_ptr, pid_m, bh, S, D, offs_d, d_ok, BLOCK_M: tl.constexpr, UPCAST: tl.constexpr):
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    q = tl.load(
        q_ptr + (bh * S + offs_m[:, None]).to(tl.int64) * D + offs_d[None, :],
        mask=(offs_m[:, None] < S) & d_ok[None, :],
        other=0.0,
    )
    if UPCAST:
        q = q.to(tl.float32)
    return q, offs_m


@triton.jit
def attn_monolithic_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    S,
    L,
    D,
    qk_scale,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q, offs_m = _load_q(q_ptr, pid_m, bh, S, D, offs_d, d_ok, BLOCK_M, UPCAST)
    k_base = k_ptr + bh.to(tl.int64) * L * D
    v_base = v_ptr + bh.to(tl.int64) * L * D
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    denom = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for c0 in range(0, L, CHUNK):
        m2, l2, acc2 = _chunk_state(
            q, k_base, v_base, c0, L, D, D, offs_d, d_ok, qk_scale, BLOCK_M, BLOCK_N, BLOCK_D, CHUNK, UPCAST
        )
        m, denom, acc = _merge(m, denom, acc, m2, l2, acc2)
    out = acc / denom[:, None]
    tl.store(
        o_ptr + (bh * S + offs_m[:, None]).to(tl.int64) * D + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < S) & d_ok[None, :],
    )


@triton.jit
def attn_split_chunk_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    m_ptr,
    l_ptr,
    acc_ptr,
    S,
    L,
    D,
    qk_scale,
    n_chunks,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CHUNK: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    chunk = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    q, offs_m = _load_q(q_ptr, pid_m, bh, S, D, offs_d, d_ok, BLOCK_M, UPCAST)
    k_base = k_ptr + bh.to(tl.int64) * L * D
    v_base = v_ptr + bh.to(tl.int64) * L * D
    m, denom, acc = _chunk_state(
        q,
        k_base,
        v_base,
        chunk * CHUNK,
        L,
        D,
        D,
        offs_d,
        d_ok,
        qk_scale,
        BLOCK_M,
        BLOCK_N,
        BLOCK_D,
        CHUNK,
        UPCAST,
    )
    row = (bh * n_chunks + chunk).to(tl.int64) * S + offs_m
    row_ok = offs_m < S
    tl.store(m_ptr + row, m, mask=row_ok)
    tl.store(l_ptr + row, denom, mask=row_ok)
    tl.store(acc_ptr + row[:, None] * BLOCK_D + offs_d[None, :], acc, mask=row_ok[:, None])


@triton.jit
def attn_split_merge_kernel(
    m_ptr, l_ptr, acc_ptr, o_ptr, S, D, n_chunks, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < S
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    denom = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    for chunk in range(0, n_chunks):
        row = (bh * n_chunks + chunk).to(tl.int64) * S + offs_m
        m2 = tl.load(m_ptr + row, mask=row_ok, other=0.0)
        l2 = tl.load(l_ptr + row, mask=row_ok, other=1.0)
        acc2 = tl.load(acc_ptr + row[:, None] * BLOCK_D + offs_d[None, :], mask=row_ok[:, None], other=0.0)
        m, denom, acc = _merge(m, denom, acc, m2, l2, acc2)
    out = acc / denom[:, None]
    tl.store(
        o_ptr + (bh * S + offs_m[:, None]).to(tl.int64) * D + offs_d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (offs_d[None, :] < D),
    )


KERNELS = (attn_monolithic_kernel, attn_split_chunk_kernel, attn_split_merge_kernel)


def make_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    *,
    schedule: str,
    BLOCK_M: int,
    BLOCK_N: int,
    CHUNK: int,
    num_warps: int,
    num_stages: int,
) -> Callable[[], torch.Tensor]:
    """Compile one schedule (``"monolithic"`` or ``"split"``) and return a closure writing ``out``.

    q (B, H, S, D), k and v (B, H, L, D), out like q; contiguous, one dtype; D <= 256 (padded to a
    power of two in registers); CHUNK a multiple of BLOCK_N. The split schedule allocates its
    float32 scratch here: 4 * B*H*ceil(L/CHUNK)*S*(BLOCK_D + 2) bytes. Raises ``ValueError`` for
    shapes that do not fit or an unknown schedule.
    """
    B, H, S, D = q.shape
    L = k.shape[2]
    if tuple(k.shape) != (B, H, L, D) or v.shape != k.shape or out.shape != q.shape:
        raise ValueError(
            f"attention shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if not all(t.is_contiguous() for t in (q, k, v, out)):
        raise ValueError("attention needs contiguous q, k, v and out")
    if CHUNK % BLOCK_N:
        raise ValueError(f"CHUNK={CHUNK} is not a multiple of BLOCK_N={BLOCK_N}")
    block_d = max(16, triton.next_power_of_2(D))
    upcast = isinstance(attn_monolithic_kernel, InterpretedFunction) and q.dtype == torch.bfloat16
    consts = {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "BLOCK_D": block_d, "CHUNK": CHUNK, "UPCAST": upcast}
    launch_opts = {"num_warps": num_warps, "num_stages": num_stages, "enable_fp_fusion": False}
    scale = 1.0 / math.sqrt(D)
    n_chunks = triton.cdiv(L, CHUNK)
    grid = (triton.cdiv(S, BLOCK_M), B * H)
    if schedule == "monolithic":
        args = (q, k, v, out, S, L, D, scale)
        attn_monolithic_kernel.warmup(*args, grid=grid, **consts, **launch_opts)
        launch = attn_monolithic_kernel[grid]

        def run_monolithic() -> torch.Tensor:
            launch(*args, **consts, **launch_opts)
            return out

        return run_monolithic
    if schedule == "split":
        m_buf = torch.empty((B * H, n_chunks, S), dtype=torch.float32, device=q.device)
        l_buf = torch.empty((B * H, n_chunks, S), dtype=torch.float32, device=q.device)
        acc_buf = torch.empty((B * H, n_chunks, S, block_d), dtype=torch.float32, device=q.device)
        chunk_args = (q, k, v, m_buf, l_buf, acc_buf, S, L, D, scale, n_chunks)
        merge_args = (m_buf, l_buf, acc_buf, out, S, D, n_chunks)
        merge_consts = {"BLOCK_M": BLOCK_M, "BLOCK_D": block_d}
        chunk_grid = (*grid, n_chunks)
        attn_split_chunk_kernel.warmup(*chunk_args, grid=chunk_grid, **consts, **launch_opts)
        attn_split_merge_kernel.warmup(*merge_args, grid=grid, **merge_consts, **launch_opts)
        launch_chunks, launch_merge = attn_split_chunk_kernel[chunk_grid], attn_split_merge_kernel[grid]

        def run_split() -> torch.Tensor:
            launch_chunks(*chunk_args, **consts, **launch_opts)
            launch_merge(*merge_args, **merge_consts, **launch_opts)
            return out

        return run_split
    raise ValueError(f"unknown schedule {schedule!r}; known: 'monolithic', 'split'")
