"""A/A of revision jobs: what a bisect step does when nothing changed between its two commits.

    python benchmarks/aa_revisions.py OUT_DIR [--jobs 20] [--load 0]

A bisect step (``kernelab bisect``) is one revision job: the midpoint against the good end, each
side built from its commit in a worker process of its own, interleaved in one job. This makes a
git repository of a small CPU benchmark (``y = 2 x + 1`` over 100,000 floats, module
``revpkg.bench``: the end-to-end tests' ``tests/e2e/revision_repo.py``), and runs ``--jobs``
revision jobs whose two sides are the same commit
(``kernelab.runners.revision_job.run_revision_job``, as the runner runs them), ``--load N`` busy
processes beside them; every ``faster``/``slower`` is false. Then one job of the commit that does
the work four times against the first (a real step) must read ``slower``. Writes
``OUT_DIR/aa_revisions.json`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernelab.runners.revision_job import run_revision_job  # noqa: E402
from kernelab.runners.revisions import AllowList  # noqa: E402
from kernelab.service.contract.schemas import JobSpec  # noqa: E402
from kernelab.service.judge.stats import compare  # noqa: E402


def _repo(path: Path) -> tuple[str, str]:
    """The revision repository of the end-to-end tests (``tests/e2e/revision_repo.py``): commits
    ``fast`` (y = 2 x + 1) and ``slow`` (the same work done 4 times), their shas."""
    sys.path.insert(0, str(REPO / "tests" / "e2e"))
    from revision_repo import make_repo  # noqa: PLC0415

    shas = make_repo(path)
    return shas["fast"], shas["slow"]


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
    good, slow_sha = _repo(repo)
    allow = AllowList([str(repo)])
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    rows: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        for i in range(args.jobs + 1):
            slow = i == args.jobs
            result = run_revision_job(_spec(repo, good, slow_sha if slow else good), allow=allow,
                                      cache_dir=args.out / "cache")  # fmt: skip
            for cell in compare(result).cells:
                rows.append({"slow": slow, "verdict": cell.verdict, "ratio": cell.ratio,
                             "ci": [cell.ci_low, cell.ci_high],
                             "reasons": [r.code for r in cell.reasons]})  # fmt: skip
                print(f"job {i}{' (4x)' if slow else ''}: {cell.verdict} {cell.ratio}", flush=True)
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
    print(f"| the commit doing the work four times | 1 | {slow['verdict']} | - | {slow['ratio']:.4f} |")


if __name__ == "__main__":
    main()
