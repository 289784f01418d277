"""``kernelab probe --server URL --post`` against a real server over HTTP: a runner token of the
node (``kernelab token create --scope runner``) reads its band and stores the report; an admin
token is told which token it needs; ``KERNELAB_SERVER`` names the server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

KERNELAB = str(Path(sys.executable).parent / "kernelab")


def _kernelab(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KERNELAB_")}
    return subprocess.run(
        [KERNELAB, *args], env={**base, **env}, capture_output=True, text=True, timeout=240, check=False
    )


def test_probe_post_with_a_runner_token_of_the_node(server: tuple[str, str]) -> None:
    url, admin = server
    host = socket.gethostname()
    known = httpx.get(f"{url}/api/v1/nodes/{host}", headers={"Authorization": f"Bearer {admin}"})
    before = len(known.json()["probes"]) if known.status_code == 200 else 0  # a shared server's
    made = _kernelab("token", "create", "--scope", "runner", "--name", "probe-node", KERNELAB_SERVER=url,
                     KERNELAB_TOKEN=admin)  # fmt: skip
    assert made.returncode == 0, made.stderr
    runner_token = made.stdout.strip()
    refused = _kernelab("probe", "--post", KERNELAB_SERVER=url, KERNELAB_TOKEN=admin)
    assert refused.returncode == 1
    assert "403" in refused.stderr and "kernelab token create --scope runner" in refused.stderr
    first = _kernelab("probe", "--post", KERNELAB_SERVER=url, KERNELAB_TOKEN=runner_token)
    assert first.returncode == 0, first.stderr
    assert f"stored on {url} for node {host}" in first.stderr
    second = _kernelab("probe", "--post", KERNELAB_SERVER=url, KERNELAB_TOKEN=runner_token)
    assert second.returncode == 0, second.stderr
    assert f"the bands of {url} for {host}" in second.stdout  # it read the node's band with its own token
    detail = httpx.get(f"{url}/api/v1/nodes/{host}", headers={"Authorization": f"Bearer {admin}"}).json()
    assert len(detail["probes"]) == before + 2
    # bound to this node now: another node's detail stays closed to it
    other = httpx.get(
        f"{url}/api/v1/nodes/another-{host}", headers={"Authorization": f"Bearer {runner_token}"}
    )
    assert other.status_code == 403 and "runner token of node" in other.json()["detail"]


def test_post_needs_a_server() -> None:
    result = _kernelab("probe", "--post")
    assert result.returncode == 2 and "--post needs --server" in result.stderr
