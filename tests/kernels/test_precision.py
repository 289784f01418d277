"""``torch_float32_inputs``: the format torch's float32 settings let matmul and convolution use."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from kernelab.kernels.precision import torch_float32_inputs

SETTINGS = ("cuda.matmul", "cudnn.conv", "mkldnn.matmul", "mkldnn.conv")


def _holder(path: str) -> object:
    obj: object = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.fixture
def settings() -> Iterator[None]:
    """Restore every ``fp32_precision`` this test may change."""
    before = {path: _holder(path).fp32_precision for path in SETTINGS}  # type: ignore[attr-defined]
    yield
    for path, value in before.items():
        _holder(path).fp32_precision = value  # type: ignore[attr-defined]


@pytest.mark.usefixtures("settings")
def test_torchs_defaults_ieee_matmuls_and_tf32_cudnn_convolutions() -> None:
    for path in SETTINGS:
        _holder(path).fp32_precision = "none"  # type: ignore[attr-defined]
    _holder("cudnn.conv").fp32_precision = "tf32"  # type: ignore[attr-defined]  # torch's default
    assert torch_float32_inputs("matmul", "cuda")[0] is None
    assert torch_float32_inputs("matmul", "cpu")[0] is None
    assert torch_float32_inputs("conv", "cuda") == ("tf32", "torch.backends.cudnn.conv.fp32_precision='tf32'")
    assert torch_float32_inputs("conv", "cpu")[0] is None
    assert torch_float32_inputs("matmul", "mps") == (None, "float32 inputs")


@pytest.mark.usefixtures("settings")
@pytest.mark.parametrize(
    ("path", "value", "op", "device", "expected"),
    [
        ("cuda.matmul", "tf32", "matmul", "cuda", "tf32"),
        ("cuda.matmul", "ieee", "matmul", "cuda", None),
        ("cudnn.conv", "ieee", "conv", "cuda", None),
        ("mkldnn.matmul", "bf16", "matmul", "cpu", "bfloat16"),
        ("mkldnn.conv", "tf32", "conv", "cpu", "tf32"),
    ],
)
def test_each_backend_setting_is_read_and_named(
    path: str, value: str, op: str, device: str, expected: str | None
) -> None:
    _holder(path).fp32_precision = value  # type: ignore[attr-defined]
    assert torch_float32_inputs(op, device) == (expected, f"torch.backends.{path}.fp32_precision={value!r}")  # type: ignore[arg-type]


@pytest.mark.usefixtures("settings")
def test_set_float32_matmul_precision_high_allows_tf32_on_both_devices() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert torch_float32_inputs("matmul", "cuda")[0] == "tf32"
        assert torch_float32_inputs("matmul", "cpu")[0] == "tf32"
    finally:
        torch.set_float32_matmul_precision(before)
