"""The format torch's float32 settings let its matmul and convolution round their inputs to.

PyTorch may compute a float32 matmul or convolution on inputs rounded to TF32 (10 explicit
mantissa bits) or bfloat16, depending on process-wide settings ("TensorFloat-32 (TF32) on Ampere
(and later) devices" and "Bfloat16 (BF16) on MKLDNN backend" in PyTorch's numerical-accuracy and
backend notes). Since PyTorch 2.9 each backend and operation has a ``fp32_precision`` (``"ieee"``,
``"tf32"``, ``"bf16"``, or ``"none"``: inherit from the backend, then from
``torch.backends.fp32_precision``); before it, ``torch.backends.cuda.matmul.allow_tf32``,
``torch.backends.cudnn.allow_tf32`` and ``torch.get_float32_matmul_precision()`` said it. Their
defaults: float32 matmuls in IEEE float32 on every device, cuDNN convolutions on TF32 inputs.

``torch_float32_inputs`` reads them where the check runs (after ``prepare``, so a benchmark that
changes a setting is judged by it). Imports torch (runner side only).
"""

from __future__ import annotations

from typing import Literal

import torch

_FORMATS = {"tf32": "tf32", "bf16": "bfloat16", "ieee": None}


def _fp32_precision(path: str) -> str | None:
    """``torch.backends.<path>.fp32_precision`` (``"cuda.matmul"``, ``"cudnn"``, ``""`` the
    generic one), None where this torch has no such setting or it is ``"none"``."""
    obj: object = torch.backends
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part, None)
    try:
        value = getattr(obj, "fp32_precision", None) if obj is not None else None
    except (AttributeError, RuntimeError):
        return None
    return value if isinstance(value, str) and value in _FORMATS else None


def _legacy(op: Literal["matmul", "conv"], device_type: str) -> tuple[str | None, str]:
    """What torch before the ``fp32_precision`` settings would do (module docstring)."""
    if device_type != "cuda":
        return None, "float32 inputs"
    if op == "conv":
        allowed = bool(getattr(torch.backends.cudnn, "allow_tf32", False))
        return ("tf32" if allowed else None), f"torch.backends.cudnn.allow_tf32={allowed}"
    try:
        precision = torch.get_float32_matmul_precision()
    except RuntimeError:
        precision = "highest"
    if precision == "medium":
        return "bfloat16", "torch.get_float32_matmul_precision()='medium'"
    if precision == "high" or bool(torch.backends.cuda.matmul.allow_tf32):
        return "tf32", f"torch.get_float32_matmul_precision()={precision!r}"
    return None, "torch.get_float32_matmul_precision()='highest'"


def torch_float32_inputs(op: Literal["matmul", "conv"], device_type: str) -> tuple[str | None, str]:
    """The format float32 inputs of torch's ``op`` (``"matmul"`` or ``"conv"``) may be rounded to on
    a ``device_type`` (``"cuda"``, ``"cpu"``, ...) device under this process's settings, and the
    setting that says so: ``("tf32", "torch.backends.cuda.matmul.fp32_precision='tf32'")``,
    ``("bfloat16", ...)`` or ``(None, ...)`` for IEEE float32 (module docstring). Devices other
    than CUDA and the CPU: ``(None, "float32 inputs")``. Raises nothing."""
    if device_type == "cuda":
        chain = ["cuda.matmul", "cuda"] if op == "matmul" else ["cudnn.conv", "cudnn"]
    elif device_type == "cpu":
        chain = [f"mkldnn.{op}", "mkldnn"]
    else:
        return None, "float32 inputs"
    for path in [*chain, ""]:
        value = _fp32_precision(path)
        if value is not None:
            name = ".".join(filter(None, ("torch.backends", path, "fp32_precision")))
            return _FORMATS[value], f"{name}={value!r}"
    if hasattr(torch.backends, "fp32_precision"):
        return None, "float32 inputs"  # every level says "none": IEEE float32
    return _legacy(op, device_type)
