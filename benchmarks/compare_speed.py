"""How long ``kernelab.service.judge.stats.compare`` takes (a compare worker's work per result).

Usage: ``python benchmarks/compare_speed.py [--cells 1000] [--rounds 300] [--per-round 1] [--abba]
[--repeats 3]``; ``--realistic`` measures the two shapes of real jobs in turn: 1,000 cells x 300
rounds x 1 sample per side in ABBA order (the default ``measurement``: ``order: abba``, one sample
per side per round) and one cell of 1,900 rounds (a long adaptive cell).

Builds the sweep result of ``benchmarks/server_load.py`` (``sweep_result``: 2 variants x ``rounds``
x ``per_round`` samples per cell, the candidate 10% faster, 1% noise) in memory and times
``compare()`` ``--repeats`` times after one warm-up call (which also pays scipy's import). Prints
a Markdown table of the best and median wall and CPU (process) time, seconds. Recorded in
``docs/results/2026-12-01-compare-speed.md``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server_load import sweep_result, sweep_spec  # noqa: E402

from kernelab.service.contract.schemas import JobSpec  # noqa: E402
from kernelab.service.judge import stats  # noqa: E402

REALISTIC = ((1000, 300, 1), (1, 1900, 1))  # (cells, rounds, samples per side per round), ABBA


def measure(cells: int, rounds: int, per_round: int, *, abba: bool, repeats: int) -> None:
    """Time ``compare()`` on one shape and print its table."""
    spec = JobSpec.model_validate(sweep_spec(max(cells, 2)))
    result = sweep_result(1, spec, cells, rounds, per_round, abba=abba)
    stats.compare(result)  # warm-up: scipy.stats import, numpy caches
    wall, cpu = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        comparison = stats.compare(result)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    order = "ABBA" if abba else "BCBC"
    print(
        f"compare(), {cells} cells x 2 variants x {rounds} rounds x {per_round} samples ({order}), "
        f"{repeats} runs; verdicts {comparison.summary}\n"
    )
    print("| time (s) | best | median |")
    print("|---|---:|---:|")
    print(f"| wall | {min(wall):.2f} | {statistics.median(wall):.2f} |")
    print(f"| CPU | {min(cpu):.2f} | {statistics.median(cpu):.2f} |\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--per-round", type=int, default=1)
    parser.add_argument("--abba", action="store_true", help="ABBA order (the default measurement's)")
    parser.add_argument("--realistic", action="store_true", help="the shapes of real jobs (module doc)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.realistic:
        for cells, rounds, per_round in REALISTIC:
            measure(cells, rounds, per_round, abba=True, repeats=args.repeats)
        return
    measure(args.cells, args.rounds, args.per_round, abba=args.abba, repeats=args.repeats)


if __name__ == "__main__":
    main()
