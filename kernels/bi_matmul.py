"""Built-in benchmark ``bi_matmul``: batch-invariant Triton GEMM beside ``torch.matmul``.

Variants: ``"torch"`` (``torch.matmul``: cuBLAS on a GPU, which picks kernels and split-K by M)
and ``"triton"`` (``kernelab.kernels.triton_kernels.bi_matmul``: one fixed tile configuration and K order
for every M, so each C element depends only on its row of A and column of B). Parameters as
``matmul`` plus ``CHUNK_K``. The batch is M: ``batch_slice`` gives rows of A, so kernelab's
batch-invariance check (``CorrectnessSpec.batch_invariance``) compares rows computed alone, in a
small batch and in the full batch (the seed ``seeds/004``'s R/R contract).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from kernelab.kernels.base import Benchmark, BenchmarkError, Params
from kernelab.kernels.matmul import DotBlock, MatmulBenchmark, MatmulParams, NumWarps
from kernelab.kernels.tolerances import Reduction
from kernelab.service.contract.schemas import Work


class BatchInvariantMatmulParams(Params):
    """A (M, K) @ B (K, N) -> C (M, N), row-major ``dtype``; fixed tiles (no dependence on M)."""

    M: int = Field(gt=0)
    N: int = Field(gt=0)
    K: int = Field(gt=0)
    dtype: Literal["float32", "float16", "bfloat16"] = "bfloat16"
    BLOCK_M: DotBlock = 64
    BLOCK_N: DotBlock = 64
    BLOCK_K: DotBlock = 64
    CHUNK_K: int = Field(
        default=1024, gt=0, description="K chunk accumulated from zero, then added ascending"
    )
    num_warps: NumWarps = 4
    num_stages: int = Field(default=3, ge=1, le=8)

    @model_validator(mode="after")
    def _chunk_multiple(self) -> BatchInvariantMatmulParams:
        if self.CHUNK_K % self.BLOCK_K:
            raise ValueError(f"CHUNK_K={self.CHUNK_K} must be a multiple of BLOCK_K={self.BLOCK_K}")
        return self


class BatchInvariantMatmulBenchmark(Benchmark[BatchInvariantMatmulParams]):
    """``torch.matmul`` vs a batch-invariant Triton GEMM."""

    name = "bi_matmul"
    Params = BatchInvariantMatmulParams
    variants = ("torch", "triton")
    description = "C = A @ B; torch.matmul vs a batch-invariant (fixed K order, no split-K) Triton GEMM"

    def make_inputs(self, params: BatchInvariantMatmulParams, device: Any, seed: int) -> dict[str, Any]:
        """``{"a": (M, K), "b": (K, N)}`` of params.dtype on device, standard normal from ``seed``."""
        return MatmulBenchmark().make_inputs(self._gemm(params), device, seed)

    def prepare(
        self, variant: str, params: BatchInvariantMatmulParams, inputs: dict[str, Any]
    ) -> Callable[[], Any]:
        """Allocate C (M, N) and return the launch closure.

        Raises ``BenchmarkError`` for an unknown variant.
        """
        import torch

        a, b = inputs["a"], inputs["b"]
        c = torch.empty((params.M, params.N), dtype=a.dtype, device=a.device)
        if variant == "torch":

            def run_torch() -> Any:
                return torch.matmul(a, b, out=c)

            return run_torch
        if variant == "triton":
            from kernelab.kernels._device import import_triton_kernels

            kernels = import_triton_kernels("kernelab.kernels.triton_kernels.bi_matmul", a.device)
            return kernels.make_bi_matmul(
                a,
                b,
                c,
                BLOCK_M=params.BLOCK_M,
                BLOCK_N=params.BLOCK_N,
                BLOCK_K=params.BLOCK_K,
                CHUNK_K=params.CHUNK_K,
                num_warps=params.num_warps,
                num_stages=params.num_stages,
            )
        raise BenchmarkError(
            f"unknown variant {variant!r} of 'bi_matmul'; known: {', '.join(self.variants)}", ("variant",)
        )

    def reference(self, params: BatchInvariantMatmulParams, inputs: dict[str, Any]) -> Any:
        """``a @ b`` in float64 on the inputs' device: (M, N) float64."""
        return MatmulBenchmark().reference(self._gemm(params), inputs)

    def work(self, params: BatchInvariantMatmulParams, variant: str) -> Work:
        """2*M*N*K FLOPs; A and B read once, C written once."""
        return MatmulBenchmark().work(self._gemm(params), variant)

    def reduction(self, params: BatchInvariantMatmulParams) -> Reduction:
        """``MatmulBenchmark``'s reduction (K float32 sums) for the same shape and dtype."""
        return MatmulBenchmark().reduction(self._gemm(params))

    def batch_rows(self, params: BatchInvariantMatmulParams) -> int:
        return params.M

    def batch_slice(
        self, params: BatchInvariantMatmulParams, inputs: dict[str, Any], start: int, stop: int
    ) -> tuple[BatchInvariantMatmulParams, dict[str, Any]]:
        """Rows ``[start, stop)`` of A (a contiguous copy) with the same B; M becomes ``stop - start``."""
        sub = params.model_copy(update={"M": stop - start})
        return sub, {"a": inputs["a"][start:stop].contiguous(), "b": inputs["b"]}

    def output_axes(self, params: BatchInvariantMatmulParams) -> tuple[tuple[str, int | None], ...]:
        return (("row", params.BLOCK_M), ("col", params.BLOCK_N))

    @staticmethod
    def _gemm(params: BatchInvariantMatmulParams) -> MatmulParams:
        return MatmulParams(M=params.M, N=params.N, K=params.K, dtype=params.dtype)
