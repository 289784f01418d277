"""What this node is: the hardware and software fingerprint stored with every result.

torch is imported only where the answer needs it: a node whose torch cannot see a GPU (a CPU build
of torch, or a CUDA build without a loadable driver: ``kernelab.runners.devices.torch_sees_cuda``)
is described from ``/proc``, sysfs and torch's ``version.py`` alone, so a runner daemon's start
(which describes its node once) does not pay for ``import torch`` (1.3-1.9 CPU-s) there.
"""

from __future__ import annotations

import os
import platform
import socket
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernelab.runners.probes.telemetry import NvmlUnavailable, load_nvml
from kernelab.service.contract.schemas import NodeInfo

if TYPE_CHECKING:
    import torch

_SYSFS_CPU_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
_SIZE_SUFFIXES = {"K": 1024, "M": 1024**2, "G": 1024**3}


def default_device() -> torch.device:
    """``cuda:<current>`` when torch sees a CUDA (or ROCm) GPU, else ``cpu``."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cpu_cache_bytes(level: int | None = None) -> int | None:
    """Size in bytes of CPU 0's data/unified cache at ``level`` (None: the last level), from sysfs.

    Returns None where ``/sys/devices/system/cpu/cpu0/cache`` is not readable (non-Linux, sandboxes).
    """
    sizes: dict[int, int] = {}
    try:
        for index in _SYSFS_CPU_CACHE.glob("index*"):
            if (index / "type").read_text().strip() == "Instruction":
                continue
            raw = (index / "size").read_text().strip()
            scale = _SIZE_SUFFIXES.get(raw[-1:].upper(), 1)
            number = raw[:-1] if raw[-1:].upper() in _SIZE_SUFFIXES else raw
            sizes[int((index / "level").read_text())] = int(number) * scale
    except (OSError, ValueError):
        return None
    if not sizes:
        return None
    return sizes.get(level) if level is not None else sizes[max(sizes)]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _package_version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    try:
        nvml = load_nvml()
        raw = nvml.nvmlSystemGetDriverVersion()
    except NvmlUnavailable:
        return None
    except Exception:  # pynvml.NVMLError: a driver that refuses the query reads as unknown
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def node_info(device: torch.device | None = None) -> NodeInfo:
    """Fingerprint of this node as seen from ``device`` (None: ``default_device()``).

    On CUDA: the device's name, the number of visible GPUs, the L2 size from
    ``torch.cuda.get_device_properties(...).L2_cache_size``, the driver version from NVML (None
    without ``pynvml``) and the CUDA (or HIP) version torch was built with. On the CPU: the CPU
    model with its logical core count, ``device_count`` 1 and CPU 0's L2 size from sysfs. Triton's
    version is read from package metadata, so triton is never imported; torch is not imported for
    a CPU node where its build settles that (the module docstring). Raises ``RuntimeError`` for a
    CUDA device on a node without CUDA, ``ImportError`` without torch.
    """
    if device is None:
        from kernelab.runners.devices import torch_sees_cuda

        if not torch_sees_cuda():  # a CPU build, or no driver: answered without importing torch
            return _cpu_node(_torch_version())
    elif str(device) == "cpu":
        return _cpu_node(_torch_version())
    import torch

    device = default_device() if device is None else torch.device(device)
    common = _common(torch.__version__)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("a CUDA device was asked for, but torch sees no CUDA GPU on this node")
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        hip = getattr(torch.version, "hip", None)
        return NodeInfo(
            device_type="cuda",
            device_name=props.name,
            device_count=torch.cuda.device_count(),
            l2_bytes=int(props.L2_cache_size),
            driver_version=_driver_version(),
            cuda_version=torch.version.cuda or (f"hip {hip}" if hip else None),
            **common,
        )
    if device.type != "cpu":
        raise ValueError(f"device type {device.type!r} is not supported; use 'cuda' or 'cpu'")
    return _cpu_node(torch.__version__)


def _common(torch_version: str) -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "torch_version": torch_version,
        "triton_version": _package_version("triton"),
        "python_version": platform.python_version(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"),
    }


def _cpu_node(torch_version: str) -> NodeInfo:
    return NodeInfo(
        device_type="cpu",
        device_name=f"{_cpu_name()} ({os.cpu_count()} logical cores)",
        device_count=1,
        l2_bytes=cpu_cache_bytes(2),
        **_common(torch_version),
    )


def _torch_version() -> str:
    """``torch.__version__``: torch's own where it is imported, else as its ``version.py`` spells it
    (``kernelab.runners.devices.torch_build``, the same string), else from torch imported here.
    Raises ``ImportError`` without torch."""
    import sys

    from kernelab.runners.devices import torch_build

    if "torch" not in sys.modules:
        build = torch_build()
        if build is not None and isinstance(build.get("__version__"), str):
            return str(build["__version__"])
    import torch

    return str(torch.__version__)
