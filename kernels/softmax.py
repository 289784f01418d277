"""Built-in benchmark ``softmax``: row softmax of an (M, N) tensor, eager PyTorch vs fused Triton.

Variants: ``"torch"`` (``torch.softmax(x, dim=-1, out=out)``, ATen's kernel), ``"triton"``
(``kernelab.kernels.triton_kernels.softmax``) and ``"unfused"`` (the textbook formula in four
PyTorch operations, ``exp(x - max) / sum``, in float32 as ATen's kernel computes (16-bit input
converted first): four passes over memory and two (M, N) temporaries per call where ATen's kernel
makes one pass per row and none; native on a CPU, the CPU demo's baseline,
``examples/softmax_cpu.yaml``). Parameters: ``M``, ``N`` (> 0), ``dtype`` (float32, float16,
bfloat16), and for the Triton variant ``BLOCK_M``, ``BLOCK_N``, ``num_warps`` (powers of two;
None picks them from the shape, see ``launch_config``).

Writing your own benchmark (this module is the template)
--------------------------------------------------------
1. Subclass ``kernelab.kernels.Benchmark[MyParams]``; set ``name``, ``variants`` (display order) and
   ``Params = MyParams``, a ``kernelab.kernels.Params`` subclass whose fields carry their constraints
   (``Field(gt=0)``, ``PowerOfTwo``, ``Literal``); the methods below take ``params: MyParams``.
   The server validates every sweep cell against it without a GPU, so a bad value is a 422
   naming the field (``("sweep", "M")``). Import torch and triton only inside methods: the server
   imports your module to validate specs.
2. ``make_inputs(params, device, seed)``: random normal data (never zeros: a kernel that writes
   nothing must not pass) from ``kernelab.kernels._device.seeded_generator(device, seed)``.
3. ``prepare(variant, params, inputs)``: allocate the output and compile here, then return a
   zero-argument closure that launches once, writes the *same* preallocated output each call and
   returns it (the runner poisons that buffer with NaN, calls again, and checks it). Import Triton
   kernel modules with ``kernelab.kernels._device.import_triton_kernels(module, device)`` so the CPU runs
   them under the interpreter. Raise ``BenchmarkError`` for an unknown variant.
4. ``reference(params, inputs)``: the exact answer in float64.
5. ``work(params, variant)``: FLOPs and the *minimum* bytes read/written of one launch. A floor
   never makes an honest result look implausible; the runner derives throughput from it.
6. ``reduction(params)`` when each output element sums terms (here the N exponentials of a row):
   the tolerance grows with the sum's length (``kernelab.kernels.tolerances``). Optionally
   ``tolerances(params)`` when the result's rounding needs more than the dtype's defaults.
7. Make it reachable: ``"mypkg.bench:MyBenchmark"`` in a spec, or a ``kernelab.benchmarks``
   entry point (see ``kernelab.kernels.base``).
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
_MAX_SINGLE_TILE_N = 8192  # rows longer than this are streamed in tiles (online softmax)
_ROW_BLOCK_ELEMS = 2048  # heuristic: several short rows per program, up to 2048 elements
# ~5 FLOPs per element: max-compare, subtract, exp, add to the sum, divide (the count of the
# Triton tutorial "02-fused-softmax"; exp counted as one operation).
FLOPS_PER_ELEMENT = 5
NumWarps = Annotated[PowerOfTwo, Field(le=32)]  # 32 warps = 1024 threads, CUDA's block limit


class SoftmaxParams(Params):
    """One softmax cell: x is (M, N) of ``dtype``, row-major; softmax along N."""

    M: int = Field(gt=0, description="rows")
    N: int = Field(gt=0, description="columns: the softmax axis")
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    BLOCK_M: PowerOfTwo | None = Field(default=None, description="Triton: rows per program")
    BLOCK_N: PowerOfTwo | None = Field(
        default=None, validate_default=True, description="Triton: columns per tile"
    )
    num_warps: NumWarps | None = Field(default=None, description="Triton: warps per program")

    @field_validator("BLOCK_N")
    @classmethod
    def _tile_fits(cls, block_n: int | None, info: ValidationInfo) -> int | None:
        if {"M", "N", "BLOCK_M"} <= info.data.keys():
            cfg = launch_config(cls.model_construct(**info.data, BLOCK_N=block_n))
            if cfg["BLOCK_M"] * cfg["BLOCK_N"] > _MAX_TILE_ELEMS:
                raise ValueError(
                    f"BLOCK_M * BLOCK_N = {cfg['BLOCK_M']} * {cfg['BLOCK_N']} exceeds Triton's "
                    f"{_MAX_TILE_ELEMS}-element block limit"
                )
        return block_n


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def launch_config(params: SoftmaxParams) -> dict[str, int]:
    """The Triton launch configuration: explicit parameters, else shape-derived defaults.

    Defaults (heuristics, in the spirit of the Triton softmax tutorial): ``BLOCK_N`` = N rounded up
    to a power of two, at most 8192 (longer rows stream in tiles); ``BLOCK_M`` = as many rows as
    fit 2048 elements, at most M rounded up; ``num_warps`` = 4, 8 or 16 as the tile grows past
    2048 and 8192 elements. Returns ``{"BLOCK_M", "BLOCK_N", "num_warps"}``.
    """
    block_n = params.BLOCK_N or min(_next_pow2(params.N), _MAX_SINGLE_TILE_N)
    block_m = params.BLOCK_M or max(1, min(_next_pow2(params.M), _ROW_BLOCK_ELEMS // block_n))
    tile = block_m * block_n
    num_warps = params.num_warps or (4 if tile <= 2048 else 8 if tile <= 8192 else 16)
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps}


class SoftmaxBenchmark(Benchmark[SoftmaxParams]):
    """Row softmax: eager PyTorch (``"torch"``) vs a fused Triton kernel (``"triton"``) or the
    unfused formula (``"unfused"``)."""

    name = "softmax"
    Params = SoftmaxParams
    variants = ("torch", "triton", "unfused")
    description = (
        "softmax(x, dim=-1) of an (M, N) tensor; eager PyTorch vs fused Triton kernel "
        "(or vs the unfused formula in four PyTorch operations)"
    )

    def make_inputs(self, params: SoftmaxParams, device: Any, seed: int) -> dict[str, Any]:
        """``{"x": (M, N) tensor of params.dtype on device}``, standard normal from ``seed``."""
        from kernelab.kernels._device import randn, seeded_generator, torch_dtype

        gen, dtype = seeded_generator(device, seed), torch_dtype(params.dtype)
        return {"x": randn((params.M, params.N), dtype=dtype, device=device, generator=gen)}

    def prepare(self, variant: str, params: SoftmaxParams, inputs: dict[str, Any]) -> Callable[[], Any]:
        """Allocate ``out`` (M, N) like x and return the launch closure (module doc, step 3).

        Raises ``BenchmarkError`` (loc ``("variant",)``) for an unknown variant.
        """
        import torch

        x = inputs["x"]
        out = torch.empty_like(x)
        if variant == "torch":

            def run_torch() -> Any:
                return torch.softmax(x, dim=-1, out=out)

            return run_torch
        if variant == "unfused":

            def run_unfused() -> Any:  # max, subtract + exp, sum, divide: four kernels, two temporaries
                xf = x.float()  # float32 math, as ATen's kernel does (x itself for float32 input)
                shifted = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
                return torch.div(shifted, shifted.sum(dim=-1, keepdim=True), out=out)

            return run_unfused
        if variant == "triton":
            from kernelab.kernels._device import import_triton_kernels

            kernels = import_triton_kernels("kernelab.kernels.triton_kernels.softmax", x.device)
            return kernels.make_softmax(x, out, **launch_config(params))
        raise BenchmarkError(
            f"unknown variant {variant!r} of 'softmax'; known: {', '.join(self.variants)}", ("variant",)
        )

    def reference(self, params: SoftmaxParams, inputs: dict[str, Any]) -> Any:
        """``softmax(x, dim=-1)`` in float64 on the CPU: (M, N) float64."""
        import torch

        return torch.softmax(inputs["x"].detach().to("cpu", torch.float64), dim=-1)

    def work(self, params: SoftmaxParams, variant: str) -> Work:
        """x read once and out written once (M*N elements each); 5 FLOPs per element (estimate)."""
        elements = params.M * params.N
        nbytes = elements * _DTYPE_BYTES[params.dtype]
        return Work(flops=FLOPS_PER_ELEMENT * elements, bytes_read=nbytes, bytes_written=nbytes)

    def reduction(self, params: SoftmaxParams) -> Reduction:
        """Each output divides by a sum of the row's N exponentials, accumulated in float32."""
        return Reduction(length=params.N)
