"""A GPU target's name (``sm_90a``) read as what Triton compiles for: backend, compute capability,
warp size. Shared by the parent that asks for a compile (``kernelab.runners.static_metrics``) and
the ahead-of-time child that compiles (``kernelab.runners.static_metrics.aot``); imports nothing
of kernelab, torch or Triton."""

from __future__ import annotations

import re

__all__ = ["parse_target"]


def parse_target(name: str) -> tuple[str, int, int]:
    """``"sm_90a"`` → ``("cuda", 90, 32)``: backend, compute capability, warp size.

    Raises ``ValueError`` for anything but ``sm_<capability>[a]``.
    """
    m = re.fullmatch(r"sm_(\d{2,3})a?", name)
    if not m:
        raise ValueError(f"unknown target {name!r}: expected e.g. sm_80, sm_90a, sm_100a")
    return "cuda", int(m.group(1)), 32
