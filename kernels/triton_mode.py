"""Triton's interpreter switch for a device, without importing torch or triton.

``triton.jit`` reads ``TRITON_INTERPRET`` when it decorates a function, and triton's own library is
decorated at the first ``import triton``, so a process fixes its mode by setting the variable
before anything imports triton (the full rule: ``kernelab.kernels._device``). A job's orchestrating
process (``kernelab.runners.job``) sets it here for the measuring child it starts, without torch.
"""

from __future__ import annotations

import importlib.util
import os
import sys
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


_INTERPRETED = [0]  # Triton kernel launches this process ran in the interpreter (``interpreter_launches``)


def interpreter_launches() -> int:
    """How many Triton kernel launches this process has run in Triton's interpreter so far: 0 where
    ``TRITON_INTERPRET`` is not set or triton is not installed.

    The first call in interpreter mode imports ``triton.runtime.interpreter`` and wraps
    ``InterpretedFunction.run`` (every interpreted launch, ``kernel[grid](...)``, goes through it:
    triton's ``runtime/interpreter.py``) with a counter, so a caller reads the count before and
    after a call to learn whether the call ran interpreted kernels (``kernelab.runners.pipeline``:
    such a side's time is Python's, not the kernel's)."""
    if os.environ.get(TRITON_INTERPRET_ENV) != "1":
        return 0
    module = sys.modules.get("triton.runtime.interpreter")
    if module is None:
        if importlib.util.find_spec("triton") is None:
            return 0
        import triton.runtime.interpreter as imported

        module = imported
    cls = getattr(module, "InterpretedFunction", None)
    if cls is not None and not getattr(cls.run, "_kernelab_counted", False):
        run = cls.run

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            _INTERPRETED[0] += 1
            return run(self, *args, **kwargs)

        counted._kernelab_counted = True  # type: ignore[attr-defined]
        cls.run = counted
    return _INTERPRETED[0]
