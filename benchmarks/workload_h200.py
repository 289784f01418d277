"""The example workload's two arms on one GPU, and the sick-node drill (acceptance 3 of issue 20).

    python benchmarks/workload_h200.py                     # on the H200: nproc_per_node 1
    python benchmarks/workload_h200.py --device cpu --runs 3 --steps 1 --small   # anywhere, slowly

Part 1 (``healthy``): ``examples/workload/train_step.py`` with ``--attention sdpa`` against
``--attention math`` (the strict arm), ``--runs`` runs of each, interleaved ABBA, the quick probe
between runs; prints the phase table, per-rank times, the consistency table and the timeline.

Part 2 (``drill``): the same job while a second process keeps the device busy during one pair of
runs (``--drill-pair``, 0-based): on CUDA a loop of bf16 matmuls on GPU 0 holding its own context
(NVML lists it among the GPU's processes), on a CPU one busy-looping process per core. The hog
starts after the probe that follows the run before the pair and stops after the pair's probe, so
the probe after the pair's second run sees it. The drill is *flagged* when the comparison carries
``sick-node`` (every phase of a hogged run slowed together) or ``probe-changed`` (the probe saw
another process or a copy bandwidth off its band); the script prints which, and writes both
comparisons as Markdown and JSON under ``--out``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernelab.runners.workload import run_workload  # noqa: E402
from kernelab.service.contract.schemas import WorkloadComparison, WorkloadSpec  # noqa: E402
from kernelab.service.judge.workload_report import format_workload, workload_markdown  # noqa: E402
from kernelab.service.judge.workload_stats import compare_workload  # noqa: E402

_CUDA_HOG = """
import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
print("hog ready", flush=True)
while True:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""
_CPU_HOG = "while True:\n    pass\n"


class Hog:
    """A second process keeping the device busy, started and stopped around chosen runs."""

    def __init__(self, device: str):
        self.device = device
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        if self.procs:
            return
        if self.device == "cuda":
            env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0"}
            self.procs = [subprocess.Popen([sys.executable, "-c", _CUDA_HOG], env=env)]
        else:
            self.procs = [
                subprocess.Popen([sys.executable, "-c", _CPU_HOG]) for _ in range(os.cpu_count() or 1)
            ]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()
        self.procs = []


def workload_spec(device: str, runs: int, steps: int, small: bool) -> WorkloadSpec:
    """The example's two arms with one rank each; GPU-sized unless ``small``."""
    size = (
        ["--width", "64", "--layers", "2", "--batch", "4", "--prompt", "8", "--new-tokens", "8"]
        if small
        else ["--width", "1024", "--layers", "8", "--batch", "16", "--prompt", "256", "--new-tokens", "64"]
    )
    script = str(ROOT / "examples" / "workload" / "train_step.py")

    def side(attention: str) -> dict[str, object]:
        return {"command": [script], "args": ["--attention", attention, "--steps", str(steps), *size]}

    return WorkloadSpec.model_validate(
        {
            "kind": "workload",
            "name": f"example training step, sdpa vs strict math ({device}, 1 rank)",
            "baseline": side("sdpa"),
            "candidate": side("math"),
            "launch": {"nproc_per_node": 1},
            "runs": runs,
            "order": "abba",
            "seed": 0,
            "run_timeout_s": 900,
            "budget_s": 7200,
            "threshold_pct": 2,
            "device": device,
            "probes": {"between_runs": True, "all_reduce": False},
        }
    )


def run_part(spec: WorkloadSpec, hog: Hog | None, drill_pair: int) -> WorkloadComparison:
    """Run ``spec``; with ``hog``, keep it running during runs ``2 * drill_pair`` and the next."""
    first = 2 * drill_pair

    def progress(index: int, total: int, message: str) -> None:
        print(f"  run {index + 1}/{total}: {message}", flush=True)
        if hog is not None and index == first - 1:
            hog.start()
        if hog is not None and index == first + 1:
            hog.stop()

    if hog is not None and first == 0:
        hog.start()
    try:
        result = run_workload(spec, progress=progress)
    finally:
        if hog is not None:
            hog.stop()
    return compare_workload(result)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--runs", type=int, default=5, help="runs of each arm")
    p.add_argument("--steps", type=int, default=5, help="training steps per run")
    p.add_argument("--drill-pair", type=int, default=2, help="the pair of runs the hog runs during (0-based)")
    p.add_argument("--small", action="store_true", help="the CPU-sized model")
    p.add_argument("--skip-healthy", action="store_true", help="only the drill")
    p.add_argument("--out", type=Path, default=ROOT / "workload-h200-out")
    args = p.parse_args(argv)
    if not 0 <= args.drill_pair < args.runs:
        p.error("--drill-pair must name one of the --runs pairs")
    args.out.mkdir(parents=True, exist_ok=True)
    spec = workload_spec(args.device, args.runs, args.steps, args.small)
    print(f"date: {datetime.now(UTC).isoformat(timespec='seconds')}")
    parts = [] if args.skip_healthy else [("healthy", None)]
    parts.append(("drill", Hog(args.device)))
    flagged = True
    for name, hog in parts:
        print(f"\n== {name} ==", flush=True)
        comparison = run_part(spec, hog, args.drill_pair)
        print(format_workload(comparison))
        (args.out / f"{name}.md").write_text(workload_markdown(comparison), encoding="utf-8")
        (args.out / f"{name}.json").write_text(comparison.model_dump_json(indent=1), encoding="utf-8")
        if hog is not None:
            hit = [f for f in ("sick-node", "probe-changed") if f in comparison.flags]
            lines = [line.index for line in comparison.timeline if line.flags]
            flagged = bool(hit)
            print(
                f"\nDRILL: hog during runs {2 * args.drill_pair} and {2 * args.drill_pair + 1}: "
                + (f"flagged ({', '.join(hit)}; runs {lines})" if hit else "NOT flagged")
            )
    print(f"\nwritten: {args.out}")
    return 0 if flagged else 1


if __name__ == "__main__":
    raise SystemExit(main())
