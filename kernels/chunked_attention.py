"""Built-in benchmark ``chunked_attention``: chunked-KV flash attention, two schedules, vs SDPA.

Variants: ``"torch"`` (``torch.nn.functional.scaled_dot_product_attention``), ``"monolithic"``
and ``"split"`` (``kernelab.kernels.triton_kernels.chunked_attention``: one arithmetic path, two launch
schedules that must be bitwise identical; check it with ``correctness.bitwise_vs_baseline``).
Parameters: q (B, H, S, D), k and v (B, H, L, D) with ``L`` = ``S`` when None, no mask,
``dtype``, tiles ``BLOCK_M``/``BLOCK_N`` and the KV ``CHUNK``. The batch for the
batch-invariance check is B (sequences).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from kernelab.kernels.base import Benchmark, BenchmarkError, Params, PowerOfTwo
from kernelab.kernels.matmul import NumWarps
from kernelab.kernels.tolerances import Reduction
from kernelab.service.contract.schemas import Work

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


class ChunkedAttentionParams(Params):
    """q (B, H, S, D), k/v (B, H, L, D) of ``dtype``; softmax(q k^T / sqrt(D)) v, no mask."""

    B: int = Field(gt=0, description="batch (sequences)")
    H: int = Field(gt=0, description="heads")
    S: int = Field(gt=0, description="queries per sequence")
    L: int | None = Field(default=None, gt=0, description="keys per sequence (None: S)")
    D: int = Field(gt=0, le=256, description="head dimension")
    dtype: Literal["float32", "float16", "bfloat16"] = "bfloat16"
    BLOCK_M: PowerOfTwo = Field(default=64, ge=16)
    BLOCK_N: PowerOfTwo = Field(default=64, ge=16)
    CHUNK: int = Field(default=512, gt=0, description="keys per chunk; a multiple of BLOCK_N")
    num_warps: NumWarps = 4
    num_stages: int = Field(default=2, ge=1, le=8)

    @model_validator(mode="after")
    def _chunk_multiple(self) -> ChunkedAttentionParams:
        if self.CHUNK % self.BLOCK_N:
            raise ValueError(f"CHUNK={self.CHUNK} must be a multiple of BLOCK_N={self.BLOCK_N}")
        return self

    @property
    def keys(self) -> int:
        return self.S if self.L is None else self.L


class ChunkedAttentionBenchmark(Benchmark[ChunkedAttentionParams]):
    """Attention forward: SDPA vs chunked-KV Triton, monolithic and split schedules."""

    name = "chunked_attention"
    Params = ChunkedAttentionParams
    variants = ("torch", "monolithic", "split")
    description = "attention forward; PyTorch SDPA vs chunked-KV Triton flash attention (2 schedules)"

    def make_inputs(self, params: ChunkedAttentionParams, device: Any, seed: int) -> dict[str, Any]:
        """``{"q": (B, H, S, D), "k", "v": (B, H, L, D)}`` of params.dtype, standard normal."""
        from kernelab.kernels._device import randn, seeded_generator, torch_dtype

        gen, dtype, p = seeded_generator(device, seed), torch_dtype(params.dtype), params
        q = randn((p.B, p.H, p.S, p.D), dtype=dtype, device=device, generator=gen)
        k = randn((p.B, p.H, p.keys, p.D), dtype=dtype, device=device, generator=gen)
        v = randn((p.B, p.H, p.keys, p.D), dtype=dtype, device=device, generator=gen)
        return {"q": q, "k": k, "v": v}

    def prepare(
        self, variant: str, params: ChunkedAttentionParams, inputs: dict[str, Any]
    ) -> Callable[[], Any]:
        """Allocate out and return the launch closure. Raises ``BenchmarkError`` for an unknown variant."""
        import torch

        q, k, v = inputs["q"], inputs["k"], inputs["v"]
        if variant == "torch":

            def run_torch() -> Any:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)

            return run_torch
        if variant in ("monolithic", "split"):
            from kernelab.kernels._device import import_triton_kernels

            kernels = import_triton_kernels("kernelab.kernels.triton_kernels.chunked_attention", q.device)
            out = torch.empty_like(q)
            return kernels.make_attention(
                q.contiguous(),
                k.contiguous(),
                v.contiguous(),
                out,
                schedule=variant,
                BLOCK_M=params.BLOCK_M,
                BLOCK_N=params.BLOCK_N,
                CHUNK=params.CHUNK,
                num_warps=params.num_warps,
                num_stages=params.num_stages,
            )
        raise BenchmarkError(
            f"unknown variant {variant!r} of 'chunked_attention'; known: {', '.join(self.variants)}",
            ("variant",),
        )

    def reference(self, params: ChunkedAttentionParams, inputs: dict[str, Any]) -> Any:
        """SDPA in float64 on the inputs' device: (B, H, S, D) float64."""
        import torch

        q, k, v = (inputs[n].to(torch.float64) for n in ("q", "k", "v"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def work(self, params: ChunkedAttentionParams, variant: str) -> Work:
        """4*B*H*S*L*D FLOPs (two GEMMs); q, k, v read once, out written once."""
        p, item = params, _DTYPE_BYTES[params.dtype]
        return Work(
            flops=4.0 * p.B * p.H * p.S * p.keys * p.D,
            bytes_read=float(p.B * p.H * (p.S + 2 * p.keys) * p.D * item),
            bytes_written=float(p.B * p.H * p.S * p.D * item),
        )

    def reduction(self, params: ChunkedAttentionParams) -> Reduction:
        """Two float32 reductions per output: the scores ``q . k`` over D and ``P @ V`` with the
        softmax's sum over the L keys; their random-walk errors add in variance, as one reduction
        of ``L + D`` terms would. 16-bit outputs round the probabilities P to their dtype before
        ``P @ V`` (``partials``). Float32 matmuls of SDPA follow torch's setting (``torch_op``)."""
        return Reduction(
            length=params.keys + params.D,
            partials=None if params.dtype == "float32" else params.dtype,
            torch_op="matmul",
        )

    def batch_rows(self, params: ChunkedAttentionParams) -> int:
        return params.B

    def batch_slice(
        self, params: ChunkedAttentionParams, inputs: dict[str, Any], start: int, stop: int
    ) -> tuple[ChunkedAttentionParams, dict[str, Any]]:
        """Sequences ``[start, stop)`` (contiguous copies); B becomes ``stop - start``."""
        sub = params.model_copy(update={"B": stop - start})
        return sub, {n: inputs[n][start:stop].contiguous() for n in ("q", "k", "v")}

    def output_axes(self, params: ChunkedAttentionParams) -> tuple[tuple[str, int | None], ...]:
        return (("batch", None), ("head", None), ("row", params.BLOCK_M), ("dim", None))
