"""``check_output`` and ``poison_``: wrong outputs fail, NaN/Inf never pass, metrics are right."""

from __future__ import annotations

import math

import pytest
import torch

from kernelab.kernels.check import check_output, mismatch_mask, poison_
from kernelab.kernels.tolerances import Reduction, Tolerance


def _ref(seed: int = 0, shape: tuple[int, ...] = (16, 24)) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_exact_output_passes_with_exact_metrics() -> None:
    ref = _ref()
    res = check_output(ref.to(torch.float32), ref, Tolerance(rtol=1.3e-6, atol=1e-5))
    assert res.passed and res.nonfinite == 0
    assert res.max_abs_error is not None and res.max_abs_error < 1e-6
    assert res.cosine_similarity == pytest.approx(1.0, abs=1e-12)
    assert (res.rtol, res.atol) == (1.3e-6, 1e-5)
    assert res.message.startswith("ok: ") and "all 384 elements" in res.message


def test_scaled_output_gives_the_scale_as_relative_error() -> None:
    ref = _ref()
    res = check_output(ref * 1.01, ref, Tolerance(rtol=1e-3, atol=0.0))
    assert not res.passed
    assert res.rel_error == pytest.approx(0.01, rel=1e-9)
    assert res.cosine_similarity == pytest.approx(1.0, abs=1e-12)
    assert res.max_abs_error == pytest.approx(0.01 * float(ref.abs().max()), rel=1e-9)


def test_one_wrong_element_fails_and_is_located() -> None:
    ref = _ref()
    out = ref.clone()
    out[5, 7] += 0.5
    res = check_output(out, ref, Tolerance(rtol=1e-3, atol=1e-5))
    assert not res.passed
    assert res.max_abs_error == pytest.approx(0.5)
    assert "1/384 elements" in res.message
    assert "first bad at (5, 7)" in res.message and "bad rows 1/16: 5" in res.message
    assert mismatch_mask(out, ref, Tolerance(rtol=1e-3, atol=1e-5)).nonzero().tolist() == [[5, 7]]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nonfinite_never_passes_whatever_the_tolerance(bad: float) -> None:
    ref = _ref()
    out = ref.clone()
    out[0, 0] = bad
    res = check_output(out, ref, Tolerance(rtol=1e30, atol=1e30))
    assert not res.passed
    assert res.nonfinite == 1
    assert "1 NaN/Inf" in res.message
    assert res.rel_error is not None and math.isfinite(res.rel_error)  # computed over finite elements


def test_all_nan_output_has_no_metrics() -> None:
    ref = _ref()
    res = check_output(poison_(torch.empty_like(ref)), ref, Tolerance(rtol=1e-3, atol=1e-3))
    assert not res.passed and res.nonfinite == ref.numel()
    assert res.rel_error is None and res.max_abs_error is None and res.cosine_similarity is None


def test_shape_mismatch_fails_and_zero_reference_has_no_relative_error() -> None:
    res = check_output(torch.zeros(3, 4), torch.zeros(4, 3), Tolerance(rtol=1e-3, atol=1e-3))
    assert not res.passed and "shape (3, 4) != reference shape (4, 3)" in res.message
    zero = check_output(
        torch.zeros(3, 4), torch.zeros(3, 4, dtype=torch.float64), Tolerance(rtol=1e-3, atol=1e-3)
    )
    assert zero.passed and zero.rel_error is None and zero.cosine_similarity is None
    with pytest.raises(TypeError):
        check_output([1.0], torch.zeros(1), Tolerance(rtol=0.0, atol=0.0))


def test_low_precision_output_is_compared_in_float64() -> None:
    ref = _ref()
    res = check_output(ref.to(torch.bfloat16), ref, Tolerance(rtol=1.6e-2, atol=1e-5))
    assert res.passed
    assert 0 < res.rel_error < 2.0**-8  # bfloat16 rounds to 8 significant bits


def test_a_failure_says_the_rule_it_failed_and_where_its_terms_come_from() -> None:
    ref = _ref()
    out = ref.clone()
    out[2, 3] += 0.5
    plain = Tolerance(rtol=1e-3, atol=1e-5, source="the spec's correctness.rtol/atol")
    res = check_output(out, ref, plain)
    rule = "|out - ref| <= 1e-05 + 0.001 |ref|: rtol 0.001, atol 1e-05 (the spec's correctness.rtol/atol)"
    assert res.tolerance == f"{rule}; no reduction declared"
    assert res.message.endswith(f"; tolerance: {res.tolerance}")
    good = check_output(ref, ref, plain)
    assert good.passed and good.tolerance == res.tolerance and "tolerance:" not in good.message


def test_a_declared_reduction_adds_its_allowance_at_the_references_rms() -> None:
    ref = _ref() * 8.0
    rms = float(ref.square().mean().sqrt())
    out = ref.clone()
    out.view(-1)[ref.abs().argmin()] += 1e-3 * rms  # 1e-3 of the output's spread, near zero
    plain = Tolerance(rtol=1e-3, atol=1e-5)
    summed = plain.model_copy(update={"reduction": Reduction(length=4096, partials="float16")})
    assert not check_output(out, ref, plain).passed
    res = check_output(out.to(torch.float16), ref, summed)
    assert res.passed, res.message
    g = 6 * (64 * 2.0**-24 + 2.0**-11)
    assert (res.rtol, res.atol) == pytest.approx((1e-3 + g, 1e-5 + g * rms))
    assert (
        f"rms(ref) {rms:.3g}" in res.tolerance and "sqrt(4096) 2^-24 [float32 sums of 4096]" in res.tolerance
    )
    assert "2^-11 [float16 partials]" in res.tolerance


def test_an_integer_output_stays_exact_with_a_reduction() -> None:
    ref = torch.arange(12, dtype=torch.float64).reshape(3, 4) * 1000
    exact = Tolerance(rtol=0.0, atol=0.0, reduction=Reduction(length=10**6))
    assert check_output(ref.to(torch.int32), ref, exact).passed
    res = check_output(ref.to(torch.int32) + 1, ref, exact)
    assert not res.passed and (res.rtol, res.atol) == (0.0, 0.0) and "exact int32" in res.tolerance


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn])
def test_poison_floats_with_nan(dtype: torch.dtype) -> None:
    t = torch.ones(4, 5, dtype=dtype)
    assert poison_(t) is t
    assert torch.isnan(t.float()).all()


def test_poison_integers_with_their_maximum_and_refuse_bool() -> None:
    assert (poison_(torch.zeros(3, dtype=torch.int32)) == 2**31 - 1).all()
    assert (poison_(torch.zeros(3, dtype=torch.uint8)) == 255).all()
    with pytest.raises(TypeError, match="bool"):
        poison_(torch.zeros(3, dtype=torch.bool))


def test_metrics_over_the_finite_elements_say_so() -> None:
    ref = torch.randn(32, 32, dtype=torch.float64)
    out = ref.clone()
    out[1:] = float("nan")  # 31 of 32 rows NaN: the metrics cover row 0 alone
    r = check_output(out, ref, Tolerance(rtol=1e-5, atol=1e-6))
    assert not r.passed and r.cosine_similarity == pytest.approx(1.0)
    assert (
        "cos 1 over the 3.12% finite elements (32/1024); 96.9% of the output or reference is NaN/Inf"
        in r.message
    )
    ok = check_output(ref.clone(), ref, Tolerance(rtol=1e-5, atol=1e-6))
    assert ok.passed and "finite elements" not in ok.message
