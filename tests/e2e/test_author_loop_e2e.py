"""A function-form benchmark through a server, end to end over real HTTP: ``kernelab submit
--wait --json`` while one ``kernelab runner --once`` runs it, then ``kernelab report --format
github`` (the job summary appended to ``$GITHUB_STEP_SUMMARY``, annotations on stdout, a link to
the job's dashboard page)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelab.runners.cli import EXIT_FAILED
from kernelab.runners.local import ServerProcess, admin_token, free_port
from kernelab.service.contract.schemas import Comparison

pytestmark = [pytest.mark.slow]

MODULE = """
import torch

import kernelab

scale = kernelab.benchmark("scale", params={"n": 256})


@scale.inputs
def inputs(p, device, seed):
    return {"x": torch.randn(p.n, generator=torch.Generator().manual_seed(seed)).to(device)}


@scale.variant("mul")
def mul(p, x):
    return x * 2


@scale.variant("wrong")
def wrong(p, x):
    return x * 2.5


@scale.reference
def reference(p, x):
    return x.double() * 2


@scale.work
def work(p, variant):
    return kernelab.Work(flops=p.n, bytes_read=4 * p.n, bytes_written=4 * p.n)
"""

SPEC = """\
name: scale wrong
benchmark: "scalebench:scale"
baseline: {variant: mul}
candidate: {variant: wrong}
sweep: {n: [256, 1024]}
measurement: {budget_ms: 80, min_time_ms: 0}
probes: {copy_bandwidth: false, all_reduce: false, nvml: false}
"""


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=cwd,
    )


@pytest.mark.timeout(600)
def test_submit_wait_json_and_report_format_github(tmp_path: Path) -> None:
    (tmp_path / "scalebench.py").write_text(MODULE, encoding="utf-8")
    (tmp_path / "scale.yaml").write_text(SPEC, encoding="utf-8")
    token = admin_token(tmp_path / "data")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # the server validates the spec: it imports it
    server = ServerProcess(
        f"sqlite:///{tmp_path / 'kernelab.db'}", port=free_port(), admin_token=token,
        log_path=tmp_path / "server.log", env={"PYTHONPATH": str(tmp_path)},
    ).start()  # fmt: skip
    try:
        env.update(KERNELAB_SERVER=server.url, KERNELAB_TOKEN=token)
        waiting = _cli("submit", "scale.yaml", "--wait", "--json", "out.json", env=env, cwd=tmp_path)
        assert waiting.stdout is not None
        job_id = int(waiting.stdout.readline())
        runner = subprocess.run(
            [sys.executable, "-m", "kernelab.runners.cli", "runner", "--once", "--name", "loop-node",
             "--work-dir", str(tmp_path / "runner"), "--benchmark", "scalebench:scale"],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert runner.returncode == 0, runner.stderr[-3000:]
        out, err = waiting.communicate(timeout=300)
        assert waiting.returncode == EXIT_FAILED, err
        comparison = Comparison.model_validate_json((tmp_path / "out.json").read_text())
        assert comparison.job_id == job_id and [c.verdict for c in comparison.cells] == ["incorrect"] * 2

        summary = tmp_path / "summary.md"
        summary.write_text("earlier step\n", encoding="utf-8")
        report = subprocess.run(
            [sys.executable, "-m", "kernelab.runners.cli", "report", str(job_id), "--format", "github"],
            env={**env, "GITHUB_STEP_SUMMARY": str(summary)}, cwd=tmp_path, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip
        assert report.returncode == EXIT_FAILED, report.stderr
        text = summary.read_text(encoding="utf-8")
        assert text.startswith("earlier step\n**kernelab: gate failed** (2 of 2 cells")  # appended
        assert f"[Job on the dashboard]({server.url}/jobs/{job_id})" in text
        assert "| n=256 |" in text and "**incorrect**" in text
        errors = [line for line in report.stdout.splitlines() if line.startswith("::")]
        assert len(errors) == 2
        assert errors[0].startswith(
            "::error title=kernelab scalebench%3Ascale%3A incorrect::n=256: incorrect: candidate: FAIL"
        )
        assert f"{server.url}/jobs/{job_id}" in errors[0]
        passing = subprocess.run(
            [sys.executable, "-m", "kernelab.runners.cli", "report", str(job_id), "--format", "github",
             "--fail-on", "failed"],
            env={k: v for k, v in env.items() if k != "GITHUB_STEP_SUMMARY"}, cwd=tmp_path,
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert passing.returncode == 0, passing.stderr
        assert passing.stdout.startswith("**kernelab: gate passed**")  # no summary file: stdout
        assert "::warning title=kernelab scalebench%3Ascale%3A incorrect::n=256" in passing.stdout
    finally:
        server.stop()
