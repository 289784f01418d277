"""Issue 18's acceptance runs on one GPU: copies, A/A placement, sensitivity, power state, energy.

Subcommands (each appends JSON lines to ``OUT/artefacts.jsonl`` and prints a short table):

* ``copy RUNS``: 1 GiB float32 ``copy_`` A/A and 3%-more-bytes jobs under the default method
  (``timer: auto``), with ``triton.testing.do_bench``'s median beside [1 GiB within 3% of do_bench;
  3% case ``slower`` at 1.03-1.06; A/A never faster/slower];
* ``aa KERNEL RUNS [--placement rotate|fixed]``: RUNS A/A jobs of ``one`` (a one-element float32
  softmax, its output allocated per side), ``copy`` (1 GiB copy) or ``mm`` (bf16 8192^3 torch.mm)
  in this process [never faster/slower]; each row records the per-launch difference candidate -
  baseline (ns) and the timer cross-check;
* ``sens RUNS``: RUNS jobs of a 0.5% slower elementwise kernel (~240 us, ``scaledbench``) and RUNS
  A/A jobs, ``budget_ms`` 10,000, threshold 0.25% [19/20 ``slower``, 0/20 false];
* ``state``: the bf16 matmul's per-launch time and SM clock, one launch after an idle gap (cold) vs
  back-to-back graph replays for 3 s (sustained);
* ``energy``: the NVML total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, mJ): its
  update step and period under load, and joules per launch of the matmul and the 1 GiB copy.

Usage::

    PYTHONPATH=benchmarks:$PYTHONPATH python benchmarks/timing_artefacts_h200.py OUT SUBCOMMAND ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

GIB_ELEMENTS = 2**28  # float32 elements in 1 GiB
_PROBES_OFF = {"copy_bandwidth": False, "all_reduce": False, "nvml": False, "matmul_peak": False}


def _spec(kernel: str, seed: int, placement: str = "rotate", **measurement: Any) -> Any:
    from kernelab.service.contract.schemas import JobSpec

    m = {"seed": seed, "placement": placement, **measurement}
    if kernel == "one":
        body = {"benchmark": "softmax", "baseline": {"variant": "torch"}, "candidate": {"variant": "torch"},
                "params": {"M": 1, "N": 1, "dtype": "float32"}}  # fmt: skip
    elif kernel == "copy":
        body = {"benchmark": "copybench:DeviceCopy",
                "baseline": {"variant": "copy", "params": {"n": GIB_ELEMENTS}},
                "candidate": {"variant": "copy", "params": {"n": GIB_ELEMENTS}}}  # fmt: skip
    elif kernel == "copy3":
        body = {"benchmark": "copybench:DeviceCopy",
                "baseline": {"variant": "copy", "params": {"n": GIB_ELEMENTS}},
                "candidate": {"variant": "copy", "params": {"n": round(1.03 * GIB_ELEMENTS)}}}  # fmt: skip
    elif kernel == "mm":
        body = {"benchmark": "matmul", "baseline": {"variant": "torch"}, "candidate": {"variant": "torch"},
                "params": {"M": 8192, "N": 8192, "K": 8192, "dtype": "bfloat16"}}  # fmt: skip
    elif kernel in ("sens", "sens-aa"):
        extra = 0.5 if kernel == "sens" else 0.0
        body = {"benchmark": "scaledbench:ScaledMul", "baseline": {"variant": "mul"},
                "candidate": {"variant": "mul", "params": {"extra_pct": extra}}}  # fmt: skip
    else:
        raise SystemExit(f"unknown kernel {kernel!r}")
    return JobSpec.model_validate(
        {"name": kernel, **body, "measurement": m, "probes": _PROBES_OFF, "correctness": {"enabled": False}}
    )


def _job(
    kernel: str, seed: int, placement: str = "rotate", *, isolate: bool = True, **measurement: Any
) -> dict[str, Any]:
    """One job of ``kernel``: in a fresh measuring process (``isolate``, what a runner does) or in
    this process (``run_job(isolate=False)``: several jobs share one CUDA context and allocator)."""
    from kernelab.runners.job import run_job
    from kernelab.service.judge.report import cross_check_line
    from kernelab.service.judge.stats import compare

    t0 = time.time()
    result = run_job(_spec(kernel, seed, placement, **measurement), isolate=isolate)
    c = compare(result).cells[0]
    cell = result.cells[0]
    clock = cell.samples.sm_clock_mhz
    return {
        "kernel": kernel, "seed": seed, "placement": cell.placement.input_sets, "verdict": c.verdict,
        "process": "fresh" if isolate else "shared",
        "ratio": c.ratio, "ci": [c.ci_low, c.ci_high], "flags": c.flags,
        "baseline_ns": c.baseline.median_ns, "candidate_ns": c.candidate.median_ns,
        "diff_ns": None if c.baseline.median_ns is None else c.candidate.median_ns - c.baseline.median_ns,
        "timers": cell.timers, "cross": cross_check_line(c),
        "cross_disagrees": bool(c.cross_check and c.cross_check.disagrees),
        "rounds": int(cell.samples.round.max()) + 1 if len(cell.samples) else 0,
        "launches": int(statistics.median(cell.samples.launches.tolist())) if len(cell.samples) else None,
        "sm_clock_median": float(statistics.median(clock.tolist())) if len(clock) else None,
        "wall_s": round(time.time() - t0, 2), "phase_s": cell.phase_s, "error": cell.error,
        "reasons": [r.code for r in c.reasons],
        "strata": _strata(cell),
    }  # fmt: skip


def _strata(cell: Any) -> list[dict[str, Any]]:
    """Per input-set assignment of the cell's rotation: each side's median (ns) over all its
    samples there and over the samples that are not its first in a block of that assignment (the
    first finds state the other assignments' buffers and graphs evicted), and the ratio."""
    import numpy as np

    from kernelab.service.judge.estimators import placement_strata

    s = cell.samples
    if not len(s):
        return []
    rounds = np.asarray(s.round)
    strata = placement_strata(rounds, cell.placement.input_sets, cell.placement.swap_every_rounds)
    if strata is None:
        return []
    cand = np.asarray(s.variant) == 1
    ns = np.asarray(s.duration_ns, dtype=float)
    first = (rounds % cell.placement.swap_every_rounds) == 0
    out = []
    for k in np.unique(strata):
        row: dict[str, Any] = {"stratum": int(k)}
        for side, own in (("baseline", ~cand), ("candidate", cand)):
            sel = own & (strata == k)
            row[side] = float(np.median(ns[sel])) if sel.any() else None
            rest = sel & ~first
            row[side + "_not_first_round"] = float(np.median(ns[rest])) if rest.any() else None
        if row["baseline"] and row["candidate"]:
            row["ratio"] = row["candidate"] / row["baseline"]
        out.append(row)
    return out


def _do_bench_copy_us(n: int) -> float:
    import triton.testing

    x = torch.rand(n, device="cuda")
    y = torch.empty_like(x)
    ms = triton.testing.do_bench(lambda: y.copy_(x), warmup=100, rep=1000, return_mode="median")
    x = y = torch.empty(0)
    torch.cuda.empty_cache()
    return float(ms) * 1e3


def _summary(rows: list[dict[str, Any]]) -> str:
    lines = ["| kernel | process | input sets | runs | verdicts | ratio range | diff ns median | "
             "cross disagree | wall s median |",
             "| --- | --- | ---: | ---: | --- | --- | ---: | ---: | ---: |"]  # fmt: skip
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["kernel"], r.get("process", "fresh"), r["placement"]), []).append(r)
    for (kernel, process, placement), rs in groups.items():
        counts: dict[str, int] = {}
        for r in rs:
            counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        ratios = [r["ratio"] for r in rs if r["ratio"] is not None]
        diffs = [r["diff_ns"] for r in rs if r["diff_ns"] is not None]
        lines.append(
            f"| {kernel} | {process} | {placement} | {len(rs)} | {counts} | "
            f"{min(ratios, default=float('nan')):.4f}-{max(ratios, default=float('nan')):.4f} | "
            f"{statistics.median(diffs) if diffs else float('nan'):.1f} | "
            f"{sum(r['cross_disagrees'] for r in rs)} | {statistics.median(r['wall_s'] for r in rs):.1f} |"
        )
    return "\n".join(lines)


