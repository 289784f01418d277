"""How long ``kernelab.service.judge.stats`` takes: ``ratio_ci`` (the engine's adaptive stop) and ``compare``.

Usage: ``python benchmarks/stats_speed.py [--rounds 200] [--repeats 20]``. Prints the median wall
time of ``ratio_ci`` over ``rounds`` ABBA rounds (target: < 20 ms for 200 rounds, 2000 resamples,
since the engine calls it every few rounds) and of ``compare`` on a 16-cell sweep.
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime

import numpy as np

from kernelab.service.contract.schemas import CellResult, JobResult, JobSpec, NodeInfo, Sample, SampleColumns
from kernelab.service.judge import estimators, stats


def synthetic_samples(rounds: int, seed: int) -> list[Sample]:
    """``rounds`` rounds of one baseline (10 µs) and one candidate (10.3 µs) sample, 1% noise."""
    rng = np.random.default_rng(seed)
    return [
        Sample(
            variant=v,
            round=r,
            position=p,
            duration_ns=(10_000.0 if v == "baseline" else 10_300.0) * (1 + 0.01 * rng.standard_normal()),
        )
        for r in range(rounds)
        for p, v in enumerate(("baseline", "candidate"))
    ]


def median_ms(fn, repeats: int) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls, milliseconds (after one warm-up call)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    samples = SampleColumns.from_rows(synthetic_samples(args.rounds, seed=0))
    print(
        f"ratio_ci, {args.rounds} rounds, 2000 resamples: "
        f"{median_ms(lambda: estimators.ratio_ci(samples), args.repeats):.2f} ms"
    )
    now = datetime.now(UTC)
    result = JobResult(
        idempotency_key="stats-speed",
        node=NodeInfo(hostname="bench", device_type="cpu"),
        timer="perf_counter",
        started_at=now,
        finished_at=now,
        spec=JobSpec(benchmark="softmax", baseline={"variant": "torch"}, candidate={"variant": "triton"}),
        cells=[
            CellResult(index=i, params={"N": i}, samples=synthetic_samples(args.rounds, seed=i))
            for i in range(16)
        ],
    )
    print(f"compare, 16 cells x {args.rounds} rounds: {median_ms(lambda: stats.compare(result), 3):.1f} ms")


if __name__ == "__main__":
    main()
