"""Comparisons off the request path: the ingest queues a ``compare`` task in its transaction, a
compare worker (``kernelab.service.server.compare_worker``) computes and stores it, readers only read.

On a real SQLite file and a real PostgreSQL database; the worker as a real process where it is
killed or stopped (``kill -9``, ``kernelab serve``'s SIGTERM). Waiting is on the protocol (the task's
row, the job's ``comparison_status``), never on a duration."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from factories import big_result, job_result, spec_dict
from sqlalchemy import null, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from kernelab.runners.local import ServerProcess, free_port
from kernelab.service.contract.schemas import JobSpec, NodeInfo
from kernelab.service.judge import stats
from kernelab.service.server import compare_queue, crud, models, queue
from kernelab.service.server.compare_worker import CompareWorker, drain
from kernelab.service.server.core.config import Settings
from kernelab.service.server.core.db import make_engine, make_session_factory, upgrade

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # compare-worker and server processes
T = TypeVar("T")
BIG_CELLS = 400  # x 300 rounds x 1 sample per side: seconds of CPU in stats.compare
POLL_S = 0.05  # how often a test re-reads the state it waits for
DEADLINE_S = 300.0  # a wait that outlasts this fails the test


def _until(read: Callable[[], T], done: Callable[[T], bool], what: str) -> T:
    """Re-read ``read()`` until ``done`` holds (state, not time, is what the test waits for)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        value = read()
        if done(value):
            return value
        assert time.monotonic() < deadline, f"still waiting for {what}: {value}"
        time.sleep(POLL_S)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``stats.compare`` wrapped: each call in this process appends to the returned list."""
    calls: list[int] = []
    real = stats.compare

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(stats, "compare", wrapper)
    return calls


def _task(factory: sessionmaker[Session], job_id: int) -> models.CompareTask | None:
    with factory() as session:
        task = session.scalar(select(models.CompareTask).where(models.CompareTask.job_id == job_id))
        if task is not None:
            session.expunge(task)
        return task


def _post(api, spec: dict[str, Any] | None = None, *, key: str = "result-key-0001") -> int:  # type: ignore[no-untyped-def]
    job_id = api.submit(spec)
    runner = api.runner()
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    r = api.post_result(job_id, job_result(job_id, key=key, spec=spec), runner, compare=False)
    assert r.status_code == 201, r.text
    return job_id


def test_ingest_queues_the_comparison_and_readers_say_comparing(api, counted) -> None:  # type: ignore[no-untyped-def]
    """The ingest stores the samples and a queued task in one commit; every reader (REST job,
    comparison, Markdown, job page) answers "comparing", never a 500, and no request computes.
    A compare worker then stores it and every reader shows it."""
    job_id = _post(api)
    task = _task(api.factory, job_id)
    assert task is not None and (task.status, task.attempts, task.kind) == ("queued", 0, "compare")
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert (job["status"], job["comparison_status"]) == ("succeeded", "comparing")
    listed = api.client.get("/api/v1/jobs", headers=api.admin).json()["data"]
    assert [j["comparison_status"] for j in listed] == ["comparing"]
    for path in (f"/api/v1/jobs/{job_id}/comparison", f"/api/v1/jobs/{job_id}/report.md"):
        r = api.client.get(path, headers=api.admin)
        assert r.status_code == 409 and "comparing" in r.json()["detail"], r.text
        assert int(r.headers["Retry-After"]) >= 1
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin)
    assert page.status_code == 200 and "comparing…" in page.text
    history = api.client.get("/api/v1/history", params={"benchmark": "softmax"}, headers=api.admin)
    assert history.status_code == 200 and history.json()["series"] == []
    assert counted == []  # no request computed a comparison

    worker = api.compare()
    assert (worker.done, worker.failed, counted) == (1, 0, [1])
    task = _task(api.factory, job_id)
    assert task is not None and (task.status, task.attempts, task.worker) == ("done", 1, None)
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert job["comparison_status"] == "ready" and job["summary"] == {"faster": 2}
    r = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin)
    assert r.status_code == 200 and len(r.json()["cells"]) == 2
    assert api.client.get(f"/api/v1/jobs/{job_id}/report.md", headers=api.admin).status_code == 200
    assert 'id="comparison-table"' in api.client.get(f"/jobs/{job_id}", headers=api.admin).text
    history = api.client.get("/api/v1/history", params={"benchmark": "softmax"}, headers=api.admin).json()
    assert history["results"] == 1 and history["series"]  # the worker built the points
    assert counted == [1]


def test_a_comparison_that_raises_reads_failed(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``stats.compare`` raising is a failed task with its error: readers say so (409, the job's
    ``comparison_error``), the raw samples stay stored."""
    job_id = _post(api)

    def broken(*_: Any, **__: Any) -> Any:
        raise ValueError("statistics broke")

    monkeypatch.setattr(stats, "compare", broken)
    assert api.compare().failed == 1
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert job["comparison_status"] == "failed" and "statistics broke" in job["comparison_error"]
    r = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin)
    assert r.status_code == 409 and "comparison failed" in r.json()["detail"]
    assert "statistics broke" in api.client.get(f"/jobs/{job_id}", headers=api.admin).text
    assert api.client.get(f"/api/v1/jobs/{job_id}/samples", headers=api.admin).status_code == 200


