"""A device copy as a benchmark (``"copybench:DeviceCopy"`` with ``benchmarks/`` on ``PYTHONPATH``).

One variant, ``copy``: ``y.copy_(x)`` of ``n`` float32 elements (a ``cudaMemcpyAsync`` device to
device, which a CUDA graph captures as a memcpy node). The two sides differ by their ``n`` (side
``params``), so the truth of a comparison is the ratio of bytes moved. Used by
``benchmarks/copy_cases_h200.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from kernelab.kernels.base import Benchmark, BenchmarkError, Params
from kernelab.service.contract.schemas import Work


class CopyParams(Params):
    n: int = Field(gt=0, description="float32 elements copied")


class DeviceCopy(Benchmark[CopyParams]):
    """``y.copy_(x)``, x and y (n,) float32 on the device."""

    name = "device_copy"
    Params = CopyParams
    variants = ("copy",)

    def make_inputs(self, params: CopyParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(seed)
        x = torch.rand(params.n, generator=g, device=device)
        return {"x": x, "y": torch.empty_like(x)}

    def prepare(self, variant: str, params: CopyParams, inputs: dict[str, Any]) -> Any:
        if variant != "copy":
            raise BenchmarkError(f"unknown variant {variant!r}", loc=("variant",))
        x, y = inputs["x"], inputs["y"]
        return lambda: y.copy_(x)

    def reference(self, params: CopyParams, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"].double()

    def work(self, params: CopyParams, variant: str) -> Work:
        return Work(flops=0.0, bytes_read=4.0 * params.n, bytes_written=4.0 * params.n)
