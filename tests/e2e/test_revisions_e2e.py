"""Revision A/B jobs end to end over real HTTP: a git repository made here with three commits of
a small PyTorch kernel (fast, 4x the work, wrong), ``kernelab serve`` on a temp SQLite file,
``kernelab submit --baseline-ref/--candidate-ref --repo`` and REST submissions, one
``kernelab runner --once --allow-repo`` process that runs them all, then the API, the Markdown
export and the dashboard pages read back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess
from tests.e2e.revision_repo import make_repo

pytestmark = pytest.mark.slow  # server, runner, revision workers: Python processes

SPEC = """\
name: revision a/b
benchmark: "revpkg.bench:AxpyBenchmark"
baseline: {variant: torch}
candidate: {variant: torch}
params: {N: 100000}
device: cpu
measurement: {warmup_ms: 5, budget_ms: 250, min_rounds: 6}
probes: {copy_bandwidth: false, all_reduce: false, nvml: false}
timeout_s: 240
"""
NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False}


def _cli(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=600,
    )


@pytest.fixture
def server(server_for_module: Any) -> tuple[ServerProcess, str]:
    """The shared real server (``tests/conftest.py``: ``live_server``), its queue empty."""
    return server_for_module.process, server_for_module.token


def _source(repo: Path, ref: str, **extra: object) -> dict[str, object]:
    return {"repo": str(repo), "ref": ref, **extra}


def _job(baseline: dict[str, object], candidate: dict[str, object]) -> dict[str, object]:
    return {
        "name": "rev",
        "benchmark": "revpkg.bench:AxpyBenchmark",
        "params": {"N": 100000},
        "device": "cpu",
        "probes": NO_PROBES,
        "timeout_s": 240,
        "measurement": {"warmup_ms": 5, "budget_ms": 250, "min_rounds": 6},
        "baseline": {"variant": "torch", "source": baseline},
        "candidate": {"variant": "torch", "source": candidate},
    }


@pytest.mark.timeout(300)
def test_revision_ab_jobs_over_http(server: tuple[ServerProcess, str], tmp_path: Path) -> None:
    srv, token = server
    repo = tmp_path / "kernels-repo"
    shas = make_repo(repo)
    other = tmp_path / "not-allowed"
    make_repo(other)
    spec_file = tmp_path / "rev.yaml"
    spec_file.write_text(SPEC)
    env = {**os.environ, "KERNELAB_SERVER": srv.url, "KERNELAB_TOKEN": token}

    # 1. `kernelab submit --baseline-ref main~2 --candidate-ref slow --repo .` from inside the checkout.
    submitted = _cli(
        "submit",
        str(spec_file),
        "--baseline-ref",
        "main~2",
        "--candidate-ref",
        "slow",
        "--repo",
        ".",
        env=env,
        cwd=repo,
    )
    assert submitted.returncode == 0, submitted.stderr
    slower_id = int(submitted.stdout.split()[0])
    assert f"candidate: {repo} @ slow ({shas['slow'][:12]})" in submitted.stderr

    with KernelabClient(srv.url, token) as client:
        wrong_id = client.submit(
            _job(_source(repo, shas["fast"], branch="main"), _source(repo, "main", branch="main"))
        ).id
        denied_id = client.submit(_job(_source(other, "main"), _source(other, "main"))).id
        missing_id = client.submit(_job(_source(repo, "main"), _source(repo, "no-such-branch"))).id
        broken_id = client.submit(
            _job(
                _source(repo, "main"),
                _source(repo, "slow", install=["{python} -c \"raise SystemExit('build exploded')\""]),
            )
        ).id
        healthy_id = client.submit(_job(_source(repo, "slow"), _source(repo, "main~2"))).id

        runner = _cli(
            "runner",
            "--once",
            "--name",
            "rev-node",
            "--work-dir",
            str(tmp_path / "runner"),
            "--allow-repo",
            str(repo),
            env=env,
        )
        assert runner.returncode == 0, runner.stderr[-4000:]
        assert "done=3 failed=3" in runner.stderr  # the runner outlived every broken job

        verdicts = {}
        for job_id in (slower_id, wrong_id, healthy_id):
            job = client.wait(job_id, timeout_s=300)  # its comparison computed, not only its result stored
            assert job.status == "succeeded", job.error
            comparison = client.comparison(job_id)
            [cell] = comparison.cells
            verdicts[job_id] = cell
            revs = comparison.node.revisions
            assert revs is not None
            assert len(revs.baseline.sha) == len(revs.candidate.sha) == 40
            assert revs.baseline.versions["torch"] and revs.candidate.versions["python"]
        assert verdicts[slower_id].verdict == "slower" and verdicts[healthy_id].verdict == "faster"
        assert verdicts[slower_id].ratio is not None and verdicts[slower_id].ratio > 2.0
        assert "incorrect" in verdicts[wrong_id].flags
        assert verdicts[wrong_id].correctness["baseline"].passed
        assert not verdicts[wrong_id].correctness["candidate"].passed

        slower = client.comparison(slower_id).node.revisions
        assert slower is not None
        assert (slower.baseline.sha, slower.candidate.sha) == (shas["fast"], shas["slow"])
        assert slower.candidate.branch == "slow" and slower.diff_shortstat.startswith("1 file changed")
        assert "revpkg/bench.py" in slower.diff_stat

        errors = {job_id: client.get_job(job_id) for job_id in (denied_id, missing_id, broken_id)}
        assert all(j.status == "failed" for j in errors.values())
        assert errors[denied_id].error.startswith(
            f"baseline: repository '{other}' is not on this runner's allow-list"
        )
        assert errors[missing_id].error.startswith(
            f"candidate: revision 'no-such-branch' not found in repository '{repo}'"
        )
        assert errors[broken_id].error.startswith("candidate: install step 1 failed")
        assert "build exploded" in errors[broken_id].error

        markdown = client.report_md(slower_id)
        assert "**Revisions**" in markdown and f"`{shas['slow'][:12]}`" in markdown
        assert "1 file changed" in markdown and f"@ slow {shas['slow'][:8]}" in markdown

    headers = {"Authorization": f"Bearer {token}"}
    page = httpx.get(f"{srv.url}/jobs/{slower_id}", headers=headers, timeout=30)
    assert page.status_code == 200
    assert 'id="revisions-table"' in page.text and shas["fast"][:12] in page.text
    history = httpx.get(
        f"{srv.url}/history", params={"benchmark": "revpkg.bench:AxpyBenchmark"}, headers=headers, timeout=60
    )
    assert history.status_code == 200 and 'id="fig-history"' in history.text
    assert history.text.count(f"<code>{shas['slow'][:12]}</code>") >= 2  # two jobs measured it
