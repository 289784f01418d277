"""The runner daemon: one per GPU node, it claims jobs from the server and runs them.

Loop (``Runner.run``)::

    re-send spooled results -> long-poll claim -> run the job in a child process
      (python -m kernelab.runners.worker, hard timeout = spec.timeout_s, lease heartbeat from a thread)
    -> move the result into the spool -> post it (idempotent) -> delete it once acknowledged

* **Tokens.** Given an admin token the runner registers (``POST /runners/register``) and keeps its
  per-runner token in ``work_dir/runner-<name>.json`` (mode 0600) so a restart reuses it; given a
  runner token (registration answers 403) it uses that token directly. A runner token given while
  a different one is saved (e.g. after ``kernelab token rotate``) replaces the saved one. Tokens are
  never logged.
* **Nothing measured is lost.** A result goes into ``work_dir/spool/<name>/`` before it is posted
  and leaves it only when the server acknowledged it; an unreachable or failing server (any
  answer but a refusal of the result itself, ``kernelab.runners.spool.REFUSED_FOR_GOOD``) leaves it there
  to be re-sent on the next loop or after a restart (see ``kernelab.runners.spool``). When the work dir's
  disk is full the worker hands its result over on stdout and the daemon holds it in memory,
  re-posting it until the server acknowledges it (and spooling it once the disk takes it again).
* **Server faults.** The daemon survives any answer: a claim that fails (5xx, garbled answer,
  unreachable server, any refusal but of its token) is retried after a back-off that doubles from
  ``MIN_IDLE_S`` up to ``poll_s``. Only a refused token (401/403 on a claim) stops it.
* **Disk full.** Before each claim the work dir must take a small write and have
  ``MIN_FREE_BYTES`` free; otherwise the daemon says why and claims nothing until it does. A
  job whose scratch folder cannot be written after all is released at once (failed with
  ``retry=True``: re-queued while it has attempts left).
* **Leases.** A thread heartbeats every ``lease_s / 3`` seconds; when the server answers that the
  lease is lost (409/404: the job was re-queued or cancelled) the child is stopped and nothing is
  posted. A finished job's result is posted at once, without waiting for a heartbeat in flight
  (the server takes a late result while no other runner took the job over).
* **Scratch.** Each job runs in ``work_dir/jobs/<job>-<attempt>/`` (spec, result, worker stderr);
  the folder is removed once the result is spooled and kept after a failure.
* **Timeouts.** A child running longer than the spec's ``timeout_s`` is killed (its whole process
  group, so probe helpers die too) and the job is failed with a message saying so.
* **Shutdown** (SIGTERM/SIGINT, arq's behaviour): stop claiming, let the running job finish within
  ``grace_s`` seconds (a second signal ends the grace at once), else kill it and fail the job with
  ``retry=True`` so another node takes it.
* **Burst mode** (``once=True``, arq's ``burst``): drain the queue, then exit.
* **Job code gets no credentials** (``docs/security.md``, "Job code on runners"): the worker and
  everything under it get the allow-listed environment of ``kernelab.runners.jobenv`` (plus the operator's
  ``job_env`` names), never ``KERNELAB_TOKEN``; with ``job_isolation`` ``"auto"`` (default) or
  ``"namespace"`` the worker runs in a private user + mount namespace (``kernelab.runners.jobns``) where the
  work dir shows only the job's scratch folder and the revision cache, so the token file and the
  spool cannot be read. The daemon says at start-up which isolation it has and warns when job
  code could still read the token file. A failure message is redacted (the daemon's tokens and
  environment, ``kernelab.runners.redact``) and bounded before it leaves the node.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kernelab.runners import jobns
from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable
from kernelab.runners.jobenv import check_names, job_env
from kernelab.runners.redact import redact, secret_values
from kernelab.runners.spool import REFUSED_FOR_GOOD, Spool, atomic_write_text
from kernelab.runners.worker import NODE_CHANGED_MARK, RESULT_MARK
from kernelab.service.schemas import JobClaim, JobResult, JobSpec, NodeInfo, RunnerAdverts

log = logging.getLogger(__name__)

DEFAULT_WORK_DIR = Path.home() / ".kernelab"
KILL_WAIT_S = 10.0  # SIGTERM -> SIGKILL delay for a child being stopped
MIN_IDLE_S = 1.0  # least time between two empty claims, against a server that does not long-poll
STDERR_TAIL_CHARS = 4000  # how much of a failed child's stderr goes into the failure message
LEASE_LOST_STATUS = frozenset({404, 409})
TOKEN_REFUSED_STATUS = frozenset({401, 403})  # a claim answered so: the daemon's token is no good
MIN_FREE_BYTES = 64 * 2**20  # 64 MiB free in the work dir before a claim (spec, stderr, result)
JOB_FAILED_MARK = "worker: job failed: "  # kernelab.runners.worker's last stderr line on a job failure
RUNNER_NAME = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")  # kernelab.service.schemas.RunnerRegister.name
PROBE_POOL_MODES = ("auto", "on", "off")  # Runner(probe_pool=...), see Runner._pool_env
ADVERT_TIMEOUT_S = 300.0  # importing every offered benchmark to describe it (Runner.advertise)


class AdvertError(Exception):
    """The runner cannot say which benchmarks it offers (a ``--benchmark`` ref that does not load,
    the child that imports them failed): it does not start claiming."""


class RunnerTokenMismatchError(Exception):
    """``--token`` is another runner's token: it would make this daemon work as that runner."""


