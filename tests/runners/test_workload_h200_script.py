"""``benchmarks/workload_h200.py`` on the CPU, as far as a CPU goes: the drill's hog starts and
stops around the chosen pair of runs, the script prints the tables and says whether the drill was
flagged (the H200 run of acceptance 3 uses the same code with ``--device cuda``). One pair of runs,
the hog during both: the CI box has two cores, and whether a CPU drill is flagged depends on what
else runs there, so only the script's course is checked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_drill_runs_on_cpu(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "workload_h200.py"),
            "--device",
            "cpu",
            "--runs",
            "1",
            "--steps",
            "1",
            "--small",
            "--skip-healthy",
            "--drill-pair",
            "0",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=1400,
        cwd=ROOT,
    )
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    out = proc.stdout
    assert "== drill ==" in out and "Phases and metrics" in out and "DRILL: hog during runs 0 and 1:" in out
    assert (tmp_path / "drill.md").exists() and (tmp_path / "drill.json").exists()
    assert out.count("  run ") == 2
    drill = json.loads((tmp_path / "drill.json").read_text())
    assert [line["side"] for line in drill["timeline"]] == ["baseline", "candidate"]