def test_history_of_50_jobs_computes_no_comparison(api, counted) -> None:  # type: ignore[no-untyped-def]
    """A history view over 50 results whose points must be rebuilt (none built yet, half of them
    without a stored comparison) reads stored comparisons only: ``stats.compare`` is called 0
    times; the results still being compared have no points yet."""
    ids = [_post(api, key=f"history-50-{i:03d}") for i in range(50)]
    drain(api.factory, api.client.app.state.settings)
    with api.factory.begin() as session:  # points missing; half the comparisons not stored yet
        session.execute(update(models.Result).values(history_version=None))
        session.execute(
            update(models.Result).where(models.Result.job_id.in_(ids[::2])).values(comparison=null())
        )
        for job_id in ids[::2]:
            result_id = crud.result_id(session=session, job_id=job_id)
            assert result_id is not None
            compare_queue.enqueue(session, result_id=result_id, job_id=job_id, max_attempts=3)
        session.execute(text("DELETE FROM history_points"))
    counted.clear()
    for path in ("/api/v1/history", "/history"):
        r = api.client.get(path, params={"benchmark": "softmax", "limit": 50}, headers=api.admin)
        assert r.status_code == 200, r.text
    assert counted == []
    page = api.client.get("/api/v1/history", params={"benchmark": "softmax"}, headers=api.admin).json()
    shown = {p["job_id"] for s in page["series"] for p in s["points"]}
    assert page["results"] == 50 and shown == set(ids[1::2])


def _stored_big(factory: sessionmaker[Session], cells: int = BIG_CELLS) -> int:
    """A job with a stored result of ``cells`` cells x 300 rounds (through ``crud.store_result``,
    the ingest's own function: the task is queued with it)."""
    spec = JobSpec.model_validate(spec_dict(sweep={"M": [8], "N": [16 + i for i in range(cells)]}))
    with factory.begin() as session:
        runner, _ = crud.register_runner(session=session, name="big-node",
                                         node=NodeInfo(hostname="big-node", device_type="cpu"))  # fmt: skip
        job = queue.submit(session, spec, max_attempts=1)
        assert queue.claim(session, runner_id=runner.id, lease_s=600) is not None
        result = big_result(job.id, spec, "big-node", cells=cells, samples_per_cell=600)
        crud.store_result(session=session, job_id=job.id, result=result, runner_id=runner.id)
        return job.id


