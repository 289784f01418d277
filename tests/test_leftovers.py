"""An interrupted test run leaves nothing behind (``tests/leftovers.py``): a run of
``tests/interrupted_run.py`` (the shared server, a runner daemon, a PostgreSQL cluster of its own)
is stopped with Ctrl-C or its pytest process killed with ``SIGKILL``, and afterwards no process
of it runs and the cluster's folder is gone."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parent.parent
PROBE_ENV = "KERNELAB_LEFTOVERS_PROBE"
READY_S = 600.0  # the inner run's start: a server, a daemon, a cluster (minutes on a loaded machine)
GONE_S = 90.0  # the guard's sweep: TERM_GRACE_S, then SIGKILL (tests/leftovers.py)
# The inner run's end after Ctrl-C or SIGKILL: seconds, alone or under load. One that has not ended
# by then gets SIGABRT, so the failure shows where it hung (pytest's faulthandler prints every
# thread's stack): that is how the inherited ignored SIGINT (``_as_from_a_terminal``) was found.
STOP_S = 120.0


def _as_from_a_terminal() -> None:
    """In the inner run's process before it execs: SIGINT back to its default, as a run started
    from a shell has it. An ignored SIGINT is inherited across exec, and this test's own process may
    ignore it (an xdist worker after some tests): a Python started so never raises
    KeyboardInterrupt, and the Ctrl-C'd run slept on (3 of 3 full slow-tier runs on 2026-12-07)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _carrying(entry: bytes) -> dict[int, str]:
    """The processes whose initial environment holds ``entry``: pid -> command line."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            env = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
            if entry in env:
                found[int(name)] = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc (Linux)")
@pytest.mark.skipif(
    shutil.which("pg_ctl") is None and not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")),
    reason="PostgreSQL's pg_ctl not installed",
)
@pytest.mark.parametrize(
    ("how", "workers"),
    [("ctrl-c", "0"), ("sigkill", "1")],
    ids=["ctrl-c-of-a-run", "sigkill-of-an-xdist-controller"],
)
def test_an_interrupted_run_leaves_no_process_and_no_cluster(tmp_path: Path, how: str, workers: str) -> None:
    probe = secrets.token_hex(8)
    entry = f"{PROBE_ENV}={probe}".encode()
    ready_path = tmp_path / "ready.json"
    # this process's KERNELAB_TEST_OWNER stays: were this run killed, its guard would end the inner run
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env |= {PROBE_ENV: probe, "KERNELAB_LEFTOVERS_READY": str(ready_path)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers,
           "--basetemp", str(tmp_path / "inner"), "tests/interrupted_run.py"]  # fmt: skip
    log = tmp_path / "inner.log"
    hang = ""  # set when the interrupted run does not end (STOP_S)
    with log.open("wb") as out:
        inner = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                 preexec_fn=_as_from_a_terminal)  # fmt: skip
    try:
        deadline = time.monotonic() + READY_S
        while not ready_path.exists():
            assert inner.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, f"the inner run not ready in {READY_S:g} s"
            time.sleep(0.5)
        ready = json.loads(ready_path.read_text())
        running = _carrying(entry)
        commands = " | ".join(running.values())
        assert ready["server"] in running and ready["runner"] in running, commands
        assert "postgres" in commands and "compare_worker" in commands, commands

        if how == "ctrl-c":  # the terminal's SIGINT reaches the run's process group
            os.killpg(inner.pid, signal.SIGINT)
        else:
            inner.kill()
        try:
            inner.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            # where it hangs: pytest's faulthandler writes every thread's stack to its log on SIGABRT
            inner.send_signal(signal.SIGABRT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                inner.wait(timeout=30)
            hang = f"the inner run did not end within {STOP_S:g} s of {how}; its stacks:\n"
            hang += log.read_text(errors="replace")[-6000:]
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()

    deadline = time.monotonic() + GONE_S
    while (left := _carrying(entry)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"left running after the run ended: {left}\n{log.read_text(errors='replace')[-3000:]}"
    assert not Path(ready["cluster"]).exists(), "the cluster's folder was left behind"
    assert not hang, hang  # nothing was left behind, but the interrupted run itself hung
