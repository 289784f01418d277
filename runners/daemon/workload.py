"""A claimed workload job on the runner daemon: its gang seat kept until the gang is complete, its
runs (``kernelab.runners.workload.run_workload``) under a lease heartbeat, and its node's result
spooled before it is posted.

* **Gang.** The claim is a seat (``JobClaim.gang``). Until every seat is taken the daemon keeps
  its seat every ``GANG_POLL_S`` (``POST /runners/jobs/{id}/gang``); a 409 (the gathering timed out
  or lost a member: ``kernelab.service.server.gangs``) ends the wait and the daemon claims again.
* **Runs.** This runner owns the GPUs it hands over (``gpus``: all of this node's, the first
  ``launch.nproc_per_node`` of them go to each run through ``CUDA_VISIBLE_DEVICES``); a job of
  several nodes meets the others at node rank 0's c10d rendezvous (``Rendezvous``: the seat's
  endpoint, one run id per attempt and run). Ranks get the allow-listed job environment, never the
  daemon's token (``kernelab.runners.workload.launch.run_env``); they run in the daemon's working
  folder, so a relative ``command`` path is relative to it.
* **Lease.** A thread heartbeats every ``heartbeat_s`` with the run count as progress; a 409/404
  (lease lost: a member died and the attempt was re-queued, or the job was cancelled) sets the
  ``stop`` event and the run in flight is killed; nothing is posted. A daemon asked to stop gives
  the job ``grace_s`` seconds, then stops it too and hands it back (re-queued).
* **Nothing lost.** The node's ``WorkloadResult`` (with its ``node_rank`` and an idempotency key of
  this claim) goes into the daemon's workload spool (``RunnerDaemon.workload_spool``) before it
  is posted; the daemon's ``flush_spool`` posts it and keeps it through any server fault (a 503,
  an unreachable server) until the server acknowledges it, as it does benchmark results.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import TYPE_CHECKING

from kernelab.runners.client import KernelabAPIError, KernelabUnavailable
from kernelab.runners.daemon.supervisor import LEASE_LOST_STATUS
from kernelab.service.contract.schemas import GangSeat, JobClaim, JobProgress, WorkloadSpec

if TYPE_CHECKING:
    from kernelab.runners.daemon.loop import RunnerDaemon

log = logging.getLogger(__name__)

GANG_POLL_S = 1.0  # how often a seated runner asks whether its gang is complete
RUN_LOG_TAIL_LINES = 20  # lines of a run's output the runner log shows when the run did not finish


def _wait_for_gang(daemon: RunnerDaemon, seat: GangSeat) -> GangSeat | None:
    """Keep the seat until the gang is ready; None when the seat is gone or the daemon stops."""
    while not seat.ready:
        if daemon._stop.wait(GANG_POLL_S):
            return None
        try:
            seat = daemon.client.keep_seat(seat.job_id, lease_s=daemon.lease_s)
        except KernelabAPIError as exc:
            if exc.status_code in LEASE_LOST_STATUS:
                log.warning("runner %s: job %d: seat gone while the gang gathered: %s",
                            daemon.name, seat.job_id, exc)  # fmt: skip
                return None
            raise
        except KernelabUnavailable as exc:  # the seat's lease outlasts a short outage
            log.warning("runner %s: job %d: keeping the seat failed: %s", daemon.name, seat.job_id, exc)
    return seat


def _heartbeat(
    daemon: RunnerDaemon,
    job_id: int,
    done: threading.Event,
    stop: threading.Event,
    progress: list[JobProgress],
) -> None:
    """Heartbeat the lease until ``done``; set ``stop`` when it is lost or the daemon's grace ran out."""
    period = daemon.supervisor.heartbeat_s
    while not done.wait(period):
        stop_at = daemon.supervisor._stop_at
        if stop_at is not None and time.monotonic() - stop_at > daemon.grace_s:
            stop.set()  # shutdown: the run in flight is killed; the job is handed back below
        try:
            daemon.client.heartbeat(job_id, lease_s=daemon.lease_s, timeout_s=period,
                                    progress=progress[-1] if progress else None)  # fmt: skip
        except KernelabAPIError as exc:
            if exc.status_code in LEASE_LOST_STATUS and not done.is_set():
                log.warning("runner %s: job %d: lease lost (%s); stopping its runs", daemon.name, job_id, exc)
                stop.set()
                return
            log.warning("runner %s: heartbeat of job %d refused: %s", daemon.name, job_id, exc)
        except KernelabUnavailable as exc:
            log.warning("runner %s: heartbeat of job %d failed: %s", daemon.name, job_id, exc)


