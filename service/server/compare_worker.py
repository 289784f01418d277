"""The compare worker: a process that computes comparisons off the request path.

It claims ``compare`` tasks (``kernelab.service.server.compare_queue``) under a lease, heartbeats the lease
from a thread every third of ``Settings.compare_lease_s`` while ``stats.compare`` runs (a 1,000-cell
sweep takes tens of seconds of CPU: ``docs/results/2026-12-01-compare-speed.md``), then stores, in
one transaction that fails unless it still holds the lease: the comparison and the job's verdict
summary (``crud.save_comparison``), the task's ``done``, the node-health judgement and the history
points (``history.build_points``). A worker killed mid-task (``kill -9``) stores nothing; its lease
expires and another worker's claim re-queues and finishes the task.

A graceful stop (SIGTERM, SIGINT) does not wait for a comparison: the computation is abandoned,
the task handed back (``compare_queue.release``: queued again, the attempt not counted) and the
process exits. ``burst`` mode (``kernelab compare-worker --burst``) drains the queue and returns,
as arq's burst mode does; ``kernelab serve`` starts one worker process beside the API workers
(``serve_with_compare_worker``), ``kernelab compare-worker`` runs one alone (a fleet runs several,
on any host that reaches the database).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from types import FrameType

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kernelab.service.contract.schemas import Side
from kernelab.service.server import compare_queue, crud, history
from kernelab.service.server.compare_queue import TaskLease, TaskLeaseLostError
from kernelab.service.server.core.config import Settings

log = logging.getLogger("kernelab.service.server.compare_worker")
"""Named, not ``__name__``: run as ``python -m`` (how ``kernelab serve`` starts it) ``__name__`` is
``__main__``, outside the ``kernelab`` logger that ``configure_logging`` formats (a warning then
reached stderr through logging's last-resort handler: no time, no level)."""


class StopRequested(BaseException):  # noqa: N818  (a signal, like KeyboardInterrupt)
    """Raised in the worker's main thread by SIGTERM/SIGINT while a task is being computed."""


def default_name() -> str:
    """``host:pid``: who holds a task's lease."""
    return f"{socket.gethostname()}:{os.getpid()}"


class CompareWorker:
    """Claims and computes comparison tasks of the database ``factory`` reaches.

    ``settings``: ``compare_lease_s``, ``compare_poll_s``, ``compare_max_attempts`` and the
    node-health settings of the judgement. ``name``: the lease holder (default ``host:pid``).
    ``parent_pid``: the ``kernelab serve`` that started this process; when it is gone (even killed
    with SIGKILL) the worker stops as on SIGTERM, so no worker outlives its server.
    """

    def __init__(
        self, factory: sessionmaker[Session], settings: Settings, *, name: str | None = None,
        parent_pid: int | None = None,
    ):  # fmt: skip
        self.factory = factory
        self.settings = settings
        self.name = name or default_name()
        self.parent_pid = parent_pid
        self.done = 0
        self.failed = 0
        self.lost = 0
        self._stopping = threading.Event()
        self._busy = False
        self._ending = threading.Event()  # the task's finish/fail is under way: its lease ends there

    def __repr__(self) -> str:
        return f"<CompareWorker name={self.name} done={self.done} failed={self.failed} lost={self.lost}>"

    def stop(self) -> None:
        """Stop after the current claim (from another thread), or at once between tasks."""
        self._stopping.set()

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """SIGTERM/SIGINT handler: stop; a task being computed is abandoned (``StopRequested``)."""
        log.info("compare worker %s: signal %d, stopping", self.name, signum)
        self._stopping.set()
        if self._busy:
            raise StopRequested

    def sweep(self) -> int:
        """Queue the comparisons that are missing or judged by older verdict rules
        (``compare_queue.enqueue_stale``); returns how many."""
        with self.factory() as session:
            n = compare_queue.enqueue_stale(session, max_attempts=self.settings.compare_max_attempts)
            session.commit()
        if n:
            log.info("compare worker %s: queued %d missing or stale comparisons", self.name, n)
        return n

    def run(self, *, burst: bool = False) -> None:
        """Claim and compute tasks until ``stop()`` (or a signal); with ``burst``, until no task is
        claimable. A database fault is logged and retried after ``compare_poll_s``."""
        while not self._stopping.is_set() and not self._orphaned():
            try:
                took = self.run_once()
            except SQLAlchemyError as exc:
                log.warning("compare worker %s: database error: %s", self.name, exc)
                took = False
            if not took:
                if burst:
                    return
                self._stopping.wait(self.settings.compare_poll_s)

    def run_once(self) -> bool:
        """Claim one task and compute it; False when none was claimable."""
        with self.factory() as session:
            task = compare_queue.claim(session, worker=self.name, lease_s=self.settings.compare_lease_s)
            session.commit()
        if task is None:
            return False
        log.info("compare worker %s: task %d (job %s, attempt %d)", self.name, task.id, task.job_id,
                 task.attempts, extra={"event": "compare claimed", "task_id": task.id})  # fmt: skip
        beat_stop = threading.Event()
        self._ending.clear()
        beat = threading.Thread(
            target=self._heartbeat, args=(task, beat_stop), name="compare-heartbeat", daemon=True
        )
        beat.start()
        try:
            self._busy = True
            if self._stopping.is_set():
                raise StopRequested
            self._process(task)
        except StopRequested:
            self._busy = False
            self._release(task)
            self._stopping.set()
        finally:
            self._busy = False
            beat_stop.set()
            beat.join()
        return True

    def _orphaned(self) -> bool:
        return self.parent_pid is not None and os.getppid() != self.parent_pid

    def _heartbeat(self, task: TaskLease, stop: threading.Event) -> None:
        period_s = self.settings.compare_lease_s / 3
        next_beat = time.monotonic() + period_s
        while not stop.wait(min(PARENT_CHECK_S, period_s)):
            if self._orphaned():  # the server is gone: stop as on SIGTERM (the main thread hands back)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            if time.monotonic() < next_beat:
                continue
            next_beat = time.monotonic() + period_s
            try:
                with self.factory() as session:
                    compare_queue.heartbeat(
                        session, task.id, worker=self.name, lease_s=self.settings.compare_lease_s
                    )
                    session.commit()
            except TaskLeaseLostError:
                if self._ending.is_set():  # a beat that lost to the task's own end (finish reports a loss)
                    log.debug("compare worker %s: task %d ended before its heartbeat", self.name, task.id)
                else:
                    log.warning("compare worker %s: lost the lease of task %d", self.name, task.id)
                return
            except SQLAlchemyError as exc:  # the next beat retries; the lease may expire meanwhile
                log.warning("compare worker %s: heartbeat of task %d failed: %s", self.name, task.id, exc)

    def _stopped_meanwhile(self, exc: Exception) -> None:
        """Raise ``StopRequested`` when a stop came while the task was computed: the signal's
        ``StopRequested`` can surface as another exception (raised inside a C extension's module
        initialisation it becomes ``ImportError: initialization failed``, its cause the stop), which
        says nothing about the task. The task is then handed back, not failed; a real fault of the
        task raises again on the next worker's attempt."""
        if self._stopping.is_set():
            raise StopRequested from exc

    def _release(self, task: TaskLease) -> None:
        self._ending.set()
        try:
            with self.factory() as session:
                compare_queue.release(session, task.id, worker=self.name)
                session.commit()
            log.info("compare worker %s: task %d handed back (stopping)", self.name, task.id)
        except SQLAlchemyError as exc:  # its lease expires and another worker takes it
            log.warning("compare worker %s: handing back task %d failed: %s", self.name, task.id, exc)

    def _process(self, task: TaskLease) -> None:
        if task.kind == "pair":
            self._process_pair(task)
            return
        if task.kind == "workload":
            self._process_workload(task)
            return
        from kernelab.service.judge.stats import compare

        job_id = task.job_id
        with self.factory() as session:
            result = crud.load_result(session=session, job_id=job_id) if job_id is not None else None
        if result is None or job_id is None:  # the job is gone (its task went with it) or has no job
            self._end(task, error="the result's job is gone")
            return
        try:
            comparison = compare(result, job_id=job_id)
        except Exception as exc:  # a bug in the statistics: the same samples would raise again
            self._stopped_meanwhile(exc)
            log.exception("compare worker %s: comparing job %s failed", self.name, job_id)
            self._end(task, error=f"{type(exc).__name__}: {exc}")
            return
        del result
        self._ending.set()
        with self.factory() as session:
            try:
                compare_queue.finish(session, task.id, worker=self.name)
            except TaskLeaseLostError:
                self.lost += 1
                log.warning(
                    "compare worker %s: task %d was taken over; its comparison is dropped", self.name, task.id
                )
                return
            crud.save_comparison(session=session, job_id=job_id, comparison=comparison)
            try:
                with session.begin_nested():
                    history.build_points(session=session, job_id=job_id, settings=self.settings)
            except Exception:  # the comparison still counts; the history page rebuilds points on read
                log.exception(
                    "compare worker %s: judging job %s or building its history failed", self.name, job_id
                )
            session.commit()
        self.done += 1
        log.info("compare worker %s: job %s compared", self.name, job_id,
                 extra={"event": "compare stored", "task_id": task.id, "job_id": job_id})  # fmt: skip

    def _process_pair(self, task: TaskLease) -> None:
        """Job vs job of a ``pair`` task (``kernelab.service.server.job_vs_job``), its answer stored on the
        task by ``finish`` in the transaction that checks the lease. The jobs' first health
        judgements (a write) are stored before, in a short transaction of their own, so no write
        lock is held while the statistics run (SQLite serialises writers)."""
        from kernelab.service.server import job_vs_job, node_health

        assert (
            task.job_id is not None
            and task.pair_job_id is not None
            and task.side in ("baseline", "candidate")
        )
        side: Side = "baseline" if task.side == "baseline" else "candidate"
        with self.factory() as session:
            for job_id in (task.job_id, task.pair_job_id):
                node_health.job_judgement(session=session, job_id=job_id, settings=self.settings)
            session.commit()
        with self.factory() as session:
            try:
                answer = job_vs_job.compare_jobs(
                    session=session, a=task.job_id, b=task.pair_job_id, settings=self.settings, side=side
                )
            except job_vs_job.JobVsJobError as exc:  # a job without a comparison any more: say so
                session.rollback()
                self._end(task, error=exc.message)
                return
            except Exception as exc:  # a bug in the statistics: the same samples would raise again
                self._stopped_meanwhile(exc)
                session.rollback()
                log.exception("compare worker %s: job vs job task %d failed", self.name, task.id)
                self._end(task, error=f"{type(exc).__name__}: {exc}")
                return
            self._ending.set()
            try:
                compare_queue.finish(
                    session, task.id, worker=self.name, output=job_vs_job.stored_output(answer)
                )
            except TaskLeaseLostError:
                self.lost += 1
                log.warning(
                    "compare worker %s: task %d was taken over; its answer is dropped", self.name, task.id
                )
                return
            session.commit()
        self.done += 1
        log.info("compare worker %s: job %s vs job %s compared", self.name, task.pair_job_id, task.job_id,
                 extra={"event": "pair stored", "task_id": task.id})  # fmt: skip

    def _process_workload(self, task: TaskLease) -> None:
        """A workload job's comparison (``workload_stats.compare_workload`` of its nodes' results
        merged by ``workload_store.merge``), stored on the task by ``finish`` with the job's verdict
        summary, in the transaction that checks the lease."""
        from kernelab.service.judge.workload_stats import compare_workload
        from kernelab.service.server import workload_store
        from kernelab.service.server.models import Job

        job_id = task.job_id
        with self.factory() as session:
            results = workload_store.load(session, job_id) if job_id is not None else []
        if not results or job_id is None:
            self._end(task, error="the workload job has no stored result")
            return
        try:
            comparison = compare_workload(workload_store.merge(results)).model_copy(update={"job_id": job_id})
        except Exception as exc:  # a bug in the statistics: the same results would raise again
            self._stopped_meanwhile(exc)
            log.exception("compare worker %s: comparing workload job %s failed", self.name, job_id)
            self._end(task, error=f"{type(exc).__name__}: {exc}")
            return
        self._ending.set()
        with self.factory() as session:
            try:
                compare_queue.finish(
                    session, task.id, worker=self.name, output=comparison.model_dump(mode="json")
                )
            except TaskLeaseLostError:
                self.lost += 1
                log.warning("compare worker %s: task %d was taken over; its comparison is dropped",
                            self.name, task.id)  # fmt: skip
                return
            job = session.get(Job, job_id)
            if job is not None:
                job.summary = dict(comparison.summary)
            session.commit()
        self.done += 1
        log.info("compare worker %s: workload job %s compared", self.name, job_id,
                 extra={"event": "workload stored", "task_id": task.id, "job_id": job_id})  # fmt: skip

    def _end(self, task: TaskLease, *, error: str) -> None:
        self._ending.set()
        with self.factory() as session:
            try:
                compare_queue.fail(session, task.id, worker=self.name, error=error[:2000])
            except TaskLeaseLostError:
                self.lost += 1
                return
            session.commit()
        self.failed += 1


PARENT_CHECK_S = 1.0  # how often a worker started by `kernelab serve` checks that its server still runs
STOP_GRACE_S = 10.0  # SIGTERM -> SIGKILL of a compare worker process that does not exit
RESTART_DELAY_S = 1.0  # a compare worker process that died is started again after this


class WorkerProcesses:
    """``count`` compare worker processes (``python -m kernelab.service.server.compare_worker``) beside
    ``kernelab serve``'s API workers, started again when one dies (a crash or ``kill -9``: its task's
    lease expires and a worker retries it). ``stop()`` sends SIGTERM (each hands its task back
    and exits without finishing it), and SIGKILL after ``STOP_GRACE_S``. The environment is
    inherited: ``KERNELAB_DATABASE_URL`` names the database."""

    def __init__(self, count: int):
        self.count = count
        self.procs: list[subprocess.Popen[bytes]] = []
        self.restarts = 0
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._watch: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"<WorkerProcesses count={self.count} restarts={self.restarts}>"

    def _spawn(self) -> subprocess.Popen[bytes]:
        command = [
            sys.executable,
            "-m",
            "kernelab.service.server.compare_worker",
            "--parent-pid",
            str(os.getpid()),
        ]
        return subprocess.Popen(command)

    def start(self) -> None:
        """Start the processes and the thread that restarts them."""
        with self._lock:
            self.procs = [self._spawn() for _ in range(self.count)]
        self._watch = threading.Thread(target=self._keep, name="compare-workers", daemon=True)
        self._watch.start()

    def _keep(self) -> None:
        while not self._stopping.wait(RESTART_DELAY_S):
            with self._lock:
                for i, proc in enumerate(self.procs):
                    if proc.poll() is not None and not self._stopping.is_set():
                        log.warning("compare worker process %d exited with %s; starting another", proc.pid,
                                    proc.returncode)  # fmt: skip
                        self.procs[i] = self._spawn()
                        self.restarts += 1

    def stop(self) -> None:
        """SIGTERM every process, SIGKILL those still running after ``STOP_GRACE_S``."""
        self._stopping.set()
        if self._watch is not None:
            self._watch.join()
        with self._lock:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.terminate()
            for proc in self.procs:
                try:
                    proc.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def drain(factory: sessionmaker[Session], settings: Settings) -> CompareWorker:
    """Compute every claimable task in this process and return (a worker in burst mode)."""
    worker = CompareWorker(factory, settings)
    worker.run(burst=True)
    return worker


def main(*, burst: bool = False, settings: Settings | None = None, parent_pid: int | None = None) -> None:
    """Run a compare worker on ``settings`` (default: ``Settings()`` from the environment) until
    SIGTERM/SIGINT (or, with ``burst``, until the queue is empty; with ``parent_pid``, until that
    process is gone). Raises
    ``kernelab.service.server.core.db.SchemaNotCurrentError`` when the database is not at head."""
    from kernelab.service.server.core.db import check_at_head, make_engine, make_session_factory
    from kernelab.service.server.observability import configure_logging

    settings = settings or Settings()
    configure_logging(settings.log_format, settings.log_level)
    engine = make_engine(settings.database_url)
    try:
        check_at_head(engine)
        worker = CompareWorker(make_session_factory(engine), settings, parent_pid=parent_pid)
        signal.signal(signal.SIGTERM, worker.on_signal)
        signal.signal(signal.SIGINT, worker.on_signal)
        worker.sweep()
        log.info("compare worker %s started", worker.name)
        worker.run(burst=burst)
        log.info("compare worker stopped: %r", worker)
    finally:
        engine.dispose()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kernelab.service.server.compare_worker")
    parser.add_argument("--burst", action="store_true", help="compute what is queued, then exit")
    parser.add_argument("--parent-pid", type=int, default=None, help="stop when this process is gone")
    args = parser.parse_args()
    main(burst=args.burst, parent_pid=args.parent_pid)
