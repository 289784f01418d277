"""How long ``kernelab bisect`` over 8 commits takes on this machine, step by step, as a user runs it.

    python benchmarks/bisect_speed.py OUT_DIR [--commits 8] [--planted 5] [--threshold-pct 25]
                                              [--no-probes] [--repeat 1]

Makes a git repository of the end-to-end tests' small CPU benchmark (``y = 2 x + 1`` over 100,000
floats, ``tests/e2e/revision_repo.py``) with ``--commits`` commits after the good end (tag
``v1``); the ``--planted``-th of them (1-based) computes its output 16 times, and every later one
keeps it. Then, all real processes on loopback: ``kernelab serve`` on a fresh SQLite file, one
``kernelab runner`` daemon allowed that repository, and ``kernelab bisect --repo . --good v1 --bad
main SPEC`` with the default measurement (only ``threshold_pct`` set: a bisect hunts a regression
well beyond noise) and the default probes unless ``--no-probes``.

Reports the bisect's wall time, each step's job (commit, outcome, verdict, ratio) and its job's
time from submission to its end (``created_at`` to ``finished_at``; of it, ``queued_s`` until a
runner claimed it), and checks that the planted commit was found.
Writes ``OUT_DIR/bisect_speed.json``; prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

from revision_repo import make_bisect_repo  # noqa: E402

from kernelab.runners.client import KernelabClient  # noqa: E402
from kernelab.runners.local import ServerProcess, admin_token, free_port  # noqa: E402

SPEC = """\
name: bisect speed axpy
benchmark: "revpkg.bench:AxpyBenchmark"
baseline: {{variant: torch}}
candidate: {{variant: torch}}
params: {{N: 100000}}
device: cpu
measurement: {{threshold_pct: {threshold}}}
{probes}timeout_s: 600
"""


def make_repo(path: Path, commits: int, planted: int) -> tuple[str, list[str]]:
    """The good end (tag ``v1``) and ``commits`` commits after it; commit ``planted`` (1-based) and
    every later one compute the output 16 times (``revision_repo.make_bisect_repo``)."""
    return make_bisect_repo(path, commits, planted - 1)


def one_bisect(out: Path, args: argparse.Namespace, n: int) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=f"bisect-speed-{n}-", dir=out))
    repo = work / "kernels"
    good, shas = make_repo(repo, args.commits, args.planted)
    spec = work / "bisect.yaml"
    probes = "probes: {copy_bandwidth: false, all_reduce: false, nvml: false}\n" if args.no_probes else ""
    spec.write_text(SPEC.format(threshold=args.threshold_pct, probes=probes))
    token = admin_token(work)
    server = ServerProcess(
        f"sqlite:///{work / 'kernelab.db'}", port=free_port(), admin_token=token, log_path=work / "server.log"
    )
    with server:
        env = {**os.environ, "KERNELAB_SERVER": server.url, "KERNELAB_TOKEN": token}
        cli = [sys.executable, "-m", "kernelab.runners.cli"]
        with (work / "runner.log").open("w") as runner_log:
            runner = subprocess.Popen(
                [
                    *cli,
                    "runner",
                    "--name",
                    "bisect-node",
                    "--work-dir",
                    str(work / "runner"),
                    "--allow-repo",
                    str(repo),
                ],
                env=env,
                stdout=runner_log,
                stderr=subprocess.STDOUT,
            )
        try:
            t0 = time.perf_counter()
            done = subprocess.run(
                [*cli, "bisect", "--repo", ".", "--good", "v1", "--bad", "main", str(spec)],
                env=env,
                cwd=repo,
                capture_output=True,
                text=True,
                timeout=3600,
            )
            wall = time.perf_counter() - t0
        finally:
            runner.terminate()
            runner.wait(timeout=120)
        (work / "bisect.err").write_text(done.stderr)
        found = done.stdout.strip().startswith(f"first bad commit: {shas[args.planted - 1]}")
        steps: list[dict[str, Any]] = []
        with KernelabClient(server.url, token) as client:
            bisect_id = (
                int(done.stderr.split("bisect ", 1)[1].split(":", 1)[0]) if "bisect " in done.stderr else None
            )
            record = client.get_bisect(bisect_id) if bisect_id is not None else None
            for step in record.steps if record is not None else []:
                job = client.get_job(step.job_id)
                job_s = (job.finished_at - job.created_at).total_seconds() if job.finished_at else None
                queued_s = (job.started_at - job.created_at).total_seconds() if job.started_at else None
                steps.append(
                    {
                        "commit": shas.index(step.commit) + 1,
                        "outcome": step.outcome,
                        "verdict": step.verdict,
                        "ratio": step.ratio,
                        "job_s": job_s,
                        "queued_s": queued_s,
                    }
                )
    return {
        "wall_s": wall,
        "found": found,
        "returncode": done.returncode,
        "steps": steps,
        "stderr_tail": done.stderr[-2000:],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--commits", type=int, default=8)
    ap.add_argument("--planted", type=int, default=5)
    ap.add_argument("--threshold-pct", type=float, default=25.0)
    ap.add_argument("--no-probes", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [one_bisect(args.out, args, n) for n in range(args.repeat)]
    (args.out / "bisect_speed.json").write_text(
        json.dumps({"args": vars(args) | {"out": str(args.out)}, "runs": runs}, indent=1, default=str)
    )
    print(
        f"\nkernelab bisect over {args.commits} commits (planted at {args.planted}), threshold "
        f"{args.threshold_pct:g}%, probes {'off' if args.no_probes else 'default'}\n"
    )
    print("| run | wall s | found | steps | step: commit outcome verdict ratio (job s) |")
    print("| ---: | ---: | --- | ---: | --- |")
    for i, r in enumerate(runs):
        steps = "; ".join(
            f"{s['commit']} {s['outcome']} {s['verdict']} {s['ratio'] or 0:.3g} ({s['job_s'] or 0:.1f})"
            for s in r["steps"]
        )
        print(f"| {i + 1} | {r['wall_s']:.1f} | {r['found']} | {len(r['steps'])} | {steps} |")


if __name__ == "__main__":
    main()
