"""The dashboard tests' server: the app under uvicorn (as a fleet runs it) on a free loopback port,
a compare worker beside it (``compare_wait``), and a headless Chromium launch, one place for the
browser modules instead of a copy each."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import compare_wait
import httpx

ADMIN_TOKEN = "browser-test-admin-token-0123456789"
SERVER_START_S = 300.0  # a start is only slow, not wrong, on a loaded machine (tests/conftest.py)
CHROMIUM = os.environ.get("KERNELAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(base_url: str, proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """Poll ``/readyz`` until 200; ``RuntimeError`` with the log when the server exits first or
    after ``SERVER_START_S`` seconds."""
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {log_path.read_text()}")
        try:
            if httpx.get(f"{base_url}/readyz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server did not become ready within {SERVER_START_S} s")


@contextmanager
def dashboard(db_url: str, log_path: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """``kernelab.service.app:create_app`` under uvicorn on ``db_url`` (already migrated), a private
    dashboard with the admin token ``ADMIN_TOKEN``, plus a compare worker; ``env`` adds to their
    environment. Yields the base URL once ``/readyz`` answers; both processes are stopped after."""
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}"
    full_env = {**os.environ, "KERNELAB_DATABASE_URL": db_url, "KERNELAB_ADMIN_TOKEN": ADMIN_TOKEN,
                "KERNELAB_PUBLIC_DASHBOARD": "false", **(env or {})}  # fmt: skip
    command = [sys.executable, "-m", "uvicorn", "--factory", "kernelab.service.app:create_app",
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]  # fmt: skip
    with log_path.open("wb") as log:  # the server's output; a failing test's log points here
        proc = subprocess.Popen(command, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        worker = compare_wait.start(full_env, log)
        try:
            _wait_ready(base_url, proc, log_path)
            yield base_url
        finally:
            compare_wait.stop(worker)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
