"""Dtype-aware default tolerances ``(rtol, atol)`` for correctness checks.

An output element passes when ``|out - ref| <= atol + rtol * |ref|`` (the ``torch.isclose`` rule),
``ref`` being the benchmark's float64 reference. A spec's ``correctness.rtol``/``atol`` override
these defaults; a benchmark may widen them for its own arithmetic (``MatmulBenchmark`` scales
``atol`` with ``sqrt(K)``).

This module imports nothing heavy (no torch): the server may call it while validating a spec.
"""

from __future__ import annotations

# Sources:
#  [torch] torch.testing.assert_close defaults, torch/testing/_comparison.py `_DTYPE_PRECISIONS`
#          (float16 (1e-3, 1e-5), bfloat16 (1.6e-2, 1e-5), float32 (1.3e-6, 1e-5), float64 (1e-7, 1e-7)).
#  [ofp8]  OCP 8-bit Floating Point Specification (OFP8) rev. 1.0: E4M3 has 3 mantissa bits
#          (machine epsilon 2**-3) and smallest normal 2**-6; E5M2 has 2 mantissa bits (epsilon
#          2**-2) and smallest normal 2**-14. The "fnuz" variants (AMD/Graphcore) shift the
#          exponent bias by one, halving the smallest normal.
#  [tf32]  NVIDIA A100 whitepaper: TF32 keeps 10 explicit mantissa bits, like float16, so a
#          float32 dot product computed with TF32 inputs is held to float16's tolerances.
_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),  # [torch]
    "float32": (1.3e-6, 1e-5),  # [torch]
    "tf32": (1e-3, 1e-5),  # [tf32] same mantissa as float16 -> float16's entry of [torch]
    "float16": (1e-3, 1e-5),  # [torch]
    "bfloat16": (1.6e-2, 1e-5),  # [torch]
    # fp8: rtol = machine epsilon (the spacing just above 1), atol = smallest normal [ofp8];
    # [torch] has no fp8 entry. Its float16 rtol is likewise ~1 epsilon (2**-10 = 9.8e-4).
    "float8_e4m3fn": (2.0**-3, 2.0**-6),
    "float8_e4m3fnuz": (2.0**-3, 2.0**-7),
    "float8_e5m2": (2.0**-2, 2.0**-14),
    "float8_e5m2fnuz": (2.0**-2, 2.0**-15),
    # Integers and booleans are exact ([torch] returns (0, 0) for dtypes it has no entry for).
    "int8": (0.0, 0.0),
    "uint8": (0.0, 0.0),
    "int16": (0.0, 0.0),
    "int32": (0.0, 0.0),
    "int64": (0.0, 0.0),
    "bool": (0.0, 0.0),
}

_ALIASES = {
    "fp64": "float64",
    "double": "float64",
    "fp32": "float32",
    "float": "float32",
    "tensorfloat32": "tf32",
    "float32_tf32": "tf32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8_e4m3": "float8_e4m3fn",
    "e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "e5m2": "float8_e5m2",
}


def normalize_dtype_name(dtype: str) -> str:
    """Canonical name of ``dtype``: ``"torch.float16"``, ``"fp16"`` and ``"half"`` give ``"float16"``.

    Raises ``ValueError`` naming the known dtypes when ``dtype`` is not one of them.
    """
    name = str(dtype).strip().lower().removeprefix("torch.")
    name = _ALIASES.get(name, name)
    if name not in _TOLERANCES:
        raise ValueError(f"no default tolerances for dtype {dtype!r}; known: {', '.join(_TOLERANCES)}")
    return name


def default_tolerances(dtype: str) -> tuple[float, float]:
    """Default ``(rtol, atol)`` for an output of ``dtype`` compared with a float64 reference.

    ``dtype`` is a name such as ``"float32"``, ``"bfloat16"``, ``"tf32"`` (a float32 result whose
    dot products ran on TF32 inputs) or ``"float8_e4m3fn"``; aliases ``fp16``/``bf16``/``half`` and
    the ``torch.`` prefix are accepted. Sources of every value are in this module's comments.

    Raises ``ValueError`` for an unknown dtype.
    """
    return _TOLERANCES[normalize_dtype_name(dtype)]
