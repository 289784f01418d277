"""Triton's interpreter switch for a device, without importing torch or triton.

``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates a function, and triton's own library is
decorated at the first ``import triton``, so a process fixes its mode by setting the variable
before anything imports triton (the full rule: ``kernelab.kernels._device``). A job's orchestrating
process (``kernelab.runners.job``) sets it here for the measuring child it starts, without torch.
"""

from __future__ import annotations

import os
from typing import Any

TRITON_INTERPRET_ENV = "TRITON_INTERPRET"


def wants_interpreter(device: Any) -> bool:
    """True when Triton kernels for ``device`` (a ``torch.device``, a name such as ``"cuda:0"``, or
    None: the CPU) must run under the interpreter: on the CPU."""
    return device is None or str(device).partition(":")[0] == "cpu"


def configure_triton_env(device: Any) -> None:
    """Set (CPU) or remove (any other device) ``TRITON_INTERPRET`` for kernels about to be imported."""
    if wants_interpreter(device):
        os.environ[TRITON_INTERPRET_ENV] = "1"
    else:
        os.environ.pop(TRITON_INTERPRET_ENV, None)
