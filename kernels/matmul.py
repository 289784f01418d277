"""Built-in benchmark ``matmul``: C = A @ B, eager PyTorch vs a tiled Triton kernel.

Variants: ``"torch"`` (``torch.matmul(a, b, out=c)``: cuBLAS on a GPU) and ``"triton"``
(``kernelab.kernels.triton_kernels.matmul``). Parameters: ``M``, ``N``, ``K`` (> 0), ``dtype`` (float32,
float16, bfloat16) and the Triton launch configuration ``BLOCK_M``/``BLOCK_N``/``BLOCK_K`` (powers
of two, >= 16), ``GROUP_M``, ``num_warps``, ``num_stages``, ``input_precision``. Comparing two tile
sizes is a spec whose baseline and candidate both name ``"triton"`` with different ``params``.

The default configuration, 128/128/32 with GROUP_M 8, 4 warps and 4 stages, is one of the Triton
tutorial "03-matrix-multiplication" autotuning configs; it needs (128*32 + 32*128) * 4 bytes * 4
stages = 128 KiB of shared memory in float32, which fits an A100 (164 KiB) and an H100/H200
(228 KiB). The same defaults run on the CPU interpreter (a 128x128 tile costs little there).
See ``kernelab.kernels.softmax`` for how to write a benchmark of your own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from kernelab.kernels.base import Benchmark, BenchmarkError, Params, PowerOfTwo
from kernelab.kernels.tolerances import Reduction
from kernelab.service.contract.schemas import Work

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_MAX_TILE_ELEMS = 2**20  # Triton's TRITON_MAX_TENSOR_NUMEL (triton/_utils.py): elements per block
DotBlock = Annotated[PowerOfTwo, Field(ge=16)]  # tl.dot needs every dimension >= 16
NumWarps = Annotated[PowerOfTwo, Field(le=32)]  # 32 warps = 1024 threads, CUDA's block limit


class MatmulParams(Params):
    """One matmul cell: A (M, K) @ B (K, N) -> C (M, N), all row-major ``dtype``."""

    M: int = Field(gt=0)
    N: int = Field(gt=0)
    K: int = Field(gt=0)
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    BLOCK_M: DotBlock = 128
    BLOCK_N: DotBlock = 128
    BLOCK_K: DotBlock = 32
    GROUP_M: int = Field(default=8, gt=0, le=1024, description="tile-rows per L2 swizzle group")
    num_warps: NumWarps = 4
    num_stages: int = Field(default=4, ge=1, le=8, description="software-pipelining depth")
    input_precision: Literal["ieee", "tf32", "tf32x3"] = Field(
        default="ieee", description="tl.dot input precision for float32 (Triton variant only)"
    )

    @field_validator("BLOCK_N")
    @classmethod
    def _tile_fits(cls, block_n: int, info: ValidationInfo) -> int:
        block_m = info.data.get("BLOCK_M")
        if block_m is not None and block_m * block_n > _MAX_TILE_ELEMS:
            raise ValueError(
                f"BLOCK_M * BLOCK_N = {block_m} * {block_n} exceeds Triton's {_MAX_TILE_ELEMS}-element limit"
            )
        return block_n


class MatmulBenchmark(Benchmark[MatmulParams]):
    """Matmul: eager PyTorch (``"torch"``) vs a tiled Triton kernel (``"triton"``)."""

    name = "matmul"
    Params = MatmulParams
    variants = ("torch", "triton")
    description = "C = A @ B with A (M, K), B (K, N); eager PyTorch vs tiled Triton kernel"

    def make_inputs(self, params: MatmulParams, device: Any, seed: int) -> dict[str, Any]:
        """``{"a": (M, K), "b": (K, N)}`` of params.dtype on device, standard normal from ``seed``."""
        from kernelab.kernels._device import randn, seeded_generator, torch_dtype

        gen, dtype = seeded_generator(device, seed), torch_dtype(params.dtype)
        return {
            "a": randn((params.M, params.K), dtype=dtype, device=device, generator=gen),
            "b": randn((params.K, params.N), dtype=dtype, device=device, generator=gen),
        }

    def prepare(self, variant: str, params: MatmulParams, inputs: dict[str, Any]) -> Callable[[], Any]:
        """Allocate C (M, N) and return a closure writing ``a @ b`` into it and returning it.

        The ``"torch"`` variant uses torch's own float32 precision setting (full precision by
        default), so ``input_precision`` other than ``"ieee"`` is refused for it. Raises
        ``BenchmarkError`` for that and for an unknown variant (loc ``("variant",)``).
        """
        import torch

        a, b = inputs["a"], inputs["b"]
        c = torch.empty((params.M, params.N), dtype=a.dtype, device=a.device)
        if variant == "torch":
            if params.input_precision != "ieee":
                raise BenchmarkError(
                    f"input_precision={params.input_precision!r} applies to the 'triton' variant only",
                    ("variant",),
                )

            def run_torch() -> Any:
                return torch.matmul(a, b, out=c)

            return run_torch
        if variant == "triton":
            from kernelab.kernels._device import import_triton_kernels

            kernels = import_triton_kernels("kernelab.kernels.triton_kernels.matmul", a.device)
            return kernels.make_matmul(
                a,
                b,
                c,
                BLOCK_M=params.BLOCK_M,
                BLOCK_N=params.BLOCK_N,
                BLOCK_K=params.BLOCK_K,
                GROUP_M=params.GROUP_M,
                num_warps=params.num_warps,
                num_stages=params.num_stages,
                input_precision=params.input_precision,
            )
        raise BenchmarkError(
            f"unknown variant {variant!r} of 'matmul'; known: {', '.join(self.variants)}", ("variant",)
        )

    def reference(self, params: MatmulParams, inputs: dict[str, Any]) -> Any:
        """``a @ b`` in float64 on the inputs' device: (M, N) float64.

        Computed where the inputs live: an O(M*N*K) float64 product is seconds on a GPU and can
        be minutes on a CPU at the shapes a GPU benchmark uses.
        """
        import torch

        return torch.matmul(inputs["a"].to(torch.float64), inputs["b"].to(torch.float64))

    def work(self, params: MatmulParams, variant: str) -> Work:
        """2*M*N*K FLOPs; A and B read once, C written once (the traffic floor)."""
        item = _DTYPE_BYTES[params.dtype]
        return Work(
            flops=2.0 * params.M * params.N * params.K,
            bytes_read=float((params.M * params.K + params.K * params.N) * item),
            bytes_written=float(params.M * params.N * item),
        )

    def reduction(self, params: MatmulParams) -> Reduction:
        """Each element of C sums K products, in float32 (``tl.dot``'s and cuBLAS's accumulator
        for every dtype here). The products are exact (16-bit factors multiply exactly in float32)
        except with TF32 inputs (``input_precision="tf32"``; for ``"torch"``, torch's own float32
        setting: ``torch_op``). A 16-bit C may hold partial sums in its own dtype: PyTorch lets
        cuBLAS reduce split-K partial sums in the output's precision by default
        (``torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction`` and ``..._bf16_...``,
        PyTorch docs "Reduced Precision Reduction in FP16 GEMMs"; seen on an H200 for torch fp16
        1000x777x2050, and on a CPU for bfloat16 and float16 at K = 1000..4096: errors up to 0.8
        units of the output's roundoff times ``|ref| + rms(ref)``). The same reduction holds for
        both variants: it describes the computation, not one implementation.
        """
        tf32 = params.dtype == "float32" and params.input_precision == "tf32"
        return Reduction(
            length=params.K,
            inputs="tf32" if tf32 else None,
            partials=None if params.dtype == "float32" else params.dtype,
            torch_op="matmul",
        )
