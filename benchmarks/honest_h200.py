"""The H200 cases of "honest across time" that are no test: an honest float32 GEMM's verdict.

    python benchmarks/honest_h200.py OUT gemm32 [RUNS]

``gemm32``: RUNS jobs of the ``matmul`` benchmark, eager ``torch`` against itself, float32
M = N = K in (1000, 1024, 2048), correctness on (the default), each in a fresh measuring process,
as a runner runs it. Before the declared reduction, both sides read ``incorrect`` at 1000^3 (4 of
10^6 elements off by 2.4e-6 relative, beyond rtol 1.3e-6). Prints per run and cell the verdict,
each side's rel. error and the tolerance used; appends JSON lines to ``OUT/honest.jsonl``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import JobSpec
from kernelab.service.judge.stats import compare

PROBES_OFF = {"copy_bandwidth": False, "all_reduce": False, "nvml": False, "matmul_peak": False}


def gemm32(out: Path, runs: int) -> None:
    print("| run | M=N=K | verdict | rel error baseline / candidate | tolerance | wall s |")
    print("| ---: | ---: | --- | --- | --- | ---: |")
    with (out / "honest.jsonl").open("a") as log:
        for run in range(runs):
            for size in (1000, 1024, 2048):
                spec = JobSpec.model_validate({
                    "name": "honest float32 GEMM", "benchmark": "matmul", "device": "cuda",
                    "baseline": {"variant": "torch"}, "candidate": {"variant": "torch"},
                    "params": {"M": size, "N": size, "K": size, "dtype": "float32"},
                    "measurement": {"budget_ms": 1000, "seed": run}, "probes": PROBES_OFF,
                })  # fmt: skip
                t0 = time.time()
                cell = compare(run_job(spec)).cells[0]
                wall = time.time() - t0
                rel = [c.rel_error for c in cell.correctness.values()]
                tol = cell.correctness["baseline"].tolerance if "baseline" in cell.correctness else ""
                row = {"part": "gemm32", "run": run, "size": size, "verdict": cell.verdict, "rel": rel,
                       "reasons": [r.code for r in cell.reasons], "tolerance": tol,
                       "messages": [r.message for r in cell.reasons]}  # fmt: skip
                log.write(json.dumps(row) + "\n")
                print(f"| {run} | {size} | {cell.verdict} | {rel} | {tol[:80]} | {wall:.1f} |", flush=True)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    if sys.argv[2] == "gemm32":
        gemm32(out, int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    else:
        raise SystemExit(f"unknown part {sys.argv[2]!r}")
