"""Nothing a test run starts outlives it: a guard process per pytest process that, once that pytest
process is gone (finished, Ctrl-C, or killed with ``SIGKILL``), kills every process the run started
and removes the folders registered with it.

Why not only fixtures' ``finally``: a ``SIGKILL`` runs no teardown, Ctrl-C may land while a fixture
starts its process, a ``PR_SET_PDEATHSIG`` set by a child dies with the *thread* that started it
(the drills start processes from threads), and several kernelab processes leave their parent's
process group on purpose (``setsid``: the fork server's children, the runner's job namespaces;
``pg_ctl`` daemonises PostgreSQL). What they all keep is their environment.

How: ``start_guard()`` (``tests/conftest.py``, at ``pytest_configure``) puts
``KERNELAB_TEST_OWNER=<random>`` into this process's environment, which every process started from
here on inherits (``subprocess``'s default, ``runuser``, ``pg_ctl``, the runner daemon's job
worker: its allow-listed environment keeps it, ``kernelab.runners.jobenv``), and starts
``python -c GUARD`` in its own session (a Ctrl-C of the terminal does not reach it) with the read
end of a pipe whose write end only this process holds (close-on-exec, so no child keeps it open).
The guard blocks on that pipe: lines ``rm PATH`` register a folder; end of file means the pytest
process is gone, however it ended. The guard then sends ``SIGTERM`` to every process whose initial
environment (``/proc/PID/environ``) holds this exact ``KERNELAB_TEST_OWNER`` entry (PostgreSQL
shuts down on it and removes its shared memory; a kernelab server stops its compare worker), waits
up to ``TERM_GRACE_S``, ``SIGKILL``s what is left until nothing carries the entry (a process that
forked meanwhile is caught on the next pass), and removes the registered folders that still exist.

An xdist controller and its workers each have a guard: a worker's initial environment carries the
controller's entry (its own, set in ``pytest_configure``, is what its children get), so a
controller that is killed takes its workers down through its guard, and each worker's guard then
takes down that worker's processes. Linux only (``/proc``); elsewhere ``start_guard`` does nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from pathlib import Path

OWNER_ENV = "KERNELAB_TEST_OWNER"
TERM_GRACE_S = 5.0  # SIGTERM -> SIGKILL for what a run left behind
SWEEP_LIMIT_S = 60.0  # the guard gives up killing after this (a process it may not signal)

GUARD = r"""
import os, shutil, signal, sys, time
entry = ("%s=" % sys.argv[1]).encode() + sys.argv[2].encode()
term_grace_s, limit_s = float(sys.argv[3]), float(sys.argv[4])
folders = []
with os.fdopen(int(sys.argv[5]), "rb") as pipe:
    for line in pipe:  # until the pytest process (the only writer) is gone
        if line.startswith(b"rm "):
            folders.append(line[3:].rstrip(b"\n").decode())
me = os.getpid()

def marked():
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:  # gone, or a kernel thread
            continue
        if entry in env:
            found.append(int(name))
    return found

def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass

pids = marked()
if pids:
    sys.stderr.write("kernelab tests: %d processes outlived their pytest process; ending them\n" % len(pids))
signal_all(pids, signal.SIGTERM)
start = time.monotonic()
while pids and time.monotonic() - start < term_grace_s:
    time.sleep(0.1)
    pids = marked()
while pids and time.monotonic() - start < limit_s:  # a zombie's environ reads empty: not counted
    signal_all(pids, signal.SIGKILL)
    time.sleep(0.1)
    pids = marked()
for folder in folders:
    shutil.rmtree(folder, ignore_errors=True)
"""

_pipe: int | None = None


def start_guard() -> bool:
    """Start this pytest process's guard (module docstring), once; False where there is no
    ``/proc`` (not Linux) or the guard is already running. Raises ``OSError`` when the guard
    cannot be started."""
    global _pipe
    if _pipe is not None or not Path("/proc/self/environ").exists():
        return False
    owner = secrets.token_hex(8)
    read_end, write_end = os.pipe()  # both close-on-exec: no child of this process holds them
    env = {k: v for k, v in os.environ.items() if k != OWNER_ENV}  # no sweep (a controller's) ends it
    args = [sys.executable, "-I", "-c", GUARD, OWNER_ENV, owner, str(TERM_GRACE_S), str(SWEEP_LIMIT_S),
            str(read_end)]  # fmt: skip
    try:
        # posix_spawn, not Popen: the guard outlives this process by design (a Popen object would
        # warn at exit that its process still runs); its own session: a Ctrl-C does not reach it;
        # stdout to /dev/null (a reader of pytest's output does not wait for the guard), stderr
        # kept for its one line when it had something to end
        os.set_inheritable(read_end, True)
        os.posix_spawn(sys.executable, args, env, setsid=True,
                       file_actions=[(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                                     (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)])  # fmt: skip
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _pipe = write_end
    os.environ[OWNER_ENV] = owner
    return True


def remove_at_exit(folder: Path) -> None:
    """Have the guard remove ``folder`` once this pytest process is gone, if it still exists then
    (a cluster's data, a temp folder outside pytest's own); a no-op without a guard."""
    if _pipe is not None:
        with contextlib.suppress(OSError):  # the guard is gone: nothing left to ask
            os.write(_pipe, f"rm {Path(folder).resolve()}\n".encode())
