"""A drill's own ``kernelab serve`` child: for the tests whose server needs its own limits or
timeouts (the connection and slow-body drills); every other test uses the shared server of
``tests/conftest.py`` (``live_server``, ``server_for_module``, ``server_for_test``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kernelab.runners.local import free_port, wait_healthy

START_TIMEOUT_S = 300.0  # a start is only slow, not wrong, on a loaded machine (tests/conftest.py)


@contextmanager
def serve_process(
    tmp_path: Path, env: dict[str, str], *, preexec_fn: Callable[[], None] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """A ``kernelab serve`` child on a free port and a temp SQLite file, with ``env`` added to its
    environment (``KERNELAB_ADMIN_TOKEN``, limits, timeouts) and ``preexec_fn`` run in the child
    before it starts (``resource.setrlimit``): for the drills that need a server configured or
    limited their own way. Yields the process, its base URL and its log's path; stopped after
    (SIGTERM, SIGKILL after 10 s)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "server.log"
    full_env = {**os.environ, "KERNELAB_DATABASE_URL": f"sqlite:///{tmp_path / 'k.db'}", **env}
    command = [sys.executable, "-m", "kernelab.runners.cli", "serve", "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            env=full_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=preexec_fn,
        )
        try:
            wait_healthy(url, proc, timeout_s=START_TIMEOUT_S, log_path=log_path)
            yield proc, url, log_path
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