def run_workload_claim(daemon: RunnerDaemon, claim: JobClaim, *, gpus: list[int] | None = None) -> str:
    """Run workload claim ``claim`` on this node to its end (see the module doc); the outcome as
    ``RunnerDaemon.run_claim`` says it: ``done`` (result spooled, posted when the server takes
    it), ``lost`` (the seat or the lease was lost: nothing posted), ``failed`` (this node cannot
    run it: the attempt is failed on the server, for the whole gang), ``shutdown`` (stopped by the
    daemon's stop after its grace: handed back, re-queued)."""
    from kernelab.runners.workload import Rendezvous, run_workload

    assert claim.gang is not None and isinstance(claim.spec, WorkloadSpec)
    spec, job_id = claim.spec, claim.job_id
    seat = _wait_for_gang(daemon, claim.gang)
    if seat is None:
        if daemon._stop.is_set():
            _fail(daemon, job_id, f"runner {daemon.name} shut down while the gang gathered", retry=True)
            return "shutdown"
        daemon.lost += 1
        return "lost"
    rdzv = None
    if spec.launch.nnodes > 1:
        assert seat.endpoint is not None, "a ready gang of several nodes has node rank 0's endpoint"
        rdzv = Rendezvous(seat.endpoint, f"kernelab-job{job_id}-a{seat.attempt}", seat.node_rank)
    log.info("runner %s: workload job %d attempt %d: node rank %d of %d%s", daemon.name, job_id, seat.attempt,
             seat.node_rank, seat.nnodes, f", rendezvous {seat.endpoint}" if rdzv else "")  # fmt: skip
    done, stop = threading.Event(), threading.Event()
    progress: list[JobProgress] = []
    started = time.monotonic()

    def on_run(index: int, total: int, message: str) -> None:
        progress.append(JobProgress(cell=min(index + 1, total), cells=total, cells_done=index + 1,
                                    phase="measuring", message=message[:500],
                                    elapsed_s=time.monotonic() - started))  # fmt: skip

    beater = threading.Thread(target=_heartbeat, args=(daemon, job_id, done, stop, progress), daemon=True)
    beater.start()
    work = daemon.work_dir / "jobs" / f"{job_id}-{seat.attempt}"
    try:
        work.mkdir(parents=True, exist_ok=True)
        result = run_workload(
            spec, job_id=job_id, gpus=gpus, rdzv=rdzv, progress=on_run, work_dir=work, stop=stop
        )
    except (ValueError, OSError) as exc:
        done.set()
        daemon.failed += 1
        _fail(daemon, job_id, daemon._clean(f"runner {daemon.name} cannot run workload job {job_id}: {exc}"),
              retry=False)  # fmt: skip
        return "failed"
    finally:
        done.set()
    beater.join(timeout=daemon.supervisor.heartbeat_s + 5.0)
    if stop.is_set():
        if daemon._stop.is_set():
            _fail(daemon, job_id, f"runner {daemon.name} shut down; the job was stopped after a "
                                  f"{daemon.grace_s:g} s grace period", retry=True)  # fmt: skip
            return "shutdown"
        daemon.lost += 1
        log.warning(
            "runner %s: lease of workload job %d lost; runs stopped, nothing posted", daemon.name, job_id
        )
        return "lost"
    for run in result.runs:  # a run that did not finish is the operator's to see, with its cause
        if run.outcome != "ok":
            log.warning("runner %s: workload job %d run %d (%s): %s: %s; its output ends:\n%s", daemon.name,
                        job_id, run.index, run.side, run.outcome, run.error or "no error given",
                        "\n".join(run.log.splitlines()[-RUN_LOG_TAIL_LINES:]))  # fmt: skip
    key = f"{daemon.name}-j{job_id}-a{seat.attempt}-n{seat.node_rank}-{uuid.uuid4().hex[:12]}"
    result = result.model_copy(update={"idempotency_key": key, "node_rank": seat.node_rank})
    path = daemon.workload_spool.put_document(job_id, key, result.model_dump_json())
    log.info("runner %s: workload job %d measured (%d runs); result kept in %s", daemon.name, job_id,
             len(result.runs), path)  # fmt: skip
    daemon.done += 1
    daemon.flush_spool()
    return "done"


def _fail(daemon: RunnerDaemon, job_id: int, message: str, *, retry: bool) -> None:
    try:
        daemon.client.fail(job_id, message, retry=retry)
    except (KernelabAPIError, KernelabUnavailable) as exc:  # its lease then expires
        log.error("runner %s: could not report the end of workload job %d: %s", daemon.name, job_id, exc)
