"""A/A through a real server and runner, then across runs: the honest-across-time acceptance.

    python benchmarks/aa_service.py OUT_DIR [--jobs 20] [--load 0] [--spec examples/softmax.yaml]
        [--slow-candidate]

1. ``kernelab serve`` on a fresh SQLite file and one ``kernelab runner`` daemon (real HTTP), as a
   user would run them; ``--jobs`` jobs of ``--spec`` with its **baseline variant on both sides**
   (an A/A: every ``faster``/``slower`` is false), submitted one after another;
   ``--load N`` keeps N busy-looping processes running meanwhile (a loaded node).
2. Job vs job over consecutive pairs (1 vs 2, 2 vs 3, ...), the candidate side: both jobs ran the
   same baseline, so the control applies (``kernelab.service.judge.between_runs``); and the baseline
   side of the same pairs (the candidate, also unchanged, is its control).
3. The benchmark's history: change points found on the A/A lines (every one is false).
4. ``--slow-candidate``: two more jobs of ``aa_service_bench:DoubledSoftmax`` (a function-form
   benchmark of this folder: a float32 row softmax, and a ``twice`` variant that computes it twice
   per call): an A/A job, then one whose candidate is ``twice``, compared job vs job: a 2x slower
   candidate against the shared baseline must read ``slower``.

Writes ``OUT_DIR/aa_service.json`` (every cell) and the server/runner logs; prints a table last.
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

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kernelab.runners.client import KernelabClient  # noqa: E402
from kernelab.runners.local import ServerProcess, free_port  # noqa: E402


def _burn() -> None:
    while True:
        pass


def _spec(path: Path, *, slow: bool | None) -> dict[str, Any]:
    """The spec's A/A (``slow`` False), or the doubled benchmark's A/A (None) or 2x job (True)."""
    spec = yaml.safe_load(path.read_text())
    spec["candidate"] = dict(spec["baseline"])
    spec["name"] = f"A/A {spec.get('name', path.stem)}"
    if slow is not False:
        spec["benchmark"] = "aa_service_bench:DoubledSoftmax"
        spec["baseline"] = {"variant": "torch"}
        spec["candidate"] = {"variant": "twice" if slow else "torch"}
        spec["name"] = "2x slower candidate" if slow else "A/A of the doubled benchmark"
        spec["sweep"] = {"M": [64], "N": [200, 1000]}  # the softmax example's CPU cells, float32
        spec.pop("sweep_by_device", None)
    return spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--load", type=int, default=0)
    ap.add_argument("--spec", type=Path, default=REPO / "examples" / "softmax.yaml")
    ap.add_argument("--slow-candidate", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "data"
    token = "aa-service-admin-token-0123456789"
    data.mkdir(exist_ok=True)
    database_url = f"sqlite:///{data / 'kernelab.db'}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    server = ServerProcess(database_url, port=port, admin_token=token, log_path=args.out / "server.log")
    server.start()
    path = os.pathsep.join(p for p in (str(REPO / "benchmarks"), os.environ.get("PYTHONPATH", "")) if p)
    runner_env = {**os.environ, "KERNELAB_TOKEN": token, "PYTHONPATH": path}
    runner = subprocess.Popen(
        [sys.executable, "-m", "kernelab.runners.cli", "runner", "--server", url, "--work-dir",
         str(args.out / "runner"), "--benchmark", "aa_service_bench:DoubledSoftmax"],
        env=runner_env, stdout=(args.out / "runner.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    try:
        with KernelabClient(url, token=token, timeout_s=120.0) as client:
            ids = []
            t0 = time.monotonic()
            kinds: list[bool | None] = [False] * args.jobs + ([None, True] if args.slow_candidate else [])
            for slow in kinds:
                job = client.submit(_spec(args.spec, slow=slow))
                done = client.wait(job.id, timeout_s=900)
                assert done.status == "succeeded", (done.status, done.error)
                ids.append(job.id)
                c = client.comparison(job.id)
                for cell in c.cells:
                    rows.append({"part": "job", "job": job.id, "slow": slow is not False, "cell": cell.label,
                                 "verdict": cell.verdict, "ratio": cell.ratio,
                                 "ci": [cell.ci_low, cell.ci_high],
                                 "reasons": [r.code for r in cell.reasons]})  # fmt: skip
                print(f"job {job.id}: {[cl.verdict for cl in c.cells]} "
                      f"{[round(cl.ratio or 0, 4) for cl in c.cells]}", flush=True)  # fmt: skip
            wall = time.monotonic() - t0
            aa = ids[: args.jobs]
            for side in ("candidate", "baseline"):
                for a, b in zip(aa, aa[1:], strict=False):
                    vs = client.compare_jobs(a, b, side=side)
                    for cell in vs.cells:
                        rows.append({"part": f"vs-{side}", "a": a, "b": b, "cell": cell.label,
                                     "verdict": cell.verdict, "basis": cell.basis, "ratio": cell.ratio,
                                     "ci": [cell.ci_low, cell.ci_high], "medians_ratio": cell.medians_ratio,
                                     "reasons": [r.code for r in cell.reasons]})  # fmt: skip
            if args.slow_candidate:
                vs = client.compare_jobs(ids[-2], ids[-1], side="candidate")
                for cell in vs.cells:
                    rows.append({"part": "vs-2x", "a": ids[-2], "b": ids[-1], "cell": cell.label,
                                 "verdict": cell.verdict, "basis": cell.basis, "ratio": cell.ratio,
                                 "ci": [cell.ci_low, cell.ci_high]})  # fmt: skip
            benchmark = _spec(args.spec, slow=False)["benchmark"]
            history = client.history(benchmark, limit=200)
            changes = [{"code": s.code, "cell": s.cell, "change_pct": cp.change_pct}
                       for s in history.series for cp in s.change_points]  # fmt: skip
    finally:
        runner.terminate()
        runner.wait(timeout=60)
        server.stop()
        for b in burners:
            b.terminate()
    (args.out / "aa_service.json").write_text(json.dumps({"rows": rows, "changes": changes, "wall_s": wall,
                                                           "load": args.load}, indent=1))  # fmt: skip
    print(f"\n{args.jobs} A/A jobs of {args.spec.name} through one runner, load {args.load} busy "
          f"processes, {wall:.0f} s\n")  # fmt: skip
    print("| what | cells | verdicts | false faster/slower |")
    print("| --- | ---: | --- | ---: |")
    for part in ("job", "vs-candidate", "vs-baseline", "vs-2x"):
        mine = [r for r in rows if r["part"] == part and not r.get("slow")]
        if not mine:
            continue
        counts: dict[str, int] = {}
        for r in mine:
            key = r["verdict"] + (f" ({r['basis']})" if "basis" in r else "")
            counts[key] = counts.get(key, 0) + 1
        false = sum(r["verdict"] in ("faster", "slower") for r in mine) if part != "vs-2x" else "-"
        print(f"| {part} | {len(mine)} | {counts} | {false} |")
    print(f"| history change points on A/A lines | - | {len(changes)} | {len(changes)} |")


if __name__ == "__main__":
    main()
