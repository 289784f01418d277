"""Time to a verdict: wall time per cell against sweep size, by phase, beside the quick tools.

    python benchmarks/verdict_speed.py OUT_DIR [--device cpu|cuda] [--cells 1,10,100]
        [--variants torch,torch] [--threshold-pct 2] [--no-probes] [--quick-tools]

For each sweep size, ``kernelab run`` (the CLI, as a user runs it: process start, spec checks,
probes, every cell in the measuring child, the comparison, the table) on a softmax sweep of that
many cells (``sweep``: rows ``M``, columns ``N``, dtypes), timed from the
command's start to its exit. The raw ``JobResult`` (``--result``) gives where the time went: the
probes' own wall time (``ProbeReport.wall_s``) and each cell's ``phase_s`` (``prepare``,
``correctness``, ``measure``: warm-up and rounds, ``checks``: timed correctness checks,
``cross_check``, ``device_work`` and the rest); "outside" is the command's wall time less those
(interpreter and imports, spec and benchmark checks, the children's start, the comparison and the
table).

``--quick-tools``: in this process, per cell, what users compare kernelab with, for both sides:
``triton.testing.do_bench`` (CUDA; its defaults: 25 ms warm-up, 100 ms of repetitions, L2
flushed) or ``torch.utils.benchmark.Timer.blocked_autorange(min_run_time=0.2)`` (CPU), and an
nvbench-like fixed budget (``--min-time 0.5`` s per state: each side timed until 0.5 s of samples,
nvbench's default ``--min-time``; NVIDIA/nvbench ``docs/cli_help.md``).

Writes ``OUT_DIR/verdict_speed.json`` and prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROWS = [64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384]
PHASES = ("prepare", "correctness", "measure", "checks", "cross_check", "device_work")


def sweep(cells: int, device: str) -> dict[str, list[Any]]:
    """A softmax sweep of exactly ``cells`` cells: up to 17 cells vary ``M`` alone (``N`` 1024,
    float32); more are 10 per row (``N`` 512-8192, float32 and bfloat16), ``cells`` a multiple of 10."""
    if cells <= len(ROWS):
        return {"M": ROWS[:cells], "N": [1024], "dtype": ["float32"]}
    columns, dtypes = [512, 1024, 2048, 4096, 8192], ["float32", "bfloat16"]
    rows, rest = divmod(cells, len(columns) * len(dtypes))
    if rest or rows > len(ROWS):
        raise SystemExit(f"--cells {cells}: at most {len(ROWS)}, or a multiple of 10 up to {10 * len(ROWS)}")
    return {"M": ROWS[:rows], "N": columns, "dtype": dtypes}


def spec_for(cells: int, args: argparse.Namespace) -> dict[str, Any]:
    baseline, candidate = args.variants.split(",")
    return {
        "name": f"verdict-speed-{cells}",
        "benchmark": "softmax",
        "baseline": {"variant": baseline},
        "candidate": {"variant": candidate},
        "device": args.device,
        "sweep": sweep(cells, args.device),
        "measurement": {"threshold_pct": args.threshold_pct},
        "probes": {
            "copy_bandwidth": not args.no_probes,
            "all_reduce": not args.no_probes,
            "nvml": not args.no_probes,
        },
    }


def run_cli(cells: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """``kernelab run`` of the sweep; its wall time and the breakdown from its raw result."""
    folder = out / f"cells-{cells}"
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec_for(cells, args)), encoding="utf-8")
    cmd = [sys.executable, "-m", "kernelab.runners.cli", "run", str(spec_path),
           "--result", str(folder / "result.json"), "--json", str(folder / "comparison.json")]  # fmt: skip
    t0 = time.perf_counter()
    lines: list[tuple[float, str]] = []  # (s since start, line): the progress lines say where time goes
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:  # fmt: skip
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - t0, line.rstrip("\n")))
    wall = time.perf_counter() - t0
    (folder / "timeline.txt").write_text("".join(f"{t:8.3f} {text}\n" for t, text in lines), encoding="utf-8")
    if not (folder / "result.json").exists():
        raise SystemExit(f"kernelab run failed ({proc.returncode}):\n" + "\n".join(t for _, t in lines[-40:]))

    def first(mark: str) -> float | None:
        return next((t for t, text in lines if mark in text), None)

    result = json.loads((folder / "result.json").read_text())
    comparison = json.loads((folder / "comparison.json").read_text())
    phases = {p: sum(c.get("phase_s", {}).get(p, 0.0) for c in result["cells"]) for p in PHASES}
    probes = sum(p.get("wall_s") or 0.0 for p in result.get("probes", []))
    inside = probes + sum(phases.values())
    verdicts: dict[str, int] = {}
    reasons: dict[str, int] = {}
    for cell in comparison["cells"]:
        verdicts[cell["verdict"]] = verdicts.get(cell["verdict"], 0) + 1
        for r in cell.get("reasons", []):
            reasons[r["code"]] = reasons.get(r["code"], 0) + 1
    return {
        "cells": cells,
        "exit": proc.returncode,
        "reasons": reasons,
        # seconds from the command's start: its first line, the first cell, the probes after, the table
        "marks_s": {
            "first_line": lines[0][0] if lines else None,
            "probes_before": first("probes before"),
            "first_cell": first("cell 1/"),
            "probes_after": first("probes after"),
            "table": first("baseline ("),
        },  # fmt: skip
        "wall_s": wall,
        "per_cell_s": wall / cells,
        "probes_s": probes,
        "phase_s": phases,
        "outside_s": wall - inside,
        "verdicts": verdicts,
    }


def quick_tools(cells: int, args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per cell (both sides) of do_bench or torch's Timer, and of an nvbench-like budget."""
    import torch

    from kernelab.kernels import get_benchmark

    bench = get_benchmark("softmax")
    device = torch.device("cuda" if args.device == "cuda" else "cpu")
    grid = spec_for(cells, args)["sweep"]
    params = [{"M": m, "N": n, "dtype": d} for m in grid["M"] for n in grid["N"] for d in grid["dtype"]]
    quick = budget = 0.0
    for cell in params:
        p = bench.Params.model_validate(cell)
        inputs = bench.make_inputs(p, device, 0)
        for variant in args.variants.split(","):
            fn = bench.prepare(variant, p, inputs)
            t0 = time.perf_counter()
            if device.type == "cuda":
                import triton.testing

                triton.testing.do_bench(fn)
            else:
                from torch.utils import benchmark as torch_benchmark

                torch_benchmark.Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.2)
            quick += time.perf_counter() - t0
            t0 = time.perf_counter()
            timed = 0.0
            while timed < 0.5:  # nvbench --min-time 0.5: samples until 0.5 s of them
                s = time.perf_counter()
                fn()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                timed += time.perf_counter() - s
            budget += time.perf_counter() - t0
    return {"quick_tool_s": quick, "nvbench_like_s": budget}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--cells", default="1,10,100")
    ap.add_argument(
        "--variants",
        default=None,
        help="baseline,candidate (default torch,torch on a CPU, torch,triton on CUDA)",
    )
    ap.add_argument("--threshold-pct", type=float, default=2.0)
    ap.add_argument("--no-probes", action="store_true")
    ap.add_argument("--quick-tools", action="store_true")
    args = ap.parse_args()
    args.variants = args.variants or ("torch,triton" if args.device == "cuda" else "torch,torch")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for cells in (int(c) for c in args.cells.split(",")):
        row = run_cli(cells, args, args.out)
        if args.quick_tools:
            row.update(quick_tools(cells, args))
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "verdict_speed.json").write_text(json.dumps({"args": vars(args) | {"out": str(args.out)},
                                                             "rows": rows}, indent=1))  # fmt: skip
    head = ["cells", "wall s", "s/cell", "probes", *PHASES, "outside", "verdicts"]
    if args.quick_tools:
        head += ["quick tool s", "nvbench-like s"]
    probes = "off" if args.no_probes else "on"
    print(f"\n{args.device}, {args.variants}, threshold {args.threshold_pct:g}%, probes {probes}\n")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cols = [str(r["cells"]), f"{r['wall_s']:.1f}", f"{r['per_cell_s']:.2f}", f"{r['probes_s']:.2f}",
                *(f"{r['phase_s'][p]:.2f}" for p in PHASES), f"{r['outside_s']:.1f}",
                ", ".join(f"{n} {v}" for v, n in sorted(r["verdicts"].items()))
                + "".join(f" ({n} {c})" for c, n in sorted(r["reasons"].items()))]  # fmt: skip
        if args.quick_tools:
            cols += [f"{r['quick_tool_s']:.1f}", f"{r['nvbench_like_s']:.1f}"]
        print("| " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
