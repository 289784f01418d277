"""Helpers of the fleet drills (``test_fault_drills_fleet.py``, ``test_fault_drills_kill*.py``):
runner daemons as child processes, their logs and spools, and the ``kill -9`` drill itself, which
runs on SQLite and on PostgreSQL from two modules (``--dist loadfile`` can then hand the two, minutes
each on a 2-core machine, to different processes when the schedule allows)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from drills import LEASE_S, TOKEN, counts, events, spec, wait_for

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, free_port


def _runner(url: str, name: str, work_dir: Path, log: Path, *, lease_s: float) -> subprocess.Popen[bytes]:
    """``kernelab runner`` as a child process of its own session (``killpg`` reaches its worker)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kernelab.runners.cli", "runner", "--server", url, "--name", name,
             "--lease-s", str(lease_s), "--poll-s", "1", "--work-dir", str(work_dir)],
            env={**os.environ, "KERNELAB_TOKEN": TOKEN}, stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip


def _stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM a daemon and wait; its exit status."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _leftovers(work_dir: Path) -> tuple[list[Path], list[Path]]:
    """Pending and rejected result files of every runner spool under ``work_dir``."""
    spools = work_dir / "spool"
    return sorted(spools.glob("*/*.json")), sorted(spools.glob("*/rejected/*.json"))


STARTED, KEPT = "starting worker", "measured; result kept in"  # the daemon's log lines
SERVING = ": serving http"


def _count(log: Path, text: str) -> int:
    return log.read_text(errors="replace").count(text) if log.exists() else 0


def _grew(log: Path, text: str, before: int, proc: subprocess.Popen[bytes]) -> bool:
    """``text`` logged more than ``before`` times, or ``proc`` ended (the caller checks which)."""
    return _count(log, text) > before or proc.poll() is not None


def _db(url: str) -> str:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


def _statuses(log: Path) -> list[int]:
    return [int(e["status"]) for e in events(log) if e.get("event") == "request"]


def kill_drill(migrated_url: str, tmp_path: Path) -> None:
    """``kill -9`` of runner daemons 20 times at random moments of their jobs (measuring, spooling,
    posting, the next job), then one survivor: every job ends with exactly one result, nothing is
    left in any spool, no daemon exits by itself. The server logs JSON (the caller sets
    ``KERNELAB_LOG_FORMAT=json``)."""
    kills = 20
    rng = random.Random(20261201)
    attempts = {"KERNELAB_MAX_ATTEMPTS": "50"}  # the kills must not use up a job's attempts
    server = ServerProcess(
        migrated_url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "server.log", env=attempts
    )
    work_dir, log = tmp_path / "victim", tmp_path / "victim.log"
    with server:
        admin = KernelabClient(server.url, TOKEN)  # polls: retried like a runner would
        jobs = [admin.submit(spec(1500)) for _ in range(12)]
        exited_early = 0
        phases = {"measuring": 0, "after its result was kept": 0}
        for i in range(kills):  # one daemon (same name, work dir and spool each time), killed at random
            if all(admin.get_job(j.id).status in ("succeeded", "failed") for j in jobs):
                jobs.append(admin.submit(spec(1500)))  # never a kill with nothing left to claim
            workers = _count(log, STARTED)
            victim = _runner(server.url, "victim", work_dir, log, lease_s=LEASE_S)
            try:
                # a daemon start and a claim; on a loaded 2-core machine (a full suite) over 120 s was seen
                wait_for(lambda v=victim, n=workers: _grew(log, STARTED, n, v), 300, "the victim's claim")
            except AssertionError:  # a failed drill leaves no daemon behind
                os.killpg(victim.pid, signal.SIGKILL)
                victim.wait()
                raise
            kept = _count(log, KEPT)
            if i % 4 == 3:  # right after its result was spooled: while (or before) it is posted
                wait_for(lambda v=victim, n=kept: _grew(log, KEPT, n, v), 120, "the victim's result")
            else:
                time.sleep(rng.uniform(0.0, 8.0))  # into its job: measuring, spooling, posting, the next one
            exited_early += victim.poll() is not None
            os.killpg(victim.pid, signal.SIGKILL)  # daemon and worker, no goodbye
            victim.wait()
            after = _count(log, KEPT) > kept
            phases["after its result was kept" if after else "measuring"] += 1
        serving = _count(log, SERVING)
        survivor = _runner(server.url, "victim", work_dir, log, lease_s=LEASE_S)
        try:  # it serves (the victims' jobs may all be done: it is stopped right after otherwise)
            wait_for(lambda: _grew(log, SERVING, serving, survivor), 120, "the survivor to serve")
            wait_for(lambda: all(admin.get_job(j.id).status in ("succeeded", "failed") for j in jobs), 300,
                     "every job to finish")  # fmt: skip
            survivor_alive = survivor.poll() is None
        finally:
            code = _stop(survivor)
        finals = [admin.get_job(j.id) for j in jobs]
        admin.close()
    stored = [counts(migrated_url, j.id) for j in jobs]
    pending, rejected = _leftovers(work_dir)
    text = log.read_text(errors="replace")
    spooled, reposted = text.count(KEPT), text.count("result stored as")
    expired = sum(a[1] == "expired" for c in stored for a in c["attempts"])
    print(
        f"\nTALLY kill -9 ({_db(migrated_url)}): {kills} kills (after a claim; the job then: {phases}), "
        f"{expired} leases expired, "
        f"{spooled} results spooled, {reposted} posts acknowledged; jobs {[j.status for j in finals]}; "
        f"results per job {[c['results'] for c in stored]}; pending {len(pending)}, rejected "
        f"{len(rejected)}; daemons that exited by themselves: {exited_early + (not survivor_alive)}"
    )
    assert exited_early == 0 and survivor_alive and code == 0
    assert [j.status for j in finals] == ["succeeded"] * len(jobs)
    assert [c["results"] for c in stored] == [1] * len(jobs)  # 0 lost, 0 duplicates
    assert all(c["samples"] > 0 for c in stored)
    assert pending == [] and rejected == []