def cmd_copy(args: argparse.Namespace, log: Any) -> str:
    truth = {
        "1 GiB": _do_bench_copy_us(GIB_ELEMENTS),
        "1.03 GiB": _do_bench_copy_us(round(1.03 * GIB_ELEMENTS)),
    }
    log.write(json.dumps({"part": "copy", "do_bench_median_us": truth}) + "\n")
    rows = []
    for kernel in ("copy", "copy3"):
        for i in range(args.runs):
            row = _job(kernel, i, budget_ms=3000.0)
            log.write(json.dumps({"part": "copy", **row}) + "\n")
            log.flush()
            rows.append(row)
    base = statistics.median(r["baseline_ns"] for r in rows) / 1e3
    return (
        f"do_bench 1 GiB {truth['1 GiB']:.1f} us, 1.03 GiB {truth['1.03 GiB']:.1f} us "
        f"(ratio {truth['1.03 GiB'] / truth['1 GiB']:.4f}); kernelab 1 GiB median {base:.1f} us "
        f"({base / truth['1 GiB']:.4f} of do_bench)\n" + _summary(rows)
    )


def cmd_aa(args: argparse.Namespace, log: Any) -> str:
    rows = []
    for kernel in args.kernels.split(","):
        for placement in args.placement.split(","):
            for i in range(args.runs):
                extra: dict[str, Any] = {} if args.timer == "auto" else {"timer": args.timer}
                if args.input_sets:
                    extra["input_sets"] = args.input_sets
                if args.sens_settings:  # the settings of the sensitivity runs (``cmd_sens``)
                    extra.update(budget_ms=10_000.0, threshold_pct=0.25, target_ci_pct=0.1)
                row = _job(kernel, args.seed + i, placement, isolate=not args.in_process, **extra)
                log.write(json.dumps({"part": "aa", "timer": args.timer, **row}) + "\n")
                log.flush()
                rows.append(row)
    return _summary(rows)


