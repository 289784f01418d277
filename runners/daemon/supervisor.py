"""One claimed job's worker process, from start to end: its scratch folder, its isolation, its
environment, its lease heartbeat, its stdout, its timeout and the grace it gets on shutdown.

* **Scratch.** Each job runs in ``work_dir/jobs/<job>-<attempt>/`` (spec, result, worker stderr).
* **Timeouts.** A worker running longer than the spec's ``timeout_s`` is killed (its whole
  process group, so probe helpers die too).
* **Leases and progress.** A thread heartbeats every ``heartbeat_s`` seconds (at most
  ``lease_s / 3``) with the job's progress (``kernelab.runners.progress``: the worker's
  ``progress:`` lines); when the server answers that the lease is lost (409/404: the job was
  re-queued or cancelled) the worker is stopped, so a cancelled job stops within ``heartbeat_s``
  plus the worker's ``KILL_WAIT_S`` grace.
* **Shutdown.** After ``stop()`` the running worker gets ``grace_s`` seconds (``stop(now=True)``:
  none), then it is killed.
* **Job code gets no credentials** (``docs/security.md``, "Job code on runners"): the worker and
  everything under it get the allow-listed environment of ``kernelab.runners.jobenv`` (plus the
  operator's ``job_env`` names), never ``KERNELAB_TOKEN``; with ``job_isolation`` ``"auto"``
  (default) or ``"namespace"`` the worker runs in a private user + mount namespace
  (``kernelab.runners.jobns``) where the work dir shows only the job's scratch folder and the
  revision cache, so the token file and the spool cannot be read; the work dirs of every other
  kernelab runner of the host (``kernelab.runners.daemon.host``) and the registry that lists them
  are hidden too.
* **Children die with the job** (``kernelab.runners.reaper``): the worker reaps and kills whatever
  the job started and detached, and gets SIGTERM should the daemon die.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from kernelab.runners import jobns
from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable
from kernelab.runners.daemon.host import HostRunners
from kernelab.runners.daemon.probe_pool import ProbePoolManager
from kernelab.runners.jobenv import check_names, job_env
from kernelab.runners.nodefault import NODE_FAULT_LINE
from kernelab.runners.progress import ProgressTracker, parse_line
from kernelab.runners.reaper import PARENT_PID_ENV, kill_pipe_holders
from kernelab.runners.spool import atomic_write_text
from kernelab.runners.worker import NODE_CHANGED_MARK, RESULT_MARK
from kernelab.service.contract.schemas import JobClaim, JobResult, JobSpec

log = logging.getLogger(__name__)

KILL_WAIT_S = 10.0  # SIGTERM -> SIGKILL delay for a worker being stopped
HEARTBEAT_S = 5.0  # default heartbeat period: how soon a cancel stops a job and progress shows
STDERR_TAIL_CHARS = 4000  # how much of a failed worker's stderr goes into the failure message
LEASE_LOST_STATUS = frozenset({404, 409})
JOB_FAILED_MARK = "worker: job failed: "  # kernelab.runners.worker's last stderr line on a job failure


class JobNotStarted(Exception):
    """The job's scratch folder or worker could not be made (e.g. a full disk); the message says
    which and why."""


@dataclass
class WorkerRun:
    """How one job's worker ended. ``why``: ``"exited"`` (by itself, with ``returncode``),
    ``"timeout"``, ``"lost"`` (lease lost) or ``"shutdown"`` (killed after the grace period).
    ``handed``: results the worker sent on stdout because it could not write ``out_path``.
    ``node_fault``: what the worker said on stdout of a fault of the node (``""``: nothing)."""

    why: str
    returncode: int | None
    out_path: Path
    err_path: Path
    handed: list[JobResult]
    heartbeat: threading.Thread
    key: str  # the claim's idempotency key: names the result's spool file
    node_fault: str = ""

    def failure_message(self, spec: JobSpec, node: str, grace_s: float) -> str:
        """What went wrong, for the server: the worker's own reason first (its ``JOB_FAILED_MARK``
        line), then how it ended, then the tail of its stderr (not yet redacted)."""
        if self.why == "timeout":
            message = (
                f"timed out: the worker ran longer than the spec's timeout_s = "
                f"{spec.timeout_s:g} s and was killed on node {node}"
            )
        elif self.why == "shutdown":
            message = f"runner {node} shut down; the job was stopped after a {grace_s:g} s grace period"
        else:
            message = f"worker exited with status {self.returncode} on node {node}"
        tail = stderr_tail(self.err_path, STDERR_TAIL_CHARS)
        reason = tail.rpartition(JOB_FAILED_MARK)[2].strip() if JOB_FAILED_MARK in tail else ""
        if reason:  # the worker said why (kernelab.runners.worker): that goes first
            message = f"{reason}\n({message})"
        if tail:
            message += f"\n--- worker stderr (last {STDERR_TAIL_CHARS} characters) ---\n{tail}"
        return message


class JobSupervisor:
    """Runs the workers of runner ``name`` (``python -m kernelab.runners.worker``), one at a time.

    ``lease_s``: lease asked for on every heartbeat, seconds; ``heartbeat_s``: the heartbeat period,
    seconds (at most ``lease_s / 3``; each carries the job's progress and learns of a cancel).
    ``grace_s``: how long a running worker may go on after ``stop()``. ``allowed_repos``:
    repositories jobs' source revisions may come from (``kernelab.service.contract.repo_address``), cloned
    into ``work_dir/revisions``. ``job_env_names``: variables job code may see besides
    ``kernelab.runners.jobenv``'s allow-list (a credential-like name raises ``ValueError``).
    ``job_isolation``: ``"auto"`` runs jobs in a private namespace where the work dir (and
    ``job_hide``) is hidden when this machine allows it (else a loud warning naming
    ``token_file``), ``"namespace"`` requires it (``check_isolation`` raises
    ``jobns.IsolationError`` without), ``"none"`` never; another value raises ``ValueError``.
    ``probe_pool``: whose pool each worker is handed. ``reprobe``: the spec of a job whose worker
    said it changed the node (the daemon probes again before its next claim and clears it).
    ``host``: the registry of this host's runners (``kernelab.runners.daemon.host``), whose work
    dirs every job's namespace hides and where each job's start is recorded; None: this work dir
    only.
    """

    def __init__(
        self,
        name: str,
        work_dir: Path,
        *,
        lease_s: float,
        grace_s: float,
        probe_pool: ProbePoolManager,
        token_file: Path,
        allowed_repos: Sequence[str] = (),
        job_env_names: Sequence[str] = (),
        job_isolation: str = "auto",
        job_hide: Sequence[Path] = (),
        heartbeat_s: float = HEARTBEAT_S,
        host: HostRunners | None = None,
    ) -> None:
        if job_isolation not in jobns.ISOLATION_MODES:
            raise ValueError(
                f"job_isolation must be one of {list(jobns.ISOLATION_MODES)}, got {job_isolation!r}"
            )
        self.name = name
        self.work_dir = work_dir
        self.lease_s = float(lease_s)
        self.heartbeat_s = min(float(heartbeat_s), self.lease_s / 3.0)
        self.progress: ProgressTracker | None = None  # the running job's
        self.grace_s = float(grace_s)
        self.probe_pool = probe_pool
        self.token_file = token_file
        self.allowed_repos = list(allowed_repos)
        self.revision_cache = work_dir / "revisions"
        self.job_env_names = check_names(job_env_names)
        self.job_isolation = job_isolation
        self.job_hide = [Path(p) for p in job_hide]
        self.host = host
        self.isolated: bool | None = None  # decided by check_isolation() at start-up
        self.running_spec: JobSpec | None = None
        self.reprobe: JobSpec | None = None
        self._node_fault_said: dict[str, str] = {}  # idempotency key -> the worker's node-fault line
        self._stop_at: float | None = None

    def stop(self, *, now: bool = False) -> None:
        """Let the running worker (and any later one) go on ``grace_s`` seconds from now, or with
        ``now`` not at all."""
        self._stop_at = float("-inf") if now else time.monotonic()

    def check_isolation(self) -> bool:
        """Decide (once) whether jobs run in the private namespace and log which isolation job code
        has; True when it does. Raises ``jobns.IsolationError`` when ``job_isolation`` is
        ``"namespace"`` and this machine cannot make one."""
        if self.isolated is not None:
            return self.isolated
        why = "disabled (job_isolation=none)" if self.job_isolation == "none" else jobns.probe()
        self.isolated = not why
        if self.isolated:
            log.info(
                "runner %s: job isolation: allow-listed environment; private user+mount namespace "
                "(the work dir %s shows jobs only their scratch folder and the revision cache)",
                self.name,
                self.work_dir,
            )
        elif self.job_isolation == "namespace":
            raise jobns.IsolationError(
                f"runner {self.name}: --job-isolation namespace, but no private "
                f"namespace can be made here: {why}"
            )
        else:
            log.warning(
                "runner %s: JOB CODE CAN READ THIS RUNNER'S TOKEN FILE %s: job isolation is the "
                "allow-listed environment only (no private namespace: %s). Run the daemon as a "
                "user of its own and allow unprivileged user namespaces (docs/security.md)",
                self.name,
                self.token_file,
                why,
            )
        return self.isolated

    def job_command(self, cmd: list[str], job_dir: Path) -> list[str]:
        """``cmd`` through ``kernelab.runners.jobns`` when jobs are isolated, else as it is: the
        work dir, every other registered runner's work dir and the registry (``hidden``) hidden
        but ``job_dir`` and the revision cache, and the places a job could leave something for
        later jobs or for the daemon's next start read-only (``_frozen``)."""
        if not self.check_isolation():
            return cmd
        self.revision_cache.mkdir(parents=True, exist_ok=True)
        readonly = [*_frozen(), *_local_repos(self.allowed_repos)]
        return jobns.wrap(
            cmd,
            hide=self.hidden(readonly),
            keep=[job_dir, self.revision_cache],
            readonly=readonly,
        )

    def hidden(self, needed: Sequence[Path]) -> list[Path]:
        """The folders a job's namespace hides: this work dir, ``job_hide``, the work dirs of the
        host's other runners and their registry (``host``), but never one that holds a folder of
        ``needed`` (the Python installation, kernelab's code, the home: hiding it would hide
        what the job runs; logged)."""
        own = [self.work_dir, *self.job_hide]
        others: list[Path] = []
        if self.host is not None:
            others = [d for d in self.host.work_dirs() if d.resolve() != self.work_dir.resolve()]
            if self.host.root.is_dir():
                others.append(self.host.root)
        out = list(own)
        for folder in others:
            real = folder.resolve()
            inside = [n for n in needed if real == n.resolve() or real in n.resolve().parents]
            if inside:
                log.warning("runner %s: another runner's work dir %s holds %s, which jobs need: not "
                            "hidden from them", self.name, folder, inside[0])  # fmt: skip
                continue
            out.append(folder)
        return out

    def run(self, claim: JobClaim, client: KernelabClient) -> WorkerRun:
        """Run ``claim``'s worker to its end, heartbeating the lease through ``client``.

        Raises ``JobNotStarted`` when the job's scratch folder or worker cannot be made. The
        returned run's heartbeat thread may still be in its last call: join it after posting.
        """
        if self.host is not None:
            self.host.job_started()
        try:
            return self._run(claim, client)
        finally:
            if self.host is not None:
                self.host.job_ended()

    def _run(self, claim: JobClaim, client: KernelabClient) -> WorkerRun:
        job_id = claim.job_id
        assert isinstance(claim.spec, JobSpec), "a workload claim runs in kernelab.runners.daemon.workload"
        self.running_spec = claim.spec
        job_dir = self.work_dir / "jobs" / f"{job_id}-{claim.attempt}"
        spec_path, out_path, err_path = job_dir / "spec.json", job_dir / "result.json", job_dir / "stderr.log"
        key = f"{self.name}-j{job_id}-a{claim.attempt}-{uuid.uuid4().hex[:12]}"
        worker = [
            sys.executable,
            "-P",
            "-m",
            "kernelab.runners.worker",
            str(spec_path),
            str(out_path),
            "--job-id",
            str(job_id),
            "--idempotency-key",
            key,
            "--cache-dir",
            str(self.revision_cache),
        ]
        for repo in self.allowed_repos:
            worker += ["--allow-repo", repo]
        log.info(
            "runner %s: job %d attempt %d (%s): starting worker, timeout %.0f s",
            self.name,
            job_id,
            claim.attempt,
            claim.spec.benchmark,
            claim.spec.timeout_s,
        )

        lease_lost = threading.Event()
        finished = threading.Event()
        self.progress = ProgressTracker()
        handed: list[JobResult] = []  # a result the worker sent on stdout (its file could not be written)
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(spec_path, claim.spec.model_dump_json())
            out_path.unlink(missing_ok=True)
            cmd = self.job_command(worker, job_dir)
            err_fh = err_path.open("w", encoding="utf-8")
        except OSError as exc:
            raise JobNotStarted(f"its scratch folder {job_dir} cannot be written: {exc}") from exc
        with err_fh:
            try:
                overrides = self.probe_pool.env_for(claim.spec)
                overrides[PARENT_PID_ENV] = str(os.getpid())  # the worker dies with this daemon
                if self.isolated:  # its install steps and benchmark code nest a read-only revision cache
                    overrides[jobns.JOBNS_ENV] = "1"
                    # HOME is read-only there: compiled kernels and temporary files in the job's folder
                    for name, sub in (
                        ("TMPDIR", "tmp"),
                        ("TRITON_CACHE_DIR", "triton"),
                        ("TORCHINDUCTOR_CACHE_DIR", "inductor"),
                    ):
                        (job_dir / sub).mkdir(exist_ok=True)
                        overrides[name] = str(job_dir / sub)
                # cwd: the job's own folder, never the daemon's (its data may sit beside it)
                proc = subprocess.Popen(
                    cmd,
                    stdout=subprocess.PIPE,
                    stderr=err_fh,
                    text=True,
                    start_new_session=True,
                    cwd=job_dir,
                    env=job_env(overrides, names=self.job_env_names),
                )
            except OSError as exc:
                raise JobNotStarted(f"its worker cannot be started: {exc}") from exc
            reader = threading.Thread(target=self.relay_stdout, args=(proc, job_id, key, handed), daemon=True)
            beater = threading.Thread(
                target=self._heartbeat, args=(client, job_id, finished, lease_lost), daemon=True
            )
            reader.start()
            beater.start()
            try:
                why = self._supervise(proc, claim.spec.timeout_s, lease_lost)
            finally:
                if proc.poll() is None:  # never leave a worker behind, whatever happened here
                    kill_group(proc)
                finished.set()  # the heartbeat thread ends after the call it may be in
                reader.join(timeout=5.0)
                if reader.is_alive() and proc.stdout is not None:  # left-behind processes hold it
                    killed = kill_pipe_holders(proc.stdout.fileno())
                    log.warning("runner %s: job %d: killed %d process(es) it left behind holding its "
                                "output: %s", self.name, job_id, len(killed), killed)  # fmt: skip
                    reader.join(timeout=5.0)
                if not reader.is_alive() and proc.stdout is not None:  # else closing would wait on it
                    proc.stdout.close()
        said = self._node_fault_said.pop(key, "")
        return WorkerRun(why, proc.returncode, out_path, err_path, handed, beater, key, said)

    def _supervise(self, proc: subprocess.Popen[str], timeout_s: float, lease_lost: threading.Event) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                proc.wait(timeout=0.2)
                return "exited"
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                why = "timeout"
            elif lease_lost.is_set():
                why = "lost"
            elif self._stop_at is not None and time.monotonic() - self._stop_at > self.grace_s:
                why = "shutdown"
            else:
                continue
            kill_group(proc)
            return why

    def _heartbeat(
        self, client: KernelabClient, job_id: int, finished: threading.Event, lease_lost: threading.Event
    ) -> None:
        while not finished.wait(self.heartbeat_s):
            try:
                progress = self.progress.snapshot() if self.progress is not None else None
                client.heartbeat(job_id, lease_s=self.lease_s, timeout_s=self.heartbeat_s, progress=progress)
            except KernelabAPIError as exc:
                if exc.status_code in LEASE_LOST_STATUS and not finished.is_set():
                    lease_lost.set()
                    return
                log.warning("runner %s: heartbeat of job %d refused: %s", self.name, job_id, exc)
            except KernelabUnavailable as exc:
                log.warning("runner %s: heartbeat of job %d failed: %s", self.name, job_id, exc)

    def relay_stdout(
        self, proc: subprocess.Popen[str], job_id: int, key: str, handed: list[JobResult]
    ) -> None:
        """Log the worker's stdout lines; a ``RESULT_MARK`` line (the result the worker could not
        write to its file) for this job and key goes into ``handed`` instead, a
        ``NODE_CHANGED_MARK`` line sets ``reprobe`` to the running job's spec, and a
        ``NODE_FAULT_LINE`` is the run's ``node_fault``."""
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(NODE_FAULT_LINE):
                self._node_fault_said[key] = line[len(NODE_FAULT_LINE) :].strip()
                log.warning("job %d: the node could not take its writes: %s", job_id,
                            self._node_fault_said[key])  # fmt: skip
                continue
            if line.startswith(NODE_CHANGED_MARK):
                log.warning("job %d changed the node: %s", job_id, line[len(NODE_CHANGED_MARK) :].strip())
                self.reprobe = self.running_spec
                continue
            if line.startswith(RESULT_MARK):
                try:
                    result = JobResult.model_validate_json(line[len(RESULT_MARK) :])
                except ValidationError as exc:
                    log.error("job %d: the worker's result on stdout is not a JobResult: %s", job_id, exc)
                    continue
                if (result.job_id, result.idempotency_key) == (job_id, key):
                    handed.append(result)
                    log.warning("job %d: result handed over on stdout (its file could not be written)",
                                job_id)  # fmt: skip
                continue
            parsed = parse_line(line)
            if parsed is not None and self.progress is not None:
                self.progress.update(*parsed)
            log.info("job %d: %s", job_id, line.rstrip())


def _frozen() -> list[Path]:
    """Folders job code sees read-only: the runner user's home (``~/.triton``, ``~/.cache``, user
    site-packages, shell start-up files: what a later job or the daemon's next start would read),
    this Python's installation (``sys.prefix``: its site-packages), kernelab's own code and every
    folder on the daemon's ``sys.path`` (what it imports when it starts again). Never ``/``
    (``/tmp``, ``/dev/shm`` stay writable); the work dir inside them stays as the namespace keeps
    it (hidden, the job's folder and the revision cache writable)."""
    import kernelab.runners

    candidates = [
        Path.home(),
        Path(sys.prefix),
        Path(kernelab.runners.__file__).resolve().parent.parent,
        *(Path(entry) for entry in sys.path if entry),
    ]
    return [p for p in candidates if p.is_dir() and p.resolve() != Path("/")]


def _local_repos(entries: Sequence[str]) -> list[Path]:
    """The folders of the allow-list's local repositories (for a pattern, the folder above its
    first glob), read-only to job code: a job must not commit into a repository later jobs fetch,
    nor make a new one a pattern would admit."""
    out = []
    for entry in [*entries, *os.environ.get("KERNELAB_ALLOWED_REPOS", "").replace(",", " ").split()]:
        if "://" in entry and not entry.startswith("file://"):
            continue
        if "@" in entry.split("/")[0] or (":" in entry.split("/")[0] and not entry.startswith("file://")):
            continue  # scp-like host:path
        path = entry.removeprefix("file://")
        head = path.split("*", 1)[0] if "*" in path else path
        folder = Path(os.path.expanduser(head))
        folder = folder if "*" not in path or head.endswith("/") else folder.parent
        if folder.is_dir() and folder.resolve() != Path("/"):
            out.append(folder)
    return out


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the worker's process group, SIGKILL it after ``KILL_WAIT_S`` seconds."""
    for sig, wait_s in ((signal.SIGTERM, KILL_WAIT_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def stderr_tail(path: Path, chars: int) -> str:
    """The last ``chars`` characters of the last 200 lines of ``path`` (``""`` when unreadable)."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=200))[-chars:].strip()
    except OSError:
        return ""
