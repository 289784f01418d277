"""Correctness and determinism checks of one variant, driven by ``CorrectnessSpec``.

What runs (every output poisoned with NaN before each run, ``kernelab.kernels.check.poison_``):

* **reference**: one run compared with the float64 reference (``kernelab.kernels.check.check_output``);
* **repeats** (``repeats > 1``): ``repeats`` runs in all, on the cell's inputs (``"fixed"``) or on
  fresh inputs drawn with seeds ``seed + i`` (``"fresh"``): failure count, worst errors, whether
  every failure had the *same* relative error (a deterministic clobber, as the conv3d seed's
  0.3075 twice) or not (a race), and how the bad-element set moves (mean Jaccard of consecutive
  failures' sets: 1 = the same elements, near 0 = a set that floats);
* **determinism** (``determinism_runs >= 2``): runs on the same inputs compared *bitwise* with the
  first; differing runs, differing elements, max |difference| and the Jaccard of the differing sets;
* **batch invariance**: rows computed alone and in a small batch (``Benchmark.batch_slice``)
  against the same rows of the full batch, bitwise; mismatched rows and max |difference|;
* **where**: bad elements mapped onto the benchmark's logical axes (``Benchmark.output_axes``)
  and summarised in one line, e.g. ``9120/27648 bad (33%): n all 1; channel 1-95 (95/96);
  pixel 0-95 (96/288), pixel % 128 in 0-95``.

Imports torch (runner side only).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from kernelab.kernels import Benchmark
from kernelab.kernels.check import check_output, mismatch_mask, poison_
from kernelab.kernels.tolerances import Tolerance
from kernelab.service.contract.schemas import (
    BatchInvarianceCheck,
    BitwiseComparison,
    CorrectnessResult,
    CorrectnessSpec,
    DeterminismCheck,
    RepeatCheck,
)

_MAX_RANGES = 4  # index ranges listed per axis before "..."
_SMALL_BATCH = 8  # rows of the "small batch" of the batch-invariance check
_SAME_REL = 1e-12  # failures' rel. errors this close (relative) count as "identical"
_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def scale_inputs(inputs: dict[str, Any], scale: float) -> dict[str, Any]:
    """Multiply every floating tensor of ``inputs`` by ``scale`` (a new dict; 1.0 returns it as is)."""
    if scale == 1.0:
        return inputs
    return {
        k: v * scale if isinstance(v, torch.Tensor) and v.is_floating_point() else v
        for k, v in inputs.items()
    }


def poisoned_run(fn: Callable[[], Any], inputs: Mapping[str, Any], device: torch.device) -> torch.Tensor:
    """Run ``fn`` once, poison its output (NaN) unless it aliases an input, run again; return it.

    Raises ``TypeError`` when ``fn`` does not return a tensor.
    """
    out = fn()
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"a variant must return a tensor, got {type(out).__name__}")
    ptr = out.untyped_storage().data_ptr()
    aliased = any(
        isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr for t in inputs.values()
    )
    if out.dtype != torch.bool and not aliased:
        poison_(out)
    del out
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out  # type: ignore[no-any-return]


def _ranges(indices: Sequence[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"`` (at most ``_MAX_RANGES`` ranges, then "...")."""
    spans: list[tuple[int, int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], i)
        else:
            spans.append((i, i))
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:_MAX_RANGES])
    return text + (", ..." if len(spans) > _MAX_RANGES else "")


def logical_view(
    mask: torch.Tensor, bench: Benchmark[Any], params: Any
) -> tuple[torch.Tensor, list[tuple[str, int | None]]]:
    """``mask`` reshaped onto the benchmark's logical axes, and those axes (name, tile)."""
    axes = list(bench.output_axes(params))
    shape = tuple(bench.output_shape(params))
    if shape and math.prod(shape) == mask.numel():
        mask = mask.reshape(shape)
    if len(axes) != mask.dim():
        axes = [(f"dim{i}", None) for i in range(mask.dim())]
    return mask, axes


def describe_where(mask: torch.Tensor, axes: Sequence[tuple[str, int | None]]) -> str:
    """One line naming where ``mask`` (bool, True = bad) is set, per logical axis.

    Per axis: the indices holding any bad element as ranges (``all n`` when every index does),
    and for a tiled axis the residues modulo the tile when they are not all of them (rows
    64-127 of every 128-row tile show as ``row % 128 in 64-127``). Empty string for no bad element.
    """
    mask = mask.to("cpu", torch.bool)
    n_bad = int(mask.sum())
    if n_bad == 0:
        return ""
    head = f"{n_bad}/{mask.numel()} bad ({100.0 * n_bad / mask.numel():.3g}%)"
    parts: list[str] = []
    for dim, (name, tile) in enumerate(axes):
        others = [d for d in range(mask.dim()) if d != dim]
        hit = mask.any(dim=others) if others else mask
        idx = hit.nonzero().flatten().tolist()
        size = mask.shape[dim]
        text = f"{name} all {size}" if len(idx) == size else f"{name} {_ranges(idx)} ({len(idx)}/{size})"
        if tile and size > tile:
            residues = sorted({i % tile for i in idx})
            if len(residues) < min(tile, size):
                text += f", {name} % {tile} in {_ranges(residues)}"
        parts.append(text)
    return f"{head}: {'; '.join(parts)}"