def cmd_sens(args: argparse.Namespace, log: Any) -> str:
    rows = []
    for kernel in ("sens", "sens-aa"):
        for i in range(args.runs):
            row = _job(
                kernel,
                i,
                isolate=not args.in_process,
                budget_ms=args.budget_ms,
                threshold_pct=0.25,
                target_ci_pct=0.1,
            )
            log.write(json.dumps({"part": "sens", **row}) + "\n")
            log.flush()
            rows.append(row)
    return _summary(rows)


def cmd_graph1(args: argparse.Namespace, log: Any) -> str:
    """The one-element softmax by a hand CUDA-graph replay (1,000 launches per graph, 50 replays,
    median per launch) beside kernelab's default method in the same process."""
    x = torch.rand(1, 1, device="cuda")
    out = torch.empty_like(x)
    fn = lambda: torch.softmax(x, dim=-1, out=out)  # noqa: E731
    for _ in range(10):
        fn()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(1000):
            fn()
    per = []
    for _ in range(50):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        per.append(s.elapsed_time(e) * 1e6 / 1000)
    hand = statistics.median(per)
    row = _job("one", 0, isolate=False)
    ratio = row["baseline_ns"] / hand
    log.write(json.dumps({"part": "graph1", "hand_graph_ns": hand, "kernelab": row, "ratio": ratio}) + "\n")
    lines = [
        f"one-element softmax: hand graph replay {hand:.1f} ns/launch, "
        f"kernelab {row['baseline_ns']:.1f} ns ({ratio:.3f}x); launches per sample {row.get('launches')}"
    ]
    # where the difference comes from: kernelab's graph timer alone, by launches and L2 flush, beside
    # hand replays of the same launch counts (one graph each, 30 replays, median per launch)
    from kernelab.runners.timing import CudaGraphTimer

    for launches in (100, 1000, 10_000):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(launches):
                fn()
        per = []
        for _ in range(30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            per.append(s.elapsed_time(e) * 1e6 / launches)
        cells = {"hand": statistics.median(per)}
        for flush in (True, False):
            timer = CudaGraphTimer(torch.device("cuda"), l2_flush=flush)
            cells[f"timer flush={flush}"] = statistics.median(timer.time_ns(fn, launches) for _ in range(30))
        log.write(json.dumps({"part": "graph1-launches", "launches": launches, **cells}) + "\n")
        lines.append(f"launches {launches}: " + ", ".join(f"{k} {v:.1f} ns" for k, v in cells.items()))
    return "\n".join(lines)


def cmd_engine(args: argparse.Namespace, log: Any) -> str:
    """``measurement.state`` and ``measurement.energy`` through the engine (in this process): the
    bf16 matmul A/A cold and sustained with energy, the 1 GiB copy and its 3%-more-bytes candidate
    with energy; each row has the medians, the SM clocks, the energy line."""
    from kernelab.runners.job import run_job
    from kernelab.service.judge.report import energy_line, side_time
    from kernelab.service.judge.stats import compare

    lines = []
    for kernel, state in (("mm", "cold"), ("mm", "sustained"), ("copy", "cold"), ("copy3", "cold"),
                          ("copy3", "sustained")):  # fmt: skip
        t0 = time.time()
        spec = _spec(kernel, 0, "rotate", state=state, energy=True)
        result = run_job(spec, isolate=False)
        c = compare(result).cells[0]
        cell = result.cells[0]
        row = {
            "part": "engine", "kernel": kernel, "state": state, "verdict": c.verdict, "ratio": c.ratio,
            "ci": [c.ci_low, c.ci_high], "baseline": side_time(c.baseline),
            "candidate": side_time(c.candidate), "baseline_ns": c.baseline.median_ns,
            "sm_clock": [c.baseline.sm_clock_mhz, c.candidate.sm_clock_mhz],
            "energy": None if c.energy is None else c.energy.model_dump(mode="json"),
            "energy_line": energy_line(c), "wall_s": round(time.time() - t0, 2), "phase_s": cell.phase_s,
            "reasons": [r.code for r in c.reasons], "error": cell.error,
        }  # fmt: skip
        log.write(json.dumps(row) + "\n")
        log.flush()
        lines.append(f"{kernel} {state}: {c.verdict} {c.ratio} | {row['baseline']} vs {row['candidate']} | "
                     f"{row['energy_line']} | wall {row['wall_s']} s")  # fmt: skip
    return "\n".join(lines)


def _nvml_handle() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def cmd_state(args: argparse.Namespace, log: Any) -> str:
    nv, h = _nvml_handle()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b, out=out)
    torch.cuda.synchronize()
    cold, cold_clock = [], []
    for _ in range(20):
        time.sleep(0.2)  # an idle gap, as between kernelab's one-launch samples and the flush
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.mm(a, b, out=out)
        e.record()
        e.synchronize()
        cold.append(s.elapsed_time(e) * 1e3)
        cold_clock.append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(20):
            torch.mm(a, b, out=out)
    sustained, clocks, power, stamps = [], [], [], []
    t_begin = time.time()
    t_end = time.time() + 3.0
    while time.time() < t_end:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        g.replay()
        e.record()
        e.synchronize()
        sustained.append(s.elapsed_time(e) * 1e3 / 20)
        clocks.append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        stamps.append(round(time.time() - t_begin, 4))
        power.append(nv.nvmlDeviceGetPowerUsage(h) / 1e3)
    last = sustained[len(sustained) // 2 :]
    row = {
        "part": "state", "cold_us_median": statistics.median(cold),
        "cold_sm_mhz": [min(cold_clock), max(cold_clock)],
        "sustained_us_first": sustained[0], "sustained_us_last_half_median": statistics.median(last),
        "sustained_sm_mhz_last_half": [min(clocks[len(clocks) // 2 :]), max(clocks[len(clocks) // 2 :])],
        "power_w_last_half_median": statistics.median(power[len(power) // 2 :]),
        "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3, "replays": len(sustained),
        "series": {"t_s": stamps, "us_per_launch": sustained, "sm_mhz": clocks},
    }  # fmt: skip
    top = max(clocks[len(clocks) // 2 :])  # the highest clock of the settled half
    settle = next((t for t, mhz in zip(stamps, clocks, strict=True) if mhz <= top), None)
    row["settled_after_s"] = settle
    log.write(json.dumps(row) + "\n")
    return json.dumps({k: v for k, v in row.items() if k != "series"})


def cmd_energy(args: argparse.Namespace, log: Any) -> str:
    nv, h = _nvml_handle()
    energy = lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h)  # noqa: E731  (mJ since driver load)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    x = torch.rand(GIB_ELEMENTS, device="cuda")
    y = torch.empty_like(x)
    kernels = {"bf16 8192^3 mm": lambda: torch.mm(a, b, out=out), "1 GiB copy": lambda: y.copy_(x)}
    # the counter's step and update period, under load (the matmul back to back)
    steps, changes, last, t_last = [], [], energy(), time.perf_counter()
    t_end = time.perf_counter() + 1.0
    while time.perf_counter() < t_end:
        for _ in range(4):
            kernels["bf16 8192^3 mm"]()
        torch.cuda.synchronize()
        now = energy()
        if now != last:
            t = time.perf_counter()
            steps.append(now - last)
            changes.append(t - t_last)
            last, t_last = now, t
    lines = [f"NVML energy counter: {len(steps)} changes in 1 s under load; step min {min(steps)} mJ, "
             f"median period {1e3 * statistics.median(changes[1:]):.1f} ms"]  # fmt: skip
    log.write(json.dumps({"part": "energy-counter", "steps_mj": steps, "periods_s": changes}) + "\n")
    for name, fn in kernels.items():
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        per = []
        for _ in range(5):  # rounds of ~1 s: many counter updates per round
            launches = 0
            e0, t0 = energy(), time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                for _ in range(10):
                    fn()
                launches += 10
                torch.cuda.synchronize()
            e1 = energy()
            per.append((e1 - e0) / 1e3 / launches)
        row = {"part": "energy", "kernel": name, "joules_per_launch": per}
        log.write(json.dumps(row) + "\n")
        lines.append(f"{name}: {statistics.median(per) * 1e3:.2f} mJ per launch (5 rounds of 1 s: "
                     f"{min(per) * 1e3:.2f}-{max(per) * 1e3:.2f})")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("copy")
    p.add_argument("runs", type=int)
    p = sub.add_parser("aa")
    p.add_argument("kernels")
    p.add_argument("runs", type=int)
    p.add_argument("--placement", default="rotate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timer", default="auto", help="measurement.timer of every job")
    p.add_argument("--sens-settings", action="store_true", help="budget, threshold and CI target of sens")
    p.add_argument("--input-sets", type=int, default=0, help="measurement.input_sets (0: the default)")
    p.add_argument("--in-process", action="store_true", help="all jobs in this process")
    p = sub.add_parser("sens")
    p.add_argument("runs", type=int)
    p.add_argument("--budget-ms", type=float, default=10_000.0, help="measurement.budget_ms per cell")
    p.add_argument("--in-process", action="store_true", help="all jobs in this process")
    sub.add_parser("graph1")
    sub.add_parser("engine")
    sub.add_parser("state")
    sub.add_parser("energy")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "artefacts.jsonl").open("a") as log:
        text = {
            "copy": cmd_copy,
            "aa": cmd_aa,
            "sens": cmd_sens,
            "state": cmd_state,
            "energy": cmd_energy,
            "graph1": cmd_graph1,
            "engine": cmd_engine,
        }[  # fmt: skip
            args.cmd
        ](args, log)
    print(text, flush=True)


if __name__ == "__main__":
    main()
