"""Node drills, against a real ``kernelab serve`` and real ``kernelab runner`` processes on
loopback: faults of the node are never the job's, and no measurement is lost or measured twice.

* the work dir's disk (a real 80 MiB tmpfs) fills while the measuring child runs, and the child is
  killed while the disk is full: the jobs are re-queued with the reason, never failed; the runner
  says it cannot write (``/status``, ``/metrics``) and claims nothing until it can; then every job
  ends with one result;
* a result held in memory (the disk full, the server away) survives a SIGTERM: written to the
  ``--spool-fallback`` spool, or to stderr as the last resort, and posted once after the restart;
* a result measured while the server was away, its lease run out meanwhile, is posted before the
  runner claims again: the job is measured once.

``-s`` shows each drill's tally (jobs, lost, measured twice), the figures of
``docs/results/2026-12-04-fault-drills.md``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from drills import LEASE_S, TOKEN, counts, spec, wait_for
from node_drills import Filler, RunnerCli, small_disk

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, free_port
from kernelab.runners.worker import RESULT_MARK

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
STARTED, KEPT = "starting worker", "measured; result kept in"  # the daemon's log lines
MEASURING = "kernelab.runners.measure cells"  # the measuring child's command line


def _attempts(admin: KernelabClient, job_id: int) -> list[dict[str, object]]:
    page = admin.call("GET", f"/jobs/{job_id}/attempts", lambda r: r.json(), idempotent=True)
    return list(page["data"])


def _tally(drill: str, url: str, job_ids: list[int], measured: int) -> dict[str, int]:
    """Jobs, lost (no result), measured twice (more measurements than jobs, or a second result)."""
    stored = [counts(url, j) for j in job_ids]
    tally = {
        "jobs": len(job_ids),
        "lost": sum(s["results"] == 0 for s in stored),
        "measured_twice": max(0, measured - len(job_ids)) + sum(s["results"] > 1 for s in stored),
        "failed": sum(s["status"] == "failed" for s in stored),
    }
    print(f"\n{drill}: {json.dumps(tally)}")
    return tally


def _server(url: str, tmp_path: Path) -> ServerProcess:
    return ServerProcess(url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "server.log")


def _fault(admin: KernelabClient, runner: RunnerCli, disk: Path, jobs: list[int], kill: bool) -> str:
    """Fill the disk while a job measures (and with ``kill`` SIGKILL its measuring child): the job
    is handed back with the reason, and the runner says it cannot write and claims nothing until
    the disk has room again. The attempt's error."""
    wait_for(lambda: runner.children(MEASURING), 180, "a measuring child")
    [running] = [j for j in jobs if admin.get_job(j).status == "running"]
    before = len(_attempts(admin, running))
    filler = Filler(disk).start()  # the disk fills while the child measures
    try:
        if kill:
            for pid in runner.children(MEASURING):
                os.kill(pid, signal.SIGKILL)
        wait_for(lambda: admin.get_job(running).status == "queued", 120, "the job handed back")
        attempt = _attempts(admin, running)[before - 1]
        assert attempt["outcome"] == "failed", attempt
        assert "the node could not take the job's writes" in str(attempt["error"]), attempt
        status = runner.status()
        assert status is not None and status["can_write"] is False and status["write_problem"], status
        claimed = runner.count(STARTED)
        refused = runner.count("not claiming: work dir")
        wait_for(lambda: runner.count("not claiming: work dir") >= refused + 3, 60, "three refused claims")
        assert runner.count(STARTED) == claimed  # nothing claimed while the disk is full
        assert not any(admin.get_job(j).status == "running" for j in jobs)
        faults = runner.status()["node_faults"]  # type: ignore[index]
        metrics = runner.metrics()
        assert 'kernelab_runner_can_write{runner="full-disk"} 0.0' in metrics, metrics
        line = f'kernelab_runner_jobs_total{{outcome="node_fault",runner="full-disk"}} {float(faults)}'
        assert line in metrics, metrics
        assert runner.status()["state"] == "not-claiming"  # type: ignore[index]
    finally:
        filler.stop()  # room again: the runner claims once it can write
    return str(attempt["error"])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_disk_that_fills_while_measuring_fails_no_job(migrated_url: str, tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 80) as disk, _server(migrated_url, tmp_path) as server:
        admin = KernelabClient(server.url, TOKEN)
        runner = RunnerCli(server.url, "full-disk", disk / "work", tmp_path / "runner.log").start()
        try:
            jobs = [admin.submit(spec(budget_ms=4000)).id for _ in range(3)]
            errors = [_fault(admin, runner, disk, jobs, kill=kill) for kill in (False, True)]
            wait_for(lambda: all(admin.get_job(j).status in ("succeeded", "failed") for j in jobs), 300,
                     "every job to end")  # fmt: skip
            status = runner.status()
            assert status is not None and status["can_write"] is True and status["node_faults"] == 2, status
        finally:
            code = runner.stop()
        finals = [admin.get_job(j) for j in jobs]
        admin.close()
    assert code == 0, runner.text()[-3000:]
    assert [j.status for j in finals] == ["succeeded"] * 3, [(j.id, j.status, j.error) for j in finals]
    assert "No space left on device" in errors[0], errors  # the child's ENOSPC, named
    assert "killed" in errors[1] or "status" in errors[1], errors  # the child killed while the disk is full
    tally = _tally("disk fills while measuring", migrated_url, jobs, runner.count(KEPT))
    assert tally == {"jobs": 3, "lost": 0, "measured_twice": 0, "failed": 0}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("fallback", [True, False], ids=["spool-fallback", "stderr"])
