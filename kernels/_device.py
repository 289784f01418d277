"""Device helpers for benchmarks: seeded random inputs and the Triton interpreter rule.

**The Triton interpreter rule.** ``triton.jit`` decides, *when it decorates a function*, whether
the function is compiled for the GPU (``JITFunction``) or run by the Python interpreter
(``InterpretedFunction``), from the environment variable ``TRITON_INTERPRET``. Triton's own
library functions (``tl.sum``, ``tl.max``, ``tl.cdiv``: ``triton/language/standard.py``) are
decorated when ``import triton`` first runs, and a kernel of one mode cannot call library
functions of the other. So the mode of a whole process is fixed by the first ``import triton``:

* a process that will run benchmarks calls ``configure_triton_env(device)`` *before anything
  imports triton* (the runner's job entry point; a test session's conftest). It sets
  ``TRITON_INTERPRET=1`` for a CPU device and removes the variable for a CUDA device (a GPU timing
  of an interpreted kernel measures Python, not the kernel);
* kernel modules (``kernelab.kernels.triton_kernels.*``) import triton at top level and are imported only
  through ``import_triton_kernels(module, device)``, lazily, inside ``Benchmark.prepare``. It
  calls ``configure_triton_env`` too, which is enough when triton was not imported yet, and then
  checks that the kernels *and* triton's library are in the mode ``device`` needs; a mismatch
  raises ``BenchmarkError`` instead of Triton's opaque "Cannot call @triton.jit'd outside of the
  scope of a kernel";
* one process cannot run both modes. The runner daemon runs each job in a fresh child process.
  Read triton's version with ``importlib.metadata.version("triton")``, not ``import triton``.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import torch

from kernelab.kernels.base import BenchmarkError
from kernelab.kernels.triton_mode import TRITON_INTERPRET_ENV, configure_triton_env, wants_interpreter


def as_device(device: Any) -> torch.device:
    """``torch.device`` from a device, a string (``"cuda:0"``) or None (the CPU)."""
    return torch.device("cpu") if device is None else torch.device(device)


def is_interpreted(kernel: Any) -> bool:
    """True when ``kernel`` (a ``triton.jit`` object) was decorated in interpreter mode."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(kernel, InterpretedFunction)


def check_kernel_mode(kernels: Sequence[Any], device: Any) -> None:
    """Raise ``BenchmarkError`` unless ``kernels`` and triton's library fit ``device`` (module doc).

    ``kernels``: ``triton.jit`` objects. Triton's library is represented by ``tl.sum``.
    """
    import triton.language as tl

    want = wants_interpreter(device)
    for kernel in (*kernels, tl.sum):
        if is_interpreted(kernel) != want:
            mode = "interpreted" if is_interpreted(kernel) else "compiled"
            raise BenchmarkError(
                f"Triton kernel {kernel.__name__!r} was imported {mode} but device "
                f"{as_device(device)} needs it {'interpreted' if want else 'compiled'}: "
                f"{TRITON_INTERPRET_ENV} is read when triton and a kernel module are first imported; "
                "call kernelab.kernels._device.configure_triton_env(device) before anything imports triton, "
                "and run CPU and GPU benchmarks in separate processes",
                loc=("device",),
            )


def import_triton_kernels(module_name: str, device: Any) -> ModuleType:
    """Import a Triton kernel module in the mode ``device`` needs and return it.

    The module must list its ``triton.jit`` functions in a ``KERNELS`` tuple. Raises
    ``BenchmarkError`` when triton or the module was already imported in the other mode.
    """
    configure_triton_env(device)  # before the first import; later calls keep the runtime consistent
    module = importlib.import_module(module_name)
    check_kernel_mode(module.KERNELS, device)
    return module


def torch_dtype(name: str) -> torch.dtype:
    """``torch.float16`` from ``"float16"``. Raises ``ValueError`` for a name torch lacks."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch has no dtype {name!r}")
    return dtype


def seeded_generator(device: Any, seed: int) -> torch.Generator:
    """A ``torch.Generator`` on ``device`` seeded with ``seed``.

    The same seed gives the same numbers on the same device type and torch version; CPU and CUDA
    generators give different streams.
    """
    return torch.Generator(device=as_device(device)).manual_seed(seed)


def randn(
    shape: Sequence[int], *, dtype: torch.dtype, device: Any, generator: torch.Generator
) -> torch.Tensor:
    """Standard-normal tensor of ``shape`` and ``dtype`` on ``device``, drawn from ``generator``.

    Drawn in float32 and rounded to ``dtype`` (torch cannot draw fp8 directly), so an input is
    never zeros and the same seed gives the same values across dtypes up to rounding.
    """
    x = torch.randn(tuple(shape), generator=generator, device=as_device(device), dtype=torch.float32)
    return x.to(dtype)
