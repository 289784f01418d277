"""Where the quick probe's wall time goes, and all-reduce latency by timing method (2+ GPUs).

Run on a node with at least two CUDA GPUs::

    python benchmarks/probe_latency.py OUT [--repeats 3]

Parts:

* ``timeline``: ``--repeats`` quick probes as ``run_probes`` runs them (ranks started, copy probe
  while they initialise, then ``go``), with each rank's stages in seconds from the start: Python
  and ``import torch`` done (``imported``), NCCL communicator up (``initialised``), groups made
  (``ready``), ``go`` seen, measurements done; plus the parent's copy probe time and the whole
  ``run_probes(quick)`` wall time (target: <= 3 s on 2 GPUs).
* ``pool``: the same quick probe with the runner daemon's ``AllReducePool`` (ranks started once,
  as every job of a runner gets it), ``2 * --repeats`` times.
* ``methods``: all-reduce at 8 B, 1 MiB, 64 MiB over all GPUs, ``--repeats`` runs per timing
  (``cuda-events`` behind a spin kernel, ``host-clock`` as nccl-tests) and one CUDA-graph run
  (reference: nccl-tests 19.5 us at 8 B on 2xH200, target <= 1.15x = 22.4 us).

Writes ``OUT/probe_latency.json`` and prints Markdown tables last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIB = 1024**2


def part_timeline(repeats: int, out: dict[str, Any]) -> list[str]:
    from kernelab.runners.probes import run_probes
    from kernelab.runners.probes.all_reduce import start_all_reduce
    from kernelab.runners.probes.copy_bandwidth import measure_copy_bandwidth
    from kernelab.service.contract.schemas import ProbeSpec

    rows = []
    for i in range(repeats):
        t0 = time.perf_counter()
        with start_all_reduce("cuda") as run:
            t_started = time.perf_counter() - t0
            measure_copy_bandwidth("cuda")
            t_copy = time.perf_counter() - t0
            run.go()
            readings, _ = run.wait()
        wall = time.perf_counter() - t0
        rows.append(
            {
                "run": i,
                "spawned_s": t_started,
                "copy_done_s": t_copy,
                "wall_s": wall,
                "ranks": run.timeline,
                "8B_us": readings[0].time_us,
            }
        )
    walls = []
    for _ in range(repeats):
        report = run_probes(ProbeSpec(mode="quick"), "adhoc", device_type="cuda")
        walls.append(report.wall_s)
        if report.errors:
            print("probe errors:", report.errors, flush=True)
    out["timeline"], out["quick_probe_wall_s"] = rows, walls
    lines = [
        "| run | ranks spawned | copy probe done | rank imported | NCCL initialised | ready | go | "
        "measured | total |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:

        def stage(name: str, r: dict[str, Any] = r) -> str:
            return f"{max(t.get(name, float('nan')) for t in r['ranks']):.2f}"

        lines.append(
            f"| {r['run']} | {r['spawned_s']:.2f} | {r['copy_done_s']:.2f} | {stage('imported')} | "
            f"{stage('initialised')} | {stage('ready')} | {stage('go')} | {stage('measured')} | "
            f"{r['wall_s']:.2f} |"
        )
    lines += [
        "",
        "(seconds from the start; rank stages: the slowest rank)",
        "",
        f"run_probes(quick) wall: {', '.join(f'{w:.2f}' for w in walls)} s (target <= 3 s)",
    ]
    return lines


def part_pool(repeats: int, out: dict[str, Any]) -> list[str]:
    """Quick probes as a runner's jobs get them: with the daemon's ``AllReducePool`` (ranks up)."""
    from kernelab.runners.probes import run_probes
    from kernelab.runners.probes.all_reduce import AllReducePool, set_pool
    from kernelab.service.contract.schemas import ProbeSpec

    t0 = time.perf_counter()
    with AllReducePool("cuda") as pool:
        first, _ = pool.measure()
        start_s = time.perf_counter() - t0
        set_pool(pool)
        try:
            reports = [
                run_probes(ProbeSpec(mode="quick"), "before", device_type="cuda") for _ in range(repeats * 2)
            ]
        finally:
            set_pool(None)
    walls = [r.wall_s for r in reports]
    eight = [r.all_reduce[0].time_us for r in reports if r.all_reduce]
    out["pool"] = {
        "start_and_first_request_s": start_s,
        "quick_probe_wall_s": walls,
        "8B_us": eight,
        "errors": [r.errors for r in reports if r.errors],
    }
    return [
        f"pool start + first request: {start_s:.2f} s (once per runner)",
        f"run_probes(quick) with the pool: {', '.join(f'{w:.2f}' for w in walls)} s (target <= 3 s); "
        f"8 B {', '.join(f'{e:.1f}' for e in eight)} us; errors {out['pool']['errors'] or 'none'}",
    ]


def part_methods(repeats: int, out: dict[str, Any]) -> list[str]:
    from kernelab.runners.probes.all_reduce import measure_all_reduce

    sizes = [8, MIB, 64 * MIB]
    table: dict[str, list[list[float]]] = {}
    for timing in ("cuda-events", "host-clock"):
        for _ in range(repeats):
            readings = measure_all_reduce("cuda", sizes_bytes=sizes, timing=timing)
            table.setdefault(timing, []).append([r.time_us for r in readings])
    graph = measure_all_reduce("cuda", sizes_bytes=sizes, cuda_graph=True)
    table["cuda-graph replay"] = [[r.time_us for r in graph if r.cuda_graph]]
    busbw = {r.size_bytes: r.busbw_gbps for r in graph if not r.cuda_graph}
    out["methods"] = table
    lines = ["| timing | 8 B us (runs) | 1 MiB us (runs) | 64 MiB us (runs) |", "| --- | --- | --- | --- |"]
    for name, runs in table.items():
        cols = [", ".join(f"{run[i]:.1f}" for run in runs) for i in range(len(sizes))]
        lines.append(f"| {name} | {' | '.join(cols)} |")
    ev8 = statistics.median(run[0] for run in table["cuda-events"])
    lines += [
        "",
        f"cuda-events 8 B median {ev8:.1f} us = {ev8 / 19.5:.2f}x nccl-tests' 19.5 us "
        f"(target <= 1.15x); 64 MiB busbw {busbw.get(64 * MIB, float('nan')):.1f} GB/s",
    ]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--parts", default="methods,timeline,pool", help="comma-separated parts to run")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    import torch

    if torch.cuda.device_count() < 2:
        raise SystemExit("probe_latency.py needs at least two CUDA GPUs")
    args.out.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"gpus": torch.cuda.device_count(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    lines = [f"# {torch.cuda.get_device_name()} x{out['gpus']} torch {torch.__version__} {out['date']}", ""]
    for name, part in (("methods", part_methods), ("timeline", part_timeline), ("pool", part_pool)):
        if name in parts:
            lines += part(args.repeats, out) + [""]
    (args.out / "probe_latency.json").write_text(json.dumps(out, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
