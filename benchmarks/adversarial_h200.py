"""The adversarial suite on a GPU: every cheat of tests/adversarial/cheats.py through ``run_job``
and ``compare``, honest A/A pairs, the "job changes the node" cases with probes on, the real
examples for false findings, and the cost of the checked samples.

Usage (repo root, on the GPU node):
``python3 benchmarks/adversarial_h200.py OUTDIR [--part all|suite|node|state|examples]``.
Writes ``OUTDIR/adversarial.json`` and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "adversarial"))

from cheats import CHEATS, GPU_CHEATS, GPU_OVERRIDES  # noqa: E402
from cheats_node_state import STATE_CHEATS  # noqa: E402

from kernelab.runners.job import run_job  # noqa: E402
from kernelab.service.contract.schemas import JobResult, JobSpec  # noqa: E402
from kernelab.service.judge.stats import compare  # noqa: E402

QUICK = {"warmup_ms": 5.0, "budget_ms": 400.0, "min_rounds": 4, "max_rounds": 400, "min_time_ms": 50.0}
NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False, "matmul_peak": False}
PROBES = {"copy_bandwidth": True, "all_reduce": False, "nvml": True, "matmul_peak": False}


def spec(
    candidate: str,
    *,
    benchmark: str = "cheats:ScaleBenchmark",
    probes: dict[str, bool] = NO_PROBES,
    size: int = 4096,
    **correctness: Any,
) -> JobSpec:
    return JobSpec.model_validate(
        {
            "benchmark": benchmark,
            "baseline": {"variant": "honest"},
            "candidate": {"variant": candidate},
            "params": {"M": size, "N": size, "work": 8},
            "device": "cuda",
            "measurement": QUICK,
            "probes": probes,
            "correctness": correctness,
        }
    )


def row(name: str, result: JobResult, wall_s: float, wanted: set[str] | None) -> dict[str, Any]:
    c = compare(result)
    cell = c.cells[0]
    codes = sorted({r.code for r in cell.reasons})
    copy = {
        p.phase: round(max((r.bandwidth_gbps for r in p.copy_bandwidth), default=0.0), 1)
        for p in result.probes
    }
    caught = None
    if wanted is not None:
        caught = bool(wanted & set(codes)) and cell.verdict not in ("faster", "same", "slower")
    return {
        "case": name,
        "verdict": cell.verdict,
        "timing_verdict": cell.timing_verdict,
        "ratio": None if cell.ratio is None else round(cell.ratio, 4),
        "baseline_median_ns": cell.baseline.median_ns,
        "candidate_median_ns": cell.candidate.median_ns,
        "timers": cell.timers,
        "codes": codes,
        "error": cell.error,
        "caught": caught,
        "reasons": [f"{r.code}: {r.message}" for r in cell.reasons][:6],
        "job_reasons": [f"{r.code}: {r.message}" for r in c.reasons],
        "copy_probe_gbps": copy,
        "wall_s": round(wall_s, 1),
        "phase_s": {
            k: round(sum(cl.phase_s.get(k, 0.0) for cl in result.cells), 2)
            for k in ("prepare", "correctness", "measure", "checks", "device_work", "canary")
        },
        "timed_checks": {
            v: [t.model_dump(mode="json", exclude={"correctness"}) for t in ts]
            for v, ts in result.cells[0].timed_checks.items()
        },
    }


def run(name: str, s: JobSpec, wanted: set[str] | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        result = run_job(s)
    except Exception as exc:  # record and go on: one broken case must not lose the others
        return {"case": name, "verdict": "ERROR", "error": f"{type(exc).__name__}: {exc}", "caught": False}
    out = row(name, result, time.perf_counter() - t0, wanted)
    print(
        f"{name:22s} {out['verdict']:14s} timing={out['timing_verdict']} ratio={out['ratio']} "
        f"codes={out['codes']} caught={out['caught']} copy={out['copy_probe_gbps']} {out['wall_s']} s "
        f"phases={out['phase_s']}",
        flush=True,
    )
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--part", default="all", choices=["all", "suite", "node", "state", "examples"])
    ap.add_argument("--cases", default="", help="comma list: only these suite cases (A/A is 'honest')")
    args = ap.parse_args()
    only = set(filter(None, args.cases.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if args.part in ("all", "suite"):
        for i in range(3 if not only else int("honest" in only)):
            rows.append(run(f"A/A honest #{i + 1}", spec("honest"), None))
        for name in sorted({**CHEATS, **GPU_CHEATS}):
            if only and name not in only:
                continue
            loose = {"rtol": 0.05, "atol": 0.1} if name == "less_accurate" else {}
            wanted = GPU_OVERRIDES.get(name) or GPU_CHEATS.get(name) or CHEATS[name]
            rows.append(run(name, spec(name, **loose), wanted or None))
    if args.part in ("all", "node"):
        rows.append(run("honest + probes", spec("honest", probes=PROBES), None))
        rows.append(
            run(
                "patched at import + probes",
                spec("honest", benchmark="cheats_import_patch:PatchedAtImport", probes=PROBES),
                {"timer-tampered", "node-changed"},
            )
        )
        rows.append(
            run("noop_after_first + probes", spec("noop_after_first", probes=PROBES), {"no-device-work"})
        )
    if args.part in ("all", "state"):  # candidates that change the device's state for their process
        for size in (4096, 1024):  # 64 MiB inputs (DRAM-bound) and 4 MiB (L2-resident)
            rows.append(run(f"honest {size}^2 + probes", spec("honest", probes=PROBES, size=size), None))
            for name in sorted(STATE_CHEATS):
                rows.append(
                    run(
                        f"{name} {size}^2 + probes",
                        spec(
                            name, benchmark="cheats_node_state:NodeStateBenchmark", probes=PROBES, size=size
                        ),
                        STATE_CHEATS[name],
                    )
                )
    if args.part in ("all", "examples"):
        for example in ("softmax", "matmul"):
            data = yaml.safe_load((ROOT / "runners" / "examples" / f"{example}.yaml").read_text())
            for checks in (True, False) if not only else (True,):
                data.setdefault("correctness", {})["timed_checks"] = checks
                rows.append(
                    run(
                        f"example {example} checks={'on' if checks else 'off'}",
                        JobSpec.model_validate(data),
                        None,
                    )
                )
    (args.out / "adversarial.json").write_text(json.dumps({"rows": rows, **extra}, indent=2, default=str))
    print("\n| case | verdict | timing alone | ratio | reasons | caught | wall s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        codes = ", ".join(r.get("codes", [])) or r.get("error") or ""
        print(
            f"| {r['case']} | {r['verdict']} | {r.get('timing_verdict')} | {r.get('ratio')} | {codes} | "
            f"{r.get('caught')} | {r.get('wall_s')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
