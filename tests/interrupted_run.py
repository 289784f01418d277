"""The run that ``tests/test_leftovers.py`` interrupts (not collected on its own: no ``test_``
prefix): it starts the kinds of process a test run starts, the shared ``kernelab serve`` (and
its compare worker), a runner daemon in a session of its own, a PostgreSQL cluster of its own
(``tests/service/pg_cluster.py``: ``pg_ctl`` daemonises it), stops none of them, says so in
``KERNELAB_LEFTOVERS_READY`` and waits to be interrupted."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).with_name("service")))
from node_drills import RunnerCli  # noqa: E402
from pg_cluster import PgCluster  # noqa: E402

from tests.conftest import LiveServer  # noqa: E402


@pytest.mark.timeout(900)
def test_start_processes_then_wait(live_server: LiveServer, tmp_path: Path) -> None:
    runner = RunnerCli(live_server.url, "leftover", tmp_path / "work", tmp_path / "runner.log",
                       env={"KERNELAB_TOKEN": live_server.token}).start()  # fmt: skip
    cluster = PgCluster()
    cluster.start()
    while runner.status() is None:  # the daemon is up (its adverts child has run)
        assert runner.alive(), runner.text()
        time.sleep(0.2)
    assert runner.proc is not None and live_server.process.proc is not None
    ready = {"cluster": str(cluster.root), "runner": runner.proc.pid, "server": live_server.process.proc.pid}
    ready_path = Path(os.environ["KERNELAB_LEFTOVERS_READY"])
    ready_path.with_suffix(".tmp").write_text(json.dumps(ready))
    ready_path.with_suffix(".tmp").rename(ready_path)  # whole when it appears
    time.sleep(900)
