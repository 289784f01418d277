"""Processes a job leaves behind die with the job, whether or not user namespaces are allowed.

Job code may start processes that leave its process group and session (``setsid``, a double
``fork``, a daemonising library): a kill of the job's process group misses them, and they outlive
the job (holding the GPU, reading what later jobs write). Two Linux mechanisms, neither of which
needs a privilege or a namespace (``prctl(2)``):

* ``PR_SET_CHILD_SUBREAPER``: the job's worker (``kernelab.runners.worker``, kernelab's own code,
  the parent of every process of the job) becomes the reaper of its descendants, so a process
  whose parent exits is re-parented to the worker rather than to ``init``, whatever session or
  group it made. When the job ends (its result written, its failure, a ``SIGTERM`` from the
  daemon: a timeout, a cancel, a lost lease, a shutdown) the worker kills every process still
  below it (``kill_descendants``: ``SIGKILL``, then reaps them) before it exits.
* ``PR_SET_PDEATHSIG``: the worker gets ``SIGTERM`` when the daemon that started it dies (even by
  ``SIGKILL``), and so runs the same clean-up; a measuring or probing child of the worker
  (``kernelab.runners.measure``) gets ``SIGKILL`` when the worker dies. ``die_with_parent`` checks
  the parent named in ``PARENT_PID_ENV`` is still the parent after the call, so a parent that died
  just before it is not missed.

A process left behind that holds the job's output pipe open would keep the reader of that pipe
waiting for its end (and closing a pipe that a thread reads blocks on that thread): the readers
(``kernelab.runners.measure``, ``kernelab.runners.daemon.supervisor``) kill the holders of the
pipe (``kill_pipe_holders``) when the process they started has ended but its output has not.

What this does not cover: a job process that kills the worker first (job code runs as the
runner's user and may signal its processes) is re-parented to ``init`` once the worker is gone.
A PID namespace would close that too, but hides the PIDs that kernelab's NVML checks of a GPU's
other processes rely on (``docs/security.md``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import time

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_CHILD_SUBREAPER = 36
PARENT_PID_ENV = "KERNELAB_PARENT_PID"  # the pid of the process that started this one
REAP_TIMEOUT_S = 10.0  # how long kill_descendants keeps killing (a process that forks on and on)


def _prctl(option: int, arg: int) -> bool:
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0)) == 0
    except (OSError, AttributeError):  # not Linux
        return False


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where refused (not Linux)."""
    return _prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int) -> bool:
    """Have this process get ``sig`` when its parent dies; False where refused. When the parent
    named in ``PARENT_PID_ENV`` is already gone (this process was re-parented before the call),
    ``sig`` is sent at once."""
    ok = _prctl(PR_SET_PDEATHSIG, int(sig))
    expected = os.environ.get(PARENT_PID_ENV, "")
    if ok and expected.isdigit() and os.getppid() != int(expected):
        os.kill(os.getpid(), sig)
    return ok


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), read from Linux's ``/proc`` (empty
    elsewhere), parents before their children."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])  # after "(comm)": state, ppid
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(0), []):
            out.append(child)
            todo.append(child)
    return out


def _reap() -> None:
    """Collect every child of this process that has ended (zombies), without blocking."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_descendants(timeout_s: float = REAP_TIMEOUT_S) -> list[int]:
    """``SIGKILL`` every process below this one and reap them, again and again until none is left
    (a process re-parented here while others die is caught on the next pass) or ``timeout_s``
    seconds have passed; the pids killed. Call it only once this process waits on no child any
    more: it reaps whatever ends."""
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        below = descendants(os.getpid())
        alive = [pid for pid in below if not _zombie(pid)]
        if not alive:
            _reap()
            return killed
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
        time.sleep(0.02)
        _reap()
        if time.monotonic() > deadline:
            return killed


def pipe_holders(fd: int) -> list[int]:
    """The other processes that hold the pipe ``fd`` (this process's end of it) open: every pid
    with a file descriptor on the same pipe (``/proc/PID/fd``, where readable)."""
    try:
        target = f"pipe:[{os.fstat(fd).st_ino}]"
        entries = os.listdir("/proc")
    except OSError:
        return []
    out = []
    for name in entries:
        if not name.isdigit() or int(name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(f"/proc/{name}/fd/{n}") == target for n in os.listdir(f"/proc/{name}/fd")):
                out.append(int(name))
    return out


def kill_pipe_holders(fd: int) -> list[int]:
    """``SIGKILL`` every other process that holds the pipe ``fd`` open (``pipe_holders``): the
    processes a job left behind that keep its output open after it ended, so a reader waiting for
    the end of that output is not kept waiting; the pids killed."""
    holders = pipe_holders(fd)
    for pid in holders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    return holders


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True  # gone
