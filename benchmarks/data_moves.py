"""What the samples cost on their way: engine overhead per sample, wire bytes, parse, store, stats.

Usage: ``python benchmarks/data_moves.py [--cells 1000] [--rounds 300] [--json FILE]``. Measures,
on this machine:

* ``engine_us_per_sample``: the measuring loop's own time per sample (``measure_interleaved`` over a
  ``PairTimer`` whose ``time_ns`` returns a constant at once: the median gap between two timed
  samples is the engine's bookkeeping), without and with a per-sample clock reader (a GPU runner
  reads SM clock, clock-event mask, temperature and power after every sample);
* a result of ``cells`` cells x ``rounds`` ABBA rounds (2 samples a round: 600 a cell at the
  defaults) with the four GPU context columns filled in (``--cpu``: without them): the bytes of
  its JSON document (``JobResult.model_dump_json``), the time to write it and to validate it back
  (``JobResult.model_validate_json``: what the server does with a body; ``parse_lists_s``: the
  same result as a version-1 body, JSON-list samples, as older runners post it), the time to encode its
  sample blocks (``kernelab.service.contract.sample_blocks.encode``: what the ingest stores), to decode them
  (what a read does) and ``kernelab.service.judge.stats.compare`` over the first ``--compare-cells`` cells
  read back (its bootstrap dominates and does not depend on the sample form).

The other figures are the median CPU time of ``--repeats`` runs after one warm-up. The script only uses the
schema's public API (``SampleColumns`` built from lists), so it runs unchanged on older trees.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from kernelab.runners.engine import measure_interleaved
from kernelab.service.contract import sample_blocks
from kernelab.service.contract.schemas import (
    CellResult,
    JobResult,
    JobSpec,
    MeasurementSpec,
    NodeInfo,
    SampleColumns,
    Side,
)
from kernelab.service.judge import stats


def median_s(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU time of ``fn()`` over ``repeats`` calls, seconds (after one warm-up call).

    CPU time of this process (``time.process_time``), not wall time: the figures are for
    single-threaded Python and numpy code, and a machine shared with other work would otherwise
    add its load to them."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


class _InstantPair:
    """A ``PairTimer`` that answers at once (1,000 ns per launch, 1 launch per sample) and notes
    the ``perf_counter_ns`` of every call: the gaps between calls are the engine's own time."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def time_ns(self, variant: Side, launches: int) -> float:
        self.calls.append(time.perf_counter_ns())
        return 1000.0

    def launches_for(self, variant: Side, per_launch_ns: float) -> int:
        return 1

    def timer_kind(self, variant: Side) -> str:
        return "perf_counter"

    def use_fallback(self, variant: Side) -> bool:
        return False


class _FixedClocks:
    """A ``ClockSampler`` that returns fixed readings (no NVML call: the engine's cost only)."""

    expected_sm_clock_mhz = 1980.0
    reading: Mapping[str, Any] = {
        "sm_clock_mhz": 1980.0, "clock_event_reasons": 0, "temperature_c": 41.0, "power_w": 300.0
    }  # fmt: skip

    def read(self) -> Mapping[str, Any]:
        return self.reading


def engine_us_per_sample(rounds: int, *, clocks: bool, repeats: int) -> float:
    """Microseconds of engine time per sample: the median gap between two consecutive timed
    samples over ``rounds`` rounds (the gaps of the CI checks, a few in ``rounds``, and of a
    machine's other load fall outside the median), the median over ``repeats`` runs."""
    settings = MeasurementSpec(
        warmup_ms=0.0, budget_ms=600_000, min_rounds=rounds, max_rounds=rounds, min_time_ms=0.0
    )
    sampler = _FixedClocks() if clocks else None
    medians = []
    for _ in range(repeats):
        pair = _InstantPair()
        measure_interleaved(pair, settings, sampler=sampler)
        medians.append(float(np.median(np.diff(pair.calls[-2 * rounds :]))) / 1e3)
    return statistics.median(medians)


