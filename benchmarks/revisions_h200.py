"""Revision A/B on a real GPU: the project's own Triton matmul at two tile sizes, as two commits.

Usage: ``python benchmarks/revisions_h200.py OUT_DIR``

Makes a git repository in ``OUT_DIR/repo`` holding a copy of this checkout's ``kernels/`` package
in two commits: ``main`` with the matmul's default tile (BLOCK_M=BLOCK_N=128, BLOCK_K=32) and
``tile64`` where the defaults become BLOCK_M=BLOCK_N=64 (a tile-size change as a pull request
would make it). Then runs ``kernelab run`` with ``--baseline-ref main --candidate-ref tile64`` (the
revision A/B path: cached worktrees, one worker process per revision with its own
``TRITON_CACHE_DIR``, interleaved rounds driven by the parent) on
``kernelab.kernels.matmul:MatmulBenchmark`` variant ``triton``: bf16 M=4096 and M=2048 with N=K=4096 on a GPU,
64^3 float32 on a CPU (Triton interpreter), so the script can be tried anywhere.

Writes into ``OUT_DIR``: ``spec.yaml``, ``result.json`` (raw JobResult, both commit shas, diff
stat, versions), ``comparison.json``, ``report.md`` (the Markdown export for a pull request),
``run.log``; prints a short Markdown table last. GPU runtime: about a minute on an H200.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = """\
name: matmul tile 128 -> 64 (revision A/B)
benchmark: "kernelab.kernels.matmul:MatmulBenchmark"
baseline: {variant: triton}
candidate: {variant: triton}
sweep: {M: [4096, 2048], N: [4096], K: [4096], dtype: [bfloat16]}
sweep_by_device:
  cpu: {M: [64], N: [64], K: [64], dtype: [float32]}
measurement: {warmup_ms: 100, budget_ms: 3000, target_ci_pct: 0.5}
probes: {copy_bandwidth: true, all_reduce: false, nvml: true}
timeout_s: 600
"""
TILE_FROM = ("BLOCK_M: DotBlock = 128", "BLOCK_N: DotBlock = 128")
TILE_TO = ("BLOCK_M: DotBlock = 64", "BLOCK_N: DotBlock = 64")


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "kernelab",
        "GIT_AUTHOR_EMAIL": "kernelab@localhost",
        "GIT_COMMITTER_NAME": "kernelab",
        "GIT_COMMITTER_EMAIL": "kernelab@localhost",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def make_repo(repo: Path) -> None:
    """``main``: this checkout's kernels/; ``tile64``: the same with 64x64 default tiles."""
    if repo.exists():
        shutil.rmtree(repo)
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    shutil.copytree(ROOT / "kernels", repo / "kernels", ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "matmul: 128x128 tiles")
    matmul = repo / "kernels" / "matmul.py"
    text = matmul.read_text()
    for old, new in zip(TILE_FROM, TILE_TO, strict=True):
        if old not in text:
            raise SystemExit(f"{matmul}: expected {old!r} (did the matmul defaults change?)")
        text = text.replace(old, new)
    _git(repo, "checkout", "-q", "-b", "tile64")
    matmul.write_text(text)
    _git(repo, "commit", "-q", "-am", "matmul: 64x64 tiles")
    _git(repo, "checkout", "-q", "main")


def _us(ns: float | None) -> str:
    return f"{ns / 1e3:.2f} µs" if ns is not None else "n/a"


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[2], file=sys.stderr)
        return 2
    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    repo = out / "repo"
    make_repo(repo)
    spec = out / "spec.yaml"
    spec.write_text(SPEC)
    cmd = [
        sys.executable,
        "-m",
        "kernelab.runners.cli",
        "run",
        str(spec),
        "--repo",
        str(repo),
        "--baseline-ref",
        "main",
        "--candidate-ref",
        "tile64",
        "--cache-dir",
        str(out / "cache"),
        "--json",
        str(out / "comparison.json"),
        "--markdown",
        str(out / "report.md"),
        "--result",
        str(out / "result.json"),
    ]
    with (out / "run.log").open("w") as log:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, timeout=900)
    (out / "table.txt").write_text(proc.stdout)
    if proc.returncode != 0:
        print((out / "run.log").read_text()[-3000:], file=sys.stderr)
        print(f"kernelab run failed with status {proc.returncode}; see {out / 'run.log'}", file=sys.stderr)
        return 1
    result = json.loads((out / "result.json").read_text())
    comparison = json.loads((out / "comparison.json").read_text())
    revs = result["node"]["revisions"]
    versions = revs["candidate"]["versions"]
    print(
        f"baseline main @ {revs['baseline']['sha'][:12]}, candidate tile64 @ "
        f"{revs['candidate']['sha'][:12]}; diff: {revs['diff_shortstat']}; node: "
        f"{comparison['node']['device_name']}, torch {versions.get('torch')}, "
        f"triton {versions.get('triton')}"
    )
    print()
    print("| cell | main (128x128) median | tile64 median | Δ% [95% CI] | verdict | flags |")
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for cell in comparison["cells"]:
        b, c = cell["baseline"]["median_ns"], cell["candidate"]["median_ns"]
        ci = (
            (
                f"{(cell['ratio'] - 1) * 100:+.2f}% [{(cell['ci_low'] - 1) * 100:+.2f}, "
                f"{(cell['ci_high'] - 1) * 100:+.2f}]"
            )
            if cell.get("ci_low") is not None
            else "n/a"
        )
        print(
            f"| {cell['label']} | {_us(b)} | {_us(c)} | {ci} | {cell['verdict']} | "
            f"{', '.join(cell['flags'])} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
