"""Built-in benchmark ``conv3d``: implicit-GEMM 3-D convolution (NCDHW), PyTorch vs Triton.

Variants: ``"torch"`` (``torch.nn.functional.conv3d``: cuDNN on a GPU) and ``"triton"``
(``kernelab.kernels.triton_kernels.conv3d``). Parameters: x (N, C, D, H, W), weight (K, C, ks, ks, ks),
``padding``, ``stride``, ``dtype``, tiles ``BLOCK_M``/``BLOCK_N``/``BLOCK_K`` and ``row_guard``,
the epilogue's ``m < npq`` store mask. The seed's comparison (``seeds/000``) is a spec whose
baseline and candidate are both ``triton`` with ``row_guard`` false and true.

Which shapes alias (the padded-row clobber)
-------------------------------------------
Let ``dhw = Do*Ho*Wo``, ``npq = N*dhw`` (GEMM rows) and ``pad = ceil(npq/BLOCK_M)*BLOCK_M - npq``
(padded rows of the last M tile, whose accumulators are 0 because their A rows are masked).
Without the row guard a padded row ``m`` in ``[npq, npq + pad)`` stores to:

* ``N == 1`` (fast path ``off = k*dhw + m``): ``off = (k+1)*dhw + (m - npq)``, i.e. channel
  ``k+1``, pixel ``m - npq``: a *live* output of the next channel, kept unless it is past the end
  of the buffer (``off >= K*dhw``). It aliases iff ``pad > 0`` and ``K >= 2``; the clobberable set
  is ``{k*dhw + m : 0 <= k < K, npq <= m < npq + pad, k*dhw + m < K*dhw}``, which for
  ``pad <= dhw`` is channels 1..K-1 x pixels 0..pad-1, ``(K-1)*pad`` elements (when
  ``pad > dhw`` the rows reach further channels; ``alias_offsets`` counts that exactly).
* ``N >= 2`` (``off = (n*K + k)*dhw + pix`` with ``n = m // dhw >= N``): every padded offset is
  ``>= N*K*dhw``, past the buffer, and the bounds mask drops it: no aliasing.

So a shape aliases iff ``N == 1``, ``npq % BLOCK_M != 0`` and ``K >= 2`` (with ``N == 1``,
``d*h*w == npq`` always holds: the seed's condition). The seed's (1, 96, 4, 8, 9, 96), ks 3,
padding 1, stride 1, BLOCK_M 128: dhw = npq = 288, pad = 96, 95 * 96 = **9120** clobberable
elements (32.99% of 27648), the seed's count. Whether a clobber happens is a race between the
padded block and the block owning the live rows: on a GPU it fails sometimes; the Triton
interpreter runs programs in grid order (M tiles outer), so the padded block always writes last
and the clobber is deterministic there.

Imports torch and triton lazily (the server validates specs with this module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from kernelab.kernels.base import Benchmark, BenchmarkError, Params
from kernelab.kernels.matmul import DotBlock, NumWarps
from kernelab.kernels.tolerances import Reduction
from kernelab.service.contract.schemas import Work

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class Conv3dParams(Params):
    """One conv3d cell: x (N, C, D, H, W), weight (K, C, ks, ks, ks) -> y (N, K, Do, Ho, Wo)."""

    N: int = Field(gt=0)
    C: int = Field(gt=0)
    D: int = Field(gt=0)
    H: int = Field(gt=0)
    W: int = Field(gt=0)
    K: int = Field(gt=0, description="output channels")
    ks: int = Field(default=3, gt=0, le=7, description="kernel size along d, h and w")
    padding: int = Field(default=1, ge=0)
    stride: int = Field(default=1, gt=0)
    dtype: Literal["float32", "float16", "bfloat16"] = "float16"
    BLOCK_M: DotBlock = 128
    BLOCK_N: DotBlock = 64
    BLOCK_K: DotBlock = 32
    num_warps: NumWarps = 4
    num_stages: int = Field(default=2, ge=1, le=8)
    row_guard: bool = Field(default=True, description="mask the epilogue store with m < npq")

    @model_validator(mode="after")
    def _output_not_empty(self) -> Conv3dParams:
        if min(output_dims(self)) <= 0:
            raise ValueError(f"the output is empty: (D, H, W) + 2*padding < ks for {self.D, self.H, self.W}")
        return self


def output_dims(p: Conv3dParams) -> tuple[int, int, int]:
    """(Do, Ho, Wo) = ``(s + 2*padding - ks) // stride + 1`` per spatial size (PyTorch's Conv3d)."""
    return tuple((s + 2 * p.padding - p.ks) // p.stride + 1 for s in (p.D, p.H, p.W))  # type: ignore[return-value]


def alias_offsets(p: Conv3dParams) -> set[int]:
    """Flat offsets into y that the unguarded epilogue's padded rows store to (module doc).

    Empty when the shape does not alias. Pure Python; O(K * pad) elements.
    """
    do, ho, wo = output_dims(p)
    dhw = do * ho * wo
    npq = p.N * dhw
    pad = -npq % p.BLOCK_M
    if p.N != 1 or pad == 0:
        return set()
    numel = p.K * dhw
    return {k * dhw + m for k in range(p.K) for m in range(npq, npq + pad) if k * dhw + m < numel}


def aliases(p: Conv3dParams) -> bool:
    """True when the unguarded kernel can clobber live outputs at ``p`` (module doc)."""
    return (
        p.N == 1 and p.K >= 2 and output_dims(p)[0] * output_dims(p)[1] * output_dims(p)[2] % p.BLOCK_M != 0
    )


class Conv3dBenchmark(Benchmark[Conv3dParams]):
    """conv3d NCDHW: ``F.conv3d`` (``"torch"``) vs an implicit-GEMM Triton kernel (``"triton"``)."""

    name = "conv3d"
    Params = Conv3dParams
    variants = ("torch", "triton")
    description = "3-D convolution NCDHW; PyTorch vs implicit-GEMM Triton kernel with a row-guard switch"

    def make_inputs(self, params: Conv3dParams, device: Any, seed: int) -> dict[str, Any]:
        """``{"x": (N, C, D, H, W), "w": (K, C, ks, ks, ks)}`` of params.dtype, standard normal."""
        from kernelab.kernels._device import randn, seeded_generator, torch_dtype

        gen, dtype = seeded_generator(device, seed), torch_dtype(params.dtype)
        p = params
        return {
            "x": randn((p.N, p.C, p.D, p.H, p.W), dtype=dtype, device=device, generator=gen),
            "w": randn((p.K, p.C, p.ks, p.ks, p.ks), dtype=dtype, device=device, generator=gen),
        }

    def prepare(self, variant: str, params: Conv3dParams, inputs: dict[str, Any]) -> Callable[[], Any]:
        """Allocate y and return the launch closure. Raises ``BenchmarkError`` for an unknown variant."""
        import torch

        x, w = inputs["x"], inputs["w"]
        if variant == "torch":

            def run_torch() -> Any:
                return torch.nn.functional.conv3d(x, w, padding=params.padding, stride=params.stride)

            return run_torch
        if variant == "triton":
            from kernelab.kernels._device import import_triton_kernels

            kernels = import_triton_kernels("kernelab.kernels.triton_kernels.conv3d", x.device)
            y = torch.empty((params.N, params.K, *output_dims(params)), dtype=x.dtype, device=x.device)
            return kernels.make_conv3d(
                x.contiguous(),
                w.contiguous(),
                y,
                padding=params.padding,
                stride=params.stride,
                BLOCK_M=params.BLOCK_M,
                BLOCK_N=params.BLOCK_N,
                BLOCK_K=params.BLOCK_K,
                row_guard=params.row_guard,
                num_warps=params.num_warps,
                num_stages=params.num_stages,
            )
        raise BenchmarkError(
            f"unknown variant {variant!r} of 'conv3d'; known: {', '.join(self.variants)}", ("variant",)
        )

    def reference(self, params: Conv3dParams, inputs: dict[str, Any]) -> Any:
        """``F.conv3d`` in float64 on the inputs' device: (N, K, Do, Ho, Wo) float64."""
        import torch

        x, w = inputs["x"].to(torch.float64), inputs["w"].to(torch.float64)
        return torch.nn.functional.conv3d(x, w, padding=params.padding, stride=params.stride)

    def work(self, params: Conv3dParams, variant: str) -> Work:
        """2 * npq * K * C*ks^3 FLOPs (padding taps included); x and w read once, y written once."""
        p, item = params, _DTYPE_BYTES[params.dtype]
        do, ho, wo = output_dims(p)
        npq, crs = p.N * do * ho * wo, p.C * p.ks**3
        return Work(
            flops=2.0 * npq * p.K * crs,
            bytes_read=float((p.N * p.C * p.D * p.H * p.W + p.K * crs) * item),
            bytes_written=float(npq * p.K * item),
        )

    def reduction(self, params: Conv3dParams) -> Reduction:
        """The implicit GEMM's: ``C * ks^3`` float32 sums per output (padding taps included), 16-bit
        partial sums possibly in the output's dtype (as ``MatmulBenchmark.reduction``), float32
        inputs as torch's convolution setting allows (cuDNN's default: TF32, ``torch_op``)."""
        return Reduction(
            length=params.C * params.ks**3,
            partials=None if params.dtype == "float32" else params.dtype,
            torch_op="conv",
        )

    def output_axes(self, params: Conv3dParams) -> tuple[tuple[str, int | None], ...]:
        """y viewed as (n, channel, pixel): pixel = GEMM row within the image, tiled by BLOCK_M."""
        return (("n", None), ("channel", params.BLOCK_N), ("pixel", params.BLOCK_M))

    def output_shape(self, params: Conv3dParams) -> tuple[int, ...]:
        do, ho, wo = output_dims(params)
        return (params.N, params.K, do * ho * wo)