def test_shutdown_keeps_a_result_held_in_memory(migrated_url: str, tmp_path: Path, fallback: bool) -> None:
    """The disk full and the server away, so the result is in memory only; then SIGTERM. The
    jobs run without the namespace (``--job-isolation none``): the measuring child's temporary
    files are then on another disk (``/tmp``) and only the worker's result file and the spool are on
    the full one, which is how a result comes to be held in memory."""
    fallback_dir = tmp_path / "fallback"
    extra = ("--job-isolation", "none", "--grace-s", "4") + (
        ("--spool-fallback", str(fallback_dir)) if fallback else ()
    )
    server = _server(migrated_url, tmp_path)
    with small_disk(tmp_path / "disk", 80) as disk, server:
        admin = KernelabClient(server.url, TOKEN, retries=1, backoff_s=0.05)
        work = disk / "work"
        runner = RunnerCli(server.url, "keeper", work, tmp_path / "runner.log", lease_s=120, extra=extra)
        runner.start()
        filler: Filler | None = None
        try:
            job = admin.submit(spec(budget_ms=4000)).id
            wait_for(lambda: runner.children(MEASURING), 180, "the measuring child")
            filler = Filler(disk).start()
            server.stop()
            wait_for(lambda: runner.count("result kept in memory") == 1, 120, "the result held in memory")
        finally:
            code = runner.stop()  # SIGTERM, the result in memory only
            if filler is not None:
                filler.stop()
        text = runner.text()
        assert "shutdown waits: 1 measured result(s) are held in memory only" in text, text[-3000:]
        if fallback:
            assert code == 0, text[-3000:]
            kept = sorted((fallback_dir / "keeper").glob("*.json"))
            assert len(kept) == 1 and f"written to {kept[0]} at shutdown" in text
            assert json.loads(kept[0].read_text())["job_id"] == job
        else:  # what the operator does with the line, as the log says
            assert code == 1 and "could be written only to stderr" in text, text[-3000:]
            [line] = [ln for ln in text.splitlines() if ln.startswith(RESULT_MARK)]
            (work / "spool" / "keeper" / f"{job}-saved.json").write_text(line[len(RESULT_MARK) :])
        server.start()  # same database and port; the runner starts again and posts it first
        again = RunnerCli(server.url, "keeper", work, tmp_path / "runner.log", lease_s=120, extra=extra)
        again.start()
        try:
            wait_for(lambda: admin.get_job(job).status == "succeeded", 180, "the kept result posted")
        finally:
            assert again.stop() == 0
        admin.close()
    assert runner.count(STARTED) == 1  # measured once, by the first daemon
    tally = _tally(f"shutdown with a result in memory ({'spool fallback' if fallback else 'stderr'})",
                   migrated_url, [job], runner.count(STARTED))  # fmt: skip
    assert tally == {"jobs": 1, "lost": 0, "measured_twice": 0, "failed": 0}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_result_measured_during_an_outage_is_posted_before_the_next_claim(
    migrated_url: str, tmp_path: Path
) -> None:
    """Four outages: the server stops while the runner measures, the result is spooled, the lease
    runs out, the server starts again at a moment of the runner's retries. A runner that claimed
    before it flushed got the re-queued job back and measured it again."""
    server = _server(migrated_url, tmp_path)
    server.start()
    jobs: list[int] = []
    runner = RunnerCli(server.url, "outage", tmp_path / "work", tmp_path / "runner.log", lease_s=LEASE_S)
    try:
        admin = KernelabClient(server.url, TOKEN)
        runner.start()
        for i in range(4):
            jobs.append(admin.submit(spec(budget_ms=3000)).id)
            wait_for(lambda: runner.children(MEASURING), 180, "the measuring child")
            kept = runner.count(KEPT)
            server.stop()
            wait_for(lambda k=kept: runner.count(KEPT) > k, 120, "the result spooled")
            time.sleep(LEASE_S + 1.0 + 0.7 * i)  # the lease runs out; the restart lands anywhere in a retry
            server.start()
            wait_for(lambda j=jobs[-1]: admin.get_job(j).status == "succeeded", 120, f"job {jobs[-1]}")
        attempts = [[a["outcome"] for a in _attempts(admin, j)] for j in jobs]
        admin.close()
    finally:
        code = runner.stop()
        server.stop()
    assert code == 0, runner.text()[-3000:]
    assert attempts == [["succeeded"]] * 4, attempts  # a late result, taken: no second attempt
    assert runner.count(STARTED) == 4, runner.text()[-3000:]
    tally = _tally("result measured during an outage", migrated_url, jobs, runner.count(STARTED))
    assert tally == {"jobs": 4, "lost": 0, "measured_twice": 0, "failed": 0}
