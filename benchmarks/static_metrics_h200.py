"""Static metrics of the Triton matmul (two tile sizes) and conv3d (row guard on/off, aligned and
unaligned shapes), compiled ahead of time; on a GPU node also compiled at run time and checked
equal.

Usage: ``python benchmarks/static_metrics_h200.py OUTDIR [--target sm_90a]``. Writes
``OUTDIR/static_metrics.json`` (every ``StaticComparison``) and, on a GPU, the runtime check; prints
a Markdown table last. On a CPU-only machine ``--target`` is required (default sm_90a) and only the
ahead-of-time part runs. GPU runtime: about a minute (compiles only, no timing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernelab.runners.static_metrics import default_target, static_comparisons  # noqa: E402
from kernelab.service.contract.schemas import JobSpec  # noqa: E402
from kernelab.service.judge.report import format_static, static_table_rows  # noqa: E402

MATMUL = {
    "name": "matmul tiles",
    "benchmark": "matmul",
    "params": {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16"},
    "baseline": {"variant": "triton", "params": {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32}},
    "candidate": {"variant": "triton", "params": {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}},
}
# npq = N*Do*Ho*Wo: 16^3 = 4096 is a multiple of BLOCK_M 128 (aligned), 15^3 = 3375 is not.
CONV3D = {
    "name": "conv3d row guard",
    "benchmark": "conv3d",
    "params": {"N": 1, "C": 64, "K": 64, "dtype": "float16"},
    "sweep": {"D": [16, 15]},
    "baseline": {"variant": "triton", "params": {"row_guard": True}},
    "candidate": {"variant": "triton", "params": {"row_guard": False}},
}


def _specs() -> list[JobSpec]:
    return [JobSpec.model_validate(MATMUL), JobSpec.model_validate(CONV3D)]


def _cells(spec: JobSpec) -> list[dict[str, Any]]:
    cells = spec.cells("cuda")
    for c in cells:
        if "D" in c:
            c["H"] = c["W"] = c["D"]
    return cells


def _runtime_digests(spec: JobSpec, params: dict[str, Any], variant: str) -> list[dict[str, Any]]:
    """Compile on this GPU through the benchmark itself and analyse the runtime kernels."""
    import torch
    import triton

    from kernelab.kernels import get_benchmark
    from kernelab.runners.static_metrics.aot import analyze

    caught: list[tuple[Any, Any]] = []

    def hook(
        *, key: Any, repr: str, fn: Any, compile: Any, is_manual_warmup: bool, already_compiled: bool
    ) -> None:
        caught.append((fn.jit_function, key))

    bench = get_benchmark(spec.benchmark)
    p = bench.parse_params(params)
    triton.knobs.runtime.jit_post_compile_hook = hook
    try:
        inputs = bench.make_inputs(p, torch.device("cuda"), 0)
        fn = bench.prepare(variant, p, inputs)
        fn()
        torch.cuda.synchronize()
    finally:
        triton.knobs.runtime.jit_post_compile_hook = None
    out = []
    target = default_target("cuda") or ""
    for jf, key in caught:
        kernel = next(iter(jf.device_caches.values()))[0][key]
        static = analyze(kernel, target)["static"]
        out.append(
            {
                "name": static["name"],
                "code_sha256": static["code_sha256"],
                "registers": static["registers"],
                "driver_n_regs": getattr(kernel, "n_regs", None),
                "driver_n_spills": getattr(kernel, "n_spills", None),
            }
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--target", default=None, help="default: this node's GPU, else sm_90a")
    args = ap.parse_args()
    args.outdir.mkdir(parents=True, exist_ok=True)
    import torch

    on_gpu = torch.cuda.is_available()
    target = args.target or (default_target("cuda") if on_gpu else "sm_90a")
    report: dict[str, Any] = {
        "target": target,
        "gpu": torch.cuda.get_device_name() if on_gpu else None,
        "jobs": [],
    }
    labelled = []
    runtime_rows = []
    for spec in _specs():
        cells = _cells(spec)
        pairs = [({**c, **spec.baseline.params}, {**c, **spec.candidate.params}) for c in cells]
        results = static_comparisons(spec, pairs, target)
        for cell, (base, cand), res in zip(cells, pairs, results, strict=True):
            label = f"{spec.name}: " + ", ".join(f"{k}={v}" for k, v in cell.items() if k in ("D", "M"))
            labelled.append((label, res))
            entry: dict[str, Any] = {"spec": spec.name, "cell": cell, "static": res.model_dump(mode="json")}
            if on_gpu and res.error is None:
                for side, params in (("baseline", base), ("candidate", cand)):
                    rt = _runtime_digests(spec, params, getattr(spec, side).variant)
                    aot = [k.baseline if side == "baseline" else k.candidate for k in res.kernels]
                    aot_digests = [k.code_sha256 for k in aot if k is not None]
                    match = [r["code_sha256"] for r in rt] == aot_digests
                    entry[f"runtime_{side}"] = {"kernels": rt, "matches_aot": match}
                    runtime_rows.append(
                        (
                            label,
                            side,
                            match,
                            [r["driver_n_regs"] for r in rt],
                            [r["driver_n_spills"] for r in rt],
                        )
                    )
            report["jobs"].append(entry)
    (args.outdir / "static_metrics.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    (args.outdir / "static_metrics.txt").write_text(format_static(labelled), encoding="utf-8")
    print(format_static(labelled))
    for label, res in labelled:
        for k in res.kernels:
            print(f"- {label} `{k.name}`: {k.summary}")
    if runtime_rows:
        print("\n| cell | side | runtime SASS == AOT SASS | driver n_regs | driver n_spills |")
        print("| --- | --- | --- | --- | --- |")
        for label, side, match, regs, spills in runtime_rows:
            print(f"| {label} | {side} | {'yes' if match else 'NO'} | {regs} | {spills} |")
    print(
        f"\n### Static metrics, target {target}"
        + (f" ({report['gpu']})" if report["gpu"] else " (AOT, no GPU)")
    )
    print("")
    header = (
        "cell",
        "kernel",
        "ISA",
        "registers",
        "spills st/ld",
        "shared",
        "occupancy",
        "instructions",
        "loop body",
        "changes",
    )
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in static_table_rows(labelled):
        print("| " + " | ".join(v.replace("|", "\\|") for v in row) + " |")
    return 1 if any(res.error for _, res in labelled) else 0


if __name__ == "__main__":
    sys.exit(main())
