"""How long ``kernelab.service.stats.compare`` takes on a 1,000-cell sweep
(the server's background comparison).

Usage: ``python benchmarks/compare_speed.py [--cells 1000] [--rounds 3] [--per-round 100] [--repeats 3]``.

Builds the sweep result of ``benchmarks/server_load.py`` (``sweep_result``: 2 variants x ``rounds``
x ``per_round`` samples per cell, the candidate 10% faster, 1% noise) in memory and times
``compare()`` ``--repeats`` times after one warm-up call (which also pays scipy's import). Prints
a Markdown table of the best and median wall and CPU (process) time, seconds. Target: <= 3 s for
the default sweep on the 2-core CI machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_load import sweep_result, sweep_spec  # noqa: E402

from kernelab.service import stats  # noqa: E402
from kernelab.service.schemas import JobSpec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    spec = JobSpec.model_validate(sweep_spec(args.cells))
    result = sweep_result(1, spec, args.cells, args.rounds, args.per_round)
    stats.compare(result)  # warm-up: scipy.stats import, numpy caches
    wall, cpu = [], []
    for _ in range(args.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        comparison = stats.compare(result)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    print(
        f"compare(), {args.cells} cells x 2 variants x {args.rounds} rounds x {args.per_round} samples, "
        f"{args.repeats} runs; verdicts {comparison.summary}\n"
    )
    print("| time (s) | best | median |")
    print("|---|---:|---:|")
    print(f"| wall | {min(wall):.2f} | {statistics.median(wall):.2f} |")
    print(f"| CPU | {min(cpu):.2f} | {statistics.median(cpu):.2f} |")


if __name__ == "__main__":
    main()
