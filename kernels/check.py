"""Correctness of one output against a float64 reference, and output poisoning.

The metrics are the ones kernel authors put in their pull requests: relative error
``||out - ref||_2 / ||ref||_2``, the largest absolute error, the cosine similarity of the
flattened tensors, and an element-wise ``torch.isclose`` test whose tolerances come from the
output's dtype and the benchmark's declared reduction (``kernelab.kernels.tolerances.Tolerance``:
``|out - ref| <= atol + rtol |ref| + g (|ref| + rms(ref))``). A NaN or Inf in the output never
passes, whatever the reference holds. Every result says the rule it was held to and where its
terms come from (``CorrectnessResult.tolerance``; a failure's ``message`` too).

Poison the output buffer (``poison_``) before a correctness run: an element the kernel forgot to
write then shows as NaN instead of silently keeping a correct value from an earlier launch.

Imports torch (runner side only).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from kernelab.kernels.precision import torch_float32_inputs
from kernelab.kernels.tolerances import Tolerance
from kernelab.service.contract.schemas import CorrectnessResult

_MAX_ROWS_LISTED = 5  # bad rows named in a failure message


def poison_(tensor: torch.Tensor) -> torch.Tensor:
    """Fill ``tensor`` in place with a value no correct kernel writes, and return it.

    Floating and complex tensors (fp8 included) get NaN; integer tensors get their dtype's
    maximum (``torch.iinfo(dtype).max``), a sentinel that a checker compares against.

    Raises ``TypeError`` for a boolean tensor (no value of it is out of band).
    """
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        return tensor.fill_(float("nan"))
    if tensor.dtype == torch.bool:
        raise TypeError("cannot poison a bool tensor: it has no out-of-band value")
    return tensor.fill_(torch.iinfo(tensor.dtype).max)


def mismatch_mask(out: torch.Tensor, ref: torch.Tensor, tolerance: Tolerance) -> torch.Tensor:
    """Boolean CPU tensor of ``out``'s shape: True where the element fails.

    An element fails when it is not finite or outside ``tolerance`` (``torch.isclose`` with
    ``Tolerance.bounds`` for ``ref``'s rms, computed in float64 on ``out``'s device), as in
    ``check_output``. The mask is what locates races: which rows or tiles are wrong, and how that
    set moves between repeated runs.

    Raises ``ValueError`` when the shapes differ.
    """
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}")
    out64, ref64 = _as_f64(out, ref)
    rule = _Rule(tolerance, out, ref64)
    return _bad(out64, ref64, rtol=rule.rtol, atol=rule.atol).cpu()


class _Rule:
    """``tolerance`` made concrete for one output and its float64 reference: the reference's rms
    (finite elements), the format torch may round float32 inputs to (``Reduction.torch_op``), and
    the resulting ``torch.isclose`` numbers and their description."""

    def __init__(self, tolerance: Tolerance, out: torch.Tensor, ref64: torch.Tensor) -> None:
        self.dtype = _dtype(out)
        self.inputs, why = None, ""
        op = tolerance.reduction.torch_op if tolerance.reduction is not None else None
        if op is not None and self.dtype == "float32":
            self.inputs, why = torch_float32_inputs(op, out.device.type)
        self.rms = _rms(ref64) if tolerance.reduction is not None else 0.0
        self.rtol, self.atol = tolerance.bounds(self.rms, self.dtype, self.inputs)
        self.text = tolerance.describe(self.rms, self.dtype, self.inputs, why)


def _rms(ref64: torch.Tensor) -> float:
    """Root mean square of the finite elements of ``ref64``; 0 when it has none."""
    finite = torch.isfinite(ref64)
    n, squares = torch.stack([finite.sum().double(), torch.where(finite, ref64, 0.0).square().sum()]).tolist()
    return 0.0 if n == 0 else math.sqrt(squares / n)


def _bad(out64: torch.Tensor, ref64: torch.Tensor, *, rtol: float, atol: float) -> torch.Tensor:
    close = torch.isclose(out64, ref64, rtol=rtol, atol=atol, equal_nan=False)
    return ~(close & torch.isfinite(out64))


def check_output(out: Any, ref: Any, tolerance: Tolerance) -> CorrectnessResult:
    """Compare ``out`` (any shape, any float/int dtype, any device) with ``ref`` (same shape).

    Both are compared in float64 on ``out``'s device (on the CPU when the device has no room for
    the copies). Returns a ``CorrectnessResult`` whose ``passed`` is True iff the shapes agree, no
    output element is NaN/Inf, and every element is within ``tolerance``: ``|out - ref| <= atol +
    rtol * |ref|`` with ``(rtol, atol) = tolerance.bounds(rms(ref), out's dtype, ...)``, the rms
    taken over ``ref``'s finite elements and, for a reduction computed by torch
    (``Reduction.torch_op``) into a float32 output, the input format torch's settings allow on
    ``out``'s device (``kernelab.kernels.precision``). The result's ``rtol``/``atol`` are those
    numbers, its ``tolerance`` the rule spelled out with the source of each term.
    ``rel_error``, ``max_abs_error`` and ``cosine_similarity`` are computed over elements where both
    tensors are finite; they are None where undefined (no such element, or a zero-norm reference /
    zero vector), and ``message`` then says so ("over the 3.12% finite elements ...; 96.9% of the
    output or reference is NaN/Inf"). ``message`` is one line: the worst element and, for a failure,
    how many elements fail, which rows, and the rule they were held to.

    Raises ``TypeError`` when ``out`` or ``ref`` is not a tensor.
    """
    if not isinstance(out, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"check_output needs tensors, got {type(out).__name__} and {type(ref).__name__}")
    if tuple(out.shape) != tuple(ref.shape):
        return CorrectnessResult(
            passed=False,
            rtol=tolerance.rtol,
            atol=tolerance.atol,
            dtype=_dtype(out),
            message=f"FAIL: output shape {tuple(out.shape)} != reference shape {tuple(ref.shape)}",
        )
    out64, ref64 = _as_f64(out, ref)
    rule = _Rule(tolerance, out, ref64)
    finite = torch.isfinite(out64)
    bad = _bad(out64, ref64, rtol=rule.rtol, atol=rule.atol)
    both = finite & torch.isfinite(ref64)
    o, r = torch.where(both, out64, 0.0), torch.where(both, ref64, 0.0)  # no boolean gather: one shape
    # one device-to-host transfer for all the scalars
    stats = (
        [0.0] * 8
        if out64.numel() == 0
        else torch.stack(
            [
                (~finite).sum().double(),
                bad.sum().double(),
                both.sum().double(),
                (o - r).abs().amax(),
                torch.linalg.vector_norm(r),
                torch.linalg.vector_norm(o),
                torch.linalg.vector_norm(o - r),
                torch.dot(o.flatten(), r.flatten()),
            ]
        ).tolist()
    )
    nonfinite, n_bad, n_both = int(stats[0]), int(stats[1]), int(stats[2])
    max_abs = stats[3] if n_both else None
    ref_norm, out_norm = stats[4], stats[5]
    numel = out64.numel()
    rel = stats[6] / ref_norm if ref_norm > 0 else None
    cosine = stats[7] / (out_norm * ref_norm) if out_norm > 0 and ref_norm > 0 else None
    passed = n_bad == 0 and nonfinite == 0
    metrics = f"rel {_fmt(rel)}, max|err| {_fmt(max_abs)}, cos {_fmt(cosine)}"
    if n_both < numel:  # the metrics left the NaN/Inf elements out: say over how few they are
        metrics += (
            f" over the {_pct(n_both, numel)} finite elements ({n_both}/{numel}); "
            f"{_pct(numel - n_both, numel)} of the output or reference is NaN/Inf"
        )
    if passed:
        message = f"ok: {metrics}; all {numel} elements within rtol={rule.rtol:.3g} atol={rule.atol:.3g}"
    else:
        message = (
            f"FAIL: {n_bad}/{numel} elements ({100.0 * n_bad / max(numel, 1):.3g}%) outside "
            f"rtol={rule.rtol:.3g} atol={rule.atol:.3g}, {nonfinite} NaN/Inf; {metrics}"
            f"{_where(bad.cpu(), out64, ref64)}; tolerance: {rule.text}"
        )
    return CorrectnessResult(
        passed=passed,
        rel_error=rel,
        max_abs_error=max_abs,
        cosine_similarity=cosine,
        nonfinite=nonfinite,
        message=message,
        rtol=rule.rtol,
        atol=rule.atol,
        dtype=_dtype(out),
        tolerance=rule.text,
    )


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _as_f64(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``out`` and ``ref`` in float64 on ``out``'s device; on the CPU when the device has no room."""
    try:
        return out.detach().to(torch.float64), ref.detach().to(device=out.device, dtype=torch.float64)
    except torch.OutOfMemoryError:
        cpu = torch.device("cpu")
        return out.detach().to(cpu, torch.float64), ref.detach().to(cpu, torch.float64)


def _pct(part: int, whole: int) -> str:
    """``part`` of ``whole`` in percent, three significant figures: ``"3.1%"``-like (``"3.12%"``)."""
    return f"{100.0 * part / max(whole, 1):.3g}%"


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _where(bad: torch.Tensor, out64: torch.Tensor, ref64: torch.Tensor) -> str:
    """'; first bad at (i, j): out=.. ref=..; bad rows 3: 0, 7, ..' for a failure message."""
    first = tuple(int(i) for i in bad.nonzero()[0])
    text = f"; first bad at {first}: out={float(out64[first]):.6g} ref={float(ref64[first]):.6g}"
    if bad.dim() >= 2:
        rows = bad.flatten(1).any(dim=1).nonzero().flatten().tolist()
        listed = ", ".join(map(str, rows[:_MAX_ROWS_LISTED]))
        listed += ", ..." if len(rows) > _MAX_ROWS_LISTED else ""
        text += f"; bad rows {len(rows)}/{bad.shape[0]}: {listed}"
    return text
