"""The runner daemon's loop: claim, run (``supervisor``), keep and post the result (the spool),
say what became of the job; signals, back-off and the work dir's health.

* **Nothing measured is lost.** A result goes into ``work_dir/spool/<name>/`` before it is posted
  and leaves it only when the server acknowledged it; an unreachable or failing server (any
  answer but a refusal of the result itself, ``kernelab.runners.spool.REFUSED_FOR_GOOD``) leaves
  it there to be re-sent on the next loop or after a restart (see ``kernelab.runners.spool``).
  When the work dir's disk is full the worker hands its result over on stdout and the daemon
  holds it in memory, re-posting it until the server acknowledges it (and spooling it once the
  disk takes it again).
* **Server faults.** The daemon survives any answer: a claim that fails (5xx, garbled answer,
  unreachable server, any refusal but of its token) is retried after a back-off that doubles from
  ``MIN_IDLE_S`` up to ``poll_s``. Only a refused token (401/403 on a claim, 401 on a result's
  post) stops it.
* **A result measured is posted before the next claim.** While a result (spooled or in memory)
  has not reached the server, the daemon claims nothing: its job may have been re-queued (its
  lease ran out while the server was away) and a claim would measure it a second time. It retries
  the post with the claim's back-off and says why (``post_problem``).
* **Faults of the node are never the job's** (``kernelab.runners.nodefault``). Before each claim
  the work dir must take a small write and have ``MIN_FREE_BYTES`` free, and the process must be
  able to open files; otherwise the daemon says why (log, ``status()``, ``/status`` and
  ``/metrics`` of ``--status-port``: ``kernelab.runners.daemon.status``) and claims nothing until
  it can. A job whose scratch folder cannot be written is released at once (failed with
  ``retry=True``: re-queued while it has attempts left), and so is a job whose worker reported a
  node fault (exit status 4: the disk or the file table full while it measured) or ended badly
  while the node was at fault: its scratch folder is removed, the reason goes with it.
* **Leases.** A lost lease stops the worker and nothing is posted. A finished job's result is
  posted at once, without waiting for a heartbeat in flight (the server takes a late result
  while no other runner took the job over).
* **Scratch.** A job's folder is removed once the result is spooled and kept after a failure.
* **Timeouts.** A worker killed for its timeout fails the job with a message saying so.
* **Shutdown** (SIGTERM/SIGINT, arq's behaviour): stop claiming (a claim waiting in its long poll
  is abandoned within a second: ``RunnerDaemon._claim_unless_stopped``), let the running job finish within
  ``grace_s`` seconds (a second signal ends the grace at once), else kill it and fail the job with
  ``retry=True`` so another node takes it. A result still held in memory is never dropped
  (``kernelab.runners.daemon.keep``): the daemon waits up to ``grace_s`` more for the disk or the
  server, saying why, then writes it to a ``fallback_dirs`` spool or, as a last resort, to stderr.
* **Runners sharing a host** (``kernelab.runners.daemon.host``): the work dir is registered
  before anything secret is written in it, and every job's namespace hides every registered work
  dir; a work dir new to the registry waits for the older jobs of other runners first.
* **Burst mode** (``once=True``, arq's ``burst``): drain the queue, then exit.
* A failure message is redacted (the daemon's tokens and environment,
  ``kernelab.runners.redact``) and bounded before it leaves the node.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kernelab.runners import jobns
from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable
from kernelab.runners.daemon.host import HostRunners
from kernelab.runners.daemon.keep import keep_at_shutdown
from kernelab.runners.daemon.probe_pool import ProbePoolManager
from kernelab.runners.daemon.supervisor import (
    HEARTBEAT_S,
    JobNotStarted,
    JobSupervisor,
    WorkerRun,
    stderr_tail,
)
from kernelab.runners.daemon.tokens import TokenStore
from kernelab.runners.jobenv import job_env
from kernelab.runners.nodefault import EXIT_NODE_FAULT, NODE_FAULT_MARK
from kernelab.runners.reaper import PARENT_PID_ENV
from kernelab.runners.redact import redact, secret_values
from kernelab.runners.spool import (
    REFUSED_FOR_GOOD,
    NewerResultFile,
    Spool,
    UnreadableResultFile,
    atomic_write_text,
)
from kernelab.service.contract.schemas import JobClaim, JobResult, JobSpec, NodeInfo, RunnerAdverts

log = logging.getLogger(__name__)

DEFAULT_WORK_DIR = Path.home() / ".kernelab"
MIN_IDLE_S = 1.0  # least time between two empty claims, against a server that does not long-poll
TOKEN_REFUSED_STATUS = frozenset({401, 403})  # a claim answered so: the daemon's token is no good
MIN_FREE_BYTES = 64 * 2**20  # 64 MiB free in the work dir before a claim (spec, stderr, result)
FREE_FDS = 32  # file descriptors the daemon must be able to open before a claim (EMFILE/ENFILE)
RUNNER_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")  # kernelab.service.contract.schemas.RunnerRegister.name


# A stop (SIGTERM/SIGINT) ends a waiting claim's long poll: the daemon looks for it this often
# while the claim waits (s) and then gives the claim this long to answer before abandoning it (s).
STOP_CHECK_S = 0.2
CLAIM_STOP_WAIT_S = 0.5
ADVERT_TIMEOUT_S = 300.0  # importing every offered benchmark to describe it (RunnerDaemon.advertise)


class AdvertError(Exception):
    """The runner cannot say which benchmarks it offers (a ``--benchmark`` ref that does not load,
    the child that imports them failed): it does not start claiming."""


class RunnerDaemon:
    """Runner daemon bound to one server (through ``client``) under the name ``name``.

    ``poll_s``: long-poll wait of each claim, seconds (server caps it). ``lease_s``: lease asked
    for on claim and on every heartbeat, seconds; ``heartbeat_s``: the heartbeat period (at most
    ``lease_s / 3``; each carries the job's progress, and a cancelled job stops at the next). ``work_dir``:
    token file, spool and per-job scratch folders. ``grace_s``: how long a running job may go on
    after SIGTERM. ``node``: the fingerprint sent on registration (default
    ``kernelab.runners.probes.node_info()``). ``allowed_repos``, ``job_env_names``,
    ``job_isolation``, ``job_hide``: how jobs run (``supervisor.JobSupervisor``); ``probe_pool``:
    ``"auto"``, ``"on"`` or ``"off"`` (``probe_pool.ProbePoolManager``). ``min_free_bytes``: free
    space the work dir must have before a claim (bytes). ``workloads``: claim workload jobs too
    (``kernelab.runners.daemon.workload``), offering ``rdzv_host`` and a free port there as the
    c10d rendezvous endpoint should this runner be node rank 0 of a gang. Counters: ``done``,
    ``failed``, ``lost``
    (lease lost), ``released`` (jobs handed back because the work dir could not take them),
    ``posted`` (results acknowledged, including re-sent spooled ones), ``node_faults`` (jobs handed
    back because the node could not take their writes). ``held``: results the full disk could not
    take, by idempotency key, re-posted from memory. ``fallback_dirs``: where a result held in memory
    goes at shutdown when the work dir still cannot take it (a spool ``DIR/<name>/`` in each, tried in
    order; flushed like the work dir's spool at every start), before stderr. ``status_port``: serve
    ``/status`` (JSON) and ``/metrics`` (Prometheus) on ``status_host:status_port`` while running
    (``kernelab.runners.daemon.status``; 0: a free port, None: none). ``host_registry``: the
    registry of this host's runners (``kernelab.runners.daemon.host.registry_root()`` by default).

    Raises ``ValueError`` for a name outside ``[A-Za-z0-9._:-]{1,200}`` (the server's rule; the
    name is also a folder name), an unknown ``probe_pool`` or ``job_isolation`` mode or a
    credential-like ``job_env_names`` entry. The caller keeps owning ``client``; the client the
    daemon makes for its own token is closed by ``close()`` (or on leaving ``with RunnerDaemon(...)``).
    """

    def __init__(
        self,
        client: KernelabClient,
        name: str,
        *,
        once: bool = False,
        poll_s: float = 20.0,
        lease_s: float = 120.0,
        work_dir: Path = DEFAULT_WORK_DIR,
        grace_s: float = 60.0,
        node: NodeInfo | None = None,
        allowed_repos: Sequence[str] = (),
        probe_pool: str = "auto",
        min_free_bytes: int = MIN_FREE_BYTES,
        job_env_names: Sequence[str] = (),
        job_isolation: str = "auto",
        job_hide: Sequence[Path] = (),
        benchmarks: Sequence[str] = (),
        heartbeat_s: float = HEARTBEAT_S,
        workloads: bool = False,
        rdzv_host: str = "127.0.0.1",
        fallback_dirs: Sequence[Path] = (),
        status_port: int | None = None,
        status_host: str = "127.0.0.1",
        host_registry: Path | None = None,
    ):
        if not RUNNER_NAME.match(name):
            raise ValueError(f"runner name {name!r} must match {RUNNER_NAME.pattern}")
        self.name = name
        self.work_dir = (
            Path(work_dir).expanduser().resolve()
        )  # jobs and adverts chdir: a relative one would be joined twice
        self.tokens = TokenStore(self.work_dir / f"runner-{name}.json", name)
        self.host = HostRunners(self.work_dir, name, host_registry)
        self.probe_pool = ProbePoolManager(probe_pool, name)
        self.supervisor = JobSupervisor(
            name,
            self.work_dir,
            lease_s=lease_s,
            grace_s=grace_s,
            probe_pool=self.probe_pool,
            token_file=self.tokens.path,
            allowed_repos=allowed_repos,
            job_env_names=job_env_names,
            job_isolation=job_isolation,
            job_hide=job_hide,
            heartbeat_s=heartbeat_s,
            host=self.host,
        )
        self.min_free_bytes = int(min_free_bytes)
        self.benchmark_refs = list(benchmarks)
        self.adverts: RunnerAdverts | None = None  # made by advertise() at start-up
        self._advert_sent = False  # the server holds self.adverts: later claims send its digest
        self.client = client
        self._given_client = client  # its token (maybe the admin's) stays a secret to redact
        self.once = once
        self.poll_s = float(poll_s)
        self.lease_s = float(lease_s)
        self.grace_s = float(grace_s)
        self.spool = Spool(self.work_dir / "spool" / name)
        self.workload_spool = Spool(self.work_dir / "spool" / name / "workload")  # WorkloadResult documents
        self.workloads = bool(workloads)
        self.rdzv_host = rdzv_host
        self.node = node
        self.done = 0
        self.failed = 0
        self.lost = 0
        self.posted = 0
        self.released = 0
        self.node_faults = 0
        self.held: dict[str, JobResult] = {}  # idempotency key -> result the full disk could not take
        self.refused_in_memory: list[tuple[JobResult, str]] = []  # refused for good, not writable
        self.fallback_dirs = [Path(d).expanduser().resolve() for d in fallback_dirs]
        self.on_stderr = 0  # results written to stderr at shutdown (nowhere else took them)
        self.status_port = status_port
        self.status_host = status_host
        self.status_server: Any = None  # kernelab.runners.daemon.status.StatusServer while running
        self.state = "starting"  # what status() says the daemon does
        self.running_job: int | None = None
        self.write_problem: str | None = None  # why the node cannot take a job's writes now
        self.write_problem_since: float | None = None  # Unix time it began
        self.post_problem: str | None = None  # why measured results wait to be posted
        self._post_error: KernelabAPIError | KernelabUnavailable | None = None  # the last "later"
        self._newer_seen: set[Path] = set()  # spool files of a newer schema_version, logged once
        self._stop = threading.Event()
        self._now = threading.Event()  # a second signal: no more waiting at shutdown
        self._signalled = threading.Event()  # SIGTERM/SIGINT: the process ends, a waiting claim is abandoned
        self._own_client: KernelabClient | None = None
        self._token_saved = False  # the token in use came from the token file

    @property
    def token_file(self) -> Path:
        """Where this runner's own token is kept (``tokens.TokenStore``)."""
        return self.tokens.path

    def __repr__(self) -> str:
        return (
            f"<RunnerDaemon name={self.name} done={self.done} failed={self.failed} lost={self.lost} "
            f"node_faults={self.node_faults} pending={len(self.spool.pending()) + len(self.held)}"
            f"{f' on_stderr={self.on_stderr}' if self.on_stderr else ''}>"
        )

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    def __enter__(self) -> RunnerDaemon:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client made for this runner's own token (not the caller's client) and stop the
        all-reduce pool."""
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None
        self.probe_pool.close()

    def _secrets(self) -> list[str]:
        """Values a job's error text must never carry: the tokens this daemon holds and its
        credential-like variables."""
        tokens = [
            getattr(c, "_token", None)
            for c in (self._given_client, self.client, self._own_client)
            if c is not None
        ]
        return secret_values(os.environ, [*tokens, self.tokens.load(self.client.base_url)])

    def _clean(self, text: str) -> str:
        """``text`` redacted (``_secrets``, the daemon's environment) and bounded
        (``kernelab.runners.redact``)."""
        return redact(text, secrets=self._secrets(), env=os.environ)

    def stop(self) -> None:
        """Stop claiming; a running job gets ``grace_s`` seconds to finish. Thread/signal safe."""
        if not self._stop.is_set():
            self.supervisor.stop()
            self._stop.set()

    def _on_signal(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        self._signalled.set()
        if self._stop.is_set():  # a second signal: no more grace
            log.warning("runner %s: second %s; stopping the running job now", self.name, name)
            self.supervisor.stop(now=True)
            self._now.set()
            return
        log.info(
            "runner %s: %s received; no new claims, running job gets %.0f s (again: stop it now)",
            self.name,
            name,
            self.grace_s,
        )
        self.stop()

    def run(self) -> None:
        """Run until stopped (or, with ``once``, until the queue is empty or the work dir cannot
        take a job).

        Installs SIGTERM/SIGINT handlers when called from the main thread. Raises
        ``KernelabAPIError`` when the token is refused (401/403 on a claim) or registration fails,
        and, with ``once``, ``KernelabAPIError``/``KernelabUnavailable`` when a claim fails
        (spooled results stay). Without ``once`` every other failure of a claim is retried.
        """
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            if self.status_port is not None:
                from kernelab.runners.daemon.status import StatusServer  # prometheus_client

                self.status_server = StatusServer(self, self.status_host, self.status_port)
                log.info("runner %s: status on %s/status and /metrics", self.name, self.status_server.url)
            if not self._join_host():
                return  # stopped while it waited: nothing written in its work dir
            self.supervisor.check_isolation()
            self.advertise()
            self.ensure_token()
            log.info("runner %s: serving %s (once=%s)", self.name, self.client.base_url, self.once)
            self._loop()
        except KernelabAPIError as exc:
            if exc.status_code == 401 and self._token_saved:
                log.error(
                    "runner %s: the token saved in %s was refused (revoked or rotated). To recover, "
                    "rotate it with `kernelab token rotate ID` (ID: see `kernelab token list`%s) and "
                    "start with --token NEW, or delete that file and register again with an admin "
                    "token",
                    self.name,
                    self.token_file,
                    self.tokens.hint(),
                )
            raise
        finally:
            self.state = "stopping"
            try:
                keep_at_shutdown(self)
            finally:
                self.host.close()
                self.state = "stopped"
                if self.status_server is not None:
                    self.status_server.close()
                    self.status_server = None
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                log.info("runner %s stopped: %r", self.name, self)

    def _join_host(self) -> bool:
        """Register the work dir with the host's runners (``kernelab.runners.daemon.host``) before
        anything secret is read or written there; a work dir new to the registry waits for the
        jobs other runners started before it, which could see it. False when stopped meanwhile."""
        if not self.host.register():
            return True
        if self.token_file.exists():
            log.warning("runner %s: %s existed before its work dir was registered with this host's "
                        "runners: jobs of other runners of this host may have read it; rotate the token "
                        "(`kernelab token rotate ID`)", self.name, self.token_file)  # fmt: skip
        self.state = "waiting"
        return self.host.wait_for_older_jobs(self._stop)

    def status(self) -> dict[str, Any]:
        """What the daemon does now and what keeps it from claiming (``kernelab.runners.daemon.status``
        serves it): ``state``, ``can_write``, ``write_problem`` (and since when, Unix time),
        ``post_problem``, the counters, ``unposted`` (results measured, not yet acknowledged) and
        ``in_memory`` (of those, held in memory only)."""
        return {
            "name": self.name, "state": self.state, "running_job": self.running_job,
            "can_write": self.write_problem is None, "write_problem": self.write_problem,
            "write_problem_since": self.write_problem_since, "post_problem": self.post_problem,
            "done": self.done, "failed": self.failed, "lost": self.lost, "released": self.released,
            "node_faults": self.node_faults, "posted": self.posted, "unposted": self.unposted(),
            "in_memory": len(self.held) + len(self.refused_in_memory), "on_stderr": self.on_stderr,
        }  # fmt: skip

    def _set_write_problem(self, problem: str | None) -> None:
        if problem is None:
            if self.write_problem is not None:
                log.info("runner %s: the work dir takes writes again", self.name)
            self.write_problem = self.write_problem_since = None
            return
        if self.write_problem is None:
            self.write_problem_since = time.time()
        self.write_problem = problem

    def _loop(self) -> None:
        failures = 0  # claims (or posts) in a row that failed: the back-off doubles with each
        while not self._stop.is_set():
            # the state stays what it was while spooled results are posted: "claiming" only once
            # nothing holds the claim back (a status read during a retried post said "claiming")
            self.flush_spool()
            unposted = self.unposted()
            if unposted:  # posted first: its job may be queued again, and a claim would measure it twice
                error = self._post_error
                if isinstance(error, KernelabAPIError) and error.status_code == 401:
                    raise error  # the token is refused: as on a claim (a 403 names the node: kept)
                if self.once:
                    if error is not None:
                        raise error
                    break
                failures += 1
                delay = min(self.poll_s, MIN_IDLE_S * 2 ** min(failures - 1, 16))
                self.state = "not-claiming"
                self.post_problem = f"{unposted} measured result(s) not posted yet: {error}"
                log.warning("runner %s: not claiming: %s; posting again in %.1f s", self.name,
                            self.post_problem, delay)  # fmt: skip
                self._stop.wait(delay)
                continue
            self.post_problem = None
            problem = self._work_dir_problem()
            self._set_write_problem(problem)
            if problem is not None:
                self.state = "not-claiming"
                log.warning("runner %s: not claiming: %s%s", self.name, problem,
                            "" if self.once else f"; checking again in {self.poll_s:g} s")  # fmt: skip
                if self.once:
                    break
                self._stop.wait(self.poll_s)
                continue
            self.state = "claiming"
            if self.supervisor.reprobe is not None:
                self._probe_again(self.supervisor.reprobe)
                self.supervisor.reprobe = None
            started = time.monotonic()
            try:
                claim = self._claim_unless_stopped()
            except (KernelabUnavailable, KernelabAPIError) as exc:
                refused = isinstance(exc, KernelabAPIError) and exc.status_code in TOKEN_REFUSED_STATUS
                if refused or self.once:
                    raise
                failures += 1
                delay = min(self.poll_s, MIN_IDLE_S * 2 ** min(failures - 1, 16))
                log.warning("runner %s: claim failed (%s); retrying in %.1f s", self.name, exc, delay)
                self._stop.wait(delay)
                continue
            failures = 0
            if claim is None:
                if self.once:
                    break
                self._stop.wait(max(0.0, MIN_IDLE_S - (time.monotonic() - started)))
                continue
            self.run_claim(claim)
        self.flush_spool()

    def _probe_again(self, spec: JobSpec) -> None:
        """After a job that changed the node (its worker said so): probe the node in a fresh
        process (``kernelab.runners.children.probes_in_child``; the job's probes, or the default
        ones when the job had none) and post the report, so the node's health reflects the node as
        the next job finds it. Failures are logged; the next claim goes ahead."""
        from kernelab.runners.children import probes_in_child
        from kernelab.runners.devices import device_name
        from kernelab.runners.probes import probes_enabled
        from kernelab.service.contract.schemas import ProbeSpec

        try:
            device_type = device_name(None, spec.device).partition(":")[0]
            if not probes_enabled(spec, device_type):
                spec = spec.model_copy(update={"probes": ProbeSpec()})
            reports = probes_in_child(spec, phase="adhoc", device_type=device_type, timeout_s=600.0)
            node = self.node_info()
            for report in reports:
                if node is not None:
                    self.client.post_probe(node.hostname, report)
            log.info("runner %s: probed the node again after a job that changed it (%d report(s))",
                     self.name, len(reports))  # fmt: skip
        except (RuntimeError, OSError, KernelabAPIError, KernelabUnavailable) as exc:
            log.warning("runner %s: could not probe the node again: %s", self.name, exc)

    def _work_dir_problem(self) -> str | None:
        """Why this node cannot take a job now, or None: the work dir full or not writable, or no
        file descriptor to spare (``FREE_FDS`` cannot be opened: EMFILE, ENFILE)."""
        check = self.work_dir / "jobs" / ".write-check"
        try:
            free = shutil.disk_usage(self.work_dir).free
            if free < self.min_free_bytes:
                return (f"work dir {self.work_dir} is full: {free / 2**20:.1f} MiB free, "
                        f"{self.min_free_bytes / 2**20:g} MiB needed")  # fmt: skip
            atomic_write_text(check, "ok\n")
            check.unlink()
        except OSError as exc:
            return f"work dir {self.work_dir} cannot be written: {exc}"
        opened: list[int] = []
        try:
            for _ in range(FREE_FDS):
                opened.append(os.open(os.devnull, os.O_RDONLY))
        except OSError as exc:
            return f"no file descriptor to spare ({len(opened)} of {FREE_FDS} opened): {exc}"
        finally:
            for fd in opened:
                os.close(fd)
        return None

    # ---------------------------------------------------------------------------------------------
    # token

    def ensure_token(self) -> None:
        """Switch ``self.client`` to this runner's own token (``tokens.TokenStore.choose``: the
        given runner token, the saved one, or one from registering with an admin token). Raises
        ``RunnerTokenMismatchError`` for another runner's token and ``KernelabAPIError`` for a
        refusal (e.g. 401)."""
        choice = self.tokens.choose(self.client, self.node_info)
        if choice.token is not None:
            self.close()
            self._own_client = self.client = self.client.with_token(choice.token)
        self._token_saved = choice.saved

    def node_info(self) -> NodeInfo | None:
        """This node's fingerprint (``node``, else ``kernelab.runners.probes.node_info()`` once),
        or None when the probes cannot be imported."""
        if self.node is None:
            try:
                from kernelab.runners.probes import node_info

                self.node = node_info()  # imports torch only where its build cannot answer
            except ImportError as exc:
                log.warning("runner %s: node_info unavailable (%s)", self.name, exc)
                return None
        return self.node

    # ---------------------------------------------------------------------------------------------
    # spool

    def flush_spool(self) -> int:
        """Post every spooled result, then every result held in memory; return how many the
        server acknowledged.

        Held results are first moved into the spool when the disk takes them again. The spools of
        ``fallback_dirs`` (results a shutdown wrote there) are posted too. Stops at the
        first failure that says "later" (unreachable server, 5xx, ...; the rest stay pending) or
        a refused token (401/403: kept too); ``unposted()`` then says how many wait. A result the
        server refuses for good (``REFUSED_FOR_GOOD``: 400/404/409/413/422) is moved to
        ``rejected/`` (kept in memory, in ``refused_in_memory``, when even that cannot be written).
        """
        self._post_error = None
        for key, result in list(self.held.items()):
            try:
                self.spool.put(result)
            except OSError:
                break  # still full: post them from memory below
            del self.held[key]
        sent = 0
        spools = [(self.spool, "post_result_json"), (self.workload_spool, "post_workload_json")]
        spools += [(fallback, "post_result_json") for fallback in self.fallback_spools()]
        for spool, post in spools:
            for path in spool.pending():
                try:
                    job_id, body = spool.read(path)
                except NewerResultFile as exc:
                    if path not in self._newer_seen:  # once per file, not at every flush
                        self._newer_seen.add(path)
                        log.error("runner %s: spool file not posted and kept: %s", self.name, exc)
                    continue
                except (OSError, UnreadableResultFile) as exc:
                    spool.reject(path, f"unreadable spool file: {exc}")
                    continue
                outcome = self._post(job_id, body, where=str(path), post=post)
                if outcome == "later":
                    return sent
                if outcome == "stored":
                    spool.done(path)
                    sent += 1
                else:
                    target = spool.reject(path, outcome)
                    log.error("runner %s: result of job %d kept in %s", self.name, job_id, target)
        for key, result in list(self.held.items()):
            assert result.job_id is not None
            body = result.model_dump_json().encode()
            outcome = self._post(result.job_id, body, where="memory (the work dir's disk is full)")
            if outcome == "later":
                break
            del self.held[key]
            if outcome == "stored":
                sent += 1
            else:
                try:
                    target = self.spool.reject(self.spool.put(result), outcome)
                    log.error("runner %s: result of job %s kept in %s", self.name, result.job_id, target)
                except OSError:
                    self.refused_in_memory.append((result, outcome))
        return sent

    def fallback_spools(self) -> list[Spool]:
        """The spools ``DIR/<name>/`` of ``fallback_dirs`` that exist (a shutdown made them)."""
        out = []
        for folder in self.fallback_dirs:
            root = folder / self.name
            if root.is_dir():
                with contextlib.suppress(OSError):
                    out.append(Spool(root))
        return out

    def unposted(self) -> int:
        """Results measured and not yet acknowledged by the server that this kernelab can post:
        spooled (a file of a newer ``schema_version`` is not counted) or held in memory."""
        files = [self.spool, self.workload_spool, *self.fallback_spools()]
        pending = 0
        for spool in files:
            with contextlib.suppress(OSError):
                pending += sum(1 for p in spool.pending() if p not in self._newer_seen)
        return pending + len(self.held)

    def _post(self, job_id: int, body: bytes, *, where: str, post: str = "post_result_json") -> str:
        """Post the ``JobResult`` document ``body`` of ``job_id`` as it is (``post``: the client's
        method, ``post_workload_json`` for a ``WorkloadResult``): ``"stored"`` (acknowledged),
        ``"later"`` (keep it, stop flushing), or the server's reason for refusing it for good."""
        try:
            accepted = getattr(self.client, post)(job_id, body)
        except KernelabUnavailable as exc:
            log.warning("runner %s: result of job %d stays in %s: %s", self.name, job_id, where, exc)
            self._post_error = exc
            return "later"
        except KernelabAPIError as exc:
            if exc.status_code not in REFUSED_FOR_GOOD:  # 401/403: the token, not the result
                log.error("runner %s: result of job %d refused (%s); kept in %s",
                          self.name, job_id, exc, where)  # fmt: skip
                self._post_error = exc
                return "later"
            log.error("runner %s: server refused result of job %d: %s", self.name, job_id, exc)
            return str(exc)
        self.posted += 1
        log.info("runner %s: job %d result stored%s", self.name, accepted.job_id,
                 " (duplicate)" if accepted.duplicate else "")  # fmt: skip
        return "stored"

    def advertise(self) -> RunnerAdverts:
        """Describe the benchmarks this runner offers (``kernelab.runners.adverts``): built-ins,
        installed entry points and ``benchmarks`` (the ``--benchmark`` refs), imported in a child
        process isolated as a job is (allow-listed environment, private namespace when jobs get
        one), so no benchmark module's import-time code runs in the daemon, which holds the
        token. Raises ``AdvertError`` naming the ref when one does not load or the child fails."""
        if self.adverts is not None:
            return self.adverts
        scratch = self.work_dir / "adverts"
        scratch.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-P", "-m", "kernelab.runners.adverts", "--print", *self.benchmark_refs]
        self.host.job_started()  # benchmark modules' import-time code runs there: job code
        try:
            env = job_env({PARENT_PID_ENV: str(os.getpid())}, names=self.supervisor.job_env_names)
            done = subprocess.run(self.supervisor.job_command(cmd, scratch), capture_output=True, text=True,
                                  cwd=scratch, timeout=ADVERT_TIMEOUT_S, env=env)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AdvertError(
                f"runner {self.name}: the benchmarks it offers cannot be listed: {exc}"
            ) from exc
        finally:
            self.host.job_ended()
        if done.returncode != 0:
            why = self._clean(
                done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
            )
            if "cannot import module" in why and "No module named" in why:
                # the listing and the jobs run in the runner's scratch, never its current folder (the
                # job sandbox): a module that is a file there is not found, as `kernelab run` finds it
                why += (
                    "; the runner does not import from its current folder: add the module's folder "
                    "to PYTHONPATH (PYTHONPATH=$PWD kernelab runner ...) or install it"
                )
            raise AdvertError(f"runner {self.name}: the benchmarks it offers cannot be listed: {why}")
        try:
            self.adverts = RunnerAdverts.model_validate_json(done.stdout)
        except ValidationError as exc:
            raise AdvertError(f"runner {self.name}: its advertisement is invalid: {exc}") from exc
        names = sorted({a.names[0] for a in self.adverts.benchmarks})
        log.info("runner %s: offers %d benchmarks: %s", self.name, len(names), ", ".join(names))
        return self.adverts

    def _claim_unless_stopped(self) -> JobClaim | None:
        """``_claim`` in a thread of its own, so a signal does not wait for its long poll (up to
        ``poll_s``): the job claimed, None when nothing was queued or the claim was abandoned.

        After SIGTERM/SIGINT (``_on_signal``) the claim gets ``CLAIM_STOP_WAIT_S`` more to answer
        (a job it brings is run as any claimed job at a stop: within ``grace_s``), then is abandoned:
        its connection closes when the process exits, and the server, which checks that its caller
        is still there before it claims (``/runners/claim``), leaves the job queued; a job the
        abandoned claim still brings while the daemon shuts down is handed back (``_release``), and
        only a job the server claimed in the instant the connection closed waits for its lease
        (``lease_s``). A ``stop()`` without a signal (an embedding caller's) waits for the claim as
        before. Raises what ``_claim`` raises."""
        lock = threading.Lock()
        answer: dict[str, Any] = {}
        answered = threading.Event()

        def claim_now() -> None:
            try:
                got = self._claim()
            except BaseException as exc:  # handed to the daemon's thread
                with lock:
                    answer["error"] = exc
                    answered.set()
                return
            with lock:
                answer["claim"] = got
                answered.set()
                abandoned = answer.get("abandoned", False)
            if abandoned and got is not None:
                self._release(got, "the runner was stopped while its claim was answered")

        threading.Thread(target=claim_now, name=f"claim-{self.name}", daemon=True).start()
        while not answered.wait(STOP_CHECK_S):
            if self._signalled.is_set():
                answered.wait(CLAIM_STOP_WAIT_S)
                with lock:
                    if not answered.is_set():
                        answer["abandoned"] = True
                        log.info("runner %s: stopping: the waiting claim is abandoned", self.name)
                        return None
                break
        if "error" in answer:
            raise answer["error"]
        claim: JobClaim | None = answer["claim"]
        return claim

    def _claim(self) -> JobClaim | None:
        """One claim, carrying the advertisement whole until the server holds it, then its digest;
        a 409 ``advert_required`` (the server lost it: a new database, a re-registration) sends it
        whole again at once."""
        wait_s = 0.0 if self.once else self.poll_s
        adverts = self.adverts
        extra: dict[str, Any] = {}
        if self.workloads:
            from kernelab.runners.workload.run import free_endpoint

            extra = {"workloads": True, "rdzv_endpoint": free_endpoint(self.rdzv_host)}
        if adverts is None:
            return self.client.claim(wait_s=wait_s, lease_s=self.lease_s, **extra)
        if self._advert_sent:
            try:
                return self.client.claim(
                    wait_s=wait_s, lease_s=self.lease_s, benchmarks_sha256=adverts.sha256, **extra
                )
            except KernelabAPIError as exc:
                if exc.status_code != 409:
                    raise
                self._advert_sent = False
        claim = self.client.claim(wait_s=wait_s, lease_s=self.lease_s, benchmarks=adverts, **extra)
        self._advert_sent = True
        return claim

    # ---------------------------------------------------------------------------------------------
    # one job

    def run_claim(self, claim: JobClaim) -> str:
        """Run one claimed job to the end; return the outcome.

        Outcomes: ``"done"`` (result spooled, or held in memory, and, if reachable, posted),
        ``"failed"`` (worker failed: non-zero exit or timeout; the job was failed on the server),
        ``"lost"`` (lease lost; nothing posted), ``"shutdown"`` (killed after the grace period;
        failed with retry), ``"released"`` (the job's scratch folder or worker could not be made,
        e.g. a full disk, or the node could not take the job's writes while it ran
        (``node_faults``): failed with retry, so it is re-queued while it has attempts left).
        """
        if claim.gang is not None:
            from kernelab.runners.daemon.workload import run_workload_claim

            return run_workload_claim(self, claim)
        self.state, self.running_job = "running", claim.job_id
        try:
            run = self.supervisor.run(claim, self.client)
        except JobNotStarted as exc:
            return self._release(claim, str(exc))
        finally:
            self.state, self.running_job = "claiming", None
        outcome = self._finish(claim, run)
        run.heartbeat.join(
            timeout=self.supervisor.heartbeat_s
        )  # after posting: a stalled heartbeat delays nothing
        return outcome

    def _release(self, claim: JobClaim, why: str) -> str:
        """Hand a claimed job back (``fail`` with ``retry=True``) because this node cannot run it."""
        message = self._clean(f"runner {self.name} released the job: {why}")
        log.error("runner %s: job %d: %s", self.name, claim.job_id, message)
        self.released += 1
        try:
            self.client.fail(claim.job_id, message, retry=True)
        except (KernelabAPIError, KernelabUnavailable) as exc:  # the lease then expires
            log.error("runner %s: could not release job %d (its lease expires in %.0f s): %s",
                      self.name, claim.job_id, self.lease_s, exc)  # fmt: skip
        return "released"

    def _keep(self, out_path: Path, handed: list[JobResult], *, job_id: int, key: str) -> str:
        """Put the finished result of the claim ``(job_id, key)`` into the spool (the worker's
        file, renamed unread, else the one it handed over on stdout); when the disk cannot take
        it, hold it in memory. Returns where it is."""
        try:
            if out_path.exists():
                path = self.spool.adopt(out_path, job_id=job_id, key=key)
            elif handed:
                path = self.spool.put(handed[-1])
            else:
                return ""
        except OSError as exc:
            try:
                result = handed[-1] if handed else Spool.load(out_path)
            except (ValidationError, NewerResultFile) as invalid:  # the worker wrote something else
                log.error("runner %s: %s is not a JobResult: %s", self.name, out_path, invalid)
                return ""
            except OSError as unreadable:
                log.error("runner %s: result %s cannot be read (%s); left there",
                          self.name, out_path, unreadable)  # fmt: skip
                return str(out_path)
            self.held[result.idempotency_key] = result
            return f"memory ({exc})"
        shutil.rmtree(out_path.parent, ignore_errors=True)  # scratch; failed jobs' stay for a look
        return str(path)

    def _finish(self, claim: JobClaim, run: WorkerRun) -> str:
        job_id = claim.job_id
        if run.why == "lost":
            self.lost += 1
            log.warning("runner %s: lease of job %d lost; worker stopped, nothing posted", self.name, job_id)
            return "lost"
        if run.why == "exited" and run.returncode == jobns.EXIT_NO_NAMESPACE and self.supervisor.isolated:
            last = (stderr_tail(run.err_path, 500).splitlines() or [""])[-1]
            return self._release(claim, f"its private namespace could not be made ({last})")
        finished = run.why == "exited" and run.returncode == 0
        if not finished and run.why in ("exited", "timeout"):
            fault = self._node_fault_of(run)
            if fault:
                return self._node_fault(claim, run, fault)
        where = self._keep(run.out_path, run.handed, job_id=job_id, key=run.key) if finished else ""
        if where:
            log.info("runner %s: job %d measured; result kept in %s", self.name, job_id, where)
            self.done += 1
            self.flush_spool()
            return "done"
        assert isinstance(claim.spec, JobSpec)
        message = self._clean(run.failure_message(claim.spec, self.name, self.grace_s))
        self.failed += 1
        log.error("runner %s: job %d failed: %s", self.name, job_id, message.splitlines()[0])
        try:
            self.client.fail(job_id, message, retry=run.why == "shutdown")
        except (KernelabAPIError, KernelabUnavailable) as exc:
            log.error("runner %s: could not report the failure of job %d: %s", self.name, job_id, exc)
        return "shutdown" if run.why == "shutdown" else "failed"

    def _node_fault_of(self, run: WorkerRun) -> str:
        """Why the node, not the job, ended ``run`` badly, or ``""``: the worker said so (exit status
        ``EXIT_NODE_FAULT``, its node-fault line on stdout or stderr), or the node is at fault now
        (``_work_dir_problem``: the job may have died of it, e.g. killed when a write failed)."""
        problem = self._work_dir_problem()
        if run.why == "exited" and run.returncode == EXIT_NODE_FAULT:
            tail = stderr_tail(run.err_path, 2000)
            said = [line for line in tail.splitlines() if NODE_FAULT_MARK in line]
            reason = run.node_fault or (said[-1].partition(NODE_FAULT_MARK)[2].strip() if said else "")
            return reason or problem or "the worker could not write on this node"
        if problem is None:
            return ""
        ended = "timed out" if run.why == "timeout" else f"exited with status {run.returncode}"
        return f"the worker {ended} while {problem}"

    def _node_fault(self, claim: JobClaim, run: WorkerRun, why: str) -> str:
        """Hand back a job the node could not run (``_release``), say that this node cannot write
        (``write_problem``, until ``_work_dir_problem`` finds it can again) and free its scratch."""
        self.node_faults += 1
        self._set_write_problem(f"job {claim.job_id}: {why}")
        shutil.rmtree(run.out_path.parent, ignore_errors=True)  # room for the next job; nothing to keep
        return self._release(claim, f"the node could not take the job's writes: {why}")
