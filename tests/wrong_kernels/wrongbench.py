"""Benchmarks whose candidate is fast and wrong, named in a spec as ``"wrongbench:Object"`` with
this folder on ``PYTHONPATH`` (a user's own benchmark module, outside kernelab).

* ``RowSoftmax`` (softmax over the last dim of x (M, N), float32): ``exact`` (torch.softmax,
  computed ``REPEATS`` times: a slow, right baseline), ``unnormalised`` (exp(x) without the
  division: one cheap kernel, every output wrong), ``raises`` (the call raises: the cell fails).
* ``PaddedAttention`` (q, k, v (B, H, S, D) float32, keys ``valid`` .. S - 1 are padding):
  ``masked`` (explicit q k^T / sqrt(D), padding masked, softmax, times v), ``nomask`` (fused
  SDPA that forgot the padding mask: faster, every query row wrong).

CPU and GPU alike; plain PyTorch, no Triton.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from pydantic import Field

from kernelab.kernels.base import Benchmark, BenchmarkError, Params
from kernelab.service.contract.schemas import Work

REPEATS = 8


class SoftmaxParams(Params):
    M: int = Field(gt=0)
    N: int = Field(gt=0)


class RowSoftmax(Benchmark[SoftmaxParams]):
    """Row softmax: a right baseline, an unnormalised (wrong) candidate, one that raises."""

    name = "row_softmax"
    Params = SoftmaxParams
    variants = ("exact", "unnormalised", "raises")

    def make_inputs(self, params: SoftmaxParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(params.M, params.N, generator=g).to(device)}

    def prepare(self, variant: str, params: SoftmaxParams, inputs: dict[str, Any]) -> Any:
        x = inputs["x"]
        out = torch.empty_like(x)
        if variant == "exact":

            def exact() -> torch.Tensor:
                for _ in range(REPEATS):
                    torch.softmax(x, dim=-1, out=out)
                return out

            return exact
        if variant == "unnormalised":

            def unnormalised() -> torch.Tensor:
                return torch.exp(x, out=out)

            return unnormalised
        if variant == "raises":

            def raises() -> torch.Tensor:
                raise RuntimeError("kernel launch failed: invalid configuration argument")

            return raises
        raise BenchmarkError(f"unknown variant {variant!r}", loc=("variant",))

    def reference(self, params: SoftmaxParams, inputs: dict[str, Any]) -> torch.Tensor:
        return torch.softmax(inputs["x"].double(), dim=-1)

    def work(self, params: SoftmaxParams, variant: str) -> Work:
        n = params.M * params.N
        return Work(flops=3.0 * n, bytes_read=4.0 * n, bytes_written=4.0 * n)


class AttentionParams(Params):
    B: int = Field(gt=0)
    H: int = Field(gt=0)
    S: int = Field(gt=1)
    D: int = Field(gt=0)
    valid: int = Field(gt=0, description="keys 0 .. valid - 1 are real, the others padding")


class PaddedAttention(Benchmark[AttentionParams]):
    """Attention over padded keys: explicit and masked (right) vs fused SDPA without the mask."""

    name = "padded_attention"
    Params = AttentionParams
    variants = ("masked", "nomask")

    def make_inputs(self, params: AttentionParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        shape = (params.B, params.H, params.S, params.D)
        q, k, v = (torch.randn(shape, generator=g).to(device) for _ in range(3))
        keep = torch.arange(params.S, device=device) < min(params.valid, params.S)
        return {"q": q, "k": k, "v": v, "keep": keep}

    def prepare(self, variant: str, params: AttentionParams, inputs: dict[str, Any]) -> Any:
        q, k, v, keep = inputs["q"], inputs["k"], inputs["v"], inputs["keep"]
        scale = 1.0 / math.sqrt(params.D)
        if variant == "masked":

            def masked() -> torch.Tensor:
                scores = (q @ k.transpose(-2, -1)) * scale
                scores = scores.masked_fill(~keep, float("-inf"))
                return torch.softmax(scores, dim=-1) @ v

            return masked
        if variant == "nomask":

            def nomask() -> torch.Tensor:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)

            return nomask
        raise BenchmarkError(f"unknown variant {variant!r}", loc=("variant",))

    def reference(self, params: AttentionParams, inputs: dict[str, Any]) -> torch.Tensor:
        q, k, v = (inputs[n].double() for n in ("q", "k", "v"))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(params.D)
        scores = scores.masked_fill(~inputs["keep"], float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    def work(self, params: AttentionParams, variant: str) -> Work:
        p = params
        return Work(
            flops=4.0 * p.B * p.H * p.S * p.S * p.D,
            bytes_read=12.0 * p.B * p.H * p.S * p.D,
            bytes_written=4.0 * p.B * p.H * p.S * p.D,
        )
