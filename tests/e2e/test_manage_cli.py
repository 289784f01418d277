"""``kernelab jobs``, ``cancel``, ``rerun`` and ``submit --wait``'s progress lines as a user runs
them, against the shared real server (``kernelab serve`` on a temp SQLite file); the runner's
side is driven over the REST API (claim, heartbeats with progress, failure), so what the CLI
prints is the server's answer, not a fake."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

SPEC = """\
name: managed softmax
benchmark: softmax
baseline: {variant: torch}
candidate: {variant: triton}
sweep: {M: [4, 8, 16, 32], N: [64]}
device: cpu
"""


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.timeout(600)
def test_jobs_cancel_rerun_and_submit_wait_progress(server_for_module: Any, tmp_path: Path) -> None:
    url, token = server_for_module.url, server_for_module.token
    env = {**os.environ, "KERNELAB_SERVER": url, "KERNELAB_TOKEN": token}
    spec = tmp_path / "managed.yaml"
    spec.write_text(SPEC)
    first = _cli("submit", str(spec), env=env)
    assert first.returncode == 0, first.stderr
    job_id = int(first.stdout.split()[0])

    listed = _cli("jobs", "--status", "queued", "--benchmark", "softmax", env=env)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert rows[0].split()[:3] == ["id", "status", "benchmark"]
    assert any(r.split()[:3] == [str(job_id), "queued", "softmax"] for r in rows[1:])
    bad = _cli("jobs", "--status", "done", env=env)
    assert bad.returncode == 2 and "--status: 'done' is no job status" in bad.stderr

    cancelled = _cli("cancel", str(job_id), env=env)
    assert cancelled.returncode == 0 and cancelled.stdout.strip() == f"job {job_id} cancelled"
    again = _cli("cancel", str(job_id), env=env)
    assert again.returncode == 1 and "only queued or running jobs cancel" in again.stderr
    assert _cli("cancel", "987654", env=env).returncode == 2

    rerun = _cli("rerun", str(job_id), env=env)
    assert rerun.returncode == 0, rerun.stderr
    new_id = int(rerun.stdout.strip())
    newest = _cli("jobs", "--limit", "1", env=env).stdout.splitlines()[1]
    assert newest.split()[:2] == [str(new_id), "queued"] and f"(re-run of #{job_id})" in newest
    assert _cli("cancel", str(new_id), env=env).returncode == 0

    # submit --wait prints the progress the runner heartbeats, through the server
    admin = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=f"{url}/api/v1", timeout=30) as api:
        reg = api.post("/runners/register", json={"name": "cli-progress-runner"}, headers=admin)
        runner = {"Authorization": f"Bearer {reg.json()['token']}"}
        waiter = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelab.runners.cli",
                "submit",
                str(spec),
                "--wait",
                "--timeout-s",
                "240",
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            claim = None
            for _ in range(600):  # until the waiter's job is queued and claimed
                r = api.post("/runners/claim", json={"lease_s": 120}, headers=runner)
                if r.status_code == 200:
                    claim = r.json()
                    break
                time.sleep(0.2)
            assert claim is not None
            waited = claim["job_id"]
            steps = [(0, 0, "warm-up", None), (1, 1, "measuring", 10.0), (3, 3, "checks", 3.0)]
            for cell, done, phase, eta in steps:
                progress = {
                    "cell": cell,
                    "cells": 4,
                    "cells_done": done,
                    "phase": phase,
                    "elapsed_s": 1.0,
                    "message": f"{phase} of cell {cell + 1}",
                    **({"eta_s": eta} if eta else {}),
                }
                beat = api.post(
                    f"/runners/jobs/{waited}/heartbeat", json={"progress": progress}, headers=runner
                )
                assert beat.status_code == 200, beat.text
                time.sleep(2.0)  # the waiter reads the job every 0.5 s
            assert (
                api.post(
                    f"/runners/jobs/{waited}/fail", json={"error": "node on fire"}, headers=runner
                ).status_code
                == 200
            )
            out, err = waiter.communicate(timeout=120)
        finally:
            if waiter.poll() is None:
                waiter.kill()
    assert waiter.returncode == 1, err
    assert "cell 1/4 · warm-up · 0 done · warm-up of cell 1" in err
    assert "cell 2/4 · measuring · 1 done · ETA 10 s · measuring of cell 2" in err
    assert "cell 4/4 · checks · 3 done · ETA 3 s · checks of cell 4" in err
    assert f"job {waited} failed: node on fire" in err
