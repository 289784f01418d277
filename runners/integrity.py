"""Are the functions kernelab times and checks with still the originals?

A benchmark module runs in the process that times it (a CUDA event pair must be recorded in the
context that launches the kernel), so it can reach what kernelab relies on: replace
``torch.cuda.Event.elapsed_time``, ``time.perf_counter_ns``, ``torch.cuda.CUDAGraph.replay``, or
kernelab's own timer methods and correctness check, at import time or during a call. Probes run
in a process that never imports benchmark code (``runners.isolation``); here the timing process
takes a snapshot of every such function when this module is imported (before any benchmark is
loaded: ``kernelab.runners.cells`` imports it first) and ``tampered()`` names those that were replaced since:
the attribute now holds another object, or a Python function's code object was swapped.

What this cannot see: a replacement of this module's own state, C-level patches through
``ctypes``, a benchmark that rewrites memory. Those need a process boundary (a benchmark's code
and kernelab's timing in different processes), which CUDA timing does not allow; the checked
samples through the timer (``kernelab.runners.sides``) and the plausibility bounds judge the output and the
times whatever was patched. docs/security.md states this residual risk.
"""

from __future__ import annotations

import importlib
import inspect
import types
from collections.abc import Iterator
from typing import Any

import torch  # noqa: F401  # loaded before the snapshot, so torch.cuda resolves

from kernelab.service.contract.schemas import Reason
from kernelab.service.judge.verdicts import reason

# (module, dotted attribute path) of every function the timing and checking path calls.
_WATCHED: tuple[tuple[str, str], ...] = (
    ("time", "perf_counter_ns"), ("time", "perf_counter"), ("time", "monotonic"), ("time", "sleep"),
    ("threading", "enumerate"),
    ("torch", "isclose"), ("torch", "isfinite"), ("torch", "equal"), ("torch", "empty"),
    ("torch", "empty_like"), ("torch", "zeros"), ("torch.linalg", "vector_norm"), ("torch", "dot"),
    ("torch", "Tensor"), ("torch", "Tensor.copy_"), ("torch", "Tensor.fill_"), ("torch", "Tensor.zero_"),
    ("torch", "Tensor.clone"), ("torch", "Tensor.to"), ("torch", "Tensor.cpu"), ("torch", "Tensor.view"),
    ("torch", "Tensor.__ne__"), ("torch", "Tensor.any"), ("torch", "Tensor.sum"),
    ("torch.cuda", "Event"), ("torch.cuda", "Event.record"), ("torch.cuda", "Event.elapsed_time"),
    ("torch.cuda", "Event.synchronize"), ("torch.cuda", "Event.query"), ("torch.cuda", "synchronize"),
    ("torch.cuda", "_sleep"), ("torch.cuda", "CUDAGraph"), ("torch.cuda", "CUDAGraph.replay"),
    ("torch.cuda", "CUDAGraph.capture_begin"), ("torch.cuda", "CUDAGraph.capture_end"),
    ("torch.cuda", "graph"), ("torch.cuda", "Stream"), ("torch.cuda", "stream"),
    ("torch.cuda", "current_stream"), ("torch.cuda", "device"), ("torch.cuda", "empty_cache"),
    ("torch.cuda", "get_device_properties"),
)  # fmt: skip

# kernelab's own modules on the timing and checking path: every function and method in them.
_OWN_MODULES = (
    "kernelab.runners.timing",
    "kernelab.runners.engine",
    "kernelab.runners.sides",
    "kernelab.runners.checks",
    "kernelab.runners.integrity",
    "kernelab.runners.probes.copy_bandwidth",
    "kernelab.runners.probes.telemetry",
    "kernelab.kernels.check",
    "kernelab.service.judge.estimators",
    "kernelab.service.judge.verdicts",
    "kernelab.service.judge.stats",
    "kernelab.service.contract.schemas",
)


def _resolve(module: str, path: str) -> tuple[Any, str, Any] | None:
    """``(owner, name, value)`` of ``module.path``, or None where it does not exist here."""
    try:
        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        return owner, name, _current(owner, name)
    except (ImportError, AttributeError):
        return None


def _current(owner: Any, name: str) -> Any:
    """``owner``'s own ``name`` (its ``__dict__`` entry: a patched method lands there), else the
    inherited one; ``_MISSING`` when there is none."""
    own = getattr(owner, "__dict__", {})
    return own[name] if name in own else getattr(owner, name, _MISSING)


def _own_functions() -> Iterator[tuple[str, Any, str, Any]]:
    """``(label, owner, name, function)`` of every function defined in ``_OWN_MODULES``."""
    for module_name in _OWN_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        for name, value in list(vars(module).items()):
            if inspect.isfunction(value) and value.__module__ == module_name:
                yield f"{module_name}.{name}", module, name, value
            elif inspect.isclass(value) and value.__module__ == module_name:
                for attr, member in list(vars(value).items()):
                    fn = member.__func__ if isinstance(member, classmethod | staticmethod) else member
                    if inspect.isfunction(fn):
                        yield f"{module_name}.{name}.{attr}", value, attr, member


class Snapshot:
    """The identity of every watched function and code object, taken at construction."""

    def __init__(self) -> None:
        self._entries: list[tuple[str, Any, str, Any, types.CodeType | None]] = []
        for module, path in _WATCHED:
            found = _resolve(module, path)
            if found is not None:
                owner, name, value = found
                self._entries.append((f"{module}.{path}", owner, name, value, _code(value)))
        for label, owner, name, value in _own_functions():
            self._entries.append((label, owner, name, value, _code(value)))

    def __len__(self) -> int:
        return len(self._entries)

    def tampered(self) -> list[str]:
        """Names of the watched functions replaced since the snapshot (empty: all original)."""
        changed = []
        for label, owner, name, value, code in self._entries:
            now = _current(owner, name)
            if now is not value or _code(now) is not code:
                changed.append(label)
        return changed


_MISSING = object()


def _code(value: Any) -> types.CodeType | None:
    fn = value.__func__ if isinstance(value, classmethod | staticmethod) else value
    return fn.__code__ if isinstance(fn, types.FunctionType) else None


_SNAPSHOT: Snapshot | None = None


def take_snapshot() -> Snapshot:
    """The process's snapshot, taken on the first call (call it before any benchmark is imported:
    ``kernelab.runners.cells.measure_cells`` does first). Later calls return the same snapshot."""
    global _SNAPSHOT
    if _SNAPSHOT is None:
        _SNAPSHOT = Snapshot()
    return _SNAPSHOT


def tampered() -> list[str]:
    """``take_snapshot().tampered()``: the watched functions replaced since the snapshot."""
    return take_snapshot().tampered()


def tamper_reason() -> Reason | None:
    """A ``timer-tampered`` reason naming the replaced functions, or None when all are original."""
    replaced = tampered()
    if not replaced:
        return None
    shown = ", ".join(replaced[:5]) + (f" and {len(replaced) - 5} more" if len(replaced) > 5 else "")
    return reason("timer-tampered", f"replaced while the job ran (by the benchmark's code?): {shown}")
