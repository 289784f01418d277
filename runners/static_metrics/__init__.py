"""Static kernel metrics: registers, spills, shared memory, occupancy, instruction mix, loops, and
"identical ISA" between a job's baseline and candidate.

When the clock cannot be trusted (a node pegged by other tenants), instruction counts still hold.
For every cell of a job, both sides' Triton kernels are compiled *ahead of time* for a named GPU
(``sm_90a``; by default the runner's own) in a child process (``kernelab.runners.static_metrics.aot``: the
same specialisation and compiler pipeline as a GPU run, but no GPU needed), their machine code is
read with the ``nvdisasm``/``cuobjdump`` that Triton ships, and the two sides are diffed
(``kernelab.runners.static_metrics.diff``).

Public entry points:

* ``compile_kernels(items, target)``: compile request items (benchmark variants or ``module:fn``
  kernels with example arguments) → ``{key: [KernelCode]}``;
* ``static_comparisons(spec, cells, target)``: one ``StaticComparison`` per cell of a job;
* ``side_items(spec, variant, cells)`` and ``pair_comparisons(target, baseline, candidate)``: the
  two halves of it, for sides compiled apart (a revision job: each side's worker compiles its own
  revision's kernels, ``kernelab.runners.pipeline.attach_static`` diffs them);
* ``kernel_code_json``/``kernel_code_from_json``: a ``KernelCode`` as JSON (a worker's answer);
* ``default_target(device)``: the target name of a CUDA device (``sm_90a`` on an H100/H200).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from kernelab.runners.jobenv import job_env
from kernelab.runners.static_metrics.diff import KernelCode, compare
from kernelab.runners.static_metrics.isa import Loop
from kernelab.runners.static_metrics.target import parse_target
from kernelab.service.contract.schemas import (
    CellResult,
    JobSpec,
    KernelStatic,
    ParamValue,
    Side,
    StaticComparison,
)

__all__ = [
    "KernelCode",
    "StaticMetricsError",
    "attach_static",
    "compile_kernels",
    "default_target",
    "kernel_code_from_json",
    "kernel_code_json",
    "no_target_message",
    "pair_comparisons",
    "side_items",
    "static_comparisons",
]

_COMPILE_TIMEOUT_S = 600.0  # a whole job's kernels; one matmul tile config takes ~5 s on one core


class StaticMetricsError(RuntimeError):
    """The ahead-of-time compile child failed as a whole (not one item: those carry their error)."""


def default_target(device: Any) -> str | None:
    """``sm_<major><minor>`` (with ``a`` for 9.0, as Triton compiles for it) of a CUDA ``device``;
    None for any other device."""
    import torch  # heavy: importing this package imports no torch (its compile child starts light)

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(dev)
    cap = major * 10 + minor
    return f"sm_{cap}a" if cap == 90 else f"sm_{cap}"


def kernel_code_from_json(raw: Mapping[str, Any]) -> KernelCode:
    """A ``KernelCode`` from its JSON form ``{"static": KernelStatic, "sequence": [[offset,
    opcode], ...], "loops": [[start, end], ...]}`` (``aot.analyze``'s answer); loops keep their
    bounds, not their instructions."""
    static = KernelStatic.model_validate(raw["static"])
    sequence = tuple((int(off), str(op)) for off, op in raw["sequence"])
    loops = tuple(Loop(s, e, ()) for s, e in raw["loops"])
    return KernelCode(static=static, sequence=sequence, loops=loops)


def kernel_code_json(code: KernelCode) -> dict[str, Any]:
    """The JSON form ``kernel_code_from_json`` reads."""
    return {
        "static": code.static.model_dump(mode="json"),
        "sequence": [[off, op] for off, op in code.sequence],
        "loops": [[lp.start, lp.end] for lp in code.loops],
    }


def compile_kernels(
    items: Sequence[Mapping[str, Any]],
    target: str,
    *,
    timeout_s: float = _COMPILE_TIMEOUT_S,
    revision: Mapping[str, str | None] | None = None,
) -> dict[str, tuple[list[KernelCode], str | None]]:
    """Compile and analyse ``items`` for ``target`` in a child process: ``{key: (kernels, error)}``.

    An item is ``{"key", "benchmark", "variant", "params"[, "seed"]}`` (a benchmark side, prepared
    on meta tensors) or ``{"key", "kernel": "module:function", "args": [...], "kwargs": {...}}``
    (a ``triton.jit`` function; a tensor argument is ``{"tensor": [shape], "dtype": "float16"}``,
    constexprs and ``num_warps``/``num_stages`` go in ``kwargs``). ``revision``: ``{"path",
    "site"}`` of a source revision whose benchmark the items name (put first on the child's
    ``sys.path`` and loaded as ``kernelab.runners.revision_worker`` loads it). One item's failure
    is its ``error``; raises ``StaticMetricsError`` when the child fails as a whole (timeout,
    crash) and ``ValueError`` for a malformed ``target``.
    """
    parse_target(target)
    env = {k: v for k, v in job_env().items() if k != "TRITON_INTERPRET"}  # no credentials (jobenv)
    request = json.dumps({"target": target, "items": list(items), "revision": dict(revision or {})})
    try:
        proc = subprocess.run(
            [sys.executable, "-P", "-m", "kernelab.runners.static_metrics.aot"],
            input=request,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise StaticMetricsError(f"ahead-of-time compilation for {target} took over {timeout_s:g} s") from exc
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        raise StaticMetricsError(
            f"ahead-of-time compilation for {target} failed ({proc.returncode}): {tail[0]}"
        )
    answer = json.loads(proc.stdout)
    return {
        key: ([kernel_code_from_json(k) for k in value["kernels"]], value["error"])
        for key, value in answer.items()
    }


def side_items(
    spec: JobSpec, variant: Side, cells: Sequence[Mapping[str, ParamValue]]
) -> list[dict[str, Any]]:
    """``compile_kernels`` items of one side: cell ``i`` (its merged parameters) is key
    ``"i/variant"``."""
    side = getattr(spec, variant)
    return [
        {
            "key": f"{i}/{variant}",
            "benchmark": spec.benchmark,
            "variant": side.variant,
            "params": dict(params),
            "seed": spec.measurement.seed,
        }
        for i, params in enumerate(cells)
    ]


def pair_comparisons(
    target: str,
    baseline: Sequence[tuple[Sequence[KernelCode], str | None]],
    candidate: Sequence[tuple[Sequence[KernelCode], str | None]],
) -> list[StaticComparison]:
    """One ``StaticComparison`` per cell from each side's ``(kernels, error)`` of that cell; a side
    that failed to compile makes the cell's comparison carry its error."""
    out = []
    for (kb, eb), (kc, ec) in zip(baseline, candidate, strict=True):
        errors = [f"{side}: {e}" for side, e in (("baseline", eb), ("candidate", ec)) if e]
        if errors:
            out.append(StaticComparison(target=target, error="; ".join(errors)))
        else:
            out.append(compare(kb, kc, target=target))
    return out


def static_comparisons(
    spec: JobSpec, cells: Sequence[tuple[Mapping[str, ParamValue], Mapping[str, ParamValue]]], target: str
) -> list[StaticComparison]:
    """One ``StaticComparison`` per cell; ``cells`` holds each cell's (baseline, candidate) merged
    parameters. All cells compile in one child process. A side that failed to compile makes that
    cell's comparison carry the error; a whole-child failure puts its error on every cell."""
    items = side_items(spec, "baseline", [b for b, _ in cells]) + side_items(
        spec, "candidate", [c for _, c in cells]
    )
    try:
        compiled = compile_kernels(items, target)
    except (StaticMetricsError, ValueError) as exc:
        return [StaticComparison(target=target, error=str(exc)) for _ in cells]
    return pair_comparisons(
        target,
        [compiled[f"{i}/baseline"] for i in range(len(cells))],
        [compiled[f"{i}/candidate"] for i in range(len(cells))],
    )


def no_target_message(device: Any) -> str:
    """Why a job on ``device`` that names no ``static_metrics.target`` has no static metrics."""
    return f"static_metrics.target is not set and device {device} is not a CUDA GPU; name one, e.g. sm_90a"


def attach_static(spec: JobSpec, cells: Sequence[CellResult], device: Any) -> None:
    """Set ``cell.static`` on every cell of a job (``JobSpec.static_metrics``), in place.

    The target is ``spec.static_metrics.target`` or the ``device``'s own; with neither (a CPU run
    without a named target) each cell gets a ``StaticComparison`` whose ``error`` says so. Never
    raises for a compile failure: that becomes the cells' ``error``.
    """
    target = spec.static_metrics.target or default_target(device)
    if target is None:
        for cell in cells:
            cell.static = StaticComparison(error=no_target_message(device))
        return
    pairs = [(cell.baseline_params, cell.candidate_params) for cell in cells]
    for cell, comparison in zip(cells, static_comparisons(spec, pairs, target), strict=True):
        cell.static = comparison
