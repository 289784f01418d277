"""A benchmark module that replaces a timing function when it is imported (issue: "a benchmark
module that patched a timing function at import time also reached the after-job probe").
``torch.cuda.Event.elapsed_time`` reads 100x short from the import on, in whatever process imports
this module: kernelab imports it only in the measuring process."""

from __future__ import annotations

from typing import Any

import torch
from cheats import ScaleBenchmark

_real = torch.cuda.Event.elapsed_time


def _short(event: Any, end: Any) -> float:
    return float(_real(event, end)) / 100


torch.cuda.Event.elapsed_time = _short  # type: ignore[method-assign]


class PatchedAtImport(ScaleBenchmark):
    """``ScaleBenchmark`` from a module that patched the CUDA event timer at import."""
