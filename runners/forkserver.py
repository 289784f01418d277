"""One warm process per job that forks the job's measuring and probing processes.

A job runs three fresh processes (``kernelab.runners.measure``: probes before, the cells, probes
after), and each used to pay for a new interpreter and ``import torch`` (1.6-1.9 CPU-s each on a
2-core machine, plus Triton, NumPy and SciPy). ``ForkServer`` starts one process per job,
``python -P -m kernelab.runners.forkserver CONTROL_FD``, that imports those libraries (no benchmark
code, never a CUDA context: CUDA cannot be forked) and then forks one child per request. Each
child is as fresh as before where it matters: a benchmark module, its patches and the CUDA context
it makes exist only in the child that measured it; the probes' children never share a process with
benchmark code. This is the fork-server pattern of Python's own ``multiprocessing``
(``forkserver`` start method, ``Lib/multiprocessing/forkserver.py``) and of Android's zygote.

Protocol, over an ``AF_UNIX`` ``SOCK_SEQPACKET`` socket pair (one message per packet):

* parent -> server: ``{"argv": [...]}`` with two file descriptors (``socket.send_fds``): the
  child's stdout (a pipe the parent reads) and stderr (a file);
* server -> parent: ``{"pid": N}`` once forked, then ``{"exit": status}`` when the child ended
  (``os.waitstatus_to_exitcode``: negative for a signal), as ``subprocess.Popen.returncode``.

The child calls ``setsid`` (its own process group, which the parent kills on a timeout),
``PR_SET_PDEATHSIG`` through ``kernelab.runners.measure.main`` (it dies with the server, which dies
with the job's process) and runs ``kernelab.runners.measure.main(argv)``. One request at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from kernelab.runners import measure
from kernelab.runners.reaper import PARENT_PID_ENV, die_with_parent

_MAX_PACKET = 1 << 16
_START_TIMEOUT_S = 120.0  # the server's imports, at most (then the job's children start cold)
PRELOAD = ("torch", "numpy", "scipy.special", "triton", "kernelab.runners.cells", "kernelab.runners.probes")
"""What the server imports before it forks: libraries and kernelab's own engine, never a benchmark
(``triton`` where installed; the job's ``TRITON_INTERPRET`` is in the server's environment)."""


class ForkedChild:
    """A child forked by the server, with the part of ``subprocess.Popen`` that
    ``kernelab.runners.children`` uses: ``pid``, ``stdout`` (text), ``wait(timeout)``, ``poll()``,
    ``returncode``."""

    def __init__(self, server: ForkServer, pid: int, stdout: IO[str]):
        self._server = server
        self.pid = pid
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        if self.returncode is None:
            reply = self._server._receive(timeout, waiting_for=f"child {self.pid}")
            self.returncode = int(reply["exit"])
        return self.returncode

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.wait(0)
        return None

    def abandon(self) -> None:
        """The server does not answer for this child (stopped, hung): kill the server's process
        group; the child and its own children die with it (their death signal). The job's next
        children start cold (``active()`` is None from then on)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._server.proc.pid, signal.SIGKILL)
        self._server.proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        self.returncode = -signal.SIGKILL


class ForkServerError(RuntimeError):
    """The fork server is gone or answered nonsense; its log's tail is in the message."""


class ForkServer:
    """The job's fork server (module docstring). ``env``: the children's environment (the job's,
    ``kernelab.runners.children._child_env``). Use as a context manager or call ``close()``; while it
    lives, ``active()`` returns it. Raises ``OSError`` when the process cannot be started."""

    def __init__(self, env: Mapping[str, str]):
        self._tmp = tempfile.TemporaryDirectory(prefix="kernelab-forkserver-")
        self.log_path = Path(self._tmp.name, "server.log")
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with self.log_path.open("wb") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-P", "-m", "kernelab.runners.forkserver", str(theirs.fileno())],
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(env),
                    start_new_session=True,
                )
        except BaseException:
            self._sock.close()
            self._tmp.cleanup()
            raise
        finally:
            theirs.close()
        self.forked = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def spawn(self, argv: Sequence[str], stderr: IO[Any]) -> ForkedChild:
        """Fork a child that runs ``kernelab.runners.measure.main(argv)`` with ``stderr`` as its
        stderr and a new pipe as its stdout. Raises ``ForkServerError`` when the server is gone."""
        read_end, write_end = os.pipe()
        try:
            try:
                request = json.dumps({"argv": list(argv)}).encode()
                socket.send_fds(self._sock, [request], [write_end, stderr.fileno()])
            except OSError as exc:
                raise ForkServerError(f"the fork server is gone ({exc}): {self._log_tail()}") from None
        finally:
            os.close(write_end)
        stdout = open(read_end, encoding="utf-8", errors="replace")  # noqa: SIM115 (the child's, closed by the caller)
        try:
            reply = self._receive(_START_TIMEOUT_S, waiting_for="a fork")
        except subprocess.TimeoutExpired:  # still importing, or stuck: cold starts from here on
            stdout.close()
            self.kill()
            why = f"the fork server did not fork within {_START_TIMEOUT_S:g} s and was killed"
            raise ForkServerError(f"{why}: {self._log_tail()}") from None
        except BaseException:
            stdout.close()
            raise
        self.forked += 1
        return ForkedChild(self, int(reply["pid"]), stdout)

    def _receive(self, timeout: float | None, *, waiting_for: str) -> dict[str, Any]:
        self._sock.settimeout(timeout)
        try:
            data = self._sock.recv(_MAX_PACKET)
        except (TimeoutError, BlockingIOError):  # BlockingIOError: timeout 0 (a poll)
            raise subprocess.TimeoutExpired(f"fork server: {waiting_for}", timeout or 0.0) from None
        except OSError as exc:
            raise ForkServerError(f"the fork server is gone ({exc}): {self._log_tail()}") from None
        if not data:
            code = self.proc.wait()
            raise ForkServerError(f"the fork server exited with status {code}: {self._log_tail()}")
        return dict(json.loads(data))

    def _log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:].strip()
        except OSError:
            return ""

    def kill(self) -> None:
        """Kill the server's process group at once (a request it will never answer in time)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        """End the server (it has no child by then: each request waits for its child). Idempotent."""
        global _ACTIVE
        if _ACTIVE is self:
            _ACTIVE = None
        self._sock.close()  # the server reads end-of-file and exits
        try:
            self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._tmp.cleanup()

    def __enter__(self) -> ForkServer:
        global _ACTIVE
        _ACTIVE = self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_ACTIVE: ForkServer | None = None


def active() -> ForkServer | None:
    """The fork server of the job this process runs now (``run_job``), or None."""
    return _ACTIVE if _ACTIVE is not None and _ACTIVE.alive() else None


def _serve(control_fd: int) -> int:
    """The server: preload, then fork one child per request until the parent closes the socket."""
    die_with_parent(signal.SIGKILL)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    sock = socket.socket(fileno=control_fd)
    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_PACKET, 2)
        except OSError:
            data = b""
        if not data:  # the job's process closed its end: done, without tearing torch down (~1 s)
            os._exit(0)
        argv = list(json.loads(data)["argv"])
        pid = os.fork()
        if pid == 0:  # the child: never returns
            sock.close()
            os.environ[PARENT_PID_ENV] = str(os.getppid())  # die_with_parent checks its parent: us
            _child(argv, fds)
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode())


def _child(argv: list[str], fds: list[int]) -> None:
    code = 1
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for fd in (devnull, *fds):
            os.close(fd)
        sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
        code = measure.main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        with contextlib.suppress(OSError):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(_serve(int(sys.argv[1])))
