"""The quick node probe between a workload's runs, in its own process: ``python -m
kernelab.runners.workload.probe OUT_JSON [--device-type T] [--no-copy] [--no-all-reduce]
[--no-nvml]`` writes one ``ProbeReport`` (``kernelab.runners.probes.run_probes``, quick mode, no
matmul peak) to ``OUT_JSON``. Its own process so no CUDA context of the runner stays on the GPUs
the next run is handed."""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from kernelab.service.contract.schemas import ProbeReport, ProbeSpec, WorkloadProbes


def probe_between(probes: WorkloadProbes, device_type: str) -> ProbeReport:
    """One quick probe: on CUDA in a child process (killed after ``probes.timeout_s``; no CUDA
    context of the runner stays behind), on a CPU in this process (nothing to hold, and a child's
    torch import costs seconds). A failing probe gives a report holding the error (a probe
    failure is a finding, never a lost job)."""
    from kernelab.runners.children import _child_env

    if device_type == "cpu":
        from kernelab.runners.probes import run_probes

        return run_probes(_probe_spec(probes), "adhoc", device_type="cpu")

    flags = [
        f
        for on, f in (
            (probes.copy_bandwidth, "--no-copy"),
            (probes.all_reduce, "--no-all-reduce"),
            (probes.nvml, "--no-nvml"),
        )
        if not on
    ]
    with tempfile.TemporaryDirectory(prefix="kernelab-wprobe-") as tmp:
        out = Path(tmp, "probe.json")
        cmd = [
            sys.executable,
            "-P",
            "-m",
            "kernelab.runners.workload.probe",
            str(out),
            "--device-type",
            device_type,
        ]
        try:
            proc = subprocess.run(
                cmd + flags,
                capture_output=True,
                text=True,
                timeout=probes.timeout_s,
                env=_child_env(),
                stdin=subprocess.DEVNULL,
                check=False,
            )
            if proc.returncode == 0 and out.exists():
                return ProbeReport.model_validate_json(out.read_text(encoding="utf-8"))
            why = (proc.stderr or "").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
            error = why[0][:500]
        except subprocess.TimeoutExpired:
            error = f"the probe ran longer than {probes.timeout_s:g} s and was killed"
    return ProbeReport(phase="adhoc", taken_at=datetime.now(UTC), errors={"run_probes": error})


def _probe_spec(probes: WorkloadProbes) -> ProbeSpec:
    return ProbeSpec(
        copy_bandwidth=probes.copy_bandwidth,
        all_reduce=probes.all_reduce,
        nvml=probes.nvml,
        mode="quick",
        matmul_peak=False,
        canary=False,
    )


def main(argv: list[str] | None = None) -> int:
    """Probe and write the report; 0, or 2 for unusable arguments."""
    p = argparse.ArgumentParser(prog="python -m kernelab.runners.workload.probe")
    p.add_argument("out_json", type=Path)
    p.add_argument("--device-type", choices=("cpu", "cuda"), default=None)
    p.add_argument("--no-copy", action="store_true")
    p.add_argument("--no-all-reduce", action="store_true")
    p.add_argument("--no-nvml", action="store_true")
    args = p.parse_args(argv)
    from kernelab.runners.probes import run_probes

    wanted = WorkloadProbes(
        copy_bandwidth=not args.no_copy, all_reduce=not args.no_all_reduce, nvml=not args.no_nvml
    )
    report = run_probes(_probe_spec(wanted), "adhoc", device_type=args.device_type)
    args.out_json.write_text(report.model_dump_json(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
