"""What a user waits for on a CPU machine: the command line, the demo, the scaffold, the Python API.

    python benchmarks/cpu_speed.py OUT_DIR [--checkout PATH] [--python PY] [--repeat 3] [--skip softmax,...]

Each case runs as a user runs it, in a new process, ``--repeat`` times; the table gives the
median and the range of the wall time (s) and the median CPU time (user + system of the process
and its children, s):

* ``version``: ``kernelab --version``;
* ``softmax``: ``kernelab run examples/softmax.yaml`` (probes on, the quick start's spec);
* ``scaffold``: ``kernelab init demo`` in an empty folder, then ``kernelab run demo.yaml`` there;
* ``compare``: a script that imports torch and kernelab and calls ``kernelab.compare`` once on two
  small CPU functions (a 256 x 256 softmax, eager against composed), then once more: the first
  call's own wall time (imports of the first call included) and the second's (a notebook's or a
  test session's later calls) are reported beside the process's.

``--checkout PATH`` runs another checkout of kernelab (put first on ``PYTHONPATH``: a "before"
figure on the same machine). A checkout whose subpackages are mapped by pyproject.toml's
``package-dir`` (no ``kernelab/<room>`` links) imports only through an install: give the Python of
an environment where it is installed (``--python VENV/bin/python``, after ``VENV/bin/pip install -e
PATH``); ``import kernelab`` refuses one checkout's ``kernelab/`` with another's subpackages.
Writes ``OUT_DIR/cpu_speed.json``; prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
COMPARE = """
import time
t0 = time.perf_counter()
import torch
import kernelab
x = torch.randn(256, 256)
t1 = time.perf_counter()
result = kernelab.compare(lambda x: torch.softmax(x, -1), lambda x: x.exp() / x.exp().sum(-1, keepdim=True),
                          inputs={"x": x})
print(f"compare_s {time.perf_counter() - t1:.3f} {result.cells[0].verdict}")
t2 = time.perf_counter()
again = kernelab.compare(lambda x: torch.softmax(x, -1), lambda x: x.exp() / x.exp().sum(-1, keepdim=True),
                         inputs={"x": x})
print(f"again_s {time.perf_counter() - t2:.3f} {again.cells[0].verdict}")
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """(wall s, CPU s of the process tree, stdout+stderr) of one run; raises on a non-zero exit
    other than 1 (a gate that failed is still an answer)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    if done.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return wall, cpu, done.stdout + done.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--checkout", type=Path, default=ROOT)
    ap.add_argument("--python", default=sys.executable, help="the interpreter to run (default: this one)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip", default="")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    checkout = args.checkout.resolve()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.environ.get("PYTHONPATH")])),
    }
    cli = [args.python, "-m", "kernelab.runners.cli"]
    skip = set(filter(None, args.skip.split(",")))
    rows: dict[str, dict[str, Any]] = {}

    def case(name: str, runs: list[tuple[float, float, str]], extra: dict[str, Any] | None = None) -> None:
        walls = [w for w, _, _ in runs]
        rows[name] = {"wall_s": walls, "cpu_s": [c for _, c, _ in runs], **(extra or {})}
        print(json.dumps({name: rows[name]}), flush=True)

    if "version" not in skip:
        case("version", [timed([*cli, "--version"], env, checkout) for _ in range(args.repeat)])
    if "softmax" not in skip:
        spec = checkout / "examples" / "softmax.yaml"
        case(
            "softmax", [timed([*cli, "run", str(spec), "--quiet"], env, checkout) for _ in range(args.repeat)]
        )
    if "scaffold" not in skip:
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                subprocess.run([*cli, "init", "demo"], env=env, cwd=tmp, check=True, capture_output=True)
                runs.append(timed([*cli, "run", "demo.yaml", "--quiet"], env, Path(tmp)))
        case("scaffold", runs)
    if "compare" not in skip:
        runs = [timed([args.python, "-c", COMPARE], env, checkout) for _ in range(args.repeat)]
        calls = [float(text.split("compare_s ")[1].split()[0]) for _, _, text in runs]
        verdicts = [text.split("compare_s ")[1].split()[1] for _, _, text in runs]
        again = [float(text.split("again_s ")[1].split()[0]) for _, _, text in runs]
        case("compare", runs, {"call_s": calls, "again_s": again, "verdicts": verdicts})
    (args.out / "cpu_speed.json").write_text(json.dumps({"checkout": str(checkout), "rows": rows}, indent=1))
    print(f"\n{checkout}\n\n| case | wall s median [min-max] | CPU s median | note |\n|---|---|---|---|")
    for name, row in rows.items():
        walls = row["wall_s"]
        note = ""
        if name == "compare":
            note = (
                f"the first call {statistics.median(row['call_s']):.2f} s, a second call in the same "
                f"process {statistics.median(row['again_s']):.2f} s; {', '.join(row['verdicts'])}"
            )
        print(f"| {name} | {statistics.median(walls):.2f} [{min(walls):.2f}-{max(walls):.2f}] | "
              f"{statistics.median(row['cpu_s']):.2f} | {note} |")  # fmt: skip


if __name__ == "__main__":
    main()
