"""Default tolerances mirror torch.testing and the FP8 formats' own spacing."""

from __future__ import annotations

import pytest
import torch
from torch.testing._comparison import _DTYPE_PRECISIONS

from kernelab.kernels.tolerances import default_tolerances, normalize_dtype_name


@pytest.mark.parametrize("name", ["float64", "float32", "float16", "bfloat16"])
def test_matches_torch_testing_assert_close_defaults(name: str) -> None:
    assert default_tolerances(name) == _DTYPE_PRECISIONS[getattr(torch, name)]


def test_tf32_is_held_to_float16_tolerances() -> None:
    assert default_tolerances("tf32") == default_tolerances("float16")
    assert default_tolerances("tf32")[0] > default_tolerances("float32")[0]


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"])
def test_fp8_rtol_is_the_spacing_above_one_and_atol_the_smallest_normal(name: str) -> None:
    dtype = getattr(torch, name)
    one = torch.ones(1, dtype=dtype)
    next_above_one = float((one.view(torch.uint8) + 1).view(dtype).float())
    rtol, atol = default_tolerances(name)
    assert rtol == next_above_one - 1.0
    assert atol == torch.finfo(dtype).smallest_normal


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("fp16", "float16"),
        ("half", "float16"),
        ("torch.bfloat16", "bfloat16"),
        ("BF16", "bfloat16"),
        ("fp32", "float32"),
        ("double", "float64"),
        ("e4m3", "float8_e4m3fn"),
    ],
)
def test_aliases(alias: str, canonical: str) -> None:
    assert normalize_dtype_name(alias) == canonical
    assert default_tolerances(alias) == default_tolerances(canonical)


def test_integers_are_exact_and_unknown_names_raise() -> None:
    assert default_tolerances("int32") == (0.0, 0.0)
    with pytest.raises(ValueError, match="no default tolerances for dtype 'float128'; known: float64"):
        default_tolerances("float128")
