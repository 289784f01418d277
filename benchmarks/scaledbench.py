"""An elementwise kernel with tunable extra work (``"scaledbench:ScaledMul"`` with ``benchmarks/`` on
``PYTHONPATH``), for the sensitivity target of ``benchmarks/timing_artefacts_h200.py``.

One variant, ``mul``: ``torch.mul(x[:m], 1.0001, out=y[:m])`` of float32 elements, an SM kernel
(a CUDA graph captures it as one kernel node), with ``m = round(n * (1 + extra_pct / 100))``: the
candidate's ``extra_pct: 0.5`` reads and writes 0.5% more bytes, so the truth of the comparison is
a 1.005 ratio for a memory-bound kernel. ``n = 2**27`` is 512 MiB read plus 512 MiB written per
launch, about 240 us on an H200 (4.3 TB/s measured copy bandwidth): well over the 100 us target.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from kernelab.kernels.base import Benchmark, BenchmarkError, Params
from kernelab.service.contract.schemas import Work


class ScaledParams(Params):
    n: int = Field(default=2**27, gt=0, description="float32 elements of the base work")
    extra_pct: float = Field(default=0.0, ge=0, le=100, description="extra elements, percent of n")

    @property
    def m(self) -> int:
        return round(self.n * (1 + self.extra_pct / 100))


class ScaledMul(Benchmark[ScaledParams]):
    """``y[:m] = x[:m] * 1.0001``; x and y (m,) float32 on the device."""

    name = "scaled_mul"
    Params = ScaledParams
    variants = ("mul",)

    def make_inputs(self, params: ScaledParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(seed)
        return {"x": torch.rand(params.m, generator=g, device=device)}

    def prepare(self, variant: str, params: ScaledParams, inputs: dict[str, Any]) -> Any:
        if variant != "mul":
            raise BenchmarkError(f"unknown variant {variant!r}", loc=("variant",))
        x = inputs["x"]
        y = torch.empty_like(x)
        return lambda: torch.mul(x, 1.0001, out=y)

    def reference(self, params: ScaledParams, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"].double() * 1.0001

    def work(self, params: ScaledParams, variant: str) -> Work:
        return Work(flops=float(params.m), bytes_read=4.0 * params.m, bytes_written=4.0 * params.m)
