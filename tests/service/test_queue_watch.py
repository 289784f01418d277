"""Long-polling claims wait in one ``QueueWatch`` per server process
(``kernelab.service.server.queue_watch``): the
database sees one queue read per poll period however many runners wait, a new job wakes one
waiter, a job for another device wakes none, and with two ``kernelab serve`` workers on
PostgreSQL every job submitted while runners wait is handed out exactly once."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from factories import spec_dict
from service_api import Fleet
from sqlalchemy import event, select

from kernelab.service.contract.schemas import JobSpec
from kernelab.service.server import queue
from kernelab.service.server.core.db import make_engine, make_session_factory
from kernelab.service.server.models import Job, Runner, utcnow
from kernelab.service.server.queue_watch import QueueWatch

pytestmark = pytest.mark.timeout(120)


def _count_statements(api):  # type: ignore[no-untyped-def]
    """A list that grows by one entry per SQL statement the app's engine runs."""
    seen: list[str] = []
    event.listen(api.client.app.state.engine, "before_cursor_execute",
                 lambda conn, cursor, statement, *rest: seen.append(statement))  # fmt: skip
    return seen


def _claims(api, headers: list[dict[str, str]], wait_s: float) -> list[int]:  # type: ignore[no-untyped-def]
    """Concurrent long polls, one per runner header; the status of each."""
    with ThreadPoolExecutor(len(headers)) as pool:
        answers = pool.map(
            lambda h: api.client.post("/api/v1/runners/claim", json={"wait_s": wait_s}, headers=h), headers
        )
        return [r.status_code for r in answers]


def test_waiting_claims_share_one_queue_read_per_poll(api) -> None:  # type: ignore[no-untyped-def]
    runners = [api.runner(f"idle-{i}") for i in range(12)]
    statements = _count_statements(api)
    assert _claims(api, runners[:1], 0.0) == [204]
    per_claim = len(statements)  # one empty claim: token check, re-queue check, candidate read
    statements.clear()
    wait_s, poll_s = 1.0, api.client.app.state.settings.claim_poll_s
    t0 = time.monotonic()
    assert _claims(api, runners, wait_s) == [204] * len(runners)
    assert time.monotonic() - t0 >= wait_s  # each waited wait_s (load only makes it longer)
    polls = math.ceil(wait_s / poll_s) + 1
    # Each claim's first attempt, plus at most one queue read per poll period. A poll per waiting
    # runner (the old loop) would have been len(runners) * polls claim transactions.
    assert len(statements) <= len(runners) * per_claim + polls, len(statements)
    assert 1 <= api.client.app.state.queue_watch.polls <= polls


def test_a_new_job_wakes_one_waiter(api) -> None:  # type: ignore[no-untyped-def]
    runners = [api.runner(f"w-{i}") for i in range(5)]
    submitted: list[int] = []
    submitter = api.when_claims_wait(len(runners), lambda: submitted.append(api.submit()))
    with ThreadPoolExecutor(len(runners)) as pool:

        def claim(h: dict[str, str]) -> tuple[int, int | None]:
            r = api.client.post("/api/v1/runners/claim", json={"wait_s": 3.0}, headers=h)
            return r.status_code, r.json()["job_id"] if r.status_code == 200 else None

        answers = list(pool.map(claim, runners))
    submitter.join()
    # All five waited when the job came; one was woken and got it (200), the others timed out.
    assert sorted(answers, key=lambda a: a[0]) == [(200, submitted[0])] + [(204, None)] * (len(runners) - 1)


def test_a_job_for_another_device_wakes_no_waiter(api) -> None:  # type: ignore[no-untyped-def]
    cuda_job = api.submit(spec_dict(device="cuda"))
    cpu_runner, gpu_runner = api.runner("cpu-node"), api.runner("gpu-node", device_type="cuda")
    t0 = time.monotonic()
    r = api.client.post("/api/v1/runners/claim", json={"wait_s": 0.5}, headers=cpu_runner)
    assert r.status_code == 204
    assert time.monotonic() - t0 >= 0.5
    with api.factory() as session:
        assert queue.claimable(session, device_type="cpu", limit=10) == 0
        assert queue.claimable(session, device_type="cuda", limit=10) == 1
        assert queue.claimable(session, limit=10) == 1
    r = api.client.post("/api/v1/runners/claim", json={"wait_s": 0.5}, headers=gpu_runner)
    assert r.status_code == 200 and r.json()["job_id"] == cuda_job


def test_claimable_counts_expired_leases_and_stops_at_limit(api) -> None:  # type: ignore[no-untyped-def]
    spec = JobSpec.model_validate(spec_dict())
    with api.factory.begin() as session:
        runner = Runner(name="r")
        session.add(runner)
        session.flush()
        for _ in range(3):
            queue.submit(session, spec, max_attempts=3)
    with api.factory.begin() as session:
        taken = queue.claim(session, runner_id=runner.id, lease_s=60)
        assert taken is not None
    with api.factory() as session:
        assert queue.claimable(session, limit=10) == 2
        assert queue.claimable(session, limit=1) == 1
    with api.factory.begin() as session:  # the lease runs out: claimable again
        session.get(Job, taken.id).lease_expires_at = utcnow() - timedelta(seconds=1)
    with api.factory() as session:
        assert queue.claimable(session, limit=10) == 3
        assert session.scalar(select(Job.status).where(Job.id == taken.id)) == "running"


