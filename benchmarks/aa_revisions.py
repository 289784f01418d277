"""A/A of revision jobs: what a bisect step does when nothing changed between its two commits.

    python benchmarks/aa_revisions.py OUT_DIR [--jobs 20] [--load 0]

A bisect step (``kernelab bisect``) is one revision job: the midpoint against the good end, each
side built from its commit in a worker process of its own, interleaved in one job. This makes a
git repository of a small CPU benchmark (``y = 2 x + 1`` over 100,000 floats, module
``revpkg.bench``), and runs ``--jobs`` revision jobs whose two sides are the same commit
(``kernelab.runners.revision_job.run_revision_job``, as the runner runs them), ``--load N`` busy
processes beside them; every ``faster``/``slower`` is false. Then one job of the commit that does
the work twice against the first (a real 2x step) must read ``slower``. Writes
``OUT_DIR/aa_revisions.json`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernelab.runners.revision_job import run_revision_job  # noqa: E402
from kernelab.runners.revisions import AllowList  # noqa: E402
from kernelab.service.schemas import JobSpec  # noqa: E402
from kernelab.service.stats import compare  # noqa: E402

BENCH = """\
from typing import Any

import torch
from pydantic import Field

from kernelab.kernels.base import Benchmark, Params
from kernelab.service.schemas import Work

REPEATS = 1


class AxpyParams(Params):
    N: int = Field(gt=0)


class AxpyBenchmark(Benchmark[AxpyParams]):
    name = "axpy"
    Params = AxpyParams
    variants = ("torch",)

    def make_inputs(self, params: AxpyParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(params.N, generator=g).to(device)}

    def prepare(self, variant: str, params: AxpyParams, inputs: dict[str, Any]) -> Any:
        x = inputs["x"]
        out = torch.empty_like(x)

        def fn() -> torch.Tensor:
            for _ in range(REPEATS):
                torch.mul(x, 2.0, out=out)
                out.add_(1.0)
            return out
        return fn

    def reference(self, params: AxpyParams, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"].double() * 2.0 + 1.0

    def work(self, params: AxpyParams, variant: str) -> Work:
        return Work(flops=2.0 * params.N, bytes_read=4.0 * params.N, bytes_written=4.0 * params.N)
"""


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "k", "GIT_AUTHOR_EMAIL": "k@example.com",
           "GIT_COMMITTER_NAME": "k", "GIT_COMMITTER_EMAIL": "k@example.com"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=env).stdout.strip()  # fmt: skip


def _repo(path: Path) -> tuple[str, str]:
    (path / "revpkg").mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "revpkg" / "__init__.py").write_text("")
    shas = []
    for text in (BENCH, BENCH.replace("REPEATS = 1", "REPEATS = 2")):
        (path / "revpkg" / "bench.py").write_text(text)
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", "step")
        shas.append(_git(path, "rev-parse", "HEAD"))
    return shas[0], shas[1]


def _spec(repo: Path, a: str, b: str) -> JobSpec:
    return JobSpec.model_validate({
        "name": "bisect step", "benchmark": "revpkg.bench:AxpyBenchmark", "params": {"N": 100000},
        "device": "cpu", "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
        "timeout_s": 300, "measurement": {"budget_ms": 1000},
        "baseline": {"variant": "torch", "source": {"repo": str(repo), "ref": a}},
        "candidate": {"variant": "torch", "source": {"repo": str(repo), "ref": b}},
    })  # fmt: skip


def _burn() -> None:
    while True:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--load", type=int, default=0)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    repo = args.out / "repo"
    if repo.exists():
        subprocess.run(["rm", "-rf", str(repo)], check=True)
    good, twice = _repo(repo)
    allow = AllowList([str(repo)])
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for i in range(args.jobs + 1):
            slow = i == args.jobs
            result = run_revision_job(_spec(repo, good, twice if slow else good), allow=allow,
                                      cache_dir=args.out / "cache")  # fmt: skip
            for cell in compare(result).cells:
                rows.append({"slow": slow, "verdict": cell.verdict, "ratio": cell.ratio,
                             "ci": [cell.ci_low, cell.ci_high],
                             "reasons": [r.code for r in cell.reasons]})  # fmt: skip
                print(f"job {i}{' (2x)' if slow else ''}: {cell.verdict} {cell.ratio}", flush=True)
    finally:
        for b in burners:
            b.terminate()
    wall = time.monotonic() - t0
    (args.out / "aa_revisions.json").write_text(json.dumps({"rows": rows, "load": args.load, "wall_s": wall}))
    aa = [r for r in rows if not r["slow"]]
    counts: dict[str, int] = {}
    for r in aa:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    ratios = [r["ratio"] for r in aa if r["ratio"] is not None]
    print(f"\n{args.jobs} revision A/A jobs (one commit on both sides), load {args.load}, {wall:.0f} s\n")
    print("| what | jobs | verdicts | false faster/slower | ratio range |")
    print("| --- | ---: | --- | ---: | --- |")
    print(f"| same commit on both sides | {len(aa)} | {counts} | "
          f"{sum(r['verdict'] in ('faster', 'slower') for r in aa)} | "
          f"{min(ratios, default=0):.4f}-{max(ratios, default=0):.4f} |")  # fmt: skip
    (slow,) = [r for r in rows if r["slow"]]
    print(f"| the commit doing the work twice | 1 | {slow['verdict']} | - | {slow['ratio']:.4f} |")


if __name__ == "__main__":
    main()
