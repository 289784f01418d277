"""The kernelab runners of this host (of this user): every runner's work dir, hidden from every job.

Several daemons of one service user may share a host (one per GPU, each with its own
``--work-dir``). Each work dir holds a runner token file and a spool, and a job of one runner must
read neither of another's. A job's namespace (``kernelab.runners.jobns``) hides the folders it is
told to, so every daemon has to know every other daemon's work dir: each registers its own, before
it writes anything secret there, in a registry at a fixed place per user (``registry_root``:
``~/.local/state/kernelab/runners``, or ``$KERNELAB_RUNNER_REGISTRY``: every runner of a host must
see the same one), and hides every registered work dir that still exists from each job it starts
(``HostRunners.work_dirs``).

A namespace is made when a job starts, so a work dir registered later is not hidden from a job
that was already running. A daemon whose work dir is new to the registry therefore waits, before
it reads or writes its token and before it claims, until no job that another live daemon of the
registry started before the registration is still running (``HostRunners.wait_for_older_jobs``):
each daemon records when its running job's namespace was made (``job_started``/``job_ended``), with
its pid and the pid's start time (a dead daemon's record, or a reused pid, is no job). A work dir
that already held a token file when it was first registered (made by an older kernelab) may have
been read by a job of another runner: the daemon says so, and the token should be rotated.

Layout under the registry root::

    dirs/<sha256 of the work dir>.json     {"work_dir", "registered_at"}: written once
    live/<name>-<sha256>.json              {"pid", "pid_start", "job_since"}: the daemon's own
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from kernelab.runners.spool import atomic_write_text

log = logging.getLogger(__name__)

REGISTRY_ENV = "KERNELAB_RUNNER_REGISTRY"
WAIT_POLL_S = 1.0  # how often a newly registered daemon looks whether the older jobs have ended


def registry_root() -> Path:
    """``$KERNELAB_RUNNER_REGISTRY``, else ``~/.local/state/kernelab/runners``."""
    explicit = os.environ.get(REGISTRY_ENV)
    if explicit:
        return Path(explicit).expanduser()
    return Path.home() / ".local" / "state" / "kernelab" / "runners"


def _digest(path: Path) -> str:
    return hashlib.sha256(str(path).encode()).hexdigest()[:32]


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` (``/proc/PID/stat`` field 22, clock ticks since boot), or
    None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


class HostRunners:
    """The registry (``root``, default ``registry_root()``) as runner ``name`` with work dir
    ``work_dir`` sees it. Every write is atomic; a registry that cannot be written is logged, and
    this runner's work dir then stays visible to other runners' jobs."""

    def __init__(self, work_dir: Path, name: str, root: Path | None = None) -> None:
        self.work_dir = Path(work_dir)
        self.name = name
        self.root = Path(root) if root is not None else registry_root()
        self.entry = self.root / "dirs" / f"{_digest(self.work_dir)}.json"
        self.live = self.root / "live" / f"{name}-{_digest(self.work_dir)}.json"
        self.registered_at: float | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._jobs = 0  # namespaces of this daemon in use now (a worker, the advertisement)

    def register(self) -> bool:
        """Record this work dir (once) and this daemon as live; True when the work dir was new to
        the registry (``wait_for_older_jobs`` then applies). Returns False when it was known or
        the registry cannot be written (logged)."""
        known = _read(self.entry)
        new = known.get("work_dir") != str(self.work_dir)
        try:
            if new:
                self.registered_at = time.time()
                atomic_write_text(
                    self.entry,
                    json.dumps({"work_dir": str(self.work_dir), "registered_at": self.registered_at}),
                )
            else:
                self.registered_at = float(known.get("registered_at") or 0.0)
            self._write_live(None)
        except OSError as exc:
            log.warning("runner %s: cannot register its work dir in %s (%s): jobs of other runners of "
                        "this host may read its token file and spool", self.name, self.root, exc)  # fmt: skip
            return False
        return new

    def work_dirs(self) -> list[Path]:
        """Every registered work dir that exists (this runner's own among them)."""
        out = []
        for entry in sorted((self.root / "dirs").glob("*.json")):
            value = _read(entry).get("work_dir")
            if isinstance(value, str) and Path(value).is_dir():
                out.append(Path(value))
        return out

    def job_started(self) -> None:
        """A namespace of this daemon (a job's worker, the advertisement child) starts now."""
        with self._lock:
            self._jobs += 1
            if self._jobs == 1:
                self._write_live(time.time())

    def job_ended(self) -> None:
        """The namespace of ``job_started`` ended."""
        with self._lock:
            self._jobs = max(0, self._jobs - 1)
            if self._jobs == 0:
                self._write_live(None)

    def _write_live(self, job_since: float | None) -> None:
        record = {"name": self.name, "work_dir": str(self.work_dir), "pid": self._pid,
                  "pid_start": _start_ticks(self._pid), "job_since": job_since}  # fmt: skip
        try:
            atomic_write_text(self.live, json.dumps(record))
        except OSError as exc:  # a full disk: other daemons may not wait for this job
            log.debug("runner %s: cannot record its job in %s: %s", self.name, self.live, exc)

    def older_jobs(self, before: float) -> list[str]:
        """Other live daemons whose running job started before ``before`` (a Unix time): one
        ``"NAME (work dir W, since T)"`` each."""
        out = []
        for path in sorted((self.root / "live").glob("*.json")):
            if path == self.live:
                continue
            record = _read(path)
            pid, since = record.get("pid"), record.get("job_since")
            if not isinstance(pid, int) or not isinstance(since, (int, float)) or since >= before:
                continue
            if _start_ticks(pid) is None or _start_ticks(pid) != record.get("pid_start"):
                continue  # that daemon is gone (its pid maybe reused)
            out.append(f"{record.get('name')} (work dir {record.get('work_dir')}, job since "
                       f"{time.strftime('%H:%M:%S', time.localtime(since))})")  # fmt: skip
        return out

    def wait_for_older_jobs(self, stop: threading.Event) -> bool:
        """Block until no other daemon's job that started before this work dir's registration is
        running (logged once, naming them), or ``stop`` is set; True when none is left."""
        assert self.registered_at is not None, "register() first"
        said = False
        while older := self.older_jobs(self.registered_at):
            if not said:
                log.warning("runner %s: its work dir %s is new to this host's runners; waiting for "
                            "jobs that started before it was registered, which could read it: %s",
                            self.name, self.work_dir, "; ".join(older))  # fmt: skip
                said = True
            if stop.wait(WAIT_POLL_S):
                return False
        if said:
            log.info("runner %s: no older job of another runner is running any more", self.name)
        return True

    def close(self) -> None:
        """This daemon stops: its live record goes."""
        self.live.unlink(missing_ok=True)