def test_close_ends_waits_and_the_poll_task(migrated_url: str) -> None:
    """``aclose`` (the runners router's lifespan calls it at shutdown) answers waiting claims at
    once and lets the poll task finish before the engine is disposed."""
    engine = make_engine(migrated_url)

    async def scenario() -> tuple[bool, float, int]:
        watch = QueueWatch(make_session_factory(engine), poll_s=0.05)
        waiting = asyncio.create_task(watch.wait("cpu", timeout_s=30.0))
        await asyncio.sleep(0.2)  # a few empty polls
        t0 = time.monotonic()
        await watch.aclose()
        woken = await waiting
        return woken, time.monotonic() - t0, watch.polls

    try:
        woken, closed_s, polls = asyncio.run(scenario())
    finally:
        engine.dispose()
    assert woken is False and closed_s < 5.0 and polls >= 1


@pytest.mark.postgres
@pytest.mark.slow
def test_two_workers_hand_jobs_submitted_during_long_polls_out_once(pg_fleet: Fleet) -> None:
    url, runners = pg_fleet.url, 6
    with httpx.Client(base_url=url, timeout=30, headers=pg_fleet.admin) as http:
        tokens = [
            http.post("/api/v1/runners/register", json={"name": f"lp-{i}", "node": {
                "hostname": f"lp-{i}", "device_type": "cpu"}}).json()["token"]
            for i in range(runners)
        ]  # fmt: skip

        def long_poll(token: str) -> int | None:
            auth = {"Authorization": f"Bearer {token}"}
            with httpx.Client(base_url=url, timeout=60, headers=auth) as c:
                r = c.post("/api/v1/runners/claim", json={"wait_s": 20, "lease_s": 600})
                assert r.status_code in (200, 204), r.text
                return r.json()["job_id"] if r.status_code == 200 else None

        with ThreadPoolExecutor(runners) as pool:
            waiting = [pool.submit(long_poll, t) for t in tokens]
            # Not a synchronisation: a claim that has not begun waiting yet finds its job at its
            # first attempt instead, and the assertions hold either way; the pause makes the
            # wake-up path (every runner waiting) the usual one.
            time.sleep(1.0)
            submitted = {http.post("/api/v1/jobs", json=spec_dict()).json()["id"] for _ in range(runners)}
            claimed = [f.result() for f in waiting]
    # Every job handed out once, each to a claim that returned 200 before its 20 s wait ended.
    assert sorted(j for j in claimed if j is not None) == sorted(submitted)
    assert Counter(claimed).most_common(1)[0][1] == 1  # no job handed out twice
    assert "Traceback" not in pg_fleet.log_path.read_text()


@pytest.fixture
def slow_poll_api(settings, client_class):  # type: ignore[no-untyped-def]
    """An app whose queue reads come only from notifications within a test: ``claim_poll_s`` 10 s,
    longer than any wait below, so a claim answered with a job was woken by the database."""
    from service_api import Api

    from kernelab.app import create_app

    slow = settings.model_copy(update={"claim_poll_s": 10.0, "claim_wait_max_s": 8.0})
    with client_class(create_app(slow)) as client:
        yield Api(client)


def _claim_when_waiting(api, header: dict[str, str], action) -> tuple[int, float]:  # type: ignore[no-untyped-def]
    """One long poll (wait 8 s); ``action`` runs once it waits. Its status and seconds."""
    worker = api.when_claims_wait(1, action)
    t0 = time.monotonic()
    r = api.client.post("/api/v1/runners/claim", json={"wait_s": 8.0}, headers=header)
    worker.join()
    return r.status_code, time.monotonic() - t0


def test_a_submit_wakes_a_waiting_claim_before_the_next_poll(slow_poll_api) -> None:  # type: ignore[no-untyped-def]
    """Through the app's own process: the SQLite TEMP trigger, or PostgreSQL's NOTIFY."""
    api = slow_poll_api
    runner = api.runner("woken")
    status, waited_s = _claim_when_waiting(api, runner, api.submit)
    watch = api.client.app.state.queue_watch
    assert status == 200 and watch.notified >= 1
    assert waited_s < 8.0  # the wait ended on the job, not on wait_s (the poll is 10 s away)


@pytest.mark.postgres
def test_a_job_queued_by_another_process_wakes_a_waiting_claim(slow_poll_api, migrated_url: str) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL: a job inserted over another connection (another server process, the CLI, SQL)
    wakes the claim through ``NOTIFY kernelab_queue``, also after the LISTEN connection was lost
    and made again."""
    if not migrated_url.startswith("postgresql"):
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; on SQLite one server process is covered")
    api = slow_poll_api
    runner = api.runner("listener")
    engine = make_engine(migrated_url)
    try:
        other = make_session_factory(engine)

        def queue_elsewhere() -> None:
            with other.begin() as session:
                queue.submit(session, JobSpec.model_validate(spec_dict()), max_attempts=1)

        assert _claim_when_waiting(api, runner, queue_elsewhere)[0] == 200
        watch = api.client.app.state.queue_watch
        assert watch.listening
        with other.begin() as session:  # the database drops the LISTEN session (a restart, a failover)
            from sqlalchemy import text

            killed = session.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE query LIKE 'LISTEN kernelab_queue%' AND datname = current_database()"
            )).scalars().all()  # fmt: skip
        assert killed == [True]
        deadline = time.monotonic() + 30
        while not watch.listening and time.monotonic() < deadline:
            time.sleep(0.05)  # reconnects after LISTEN_RETRY_S[0]
        assert watch.listening
        assert _claim_when_waiting(api, runner, queue_elsewhere)[0] == 200
    finally:
        engine.dispose()
