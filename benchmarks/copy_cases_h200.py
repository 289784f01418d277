"""Large device copies under kernelab's default timer against ``triton.testing.do_bench`` (GPU only).

Cases (``benchmarks/copybench.py``, float32 ``y.copy_(x)``):

* per-launch time of a 1 GiB copy: kernelab's default method (``timer: auto``) vs do_bench's
  median (event timing, L2 cleared) [within 3%];
* A/A: 1 GiB vs 1 GiB, ``--runs`` jobs in this process [never faster/slower];
* 3% more bytes: 1 GiB vs 1.03 GiB, ``--runs`` jobs [slower, ratio 1.03-1.06, do_bench's ratio beside].

Usage::

    PYTHONPATH=benchmarks:$PYTHONPATH python benchmarks/copy_cases_h200.py OUT_DIR [--runs 5] [--timer auto]

``--timer cuda-graph`` shows the graph method alone; writes ``OUT_DIR/copy_cases_TIMER.jsonl``
and prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import JobSpec
from kernelab.service.judge.stats import compare

GIB_ELEMENTS = 2**28  # float32 elements in 1 GiB


def spec(n_baseline: int, n_candidate: int, seed: int, timer: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": f"copy {n_baseline} vs {n_candidate}",
            "benchmark": "copybench:DeviceCopy",
            "baseline": {"variant": "copy", "params": {"n": n_baseline}},
            "candidate": {"variant": "copy", "params": {"n": n_candidate}},
            "measurement": {"budget_ms": 3000.0, "seed": seed, "timer": timer},
            "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False, "matmul_peak": False},
            "correctness": {"enabled": False},
        }
    )


def do_bench_us(n: int) -> float:
    import triton.testing

    x = torch.rand(n, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=100, rep=1000, return_mode="median")
    x = y = torch.empty(0)
    torch.cuda.empty_cache()
    return float(ms) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--timer", default="auto", help="measurement.timer of the jobs (auto: the default)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    n3 = int(round(1.03 * GIB_ELEMENTS))
    truth = {"1 GiB": do_bench_us(GIB_ELEMENTS), "1.03 GiB": do_bench_us(n3)}
    rows = []
    with (args.out / f"copy_cases_{args.timer}.jsonl").open("w") as log:
        log.write(json.dumps({"do_bench_median_us": truth}) + "\n")
        for label, n_cand in (("A/A", GIB_ELEMENTS), ("3% more bytes", n3)):
            for i in range(args.runs):
                t0 = time.time()
                result = run_job(spec(GIB_ELEMENTS, n_cand, seed=i, timer=args.timer))
                c = compare(result).cells[0]
                row = {
                    "case": label,
                    "run": i,
                    "verdict": c.verdict,
                    "ratio": c.ratio,
                    "ci": [c.ci_low, c.ci_high],
                    "baseline_us": c.baseline.median_ns / 1e3 if c.baseline else None,
                    "timer": result.timer,
                    "wall_s": round(time.time() - t0, 1),
                }
                log.write(json.dumps(row) + "\n")
                print(row, flush=True)
                rows.append(row)
    print()
    print(
        f"do_bench median: 1 GiB {truth['1 GiB']:.1f} us, 1.03 GiB {truth['1.03 GiB']:.1f} us, "
        f"ratio {truth['1.03 GiB'] / truth['1 GiB']:.4f}"
    )
    print("| case | run | verdict | ratio [CI] | baseline us (kernelab / do_bench) | timer | wall s |")
    print("| --- | ---: | --- | --- | --- | --- | ---: |")
    for r in rows:
        base = r["baseline_us"]
        ratio = f"{r['ratio']:.4f} [{r['ci'][0]:.4f}, {r['ci'][1]:.4f}]"
        vs = f"{base:.1f} / {truth['1 GiB']:.1f} ({base / truth['1 GiB']:.3f})"
        print(
            f"| {r['case']} | {r['run']} | {r['verdict']} | {ratio} | {vs} | {r['timer']} | {r['wall_s']} |"
        )


if __name__ == "__main__":
    main()
