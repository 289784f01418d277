"""Tolerances of correctness checks: the output dtype's ``(rtol, atol)``, and what a reduction adds.

An output element passes when (``kernelab.kernels.check``)::

    |out - ref| <= atol + rtol * |ref| + g * (|ref| + rms(ref))

``ref`` being the benchmark's float64 reference and ``rms(ref)`` the root mean square of its finite
elements. ``rtol``/``atol`` cover rounding the result to its dtype (``default_tolerances``: the
values of ``torch.testing``; a spec's ``correctness.rtol``/``atol`` or a benchmark's own
``tolerances()`` replace them). ``g`` is the allowance of the reduction a benchmark declares
(``Reduction``: K terms summed into each output element; 0 when it declares none)::

    g = LAMBDA * (sqrt(K) * u_accumulate + u_inputs + u_partials)

Where it comes from. Summing K terms in a precision of unit roundoff u makes, to first order, the
error ``sum_k delta_k * s_k`` (``s_k`` the partial sums, ``|delta_k| <= u``; Higham, "Accuracy and
Stability of Numerical Algorithms", 2nd ed., ch. 3-4). The worst case is ``gamma_K = K u / (1 - K u)``
times ``|x| . |y|``; with the ``delta_k`` independent and of mean zero, the Azuma-Hoeffding inequality
bounds it by ``LAMBDA * u * sqrt(sum_k s_k**2)`` with probability at least ``1 - 2 exp(-LAMBDA**2 / 2)``
(Higham & Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J. Sci. Comput.
41(5), 2019, sec. 2-3; Ipsen & Zhou, "Probabilistic Error Analysis for Inner Products",
SIAM J. Matrix Anal. Appl. 41(4), 2020, for the partial-sum form). kernelab takes the partial sums
of element ``ij`` to be no larger than ``|ref_ij| + rms(ref)``: terms of one sign (a softmax
denominator) have partial sums below ``|ref_ij|``; signed random terms (a matmul of the benchmark's
random inputs) have partial sums of the size of the output's spread, which ``rms(ref)`` measures
and which scales with the inputs (``correctness.input_scale``) as the errors do. ``|x| . |y|`` is
not used: for random signs it exceeds the partial sums by about ``sqrt(K)``, and a bound on it at
float32 cannot tell bfloat16 arithmetic from float32 beyond a few thousand terms. Rounding the factors of each
term once (TF32 inputs: ``u_inputs``) or partial results once (split-K partial sums kept in the
output's dtype, attention's probabilities: ``u_partials``) adds one unit roundoff of that format.

This module imports nothing heavy (no torch): the server may call it while validating a spec.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


# Significand bits p, the implicit bit included: unit roundoff u = 2**-p (round to nearest).
# IEEE 754-2019 Table 3.5 (binary16 11, binary32 24, binary64 53); bfloat16 keeps float32's 8
# exponent bits and 8 significand bits; [tf32] 10 explicit mantissa bits; [ofp8] E4M3 3 and E5M2 2
# mantissa bits.
_SIGNIFICAND_BITS: dict[str, int] = {
    "float64": 53,
    "float32": 24,
    "tf32": 11,
    "float16": 11,
    "bfloat16": 8,
    "float8_e4m3fn": 4,
    "float8_e4m3fnuz": 4,
    "float8_e5m2": 3,
    "float8_e5m2fnuz": 3,
}

LAMBDA = 6.0
"""Standard deviations of the reduction allowance (the module docstring's ``g``): the
Azuma-Hoeffding bound fails with probability at most ``2 exp(-LAMBDA**2 / 2)`` = 3e-8 per element
when every rounding error is as large as ``u`` and the partial sums as large as assumed. Rounding
errors are in practice about ``u / sqrt(3)``: on a CPU the largest error of 256x256 float32
products with K = 1000..4096 (20 seeds by ``torch.matmul``, 5 by a sequential sum) used 27% of the
tolerance, about 1.6 ``sqrt(K) * u * (|ref| + rms(ref))`` (``docs/writing-benchmarks.md``,
"Tolerances")."""


def unit_roundoff(dtype: str) -> float:
    """Unit roundoff ``u = 2**-p`` of ``dtype`` (``p`` significand bits, the implicit one included;
    sources in this module's comments): 2**-24 for float32, 2**-11 for float16 and TF32, 2**-8 for
    bfloat16; 0 for integer and boolean dtypes, which are exact. Raises ``ValueError`` for an
    unknown dtype (``normalize_dtype_name``)."""
    bits = _SIGNIFICAND_BITS.get(normalize_dtype_name(dtype))
    return 0.0 if bits is None else 2.0**-bits


def _exact(dtype: str) -> bool:
    """True for a dtype known to be exact (integers, bool); False for floating and unknown ones."""
    try:
        return unit_roundoff(dtype) == 0.0
    except ValueError:
        return False


class Reduction(BaseModel):
    """The reduction behind each output element, declared by a benchmark (``Benchmark.reduction``).

    ``length``: terms summed into one output element (K of a matmul, C * ks**3 of a convolution,
    N of a row softmax). ``accumulate``: the dtype of the running sum (float32 for every built-in,
    whatever the output dtype). ``inputs``: a format the factors of each term are rounded to first
    (``"tf32"``), None when the products are exact (16-bit factors multiply exactly in float32).
    ``partials``: a format partial results are rounded to once on the way (split-K partial sums in
    the output's dtype, attention's probabilities before ``P @ V``), None when none is.
    ``torch_op``: ``"matmul"`` or ``"conv"`` when the terms are computed by torch's float32
    matmul or convolution, whose inputs torch may round to TF32 or bfloat16
    (``kernelab.kernels.precision``): a float32 output is then held to that format, read where
    the check runs. Dtype names take ``normalize_dtype_name``'s aliases.

    Raises ``pydantic.ValidationError`` naming the field for a length below 1 or an unknown dtype.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    length: int = Field(ge=1, description="terms summed into each output element")
    accumulate: str = Field(default="float32", description="dtype of the running sum")
    inputs: str | None = Field(default=None, description="format the factors are rounded to first")
    partials: str | None = Field(default=None, description="format partial results are rounded to once")
    torch_op: Literal["matmul", "conv"] | None = Field(
        default=None, description="computed by torch's float32 matmul/conv: inputs follow torch's setting"
    )

    @field_validator("accumulate", "inputs", "partials")
    @classmethod
    def _dtype_name(cls, value: str | None) -> str | None:
        return None if value is None else normalize_dtype_name(value)

    def coefficient(self, inputs: str | None = None) -> float:
        """``sqrt(length) * u(accumulate) + u(inputs) + u(partials)``; ``inputs`` (a format torch
        chose, ``kernelab.kernels.precision``) stands in for ``self.inputs`` when that is None."""
        rounded = self.inputs or inputs
        return (
            math.sqrt(self.length) * unit_roundoff(self.accumulate)
            + (unit_roundoff(rounded) if rounded else 0.0)
            + (unit_roundoff(self.partials) if self.partials else 0.0)
        )

    def terms(self, inputs: str | None = None, why: str = "") -> str:
        """The coefficient spelled out: ``"sqrt(1000) 2^-24 [float32 sums] + 2^-11 [tf32 inputs]"``;
        ``why`` is said after a format torch chose."""
        parts = [f"sqrt({self.length}) {_pow2(self.accumulate)} [{self.accumulate} sums of {self.length}]"]
        rounded = self.inputs or inputs
        if rounded:
            said = f": {why}" if why and self.inputs is None else ""
            parts.append(f"{_pow2(rounded)} [{rounded} inputs{said}]")
        if self.partials:
            parts.append(f"{_pow2(self.partials)} [{self.partials} partials]")
        return " + ".join(parts)


def _pow2(dtype: str) -> str:
    bits = _SIGNIFICAND_BITS.get(dtype)
    return "0" if bits is None else f"2^-{bits}"


class Tolerance(BaseModel):
    """What an output is held to: ``rtol``/``atol`` (the result's rounding) and the declared
    ``reduction``'s allowance (module docstring). ``source`` says where ``rtol``/``atol`` come from
    ("float32 defaults of torch.testing", "the spec's correctness.rtol", "Bench.tolerances()").
    Numbers are >= 0 (``pydantic.ValidationError`` otherwise)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rtol: float = Field(ge=0)
    atol: float = Field(ge=0)
    source: str = ""
    reduction: Reduction | None = None

    def growth(self, dtype: str, inputs: str | None = None) -> float:
        """``g`` of the module docstring for an output of ``dtype``: ``LAMBDA *
        reduction.coefficient(inputs)``; 0 without a reduction and for an exact (integer, bool)
        dtype. A dtype unknown to this module (``complex64``) gets the allowance."""
        if self.reduction is None or _exact(dtype):
            return 0.0
        return LAMBDA * self.reduction.coefficient(inputs)

    def bounds(self, ref_rms: float, dtype: str, inputs: str | None = None) -> tuple[float, float]:
        """The ``(rtol, atol)`` of the ``torch.isclose`` rule this tolerance is for a reference of
        root mean square ``ref_rms``: ``(rtol + g, atol + g * ref_rms)``."""
        g = self.growth(dtype, inputs)
        return self.rtol + g, self.atol + g * ref_rms

    def describe(self, ref_rms: float, dtype: str, inputs: str | None = None, why: str = "") -> str:
        """One line: the rule with its numbers and where each term comes from, e.g.
        ``|out - ref| <= 0.000367 + 1.14e-05 |ref|: rtol 1.3e-06, atol 1e-05 (float32 defaults of
        torch.testing) + 6 (sqrt(1000) 2^-24 [float32 sums of 1000]) (|ref| + rms(ref)), rms(ref) 31.6
        [Higham & Mary 2019]``."""
        rtol, atol = self.bounds(ref_rms, dtype, inputs)
        base = f"rtol {self.rtol:.3g}, atol {self.atol:.3g}" + (f" ({self.source})" if self.source else "")
        text = f"|out - ref| <= {atol:.3g} + {rtol:.3g} |ref|: {base}"
        if self.reduction is None:
            return text + "; no reduction declared"
        if self.growth(dtype, inputs) == 0.0:
            return text + f"; exact {dtype}: no reduction allowance"
        return (
            f"{text} + {LAMBDA:g} ({self.reduction.terms(inputs, why)}) (|ref| + rms(ref)), rms(ref) "
            f"{ref_rms:.3g} [Higham & Mary 2019]"
        )
