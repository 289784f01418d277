"""Candidates that change the device's state for the rest of their process (issue: "a candidate
that set a device-wide cache policy through the CUDA runtime made both sides three times slower").

``NodeStateBenchmark`` is ``cheats.ScaleBenchmark`` (``out = 2 * x + y``) with three more
candidates, each honest in its output and in its work (the baseline's ``work`` extra passes, so
that without the state change the pair reads ``same``):

* ``l2_persist``: reserves the largest persisting L2 set-aside the device allows
  (``cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, cudaDevAttrMaxPersistingL2CacheSize)``)
  and marks a buffer of that size persisting on the current stream (an access policy window,
  hit ratio 1), touching it on every call: the rest of the L2 is left to everything else in the
  process, both sides alike (CUDA C++ Programming Guide, "Device Memory L2 Access Management");
* ``l2_streaming``: an access policy window over the candidate's own inputs with
  ``hitProp = missProp = cudaAccessPropertyStreaming`` on the current stream: every kernel on that
  stream treats those lines as evict-first;
* ``device_hog``: leaves a thread copying 1 GiB back and forth on a side stream for the rest of
  the process (another tenant inside the job: every later kernel slows down, both sides alike).

``STATE_CHEATS`` maps each to the reason codes that may catch it: a change kernelab must see as
``node-changed`` (the in-process copy canary) or ``background-work`` (the window's drain check)
when it moves the device's speed; a policy that moves nothing is reported as measured.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

import torch
from cheats import ScaleBenchmark, ScaleParams

from kernelab.runners.timing import cuda_runtime

STATE_CHEATS: dict[str, set[str]] = {
    "l2_persist": {"node-changed", "background-work"},
    "l2_streaming": {"node-changed", "background-work"},
    "device_hog": {"node-changed", "background-work"},
}

# CUDA runtime API enums (driver_types.h, CUDA 12/13)
_LIMIT_PERSISTING_L2_CACHE_SIZE = 0x06  # enum cudaLimit
_ATTR_MAX_PERSISTING_L2_CACHE_SIZE = 108  # enum cudaDeviceAttr
_ATTR_ACCESS_POLICY_MAX_WINDOW_SIZE = 109  # enum cudaDeviceAttr
_STREAM_ATTR_ACCESS_POLICY_WINDOW = 1  # cudaLaunchAttributeAccessPolicyWindow
_ACCESS_NORMAL, _ACCESS_STREAMING, _ACCESS_PERSISTING = 0, 1, 2  # enum cudaAccessProperty


class _AccessPolicyWindow(ctypes.Structure):
    _fields_ = [
        ("base_ptr", ctypes.c_void_p),
        ("num_bytes", ctypes.c_size_t),
        ("hitRatio", ctypes.c_float),
        ("hitProp", ctypes.c_int),
        ("missProp", ctypes.c_int),
    ]


class _LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("accessPolicyWindow", _AccessPolicyWindow)]


def _check(err: int, call: str) -> None:
    if err != 0:
        raise RuntimeError(f"{call} returned cudaError {err}")


def device_attribute(attr: int, device: int) -> int:
    """``cudaDeviceGetAttribute(attr, device)``. Raises ``RuntimeError`` on an error."""
    value = ctypes.c_int(0)
    lib = cuda_runtime()
    _check(
        lib.cudaDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(attr), ctypes.c_int(device)),
        "cudaDeviceGetAttribute",
    )
    return int(value.value)


def set_access_policy(buf: torch.Tensor, *, hit: int, miss: int, hit_ratio: float = 1.0) -> int:
    """An access policy window over ``buf`` (clipped to the device's maximum window) on the
    current torch stream; returns the window's bytes. Raises ``RuntimeError`` on an error."""
    index = buf.device.index or 0
    largest = device_attribute(_ATTR_ACCESS_POLICY_MAX_WINDOW_SIZE, index)
    nbytes = min(buf.numel() * buf.element_size(), largest)
    value = _LaunchAttributeValue()
    value.accessPolicyWindow = _AccessPolicyWindow(buf.data_ptr(), nbytes, hit_ratio, hit, miss)
    stream = ctypes.c_void_p(torch.cuda.current_stream(buf.device).cuda_stream)
    _check(
        cuda_runtime().cudaStreamSetAttribute(
            stream, ctypes.c_int(_STREAM_ATTR_ACCESS_POLICY_WINDOW), ctypes.byref(value)
        ),
        "cudaStreamSetAttribute",
    )
    return nbytes


def reserve_persisting_l2(device: torch.device) -> int:
    """The largest persisting L2 set-aside the device allows, in this process's context; returns
    its bytes. Raises ``RuntimeError`` on an error."""
    torch.empty(1, device=device)  # the context exists
    nbytes = device_attribute(_ATTR_MAX_PERSISTING_L2_CACHE_SIZE, device.index or 0)
    lib = cuda_runtime()
    _check(
        lib.cudaDeviceSetLimit(ctypes.c_int(_LIMIT_PERSISTING_L2_CACHE_SIZE), ctypes.c_size_t(nbytes)),
        "cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize)",
    )
    return nbytes


def start_device_hog(device: torch.device, nbytes: int = 1 << 30) -> threading.Thread:
    """A daemon thread copying ``nbytes`` back and forth on a side stream until the process ends."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    stream = torch.cuda.Stream(device=device)

    def hog() -> None:
        with torch.cuda.stream(stream):
            while True:
                for _ in range(8):
                    dst.copy_(src)
                stream.synchronize()

    thread = threading.Thread(target=hog, name="device-hog", daemon=True)
    thread.start()
    return thread


class NodeStateBenchmark(ScaleBenchmark):
    """``ScaleBenchmark`` plus candidates that change the device's state (module docstring)."""

    name = "scale-node-state"
    variants = (*ScaleBenchmark.variants, *STATE_CHEATS)

    def _l2_persist(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        nbytes = reserve_persisting_l2(x.device)
        hot = torch.ones(max(nbytes // 4, 1), device=x.device)
        set_access_policy(hot, hit=_ACCESS_PERSISTING, miss=_ACCESS_STREAMING)
        honest = self._honest(x, y, out, p)

        def run() -> torch.Tensor:
            hot.add_(0.0)  # keeps the persisting lines resident
            return honest()

        return run

    def _l2_streaming(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        set_access_policy(x, hit=_ACCESS_STREAMING, miss=_ACCESS_STREAMING)
        return self._honest(x, y, out, p)

    def _device_hog(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        start_device_hog(x.device)
        return self._honest(x, y, out, p)