def sweep_result(cells: int, rounds: int, *, context: bool = True) -> JobResult:
    """A valid result of ``cells`` cells x ``rounds`` ABBA rounds, with the GPU context columns
    (``context``) or without (a CPU runner's samples: 1 launch, no clocks)."""
    rng = np.random.default_rng(0)
    n = 2 * rounds
    variant: list[Side] = [("baseline", "candidate")[(i + i // 2) % 2] for i in range(n)]  # ABBA
    round_ = [i // 2 for i in range(n)]
    position = [i % 2 for i in range(n)]
    out = []
    for i in range(cells):
        factor = np.where(np.array(variant) == "candidate", 0.9, 1.0)
        duration = 1e4 * (1 + i % 17) * factor * (1 + 0.01 * rng.standard_normal(n))
        columns: dict[str, Any] = {
            "variant": variant, "round": round_, "position": position, "duration_ns": duration.tolist(),
            "launches": [16] * n, "sm_clock_mhz": (1980.0 - rng.integers(0, 30, n)).astype(float).tolist(),
            "clock_event_reasons": [0] * n, "temperature_c": (40 + rng.random(n)).tolist(),
            "power_w": (300 + 10 * rng.random(n)).tolist(), "throttled": [False] * n,
        }  # fmt: skip
        if not context:
            columns = {k: columns[k] for k in ("variant", "round", "position", "duration_ns")}
        out.append(CellResult(index=i, params={"N": 16 + i}, samples=SampleColumns(**columns)))
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    spec = JobSpec(benchmark="softmax", baseline={"variant": "torch"}, candidate={"variant": "triton"})
    return JobResult(
        idempotency_key="data-moves-bench", job_id=1, spec=spec, timer="cuda-event",
        node=NodeInfo(hostname="bench", device_type="cuda"), started_at=t0,
        finished_at=t0 + timedelta(minutes=5), cells=out,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--engine-rounds", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-cells", type=int, default=50, help="cells of the stats.compare figure")
    parser.add_argument("--cpu", action="store_true", help="samples without the four GPU context columns")
    parser.add_argument("--json", dest="json_path", default=None, help="write the figures as JSON")
    args = parser.parse_args()
    out: dict[str, Any] = {}
    for clocks in (False, True):
        key = f"engine_us_per_sample{'_with_clocks' if clocks else ''}"
        out[key] = round(engine_us_per_sample(args.engine_rounds, clocks=clocks, repeats=args.repeats), 3)
        print(f"{key}: {out[key]} us")
    result = sweep_result(args.cells, args.rounds, context=not args.cpu)
    body = result.model_dump_json().encode()
    out["samples"] = sum(len(c.samples) for c in result.cells)
    out["body_bytes"] = len(body)
    out["dump_s"] = round(median_s(result.model_dump_json, args.repeats), 3)
    out["parse_s"] = round(median_s(lambda: JobResult.model_validate_json(body), args.repeats), 3)
    if hasattr(SampleColumns, "to_lists"):  # the same result as a version-1 body (JSON-list samples)
        doc = json.loads(body)
        for cell, posted in zip(doc["cells"], result.cells, strict=True):
            cell["samples"] = posted.samples.to_lists()
        lists_body = json.dumps(doc).encode()
        out["lists_body_bytes"] = len(lists_body)
        out["parse_lists_s"] = round(
            median_s(lambda: JobResult.model_validate_json(lists_body), args.repeats), 3
        )
    parsed = JobResult.model_validate_json(body)
    blocks = [sample_blocks.encode(c.samples) for c in parsed.cells]
    out["encode_blocks_s"] = round(median_s(lambda: [sample_blocks.encode(c.samples) for c in parsed.cells],
                                            args.repeats), 3)  # fmt: skip
    out["decode_blocks_s"] = round(
        median_s(lambda: [sample_blocks.decode(b) for b in blocks], args.repeats), 3
    )
    back = parsed.model_copy(
        update={
            "cells": [
                c.model_copy(update={"samples": sample_blocks.decode(b)})
                for c, b in zip(parsed.cells, blocks, strict=True)
            ]
        }  # fmt: skip
    )
    few = back.model_copy(update={"cells": back.cells[: args.compare_cells]})
    out["compare_s"] = round(median_s(lambda: stats.compare(few), 1), 3)
    for key in (
        "samples",
        "body_bytes",
        "dump_s",
        "parse_s",
        "encode_blocks_s",
        "decode_blocks_s",
        "compare_s",
    ):
        print(f"{key}: {out.get(key)}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=2)


if __name__ == "__main__":
    main()
