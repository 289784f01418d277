"""A benchmark module that makes ``torch.cuda.Event.elapsed_time`` read 0.0 ms for everyone at
import (``cheats_clock_patch`` says why it matters); for the GPU suite and the H200 script."""

from __future__ import annotations

import torch
from cheats import ScaleBenchmark

torch.cuda.Event.elapsed_time = lambda self, end: 0.0  # type: ignore[method-assign,assignment]


class EventsConstantAtImport(ScaleBenchmark):
    """``ScaleBenchmark`` from a module that made CUDA events read 0 ms at import."""