def jaccard(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a ∩ b| / |a ∪ b| of two boolean masks of one shape; 1.0 when both are empty."""
    union = int((a | b).sum())
    return 1.0 if union == 0 else int((a & b).sum()) / union


def bitwise_diff(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Boolean mask on ``a``'s device: True where ``a`` and ``b`` (same shape and dtype) differ in
    their bytes. NaNs with the same payload are equal. Raises ``ValueError`` for different shapes
    or dtypes."""
    if a.shape != b.shape or a.dtype != b.dtype:
        raise ValueError(f"cannot compare {tuple(a.shape)} {a.dtype} with {tuple(b.shape)} {b.dtype} bitwise")
    b = b.detach().to(a.device)
    view = _INT_VIEW.get(a.element_size())
    if view is None or a.dtype == torch.bool:
        return a.detach() != b
    return a.detach().contiguous().view(view) != b.contiguous().view(view)


def _max_abs(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor) -> float | None:
    d = (a.detach().double() - b.detach().to(a.device).double()).abs()
    d = torch.where(where.to(a.device) & torch.isfinite(d), d, -1.0)
    worst = float(d.amax()) if d.numel() else -1.0
    return worst if worst >= 0 else None


def compare_bitwise(
    a: torch.Tensor, b: torch.Tensor, bench: Benchmark[Any] | None = None, params: Any = None
) -> BitwiseComparison:
    """``a`` and ``b`` compared byte for byte, with the differing elements located."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return BitwiseComparison(
            identical=False, where=f"{tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}"
        )
    diff = bitwise_diff(a, b)
    n = int(diff.sum())
    view, axes = (
        logical_view(diff, bench, params)
        if bench is not None
        else (diff, [(f"dim{i}", None) for i in range(diff.dim())])
    )
    return BitwiseComparison(
        identical=n == 0,
        differing_elements=n,
        max_abs_difference=_max_abs(a, b, diff) if n else 0.0,
        where=describe_where(view, axes),
    )


def _mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def _repeat_check(
    bench: Benchmark[Any],
    variant: str,
    params: Any,
    inputs: dict[str, Any],
    fn: Callable[[], Any],
    ref: torch.Tensor,
    spec: CorrectnessSpec,
    *,
    seed: int,
    device: torch.device,
    tolerance: Tolerance,
    first: CorrectnessResult,
    first_bad: torch.Tensor,
) -> RepeatCheck:
    errors = [first.rel_error] if not first.passed else []
    max_abs = [first.max_abs_error] if not first.passed else []
    failures, prev_bad = (0, None) if first.passed else (1, first_bad)
    union = first_bad.clone()
    jaccards: list[float] = []
    for i in range(1, spec.repeats):
        if spec.inputs == "fresh":
            run_inputs = scale_inputs(bench.make_inputs(params, device, seed + i), spec.input_scale)
            run_fn, run_ref = bench.prepare(variant, params, run_inputs), bench.reference(params, run_inputs)
        else:
            run_inputs, run_fn, run_ref = inputs, fn, ref
        out = poisoned_run(run_fn, run_inputs, device)
        res = check_output(out, run_ref, tolerance)
        if res.passed:
            continue
        failures += 1
        errors.append(res.rel_error)
        max_abs.append(res.max_abs_error)
        bad = mismatch_mask(out, run_ref, tolerance)
        union |= bad
        if prev_bad is not None:
            jaccards.append(jaccard(prev_bad, bad))
        prev_bad = bad
    finite = [e for e in errors if e is not None and math.isfinite(e)]
    identical = None
    if failures >= 2:
        same_error = len(finite) == len(errors) and max(finite) - min(finite) <= _SAME_REL * max(finite)
        identical = same_error and all(j == 1.0 for j in jaccards)
    view, axes = logical_view(union, bench, params)
    return RepeatCheck(
        runs=spec.repeats,
        inputs=spec.inputs,
        failures=failures,
        worst_rel_error=max(finite) if finite else None,
        worst_max_abs_error=max((e for e in max_abs if e is not None), default=None),
        failure_errors_identical=identical,
        bad_set_jaccard=_mean(jaccards),
        where=describe_where(view, axes),
    )


def _determinism_check(
    bench: Benchmark[Any],
    params: Any,
    inputs: dict[str, Any],
    fn: Callable[[], Any],
    first_out: torch.Tensor,
    runs: int,
    device: torch.device,
) -> DeterminismCheck:
    differing, max_elems, max_abs = 0, 0, 0.0
    prev: torch.Tensor | None = None
    union = torch.zeros(first_out.shape, dtype=torch.bool, device=first_out.device)
    jaccards: list[float] = []
    for _ in range(1, runs):
        out = poisoned_run(fn, inputs, device)
        diff = bitwise_diff(out, first_out)
        n = int(diff.sum())
        if n == 0:
            continue
        differing += 1
        max_elems = max(max_elems, n)
        max_abs = max(max_abs, _max_abs(out, first_out, diff) or 0.0)
        union |= diff
        if prev is not None:
            jaccards.append(jaccard(prev, diff))
        prev = diff
    view, axes = logical_view(union, bench, params)
    return DeterminismCheck(
        runs=runs,
        deterministic=differing == 0,
        differing_runs=differing,
        max_differing_elements=max_elems,
        max_abs_difference=max_abs if differing else 0.0,
        bad_set_jaccard=_mean(jaccards),
        where=describe_where(view, axes),
    )


def _batch_invariance_check(
    bench: Benchmark[Any],
    variant: str,
    params: Any,
    inputs: dict[str, Any],
    full: torch.Tensor,
    device: torch.device,
) -> BatchInvarianceCheck | None:
    rows = bench.batch_rows(params)
    if rows <= 0 or bench.batch_slice(params, inputs, 0, 1) is None:
        return None
    alone = sorted({0, rows // 2, rows - 1})
    small = min(_SMALL_BATCH, rows)
    plans = [("alone", r, r + 1) for r in alone] + [("small", 0, small), ("small", rows - small, rows)]
    mismatched: dict[str, int] = {"alone": 0, "small": 0}
    elems, max_abs = 0, 0.0
    for kind, start, stop in plans:
        sliced = bench.batch_slice(params, inputs, start, stop)
        assert sliced is not None
        sub_params, sub_inputs = sliced
        out = poisoned_run(bench.prepare(variant, sub_params, sub_inputs), sub_inputs, device)
        diff = bitwise_diff(out, full[start:stop])
        n = int(diff.sum())
        if n:
            mismatched[kind] += int(diff.flatten(1).any(dim=1).sum())
            elems += n
            max_abs = max(max_abs, _max_abs(out, full[start:stop], diff) or 0.0)
    checked = len(set(alone) | set(range(small)) | set(range(rows - small, rows)))
    invariant = elems == 0
    message = (
        f"bitwise equal: rows {alone} alone and {small}-row batches at both ends of {rows}"
        if invariant
        else f"{mismatched['alone']}/{len(alone)} rows alone and {mismatched['small']}/{2 * small} rows in "
        f"{small}-row batches differ from the {rows}-row batch; {elems} elements, max |diff| {max_abs:.3g}"
    )
    return BatchInvarianceCheck(
        batch_rows=rows,
        rows_checked=checked,
        invariant=invariant,
        mismatched_rows=mismatched,
        mismatched_elements=elems,
        max_abs_difference=max_abs,
        message=message,
    )


def run_checks(
    bench: Benchmark[Any],
    variant: str,
    params: Any,
    inputs: dict[str, Any],
    fn: Callable[[], Any],
    ref: torch.Tensor,
    spec: CorrectnessSpec,
    *,
    seed: int,
    device: torch.device,
    tolerance: Tolerance,
) -> tuple[CorrectnessResult, torch.Tensor]:
    """Every check ``spec`` asks for on one variant; returns the result and the first run's output.

    ``fn`` is ``bench.prepare(variant, params, inputs)``; ``ref`` the reference for ``inputs``;
    ``tolerance`` what every output is held to (``kernelab.kernels.check.check_output``).
    ``passed`` is the reference comparison *and* no failure among the repeats. Determinism and
    batch invariance are reported, not folded into ``passed`` (``kernelab.service.judge.stats`` turns a
    non-deterministic result into the ``nondeterministic`` flag). Whatever the benchmark raises
    propagates.
    """
    out = poisoned_run(fn, inputs, device)
    result = check_output(out, ref, tolerance)
    first_out = out.detach().clone()
    bad = mismatch_mask(out, ref, tolerance) if out.shape == ref.shape else torch.zeros(0, dtype=torch.bool)
    if bad.numel():
        view, axes = logical_view(bad, bench, params)
        result.where = describe_where(view, axes)
    if spec.repeats > 1 and bad.numel():
        result.repeats = _repeat_check(
            bench,
            variant,
            params,
            inputs,
            fn,
            ref,
            spec,
            seed=seed,
            device=device,
            tolerance=tolerance,
            first=result,
            first_bad=bad,
        )
        result.passed = result.passed and result.repeats.failures == 0
        if result.repeats.failures:
            r = result.repeats
            same = {
                True: "identical error every time (deterministic clobber)",
                False: "error varies between failures (a race)",
                None: "",
            }[r.failure_errors_identical]
            worst = "n/a" if r.worst_rel_error is None else f"{r.worst_rel_error:.4g}"
            result.message += f"; repeats: {r.failures}/{r.runs} failed, worst rel {worst}"
            result.message += f", {same}" if same else ""
    if spec.determinism_runs >= 2:
        result.determinism = _determinism_check(
            bench, params, inputs, fn, first_out, spec.determinism_runs, device
        )
    if spec.batch_invariance:
        result.batch_invariance = _batch_invariance_check(bench, variant, params, inputs, first_out, device)
    return result, first_out
