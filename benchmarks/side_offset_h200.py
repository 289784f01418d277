"""Where a steady A/A offset between two sides comes from: output buffer, graph instance or input.

Runs on one GPU. For a kernel, many *instances* of the same call are timed interleaved, in a
random order per round, through kernelab's own timers (``CudaGraphTimer`` as the default method
uses it, and a hot ``CudaEventTimer``): instances differ only in their output buffer (``b``), the
graph captured for them (``c``: two captures of the same call on the same buffers) or the input
buffer (``x``). Each instance's time is divided by the median of its round (drift cancels) and the
median of those ratios, with a bootstrap 95% CI over rounds, says how far it sits from the rest.
A spread across ``b`` at fixed ``c`` is an output-placement effect; across ``c`` at fixed ``b`` a
graph-instance effect.

Kernels: ``mul`` (``torch.mul(x, 1.0001, out=y)``, 2**27 float32, ~255 us, 4 launches per
sample) and ``one`` (a one-element softmax, ~1 us, ~950 launches per sample).

Usage: ``python benchmarks/side_offset_h200.py OUT [--rounds 200]`` (JSON lines to
``OUT/side_offset.jsonl``, a table on stdout).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kernelab.runners.timing import CudaEventTimer, CudaGraphTimer


def _instances(kernel: str, device: torch.device) -> tuple[dict[str, Callable[[], Any]], int]:
    g = torch.Generator(device=device).manual_seed(0)
    if kernel == "mul":
        n = 2**27
        xs = [torch.rand(n, generator=g, device=device) for _ in range(2)]
        ys = [torch.empty_like(xs[0]) for _ in range(4)]
        launches = 4
        fns: dict[str, Callable[[], Any]] = {}
        for b in range(4):
            for c in range(2):
                fns[f"graph b{b} c{c} x0"] = (lambda x, y: lambda: torch.mul(x, 1.0001, out=y))(xs[0], ys[b])
        fns["graph b0 c2 x1"] = (lambda x, y: lambda: torch.mul(x, 1.0001, out=y))(xs[1], ys[0])
        fns["graph b1 c2 x1"] = (lambda x, y: lambda: torch.mul(x, 1.0001, out=y))(xs[1], ys[1])
        for b in range(4):
            fns[f"event b{b} x0"] = (lambda x, y: lambda: torch.mul(x, 1.0001, out=y))(xs[0], ys[b])
        return fns, launches
    x = torch.rand(1, 1, generator=g, device=device)
    outs = [torch.empty_like(x) for _ in range(4)]
    fns = {}
    for b in range(4):
        for c in range(2):
            fns[f"graph b{b} c{c} x0"] = (lambda o: lambda: torch.softmax(x, dim=-1, out=o))(outs[b])
    for b in range(4):
        fns[f"event b{b} x0"] = (lambda o: lambda: torch.softmax(x, dim=-1, out=o))(outs[b])
    return fns, 950


def run(kernel: str, rounds: int, seed: int) -> list[dict[str, Any]]:
    device = torch.device("cuda", 0)
    graph_timer = CudaGraphTimer(device, l2_flush=True, eager_nodes_only=True)
    event_timer = CudaEventTimer(device, l2_flush=False)
    fns, launches = _instances(kernel, device)
    names = list(fns)
    ev_launches = min(launches, 500)

    def time_one(name: str) -> float:
        if name.startswith("graph"):
            return graph_timer.time_ns(fns[name], launches)
        return event_timer.time_ns(fns[name], ev_launches)

    for _ in range(3):  # warm-up: captures, calibration
        for name in names:
            time_one(name)
    rng = np.random.default_rng(seed)
    t = np.empty((rounds, len(names)))
    for r in range(rounds):
        for i in rng.permutation(len(names)):
            t[r, i] = time_one(names[i])
    rows = []
    for group in ("graph", "event"):
        cols = [i for i, n in enumerate(names) if n.startswith(group)]
        sub = t[:, cols]
        rel = sub / np.median(sub, axis=1, keepdims=True)
        boot = np.empty((1000, len(cols)))
        for k in range(1000):
            pick = rng.integers(0, rounds, rounds)
            boot[k] = np.median(rel[pick], axis=0)
        for j, i in enumerate(cols):
            lo, hi = np.percentile(boot[:, j], [2.5, 97.5])
            rows.append({
                "kernel": kernel, "instance": names[i], "median_ns": float(np.median(t[:, i])),
                "rel_pct": 100 * (float(np.median(rel[:, j])) - 1),
                "ci_pct": [100 * (lo - 1), 100 * (hi - 1)],
                "iqr_pct": 100 * float(np.subtract(*np.percentile(t[:, i], [75, 25])) / np.median(t[:, i])),
                "rounds": rounds,
            })  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--kernels", default="mul,one")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    lines = ["| kernel | instance | median ns | vs round median % [95% CI] | IQR % |",
             "| --- | --- | ---: | --- | ---: |"]  # fmt: skip
    with open(args.out / "side_offset.jsonl", "a") as log:
        for kernel in args.kernels.split(","):
            for row in run(kernel, args.rounds, seed=1):
                log.write(json.dumps(row) + "\n")
                lo, hi = row["ci_pct"]
                lines.append(
                    f"| {kernel} | {row['instance']} | {row['median_ns']:.1f} | "
                    f"{row['rel_pct']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {row['iqr_pct']:.2f} |"
                )
            torch.cuda.empty_cache()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
