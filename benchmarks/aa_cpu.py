"""A/A false verdicts on the CPU: the same code as baseline and candidate, many jobs, count the
cells that read ``faster`` or ``slower`` (every one is false: the two sides run identical code).

    python benchmarks/aa_cpu.py [--jobs 10] [--json OUT]

Each job is ``examples/softmax.yaml``'s CPU sweep with ``torch`` on both sides (4 cells: M in
{64, 256} x N in {200, 1000}, float32), measured by ``kernelab.runners.job.run_job`` in this
process (the jobs share it, as a runner's jobs do) and judged by ``kernelab.service.judge.stats.compare``.
Per cell it records the verdict, the timing alone's verdict (``timing_verdict``) and whether
``placement-disagreement`` decided it, so one run gives both counts: false verdicts of the
timing alone with the input-set rotation (``before``: the rule off) and of the verdict (``after``).
Prints the counts, the load average, and writes every cell with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernelab.runners.job import run_job  # noqa: E402
from kernelab.service.contract.schemas import JobSpec  # noqa: E402
from kernelab.service.judge.stats import compare  # noqa: E402

SPEC = {
    "name": "a-a softmax", "benchmark": "softmax", "device": "cpu",
    "baseline": {"variant": "torch"}, "candidate": {"variant": "torch"},
    "sweep": {"M": [64, 256], "N": [200, 1000], "dtype": ["float32"]},
    "measurement": {"warmup_ms": 10, "budget_ms": 1000, "min_rounds": 6, "max_rounds": 2000,
                    "order": "abba", "threshold_pct": 2.0},
    "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    spec = JobSpec.model_validate(SPEC)
    cells = []
    start = time.monotonic()
    for job in range(args.jobs):
        comparison = compare(run_job(spec))
        for c in comparison.cells:
            codes = [r.code for r in c.reasons]
            cells.append({"job": job, "cell": c.label, "verdict": c.verdict,
                          "timing_verdict": c.timing_verdict, "ratio": c.ratio, "ci": [c.ci_low, c.ci_high],
                          "reasons": codes})  # fmt: skip
    wall_s = time.monotonic() - start
    changed = ("faster", "slower")
    before = sum(
        c["verdict"] in changed
        or ("placement-disagreement" in c["reasons"] and c["timing_verdict"] in changed)
        for c in cells
    )
    after = sum(c["verdict"] in changed for c in cells)
    caught = sum("placement-disagreement" in c["reasons"] for c in cells)
    load = os.getloadavg()
    print(f"A/A cells {len(cells)} ({args.jobs} jobs, {wall_s:.0f} s, load average {load[0]:.1f}): "
          f"false faster/slower without the placement rule {before}, with it {after}; "
          f"placement-disagreement {caught}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"cells": cells, "load": load, "wall_s": wall_s}, indent=1))


if __name__ == "__main__":
    main()
