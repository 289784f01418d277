"""Rotating tokens against a real ``kernelab serve`` (uvicorn subprocess, temp SQLite file):
``kernelab token rotate ID`` prints the new token once and revokes the old one, every refusal is one
line on stderr with exit status 1; a runner whose saved token was rotated refuses to start with a
message saying how to recover, and ``kernelab runner --token NEW`` replaces the saved token, then
claims and completes a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from test_cli_token import _refused, _token

from kernelab.runners.local import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SPEC = {
    "name": "rotation-test",
    "benchmark": "softmax",
    "baseline": {"variant": "torch"},
    "candidate": {"variant": "triton"},
    "sweep": {"M": [8], "N": [16]},
    "measurement": {"warmup_ms": 1, "budget_ms": 50, "min_rounds": 4},
    "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
    "timeout_s": 120,
}


def _api(url: str, token: str, method: str, path: str, **kwargs):  # type: ignore[no-untyped-def]
    return httpx.request(method, f"{url}/api/v1{path}", headers={"Authorization": f"Bearer {token}"},
                         timeout=30, **kwargs)  # fmt: skip


def test_token_rotate(server: tuple[str, str]) -> None:
    url, admin = server
    old = _token(url, admin, "create", "--name", "rotate-me", "--scope", "submit").stdout.strip()
    rows = _api(url, admin, "GET", "/tokens").json()["data"]
    old_id = next(r["id"] for r in rows if r["name"] == "rotate-me")

    rotated = _token(url, admin, "rotate", str(old_id))
    assert rotated.exit_code == 0, rotated.stderr
    new = rotated.stdout.strip()
    assert len(rotated.stdout.splitlines()) == 1 and new != old
    assert "shown only now" in rotated.stderr and f"replaces token {old_id}" in rotated.stderr
    assert _api(url, new, "GET", "/jobs").status_code == 200  # same scopes: submit implies read
    assert _api(url, old, "GET", "/jobs").status_code == 401
    rows = {r["id"]: r for r in _api(url, admin, "GET", "/tokens").json()["data"]}
    assert rows[old_id]["revoked_at"] is not None
    assert [r["scopes"] for r in rows.values() if r["name"] == "rotate-me" and r["revoked_at"] is None] == [
        ["submit"]
    ]

    _refused(_token(url, admin, "rotate", str(old_id)), f"token rotate {old_id}", "HTTP 409", "revoked")
    _refused(_token(url, admin, "rotate", "987654"), "HTTP 404", "token 987654 does not exist")
    _refused(_token(url, admin, "rotate", str(2**40)), "HTTP 422", "token_id")
    _refused(_token(url, "not-a-token", "rotate", "1"), "HTTP 401", "invalid or revoked token")
    _refused(_token(url, new, "rotate", "1"), "HTTP 403", "admin")
    closed = f"http://127.0.0.1:{free_port()}"
    _refused(_token(closed, admin, "rotate", "1"), "token rotate 1: server unreachable")
    assert _token(url, admin, "rotate", "0").exit_code == 2  # a usage error, before any request


def _runner(url: str, token: str, name: str, work_dir: Path) -> subprocess.CompletedProcess[str]:
    """``kernelab runner --once`` as a real process (its log on stderr)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelab.runners.cli",
            "runner",
            "--server",
            url,
            "--token",
            token,
            "--name",
            name,
            "--once",
            "--work-dir",
            str(work_dir),
            "--probe-pool",
            "off",
        ],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "KERNELAB_TOKEN": ""},
    )


def test_runner_starts_with_a_rotated_token(server: tuple[str, str], tmp_path: Path) -> None:
    url, admin = server
    name, work_dir = "rotated-node", tmp_path / "runner"
    token_file = work_dir / f"runner-{name}.json"
    first = _runner(url, admin, name, work_dir)  # registers with the admin token; queue empty
    assert first.returncode == 0, first.stderr
    saved = json.loads(token_file.read_text())
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"

    runner_token_id = next(r["id"] for r in _api(url, admin, "GET", "/tokens?revoked=false").json()["data"]
                           if r["runner_id"] == saved["runner_id"])  # fmt: skip
    rotated = _api(url, admin, "POST", f"/tokens/{runner_token_id}/rotate")
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()["token"]

    # the saved token is revoked: an admin --token does not replace it; the message says what to do
    refused = _runner(url, admin, name, work_dir)
    assert refused.returncode == 1
    assert f"the token saved in {token_file} was refused" in refused.stderr
    assert "kernelab token rotate ID" in refused.stderr and "--token NEW" in refused.stderr
    assert f"runner {saved['runner_id']}" in refused.stderr and "Traceback" not in refused.stderr
    assert new not in refused.stderr and saved["token"] not in refused.stderr  # tokens are never logged

    job = _api(url, admin, "POST", "/jobs", json=SPEC)
    assert job.status_code == 201, job.text
    run = _runner(url, new, name, work_dir)
    assert run.returncode == 0, run.stderr
    assert "replaces the one saved" in run.stderr and new not in run.stderr
    assert "done=1" in run.stderr and "failed=0" in run.stderr
    finished = _api(url, admin, "GET", f"/jobs/{job.json()['id']}").json()
    assert (finished["status"], finished["node"]) == ("succeeded", name)
    now = json.loads(token_file.read_text())
    assert now == {**saved, "token": new}
    assert oct(token_file.stat().st_mode & 0o777) == "0o600"

    again = _runner(url, admin, name, work_dir)  # a restart with the admin token reuses the new one
    assert again.returncode == 0 and "using the token saved" in again.stderr, again.stderr
    assert json.loads(token_file.read_text())["token"] == new

    # another runner's token is refused, and the file keeps this runner's
    other = _runner(url, admin, "other-node", tmp_path / "other")
    assert other.returncode == 0, other.stderr
    other_token = json.loads((tmp_path / "other" / "runner-other-node.json").read_text())["token"]
    wrong = _runner(url, other_token, name, work_dir)
    assert wrong.returncode == 1 and "belongs to runner 'other-node'" in wrong.stderr, wrong.stderr
    assert "Traceback" not in wrong.stderr and other_token not in wrong.stderr
    assert json.loads(token_file.read_text())["token"] == new