class Runner:
    """Runner daemon bound to one server (through ``client``) under the name ``name``.

    ``poll_s``: long-poll wait of each claim, seconds (server caps it). ``lease_s``: lease asked
    for on claim and on every heartbeat, seconds (heartbeat every ``lease_s / 3``). ``work_dir``:
    token file, spool and per-job scratch folders. ``grace_s``: how long a running job may go on
    after SIGTERM. ``node``: the fingerprint sent on registration (default
    ``kernelab.runners.probes.node_info()``). ``allowed_repos``: repositories (paths, URLs or patterns,
    ``kernelab.service.repo_address``) that jobs' source revisions may come from, besides
    ``KERNELAB_ALLOWED_REPOS``; their clones and worktrees are cached in ``work_dir/revisions``.
    ``min_free_bytes``: free space the work dir must have before a claim (bytes).
    ``job_env_names``: variables job code may see besides ``kernelab.runners.jobenv``'s allow-list
    (``--job-env``; a credential-like name raises ``ValueError``). ``job_isolation``: ``"auto"``
    runs jobs in a private namespace where the work dir is hidden when this machine allows it (else
    a loud warning), ``"namespace"`` requires it (``run()`` raises ``jobns.IsolationError``
    without), ``"none"`` never. Counters: ``done``, ``failed``, ``lost`` (lease lost),
    ``released`` (jobs handed back because the work dir could not take them), ``posted`` (results
    acknowledged, including re-sent spooled ones). ``held``: results the full disk could not take,
    by idempotency key, re-posted from memory.

    Raises ``ValueError`` for a name outside ``[A-Za-z0-9._:-]{1,200}`` (the server's rule; the
    name is also a folder name). The caller keeps owning ``client``; the client the runner makes
    for its own token is closed by ``close()`` (or on leaving ``with Runner(...) as runner:``).
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
    ):
        if not RUNNER_NAME.match(name):
            raise ValueError(f"runner name {name!r} must match {RUNNER_NAME.pattern}")
        if probe_pool not in PROBE_POOL_MODES:
            raise ValueError(f"probe_pool must be one of {list(PROBE_POOL_MODES)}, got {probe_pool!r}")
        if job_isolation not in jobns.ISOLATION_MODES:
            raise ValueError(
                f"job_isolation must be one of {list(jobns.ISOLATION_MODES)}, got {job_isolation!r}"
            )
        self.probe_pool = probe_pool
        self.job_env_names = check_names(job_env_names)
        self.job_isolation = job_isolation
        self.job_hide = [Path(p) for p in job_hide]
        self.benchmark_refs = list(benchmarks)
        self.adverts: RunnerAdverts | None = None  # made by advertise() at start-up
        self._advert_sent = False  # the server holds self.adverts: later claims send its digest
        self._isolated: bool | None = None  # decided by check_isolation() at start-up
        self.min_free_bytes = int(min_free_bytes)
        self._pool: Any = None  # kernelab.runners.probes.all_reduce.AllReducePool, started by the first job
        self.client = client
        self._given_client = client  # its token (maybe the admin's) stays a secret to redact
        self.name = name
        self.once = once
        self.poll_s = float(poll_s)
        self.lease_s = float(lease_s)
        self.heartbeat_s = self.lease_s / 3.0
        self.grace_s = float(grace_s)
        self.work_dir = Path(work_dir).expanduser()
        self.spool = Spool(self.work_dir / "spool" / name)
        self.token_file = self.work_dir / f"runner-{name}.json"
        self.node = node
        self.allowed_repos = list(allowed_repos)
        self.revision_cache = self.work_dir / "revisions"
        self.done = 0
        self.failed = 0
        self.lost = 0
        self.posted = 0
        self.released = 0
        self.held: dict[str, JobResult] = {}  # idempotency key -> result the full disk could not take
        # the spec of a job whose worker said it changed the node: probe again before the next claim
        self._reprobe: JobSpec | None = None
        self._running_spec: JobSpec | None = None
        self.refused_in_memory: list[tuple[JobResult, str]] = []  # refused for good, not writable
        self._stop = threading.Event()
        self._stop_at: float | None = None
        self._own_client: KernelabClient | None = None
        self._token_saved = False  # the token in use came from token_file

    def __repr__(self) -> str:
        return (
            f"<Runner name={self.name} done={self.done} failed={self.failed} lost={self.lost} "
            f"pending={len(self.spool.pending()) + len(self.held)}>"
        )

    # ---------------------------------------------------------------------------------------------
    # lifecycle

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the client made for this runner's own token (not the caller's client) and stop the
        all-reduce pool."""
        if self._own_client is not None:
            self._own_client.close()
            self._own_client = None
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _pool_env(self, claim: JobClaim) -> dict[str, str]:
        """The worker's environment entry for this runner's all-reduce pool (``{}`` without one).

        ``probe_pool``: ``"auto"`` keeps a pool on a node with 2+ CUDA GPUs none of which is in an
        exclusive compute mode (NVML), ``"on"`` also there and on a CPU-only node (gloo), ``"off"``
        never. The pool starts with the first job that probes the
        all-reduce and is restarted when it has lost a rank; a pool that cannot start is logged
        and the job's probes start their own ranks.
        """
        spec = claim.spec
        if self.probe_pool == "off" or not spec.probes.all_reduce:
            return {}
        try:
            import torch

            from kernelab.runners.probes.all_reduce import AllReducePool
            from kernelab.runners.probes.telemetry import POOL_ENV

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            device_type = spec.device if spec.device != "auto" else ("cuda" if gpus else "cpu")
            if device_type == "cuda" and gpus < 2:
                return {}
            if device_type == "cuda" and self.probe_pool == "auto":
                from kernelab.runners.probes.telemetry import exclusive_gpus

                if exclusive := exclusive_gpus(gpus):
                    log.info(
                        "runner %s: no probe pool: GPUs %s are in an exclusive compute mode",
                        self.name,
                        exclusive,
                    )
                    return {}
            if device_type == "cpu" and self.probe_pool != "on":
                return {}
            if self._pool is not None and (not self._pool.alive() or self._pool.device_type != device_type):
                self._pool.close()
                self._pool = None
            if self._pool is None:
                self._pool = AllReducePool(device_type)
                log.info(
                    "runner %s: all-reduce probe pool started (%s x%d, pids %s)",
                    self.name,
                    device_type,
                    self._pool.world_size,
                    self._pool.pids,
                )
            return {POOL_ENV: json.dumps(self._pool.handover())}
        except (RuntimeError, ValueError, OSError) as exc:  # the probes fall back to their own ranks
            log.warning("runner %s: no all-reduce probe pool: %s", self.name, exc)
            return {}

    def check_isolation(self) -> bool:
        """Decide (once) whether jobs run in the private namespace and log which isolation job code
        has; True when it does. Raises ``jobns.IsolationError`` when ``job_isolation`` is
        ``"namespace"`` and this machine cannot make one."""
        if self._isolated is not None:
            return self._isolated
        why = "disabled (job_isolation=none)" if self.job_isolation == "none" else jobns.probe()
        self._isolated = not why
        if self._isolated:
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
        return self._isolated

    def _job_command(self, cmd: list[str], job_dir: Path) -> list[str]:
        """``cmd`` through ``kernelab.runners.jobns`` when jobs are isolated, else as it is: the work dir
        (and ``job_hide``) hidden but ``job_dir`` and the revision cache, and the places a job
        could leave something for later jobs or for the daemon's next start read-only (``_frozen``)."""
        if not self.check_isolation():
            return cmd
        self.revision_cache.mkdir(parents=True, exist_ok=True)
        return jobns.wrap(
            cmd,
            hide=[self.work_dir, *self.job_hide],
            keep=[job_dir, self.revision_cache],
            readonly=[*_frozen(), *_local_repos(self.allowed_repos)],
        )

    def _secrets(self) -> list[str]:
        """Values a job's error text must never carry: the tokens this daemon holds and its
        credential-like variables."""
        tokens = [
            getattr(c, "_token", None)
            for c in (self._given_client, self.client, self._own_client)
            if c is not None
        ]
        return secret_values(os.environ, [*tokens, self._load_token()])

    def _clean(self, text: str) -> str:
        """``text`` redacted (``_secrets``, the daemon's environment) and bounded
        (``kernelab.runners.redact``)."""
        return redact(text, secrets=self._secrets(), env=os.environ)

    def stop(self) -> None:
        """Stop claiming; a running job gets ``grace_s`` seconds to finish. Thread/signal safe."""
        if not self._stop.is_set():
            self._stop_at = time.monotonic()
            self._stop.set()

    def _on_signal(self, signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if self._stop.is_set():  # a second signal: no more grace
            log.warning("runner %s: second %s; stopping the running job now", self.name, name)
            self._stop_at = float("-inf")
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
            self.check_isolation()
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
                    self._runner_hint(),
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
            if self._reprobe is not None:
                self._probe_again(self._reprobe)
                self._reprobe = None
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
            env = job_env({}, names=self.job_env_names)
            done = subprocess.run(self._job_command(cmd, scratch), capture_output=True, text=True,
                                  cwd=scratch, timeout=ADVERT_TIMEOUT_S, env=env)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AdvertError(
                f"runner {self.name}: the benchmarks it offers cannot be listed: {exc}"
            ) from exc
        if done.returncode != 0:
            why = self._clean(
                done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"
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
        if adverts is None:
            return self.client.claim(wait_s=wait_s, lease_s=self.lease_s)
        if self._advert_sent:
            try:
                return self.client.claim(
                    wait_s=wait_s, lease_s=self.lease_s, benchmarks_sha256=adverts.sha256
                )
            except KernelabAPIError as exc:
                if exc.status_code != 409:
                    raise
                self._advert_sent = False
        claim = self.client.claim(wait_s=wait_s, lease_s=self.lease_s, benchmarks=adverts)
        self._advert_sent = True
        return claim

    def _probe_again(self, spec: JobSpec) -> None:
        """After a job that changed the node (its worker said so): probe the node in a fresh
        process (``kernelab.runners.measure.probes_in_child``; the job's probes, or the default ones when
        the job had none) and post the report, so the node's health reflects the node as the next
        job finds it. Failures are logged; the next claim goes ahead."""
        from kernelab.runners.job import probes_enabled, resolve_device
        from kernelab.runners.measure import probes_in_child
        from kernelab.service.schemas import ProbeSpec

        try:
            device_type = resolve_device(None, spec.device).type
            if not probes_enabled(spec, device_type):
                spec = spec.model_copy(update={"probes": ProbeSpec()})
            reports = probes_in_child(spec, phase="adhoc", device_type=device_type, timeout_s=600.0)
            node = self._node_info()
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
        """Switch ``self.client`` to this runner's own token.

        Order: the client's token when a different token is saved in ``token_file`` for this
        server and the server takes the client's token as this runner's token (same name, and the
        runner id the file records): it then replaces the saved one in the file (how a rotated
        runner token is put in place); another runner's token raises ``RunnerTokenMismatchError``
        and changes nothing; else the saved token;
        else register with the client's token (admin) and save the answer; else (registration
        answers 403) keep the client's token as a runner token. Raises ``KernelabAPIError`` for
        any other refusal (e.g. 401).
        """
        saved = self._load_token()
        given = self.client.token  # the token the caller's client was made with (--token)
        if saved is not None and given and given != saved and self._takes_given_token(given):
            return
        if saved is not None:
            self._use_token(saved)
            self._token_saved = True
            log.info("runner %s: using the token saved in %s", self.name, self.token_file)
            return
        try:
            registered = self.client.register(self.name, self._node_info())
        except KernelabAPIError as exc:
            if exc.status_code == 403:
                log.info("runner %s: token is not an admin token; using it as a runner token", self.name)
                return
            raise
        self._save_token(registered.token, runner_id=registered.runner_id, name=registered.name)
        self._use_token(registered.token)
        log.info(
            "runner %s: registered as runner %d; token saved in %s",
            self.name,
            registered.runner_id,
            self.token_file,
        )

    def _takes_given_token(self, given: str) -> bool:
        """Put ``given`` (the client's token, not the saved one) in place if the server takes it as
        this runner's token (``GET /runners/me``: same name, and the runner id the file records):
        saved, used, True. False when the server refuses it (401), it is no runner token (403, e.g.
        an admin one) or the server is unreachable: the saved token is used (the next start asks
        again). Raises ``RunnerTokenMismatchError`` for another runner's token, changing nothing."""
        try:
            identity = self.client.whoami()
        except KernelabAPIError as exc:
            if exc.status_code == 401:
                log.warning(
                    "runner %s: the given token was refused; trying the one saved in %s",
                    self.name,
                    self.token_file,
                )
            return False
        except KernelabUnavailable as exc:
            log.warning(
                "runner %s: cannot check the given token (%s); using the one saved in %s",
                self.name,
                exc,
                self.token_file,
            )
            return False
        saved_id = self._saved_runner_id()
        if identity.name != self.name or (saved_id is not None and identity.runner_id != saved_id):
            ours = f"{self.name!r}" + (f", id {saved_id}" if saved_id is not None else "")
            raise RunnerTokenMismatchError(
                f"runner {self.name}: the given --token belongs to runner {identity.name!r} (id "
                f"{identity.runner_id}), not to this runner ({ours}, saved in {self.token_file}); "
                "nothing was changed: give this runner's own (rotated) token, or an admin token"
            )
        self._save_token(given)
        self._use_token(given)
        self._token_saved = True
        log.info("runner %s: the given runner token replaces the one saved in %s", self.name, self.token_file)
        return True

    def _token_record(self) -> dict[str, Any]:
        """The JSON object in ``token_file`` (``server``, ``name``, ``runner_id``, ``token``), or
        ``{}`` when there is none or it cannot be read."""
        try:
            record = json.loads(self.token_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def _saved_runner_id(self) -> int | None:
        """``runner_id`` recorded in ``token_file``, or None."""
        runner_id = self._token_record().get("runner_id")
        return runner_id if isinstance(runner_id, int) else None

    def _save_token(self, token: str, *, runner_id: int | None = None, name: str | None = None) -> None:
        """Write ``token`` to ``token_file`` (mode 0600) for this server; a runner id and name not
        given are kept from the file (a rotated token keeps its runner)."""
        old = self._token_record()
        payload = {
            "server": self.client.base_url,
            "name": name or old.get("name") or self.name,
            "runner_id": runner_id if runner_id is not None else old.get("runner_id"),
            "token": token,
        }
        self.work_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.token_file, json.dumps(payload))
        os.chmod(self.token_file, 0o600)

    def _runner_hint(self) -> str:
        """``", runner N"`` from ``token_file``, or ``""``."""
        runner_id = self._saved_runner_id()
        return f", runner {runner_id}" if runner_id else ""

    def _use_token(self, token: str) -> None:
        self.close()
        self._own_client = self.client = self.client.with_token(token)

    def _load_token(self) -> str | None:
        record = self._token_record()
        if record.get("server") != self.client.base_url or not record.get("token"):
            return None
        return str(record["token"])

    def _node_info(self) -> NodeInfo | None:
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
        for path in self.spool.pending():
            try:
                result = self.spool.load(path)
            except (OSError, ValidationError) as exc:
                self.spool.reject(path, f"unreadable spool file: {exc}")
                continue
            if result.job_id is None:
                self.spool.reject(path, "result has no job_id")
                continue
            outcome = self._post(result, where=str(path))
            if outcome == "later":
                return sent
            if outcome == "stored":
                self.spool.done(path)
                sent += 1
            else:
                target = self.spool.reject(path, outcome)
                log.error("runner %s: result of job %d kept in %s", self.name, result.job_id, target)
        for key, result in list(self.held.items()):
            outcome = self._post(result, where="memory (the work dir's disk is full)")
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

    def _post(self, result: JobResult, *, where: str) -> str:
        """Post ``result``: ``"stored"`` (acknowledged), ``"later"`` (keep it, stop flushing), or
        the server's reason for refusing it for good."""
        assert result.job_id is not None
        try:
            accepted = self.client.post_result(result.job_id, result)
        except KernelabUnavailable as exc:
            log.warning("runner %s: result of job %d stays in %s: %s", self.name, result.job_id, where, exc)
            return "later"
        except KernelabAPIError as exc:
            if exc.status_code not in REFUSED_FOR_GOOD:  # 401/403: the token, not the result
                log.error("runner %s: result of job %d refused (%s); kept in %s",
                          self.name, result.job_id, exc, where)  # fmt: skip
                return "later"
            log.error("runner %s: server refused result of job %d: %s", self.name, result.job_id, exc)
            return str(exc)
        self.posted += 1
        log.info("runner %s: job %d result stored as %d%s", self.name, accepted.job_id,
                 accepted.result_id, " (duplicate)" if accepted.duplicate else "")  # fmt: skip
        return "stored"

    # ---------------------------------------------------------------------------------------------
    # one job

    def run_claim(self, claim: JobClaim) -> str:
        """Run one claimed job to the end; return the outcome.

        Outcomes: ``"done"`` (result spooled, or held in memory, and, if reachable, posted),
        ``"failed"`` (child failed: non-zero exit or timeout; the job was failed on the server),
        ``"lost"`` (lease lost; nothing posted), ``"shutdown"`` (killed after the grace period;
        failed with retry), ``"released"`` (the job's scratch folder or child could not be made,
        e.g. a full disk: failed with retry, so it is re-queued while it has attempts left).
        """
        job_id = claim.job_id
        self._running_spec = claim.spec
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
        handed: list[JobResult] = []  # a result the worker sent on stdout (its file could not be written)
        try:
            job_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(spec_path, claim.spec.model_dump_json())
            out_path.unlink(missing_ok=True)
            cmd = self._job_command(worker, job_dir)
            err_fh = err_path.open("w", encoding="utf-8")
        except OSError as exc:
            return self._release(claim, f"its scratch folder {job_dir} cannot be written: {exc}")
        with err_fh:
            try:
                overrides = self._pool_env(claim)
                if self._isolated:  # its install steps and benchmark code nest a read-only revision cache
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
                return self._release(claim, f"its worker cannot be started: {exc}")
            reader = threading.Thread(target=self._relay_stdout, args=(proc, job_id, key, handed),
                                      daemon=True)  # fmt: skip
            beater = threading.Thread(
                target=self._heartbeat, args=(job_id, finished, lease_lost), daemon=True
            )
            reader.start()
            beater.start()
            try:
                why = self._supervise(proc, claim.spec.timeout_s, lease_lost)
            finally:
                if proc.poll() is None:  # never leave a worker behind, whatever happened here
                    _kill_group(proc)
                finished.set()  # the heartbeat thread ends after the call it may be in
                reader.join(timeout=5.0)
                if proc.stdout is not None:
                    proc.stdout.close()
        outcome = self._finish(claim, why, proc.returncode, out_path, err_path, handed)
        beater.join(timeout=self.heartbeat_s)  # after posting: a stalled heartbeat delays nothing
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
            _kill_group(proc)
            return why

    def _keep(self, out_path: Path, handed: list[JobResult]) -> str:
        """Put the finished result into the spool (the worker's file, else the one it handed over
        on stdout); when the disk cannot take it, hold it in memory. Returns where it is."""
        try:
            if out_path.exists():
                path = self.spool.adopt(out_path)
            elif handed:
                path = self.spool.put(handed[-1])
            else:
                return ""
        except ValidationError as exc:  # the worker wrote something else: the job failed
            log.error("runner %s: %s is not a JobResult: %s", self.name, out_path, exc)
            return ""
        except OSError as exc:
            try:
                result = handed[-1] if handed else Spool.load(out_path)
            except OSError as unreadable:
                log.error("runner %s: result %s cannot be read (%s); left there",
                          self.name, out_path, unreadable)  # fmt: skip
                return str(out_path)
            self.held[result.idempotency_key] = result
            return f"memory ({exc})"
        shutil.rmtree(out_path.parent, ignore_errors=True)  # scratch; failed jobs' stay for a look
        return str(path)

    def _finish(
        self, claim: JobClaim, why: str, returncode: int | None, out_path: Path, err_path: Path,
        handed: list[JobResult],
    ) -> str:  # fmt: skip
        job_id = claim.job_id
        if why == "lost":
            self.lost += 1
            log.warning("runner %s: lease of job %d lost; worker stopped, nothing posted", self.name, job_id)
            return "lost"
        if why == "exited" and returncode == jobns.EXIT_NO_NAMESPACE and self._isolated:
            last = (_tail(err_path, 500).splitlines() or [""])[-1]
            return self._release(claim, f"its private namespace could not be made ({last})")
        where = self._keep(out_path, handed) if why == "exited" and returncode == 0 else ""
        if where:
            log.info("runner %s: job %d measured; result kept in %s", self.name, job_id, where)
            self.done += 1
            self.flush_spool()
            return "done"
        if why == "timeout":
            message = (
                f"timed out: the worker ran longer than the spec's timeout_s = "
                f"{claim.spec.timeout_s:g} s and was killed on node {self.name}"
            )
        elif why == "shutdown":
            message = (
                f"runner {self.name} shut down; the job was stopped after a {self.grace_s:g} s grace period"
            )
        else:
            message = f"worker exited with status {returncode} on node {self.name}"
        tail = _tail(err_path, STDERR_TAIL_CHARS)
        reason = tail.rpartition(JOB_FAILED_MARK)[2].strip() if JOB_FAILED_MARK in tail else ""
        if reason:  # the worker said why (kernelab.runners.worker): that goes first
            message = f"{reason}\n({message})"
        if tail:
            message += f"\n--- worker stderr (last {STDERR_TAIL_CHARS} characters) ---\n{tail}"
        message = self._clean(message)
        self.failed += 1
        log.error("runner %s: job %d failed: %s", self.name, job_id, message.splitlines()[0])
        try:
            self.client.fail(job_id, message, retry=why == "shutdown")
        except (KernelabAPIError, KernelabUnavailable) as exc:
            log.error("runner %s: could not report the failure of job %d: %s", self.name, job_id, exc)
        return "shutdown" if why == "shutdown" else "failed"

    def _heartbeat(self, job_id: int, finished: threading.Event, lease_lost: threading.Event) -> None:
        while not finished.wait(self.heartbeat_s):
            try:
                self.client.heartbeat(job_id, lease_s=self.lease_s, timeout_s=self.heartbeat_s)
            except KernelabAPIError as exc:
                if exc.status_code in LEASE_LOST_STATUS and not finished.is_set():
                    lease_lost.set()
                    return
                log.warning("runner %s: heartbeat of job %d refused: %s", self.name, job_id, exc)
            except KernelabUnavailable as exc:
                log.warning("runner %s: heartbeat of job %d failed: %s", self.name, job_id, exc)

    def _relay_stdout(
        self, proc: subprocess.Popen[str], job_id: int, key: str, handed: list[JobResult]
    ) -> None:
        """Log the worker's stdout lines; a ``RESULT_MARK`` line (the result the worker could not
        write to its file) for this job and key goes into ``handed`` instead."""
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(NODE_CHANGED_MARK):
                log.warning("job %d changed the node: %s", job_id, line[len(NODE_CHANGED_MARK) :].strip())
                self._reprobe = self._running_spec
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


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``KILL_WAIT_S`` seconds."""
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


def _tail(path: Path, chars: int) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as fh:
            return "".join(deque(fh, maxlen=200))[-chars:].strip()
    except OSError:
        return ""
