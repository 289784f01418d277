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
  ``MIN_IDLE_S`` up to ``poll_s``. Only a refused token (401/403 on a claim) stops it.
* **Disk full.** Before each claim the work dir must take a small write and have
  ``MIN_FREE_BYTES`` free; otherwise the daemon says why and claims nothing until it does. A
  job whose scratch folder cannot be written after all is released at once (failed with
  ``retry=True``: re-queued while it has attempts left).
* **Leases.** A lost lease stops the worker and nothing is posted. A finished job's result is
  posted at once, without waiting for a heartbeat in flight (the server takes a late result
  while no other runner took the job over).
* **Scratch.** A job's folder is removed once the result is spooled and kept after a failure.
* **Timeouts.** A worker killed for its timeout fails the job with a message saying so.
* **Shutdown** (SIGTERM/SIGINT, arq's behaviour): stop claiming, let the running job finish within
  ``grace_s`` seconds (a second signal ends the grace at once), else kill it and fail the job with
  ``retry=True`` so another node takes it.
* **Burst mode** (``once=True``, arq's ``burst``): drain the queue, then exit.
* A failure message is redacted (the daemon's tokens and environment,
  ``kernelab.runners.redact``) and bounded before it leaves the node.
"""

from __future__ import annotations

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
from kernelab.runners.redact import redact, secret_values
from kernelab.runners.spool import (
    REFUSED_FOR_GOOD,
    NewerResultFile,
    Spool,
    UnreadableResultFile,
    atomic_write_text,
)
from kernelab.service.schemas import JobClaim, JobResult, JobSpec, NodeInfo, RunnerAdverts

log = logging.getLogger(__name__)

DEFAULT_WORK_DIR = Path.home() / ".kernelab"
MIN_IDLE_S = 1.0  # least time between two empty claims, against a server that does not long-poll
TOKEN_REFUSED_STATUS = frozenset({401, 403})  # a claim answered so: the daemon's token is no good
MIN_FREE_BYTES = 64 * 2**20  # 64 MiB free in the work dir before a claim (spec, stderr, result)
RUNNER_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")  # kernelab.service.schemas.RunnerRegister.name


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
    ``posted`` (results acknowledged, including re-sent spooled ones). ``held``: results the full
    disk could not take, by idempotency key, re-posted from memory.

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
    ):
        if not RUNNER_NAME.match(name):
            raise ValueError(f"runner name {name!r} must match {RUNNER_NAME.pattern}")
        self.name = name
        self.work_dir = (
            Path(work_dir).expanduser().resolve()
        )  # jobs and adverts chdir: a relative one would be joined twice
        self.tokens = TokenStore(self.work_dir / f"runner-{name}.json", name)
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
        self.held: dict[str, JobResult] = {}  # idempotency key -> result the full disk could not take
        self.refused_in_memory: list[tuple[JobResult, str]] = []  # refused for good, not writable
        self._newer_seen: set[Path] = set()  # spool files of a newer schema_version, logged once
        self._stop = threading.Event()
        self._own_client: KernelabClient | None = None
        self._token_saved = False  # the token in use came from the token file

    @property
    def token_file(self) -> Path:
        """Where this runner's own token is kept (``tokens.TokenStore``)."""
        return self.tokens.path

    def __repr__(self) -> str:
        return (
            f"<RunnerDaemon name={self.name} done={self.done} failed={self.failed} lost={self.lost} "
            f"pending={len(self.spool.pending()) + len(self.held)}>"
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
        if self._stop.is_set():  # a second signal: no more grace
            log.warning("runner %s: second %s; stopping the running job now", self.name, name)
            self.supervisor.stop(now=True)
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
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.info("runner %s stopped: %r", self.name, self)

    def _loop(self) -> None:
        failures = 0  # claims in a row that failed: the back-off doubles with each
        while not self._stop.is_set():
            self.flush_spool()
            problem = self._work_dir_problem()
            if problem is not None:
                log.warning("runner %s: not claiming: %s%s", self.name, problem,
                            "" if self.once else f"; checking again in {self.poll_s:g} s")  # fmt: skip
                if self.once:
                    break
                self._stop.wait(self.poll_s)
                continue
            if self.supervisor.reprobe is not None:
                self._probe_again(self.supervisor.reprobe)
                self.supervisor.reprobe = None
            started = time.monotonic()
            try:
                claim = self._claim()
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
        process (``kernelab.runners.measure.probes_in_child``; the job's probes, or the default
        ones when the job had none) and post the report, so the node's health reflects the node as
        the next job finds it. Failures are logged; the next claim goes ahead."""
        from kernelab.runners.job import device_name, probes_enabled
        from kernelab.runners.measure import probes_in_child
        from kernelab.service.schemas import ProbeSpec

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
        """Why the work dir cannot take a job now (disk full, not writable), or None."""
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
            except ImportError as exc:
                log.warning("runner %s: node_info unavailable (%s)", self.name, exc)
                return None
            self.node = node_info()
        return self.node

    # ---------------------------------------------------------------------------------------------
    # spool

    def flush_spool(self) -> int:
        """Post every spooled result, then every result held in memory; return how many the
        server acknowledged.

        Held results are first moved into the spool when the disk takes them again. Stops at the
        first failure that says "later" (unreachable server, 5xx, ...; the rest stay pending) or
        a refused token (401/403: kept too). A result the server refuses for good
        (``REFUSED_FOR_GOOD``: 400/404/409/413/422) is moved to ``rejected/`` (kept in memory,
        in ``refused_in_memory``, when even that cannot be written).
        """
        for key, result in list(self.held.items()):
            try:
                self.spool.put(result)
            except OSError:
                break  # still full: post them from memory below
            del self.held[key]
        sent = 0
        for spool, post in ((self.spool, "post_result_json"), (self.workload_spool, "post_workload_json")):
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

    def _post(self, job_id: int, body: bytes, *, where: str, post: str = "post_result_json") -> str:
        """Post the ``JobResult`` document ``body`` of ``job_id`` as it is (``post``: the client's
        method, ``post_workload_json`` for a ``WorkloadResult``): ``"stored"`` (acknowledged),
        ``"later"`` (keep it, stop flushing), or the server's reason for refusing it for good."""
        try:
            accepted = getattr(self.client, post)(job_id, body)
        except KernelabUnavailable as exc:
            log.warning("runner %s: result of job %d stays in %s: %s", self.name, job_id, where, exc)
            return "later"
        except KernelabAPIError as exc:
            if exc.status_code not in REFUSED_FOR_GOOD:  # 401/403: the token, not the result
                log.error("runner %s: result of job %d refused (%s); kept in %s",
                          self.name, job_id, exc, where)  # fmt: skip
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
        try:
            env = job_env({}, names=self.supervisor.job_env_names)
            done = subprocess.run(self.supervisor.job_command(cmd, scratch), capture_output=True, text=True,
                                  cwd=scratch, timeout=ADVERT_TIMEOUT_S, env=env)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AdvertError(
                f"runner {self.name}: the benchmarks it offers cannot be listed: {exc}"
            ) from exc
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
        e.g. a full disk: failed with retry, so it is re-queued while it has attempts left).
        """
        if claim.gang is not None:
            from kernelab.runners.daemon.workload import run_workload_claim

            return run_workload_claim(self, claim)
        try:
            run = self.supervisor.run(claim, self.client)
        except JobNotStarted as exc:
            return self._release(claim, str(exc))
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
