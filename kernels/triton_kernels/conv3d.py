"""Implicit-GEMM conv3d in Triton (NCDHW), with the epilogue's row guard as a switch.

GEMM view: rows ``m`` are output pixels ``(n, od, oh, ow)`` (``M = npq = N*Do*Ho*Wo``), columns are
output channels ``k`` (``K``), the reduction runs over ``(c, t, r, s)`` (``C*KS^3``). A tile of A
is gathered from x (im2col on the fly; out-of-image taps and rows past ``npq`` read as 0), B is
the weight viewed as ``(K, C*KS^3)``; float32 accumulation with ``tl.dot``.

The epilogue reproduces the seed's store (``seeds/000``): for ``N == 1`` the output offset takes
the fast path ``off = k*dhw + m``; otherwise ``off = (n*K + k)*dhw + pix``. The store is always
masked on the column bound and on the buffer's end (``off < N*K*dhw``: what a hardware
buffer-bounds check suppresses). ``ROW_CHECK`` adds ``m < npq``; without it, padded rows of the
last M tile store their zero accumulators wherever the offset lands. Which shapes that clobbers
is worked out in ``kernelab.kernels.conv3d``.

Import through ``kernelab.kernels._device.import_triton_kernels`` (the interpreter rule).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def conv3d_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    N,
    C,
    D,
    H,
    W,
    K,
    Do,
    Ho,
    Wo,
    PAD,
    STRIDE,
    KS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROW_CHECK: tl.constexpr,
    FAST_N1: tl.constexpr,
    UPCAST: tl.constexpr,
    INPUT_PRECISION: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    dhw = Do * Ho * Wo
    npq = N * dhw
    crs = C * KS * KS * KS
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < npq
    n_idx = offs_m // dhw
    pix = offs_m % dhw
    od = pix // (Ho * Wo)
    oh = (pix // Wo) % Ho
    ow = pix % Wo
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, crs, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        k_ok = kk < crs
        c = kk // (KS * KS * KS)
        t = (kk // (KS * KS)) % KS
        r = (kk // KS) % KS
        s = kk % KS
        zd = od[:, None] * STRIDE - PAD + t[None, :]
        zh = oh[:, None] * STRIDE - PAD + r[None, :]
        zw = ow[:, None] * STRIDE - PAD + s[None, :]
        a_mask = (
            m_ok[:, None] & k_ok[None, :] & (zd >= 0) & (zd < D) & (zh >= 0) & (zh < H) & (zw >= 0) & (zw < W)
        )
        a_off = (((n_idx[:, None].to(tl.int64) * C + c[None, :]) * D + zd) * H + zh) * W + zw
        a = tl.load(x_ptr + a_off, mask=a_mask, other=0.0)
        b_off = offs_n[None, :].to(tl.int64) * crs + kk[:, None]
        b = tl.load(w_ptr + b_off, mask=k_ok[:, None] & (offs_n[None, :] < K), other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)

    if FAST_N1:
        off = offs_n[None, :].to(tl.int64) * dhw + offs_m[:, None]
    else:
        off = (n_idx[:, None].to(tl.int64) * K + offs_n[None, :]) * dhw + pix[:, None]
    mask = (offs_n[None, :] < K) & (off < npq * K)  # column bound + end of the buffer only
    if ROW_CHECK:
        mask = mask & m_ok[:, None]
    tl.store(y_ptr + off, acc.to(y_ptr.dtype.element_ty), mask=mask)


KERNELS = (conv3d_kernel,)


def make_conv3d(
    x: torch.Tensor,
    w: torch.Tensor,
    y: torch.Tensor,
    *,
    padding: int,
    stride: int,
    BLOCK_M: int,
    BLOCK_N: int,
    BLOCK_K: int,
    row_guard: bool,
    num_warps: int = 4,
    num_stages: int = 2,
) -> Callable[[], torch.Tensor]:
    """Compile and return a closure writing ``conv3d(x, w)`` into ``y`` and returning ``y``.

    ``x``: (N, C, D, H, W), ``w``: (K, C, KS, KS, KS), ``y``: (N, K, Do, Ho, Wo), all contiguous,
    one dtype. ``row_guard``: mask the store with ``m < npq`` when ``npq % BLOCK_M != 0`` (as the
    seed's fix gates it; aligned shapes compile without the compare). Raises ``ValueError`` for
    shapes that do not fit.
    """
    n, c, d, h, wd = x.shape
    k, c2, ks, ks2, ks3 = w.shape
    do, ho, wo = ((s + 2 * padding - ks) // stride + 1 for s in (d, h, wd))
    if c2 != c or not ks == ks2 == ks3 or tuple(y.shape) != (n, k, do, ho, wo):
        raise ValueError(
            f"conv3d shapes do not fit: x {tuple(x.shape)}, w {tuple(w.shape)}, y {tuple(y.shape)}"
        )
    if not (x.is_contiguous() and w.is_contiguous() and y.is_contiguous()):
        raise ValueError("conv3d needs contiguous x, w and y")
    npq = n * do * ho * wo
    grid = (triton.cdiv(npq, BLOCK_M), triton.cdiv(k, BLOCK_N))
    args = (x, w, y, n, c, d, h, wd, k, do, ho, wo, padding, stride)
    meta = {
        "KS": ks,
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": BLOCK_N,
        "BLOCK_K": BLOCK_K,
        "ROW_CHECK": row_guard and npq % BLOCK_M != 0,
        "FAST_N1": n == 1,
        "UPCAST": isinstance(conv3d_kernel, InterpretedFunction) and x.dtype == torch.bfloat16,
        "INPUT_PRECISION": "ieee",  # exact float32 products; 16-bit dtypes ignore it
        "num_warps": num_warps,
        "num_stages": num_stages,
    }
    conv3d_kernel.warmup(*args, grid=grid, **meta)
    launch = conv3d_kernel[grid]

    def run() -> torch.Tensor:
        launch(*args, **meta)
        return y

    return run