@pytest.fixture
def factory(migrated_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(migrated_url)
    try:
        yield make_session_factory(engine)
    finally:
        engine.dispose()


def _worker_env(url: str) -> dict[str, str]:
    return {**os.environ, "KERNELAB_DATABASE_URL": url, "KERNELAB_COMPARE_POLL_S": "0.05"}


def test_a_killed_worker_s_task_is_finished_by_another(migrated_url: str, factory) -> None:  # type: ignore[no-untyped-def]
    """``kill -9`` of a compare worker process mid-task stores nothing; once its lease has run out
    (its end moved into the past in the database) another worker's claim re-queues the task and
    finishes it: attempt 2, the comparison stored."""
    job_id = _stored_big(factory)
    proc = subprocess.Popen([sys.executable, "-m", "kernelab.service.server.compare_worker"],
                            env=_worker_env(migrated_url), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        task = _until(lambda: _task(factory, job_id), lambda t: t is not None and t.status == "running",
                      "the worker to claim the task")  # fmt: skip
    finally:
        proc.kill()
        proc.wait()
    assert task is not None and task.worker is not None and task.worker.endswith(f":{proc.pid}")
    after = _task(factory, job_id)
    assert after is not None and (after.status, after.attempts) == ("running", 1)  # killed mid-task
    with factory.begin() as session:
        assert crud.stored_comparison(session=session, job_id=job_id).status == "comparing"
        session.execute(update(models.CompareTask).where(models.CompareTask.job_id == job_id)
                        .values(lease_expires_at=models.utcnow().replace(year=2000)))  # fmt: skip
    settings = Settings(database_url=migrated_url, compare_poll_s=0.05)
    other = CompareWorker(factory, settings, name="second-worker")
    other.run(burst=True)
    assert (other.done, other.failed) == (1, 0)
    done = _task(factory, job_id)
    assert done is not None and (done.status, done.attempts) == ("done", 2)
    with factory() as session:
        stored = crud.stored_comparison(session=session, job_id=job_id)
        assert stored.status == "ready" and stored.comparison is not None
        assert len(stored.comparison.cells) == BIG_CELLS
        summary = session.scalar(select(models.Job.summary).where(models.Job.id == job_id))
        assert summary == stored.comparison.summary


def test_a_lease_out_of_attempts_fails_the_task(factory) -> None:  # type: ignore[no-untyped-def]
    """An expired lease on the last attempt fails the task with the reason (no endless retries)."""
    job_id = _stored_big(factory, cells=2)
    with factory.begin() as session:
        session.execute(update(models.CompareTask).values(max_attempts=1))
        assert compare_queue.claim(session, worker="w1", lease_s=60) is not None
        session.execute(
            update(models.CompareTask).values(lease_expires_at=models.utcnow().replace(year=2000))
        )
    with factory.begin() as session:
        assert compare_queue.claim(session, worker="w2", lease_s=60) is None
    task = _task(factory, job_id)
    assert task is not None and task.status == "failed" and "expired on attempt 1/1" in (task.error or "")


def test_a_stop_that_surfaces_as_another_error_hands_the_task_back(
    factory, migrated_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """SIGTERM's ``StopRequested`` raised inside a C extension's module initialisation (the first
    ``import scipy.stats`` of a comparison) reaches the worker as ``ImportError: initialization
    failed``: the task is handed back (queued, the attempt not counted), never failed."""
    job_id = _stored_big(factory, cells=2)
    settings = Settings(database_url=migrated_url, compare_poll_s=0.05)
    worker = CompareWorker(factory, settings, name="stopped-worker")

    def interrupted_import(*_: Any, **__: Any) -> Any:
        try:
            worker.on_signal(15, None)  # what SIGTERM runs in the main thread
        except BaseException as stop:
            raise ImportError("initialization failed") from stop
        raise AssertionError("on_signal did not raise while the worker was busy")

    monkeypatch.setattr(stats, "compare", interrupted_import)
    worker.run()
    assert (worker.done, worker.failed) == (0, 0)
    left = _task(factory, job_id)
    assert left is not None and (left.status, left.attempts, left.worker) == ("queued", 0, None)


@pytest.fixture
def server_db(db_url: str) -> str:
    upgrade(db_url)
    return db_url


ADMIN = "compare-admin-token-0123456789abcdef"


def _serve(url: str, tmp_path: Path, name: str) -> ServerProcess:
    return ServerProcess(url, port=free_port(), admin_token=ADMIN, log_path=tmp_path / f"{name}.log",
                         env={"KERNELAB_COMPARE_POLL_S": "0.05"})  # fmt: skip


def test_serve_stays_responsive_and_a_stop_leaves_the_task(server_db: str, tmp_path: Path) -> None:
    """``kernelab serve`` computes comparisons in its compare worker process: while a big one runs,
    the API answers at once that the job is "comparing"; SIGTERM stops the server without waiting
    for the comparison (the task queued again, nothing stored); the next server finishes it."""
    engine = make_engine(server_db)
    factory = make_session_factory(engine)
    headers = {"Authorization": f"Bearer {ADMIN}"}
    try:
        srv = _serve(server_db, tmp_path, "first").start()
        try:
            job_id = _stored_big(factory)
            _until(lambda: _task(factory, job_id), lambda t: t is not None and t.status == "running",
                   "the server's compare worker to claim the task")  # fmt: skip
            with httpx.Client(base_url=srv.url, headers=headers, timeout=30) as client:
                job = client.get(f"/api/v1/jobs/{job_id}")
                assert job.status_code == 200 and job.json()["comparison_status"] == "comparing"
                r = client.get(f"/api/v1/jobs/{job_id}/comparison")
                assert r.status_code == 409 and "comparing" in r.json()["detail"]
                assert "comparing…" in client.get(f"/jobs/{job_id}").text
                assert client.get("/healthz").status_code == 200
            running = _task(factory, job_id)
            assert running is not None and running.status == "running"  # still computing
        finally:
            srv.stop()  # SIGTERM
        left = _task(factory, job_id)
        assert left is not None and (left.status, left.attempts, left.worker) == ("queued", 0, None)
        with factory() as session:
            stored = session.scalar(select(models.Result.comparison).where(models.Result.job_id == job_id))
            assert stored is None
        again = _serve(server_db, tmp_path, "second")
        with again, httpx.Client(base_url=again.url, headers=headers) as c:
            _until(lambda: c.get(f"/api/v1/jobs/{job_id}").json()["comparison_status"],
                   lambda s: s == "ready", "the next server's worker to store the comparison")  # fmt: skip
            r = c.get(f"/api/v1/jobs/{job_id}/comparison")
            assert r.status_code == 200 and len(r.json()["cells"]) == BIG_CELLS
    finally:
        engine.dispose()


def test_cli_report_says_comparing_and_wait_waits_for_it(
    server_db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``kernelab report`` of a job still comparing exits 3 ("comparing…", no verdict yet);
    ``wait_and_show`` (``kernelab submit --wait``) keeps waiting through "comparing" and prints
    the table once a compare worker stored it."""
    from kernelab.runners.cli.output import wait_and_show
    from kernelab.runners.client import KernelabClient

    engine = make_engine(server_db)
    factory = make_session_factory(engine)
    srv = _serve(server_db, tmp_path, "cli")
    srv.env["KERNELAB_COMPARE_WORKERS"] = "0"  # no worker: the comparison waits for this test's
    try:
        with srv:
            job_id = _stored_big(factory, cells=3)
            env = {**os.environ, "KERNELAB_SERVER": srv.url, "KERNELAB_TOKEN": ADMIN}
            report = subprocess.run([sys.executable, "-m", "kernelab.runners.cli", "report", str(job_id)],
                                    env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
            assert report.returncode == 3 and "comparing…" in report.stderr, report.stderr
            with KernelabClient(srv.url, ADMIN) as client:
                job = client.get_job(job_id)
                assert job.comparison_status == "comparing"
                codes: list[int] = []
                log = tmp_path / "runner.log"  # what `kernelab up` relays: the local runner's log
                log.write_text(
                    f"INFO job {job_id}: progress: cell 3/3\nINFO job {job_id}: progress: probes after\n"
                )
                waiter = threading.Thread(
                    target=lambda: codes.append(wait_and_show(client, job, timeout_s=300, progress_log=log))
                )
                waiter.start()
                seen = ""
                while "(comparing…)" not in seen:  # the waiter has read the job as comparing
                    seen += capsys.readouterr().err
                    assert waiter.is_alive(), seen
                    time.sleep(POLL_S)
                # the runner's last lines (written before it posted) come before "succeeded"
                assert seen.index("probes after") < seen.index(f"job {job_id}: succeeded"), seen
                assert drain(factory, Settings(database_url=server_db)).done == 1
                waiter.join(timeout=DEADLINE_S)
                assert codes == [0]
                out = capsys.readouterr().out
                assert "faster" in out or "same" in out or "inconclusive" in out, out
    finally:
        engine.dispose()


def test_a_heartbeat_after_the_task_finished_does_not_warn_of_a_lost_lease(
    factory, migrated_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:  # type: ignore[no-untyped-def]
    """The heartbeat thread may beat just after the task's finish committed (the task is ``done``,
    attempt 1): that is no lost lease, and nothing is logged as one."""
    import logging

    from kernelab.service.server import compare_worker

    job_id = _stored_big(factory, cells=2)
    beaten = threading.Event()
    real_beat, real_process = compare_queue.heartbeat, CompareWorker._process

    def beat(*args: Any, **kwargs: Any) -> Any:
        try:
            return real_beat(*args, **kwargs)
        finally:
            beaten.set()

    def process_then_wait_for_a_beat(self: CompareWorker, task: Any) -> None:
        real_process(self, task)
        beaten.clear()
        assert beaten.wait(60), "no heartbeat after the task ended"

    monkeypatch.setattr(compare_queue, "heartbeat", beat)
    monkeypatch.setattr(CompareWorker, "_process", process_then_wait_for_a_beat)
    settings = Settings(database_url=migrated_url, compare_poll_s=0.05, compare_lease_s=5)
    worker = CompareWorker(factory, settings, name="racing-worker")
    with caplog.at_level(logging.DEBUG, logger="kernelab"):
        assert worker.run_once()
    task = _task(factory, job_id)
    assert task is not None and (task.status, task.attempts) == ("done", 1) and worker.done == 1
    assert compare_worker.log.name.startswith("kernelab.")
    assert not [r for r in caplog.records if "lost the lease" in r.getMessage()]
    assert [r for r in caplog.records if "ended before its heartbeat" in r.getMessage()]


def test_the_worker_process_logs_in_the_project_format(migrated_url: str, factory) -> None:  # type: ignore[no-untyped-def]
    """``python -m kernelab.service.server.compare_worker`` (as ``kernelab serve`` starts it) logs through
    the ``kernelab`` logger's format: time, level, logger name."""
    job_id = _stored_big(factory, cells=2)
    env = {**_worker_env(migrated_url), "KERNELAB_LOG_FORMAT": "text", "KERNELAB_LOG_LEVEL": "INFO"}
    command = [sys.executable, "-m", "kernelab.service.server.compare_worker", "--burst"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO kernelab\.service\.server\.compare_worker: "
    assert re.search(stamp + r"compare worker \S+ started$", done.stderr, flags=re.M), done.stderr
    assert re.search(stamp + rf"compare worker \S+: job {job_id} compared$", done.stderr, flags=re.M), (
        done.stderr
    )
