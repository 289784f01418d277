"""``DoubledSoftmax`` for ``benchmarks/aa_service.py``: a row softmax (float32, eager torch) whose
``twice`` variant computes it twice per call: a 2x slower candidate with the same output."""

from __future__ import annotations

import torch

import kernelab

DoubledSoftmax = kernelab.benchmark("doubled_softmax", params={"M": 256, "N": 1024})


@DoubledSoftmax.inputs
def _inputs(p, device, seed):  # type: ignore[no-untyped-def]
    g = torch.Generator(device=device).manual_seed(seed)
    return {"x": torch.randn(p.M, p.N, generator=g, device=device)}


@DoubledSoftmax.variant("torch")
def _torch(p, x):  # type: ignore[no-untyped-def]
    return torch.softmax(x, dim=-1)


@DoubledSoftmax.variant("twice")
def _twice(p, x):  # type: ignore[no-untyped-def]
    torch.softmax(x, dim=-1)
    return torch.softmax(x, dim=-1)


@DoubledSoftmax.reference
def _reference(p, x):  # type: ignore[no-untyped-def]
    return torch.softmax(x.double(), dim=-1)


@DoubledSoftmax.work
def _work(p, variant):  # type: ignore[no-untyped-def]
    n = p.M * p.N
    return kernelab.Work(flops=5.0 * n, bytes_read=4.0 * n, bytes_written=4.0 * n)
