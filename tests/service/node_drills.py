"""Helpers of the node drills (``test_fault_drills_node.py``, ``test_fault_drills_host.py``): a
small real filesystem to fill, a filler that keeps it full, ``kernelab runner`` as a child
process with its ``/status`` and ``/metrics``, and what its log says."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from drills import TOKEN

from kernelab.runners.local import free_port
from kernelab.runners.reaper import descendants


@contextlib.contextmanager
def small_disk(where: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB mounted at ``where`` for the drill (mounting needs root: the
    drill is skipped otherwise), unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


class Filler:
    """Fills ``disk`` to ENOSPC and keeps it full (whatever space is freed is taken again, every
    20 ms) until ``stop()``, which removes what it wrote: a disk that fills while a job runs."""

    def __init__(self, disk: Path) -> None:
        self.path = disk / f"filler-{os.getpid()}"
        self.full = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, daemon=True)

    def start(self) -> Filler:
        self._thread.start()
        assert self.full.wait(30), "the disk did not fill"
        return self

    def _fill(self) -> None:
        with self.path.open("ab", buffering=0) as fh:
            while not self._stop.is_set():
                try:
                    fh.write(b"\0" * 4096)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC, exc
                    self.full.set()
                    self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.path.unlink(missing_ok=True)


class RunnerCli:
    """``kernelab runner`` as a child process of its own session, logging to ``log``, with its
    status on a free port. ``extra``: more command-line options; ``env``: more variables."""

    def __init__(self, url: str, name: str, work_dir: Path, log: Path, *, lease_s: float = 30.0,
                 extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> None:  # fmt: skip
        self.name, self.log, self.work_dir = name, log, work_dir
        self.port = free_port()
        self.cmd = [
            sys.executable, "-m", "kernelab.runners.cli", "runner", "--server", url, "--name", name,
            "--lease-s", str(lease_s), "--poll-s", "1", "--work-dir", str(work_dir),
            "--status-port", str(self.port), *extra,
        ]  # fmt: skip
        self.env = {**os.environ, "KERNELAB_TOKEN": TOKEN, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RunnerCli:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def count(self, text: str) -> int:
        return self.text().count(text)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def status(self) -> dict[str, Any] | None:
        """``GET /status`` (None while it does not answer)."""
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/status", timeout=5).json()  # type: ignore[no-any-return]
        except httpx.HTTPError:
            return None

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def children(self, marker: str) -> list[int]:
        """Processes below the daemon whose command line holds ``marker``."""
        assert self.proc is not None
        out = []
        for pid in descendants(self.proc.pid):
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode():
                    out.append(pid)
        return out

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM and wait; the exit status (SIGKILL of its group after ``timeout_s``)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def kill(self) -> None:
        """SIGKILL of the daemon's process group (its worker is in a session of its own)."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
