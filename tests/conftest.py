"""Shared test configuration: markers skip cleanly when their resource is absent; the one shared
real server process (``live_server``, ``server_for_module``)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from kernelab.runners.local import ServerProcess, admin_token, free_port

PG_URL = os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CHROMIUM = os.environ.get("KERNELAB_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Triton's interpreter mode is fixed by the first ``import triton`` in a process
# (kernels/_device.py): pick it before any test module imports triton.
if not _has_cuda():
    from kernelab.kernels._device import configure_triton_env

    configure_triton_env("cpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine")
    has_cuda = _has_cuda()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)


@dataclass(frozen=True)
class LiveServer:
    """A running ``kernelab serve``: its base URL, its admin token and the process."""

    url: str
    token: str
    process: ServerProcess


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The one real server process of this test process (an xdist worker has its own): ``kernelab
    serve`` on a temp SQLite file, started once (a start is a Python process, the imports and the
    migrations: seconds on a 2-core CI box). Use it through ``server_for_module``."""
    tmp = tmp_path_factory.mktemp("live-server")
    token = admin_token(tmp)
    with ServerProcess(f"sqlite:///{tmp / 'kernelab.db'}", port=free_port(), admin_token=token,
                       log_path=tmp / "server.log") as proc:  # fmt: skip
        yield LiveServer(proc.url, token, proc)


@pytest.fixture(scope="module")
def server_for_module(live_server: LiveServer) -> LiveServer:
    """``live_server`` with an empty queue: the jobs an earlier module left queued or running are
    cancelled, so a ``runner --once`` of this module claims this module's job. Tokens, runners and
    finished jobs of earlier modules stay (tests look theirs up by name or id)."""
    import httpx

    admin = {"Authorization": f"Bearer {live_server.token}"}
    with httpx.Client(base_url=live_server.url, headers=admin, timeout=60) as http:
        for status in ("queued", "running"):
            for _ in range(100):  # pages of 100; a job that ended meanwhile answers 409 and is left
                jobs = http.get("/api/v1/jobs", params={"status": status, "limit": 100}).json()["data"]
                if not jobs:
                    break
                for job in jobs:
                    http.post(f"/api/v1/jobs/{job['id']}/cancel")
    return live_server
