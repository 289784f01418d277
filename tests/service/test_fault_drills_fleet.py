"""Fault drills of a fleet, against real server processes (``kernelab serve``), real runner
daemons (``kernelab runner`` subprocesses) and real databases on loopback:

* slow readers of ``/jobs/{id}/samples`` (15 on SQLite, 32 on PostgreSQL: read 1 KiB, then
  stall) while a runner claims and posts and others read: everything else answers at once, and a
  token's downloads beyond ``KERNELAB_DOWNLOADS_PER_CLIENT`` get 429;
* clock skew between two app hosts on one PostgreSQL (one of them 300 s ahead, through
  libfaketime): the skewed host takes no live lease and extends leases by the database's clock;
* PostgreSQL (a cluster of the drill's own) stopped for 20 s while two daemons measure behind
  ``kernelab serve --workers 2``: 503s, no 500, no daemon exits, every result stored once;
* ``kill -9`` of runner daemons 20 times at random moments of their jobs (measuring, spooling,
  posting, the next job): every job ends with exactly one result, nothing is left in any spool
  (``test_fault_drills_kill.py`` on SQLite, ``test_fault_drills_kill_pg.py`` on PostgreSQL;
  the helpers the drills share are ``fleet_drills.py``).

Each drill prints its tally (``-s`` shows it); ``docs/results/2026-12-01-fault-drills.md`` records them.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from drills import TOKEN, counts, spec, wait_for
from factories import big_result, job_result, spec_dict
from fleet_drills import _db, _leftovers, _runner, _statuses, _stop

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, free_port
from kernelab.service.contract.schemas import NodeInfo
from kernelab.service.server.core.db import upgrade

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

FAKETIME_LIB = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")


# ------------------------------------------------------------------------------------------------
# slow readers


def _stalled_download(port: int, path: str, token: str) -> socket.socket:
    """A download that reads the answer's first KiB and then nothing: a small receive buffer and
    no more ``recv``, so the server's sends block once the socket buffers are full."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    head = b""
    while len(head) < 1024:
        chunk = sock.recv(1024)
        assert chunk, "the server closed the download"
        head += chunk
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock


def test_slow_readers_of_samples_leave_every_other_request_served(
    migrated_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    readers = 15 if migrated_url.startswith("sqlite") else 32
    monkeypatch.setenv("KERNELAB_LOG_FORMAT", "json")
    port = free_port()
    opened: list[socket.socket] = []
    with ServerProcess(
        migrated_url, port=port, admin_token=TOKEN, log_path=tmp_path / "server.log"
    ) as server:
        admin = KernelabClient(server.url, TOKEN, retries=0, timeout_s=60)
        big = admin.submit(spec(100, cells=100))
        runner = admin.with_token(
            admin.register("reader-node", NodeInfo(hostname="reader-node", device_type="cpu")).token
        )
        claim = runner.claim(wait_s=0, lease_s=600)
        assert claim is not None and claim.job_id == big.id
        # 100 cells of 1,000 samples: ~20 MB of JSON, far more than the socket buffers hold.
        runner.post_result(
            big.id, big_result(big.id, claim.spec, "reader-node", cells=100, samples_per_cell=1000)
        )
        path = f"/api/v1/jobs/{big.id}/samples"
        try:
            t0 = time.monotonic()
            for i in range(readers):  # one token each: the per-client limit is not what protects here
                opened.append(
                    _stalled_download(port, path, admin.create_token(f"reader-{i}", ["read"])["token"])
                )
            stalled_s = time.monotonic() - t0
            other = admin.submit(spec_dict())  # meanwhile the rest of the API works as usual
            with httpx.Client(
                base_url=server.url, timeout=25, headers={"Authorization": f"Bearer {TOKEN}"}
            ) as c:
                answers = [c.get("/api/v1/jobs").status_code, c.get(f"/api/v1/jobs/{other.id}").status_code,
                           c.get("/readyz").status_code, c.get("/metrics").status_code,
                           c.get(f"/api/v1/jobs/{big.id}/attempts").status_code]  # fmt: skip
            assert answers == [200] * 5
            claimed = runner.claim(wait_s=0, lease_s=600)
            assert claimed is not None and claimed.job_id == other.id
            result = job_result(other.id, key="while-readers-stall", hostname="reader-node")  # its node
            accepted = runner.post_result(other.id, result)
            assert not accepted.duplicate and admin.get_job(other.id).status == "succeeded"

            one = admin.create_token("greedy", ["read"])["token"]
            greedy = [_stalled_download(port, path, one) for _ in range(4)]  # KERNELAB_DOWNLOADS_PER_CLIENT
            opened += greedy
            refused = httpx.get(f"{server.url}{path}", headers={"Authorization": f"Bearer {one}"}, timeout=10)
            assert refused.status_code == 429 and refused.headers["retry-after"] == "5", refused.text
            for sock in greedy:
                sock.close()
            time.sleep(1.0)  # the server notices the closed downloads and gives their slots back
            again = httpx.get(
                f"{server.url}{path}?limit=10", headers={"Authorization": f"Bearer {one}"}, timeout=30
            )
            assert again.status_code == 200 and len(again.json()) == 10
        finally:
            for sock in opened:
                sock.close()
        admin.close()
        runner.close()
    statuses = _statuses(server.log_path)
    assert 500 not in statuses
    print(f"\nTALLY slow readers ({_db(migrated_url)}): {readers} stalled downloads opened in "
          f"{stalled_s:.1f} s; other requests {answers}; runner result accepted; 429 for a 5th download "
          f"of one token; 500s: {statuses.count(500)}")  # fmt: skip


# ------------------------------------------------------------------------------------------------
# clock skew


@pytest.mark.postgres
@pytest.mark.skipif(not FAKETIME_LIB.exists(), reason="libfaketime is not installed (apt: faketime)")
def test_an_app_host_with_a_clock_300_s_ahead_takes_no_live_lease(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upgrade(pg_url)
    skew = {"LD_PRELOAD": str(FAKETIME_LIB), "FAKETIME": "+300s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    right = ServerProcess(pg_url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "right.log")
    ahead = ServerProcess(
        pg_url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "ahead.log", env=skew
    )
    with right, ahead:
        probe = httpx.get(f"{ahead.url}/healthz")
        skew_s = _date_s(probe.headers["date"]) - time.time()  # uvicorn's Date header: the host's clock
        assert skew_s > 250, f"the skewed host's clock is not ahead (Date: {probe.headers['date']})"
        admin_right = KernelabClient(right.url, TOKEN)
        admin_ahead = KernelabClient(ahead.url, TOKEN)
        job = admin_right.submit(spec_dict())
        first = admin_right.with_token(
            admin_right.register("node-1", NodeInfo(hostname="node-1", device_type="cpu")).token
        )
        second = admin_ahead.with_token(
            admin_ahead.register("node-2", NodeInfo(hostname="node-2", device_type="cpu")).token
        )
        claim = first.claim(wait_s=0, lease_s=60)
        assert claim is not None and claim.job_id == job.id
        stolen = second.claim(wait_s=0, lease_s=60)  # through the host 300 s ahead
        assert stolen is None, f"the skewed host handed out a live lease: {stolen}"
        # node-1's heartbeat and result through the skewed host: the lease runs by the database's clock
        on_ahead = KernelabClient(ahead.url, first.token)
        lease = on_ahead.call("POST", f"/runners/jobs/{job.id}/heartbeat", lambda r: r.json(),
                              json={"lease_s": 60}, idempotent=True)  # fmt: skip
        ends_in_s = _iso_s(lease["lease_expires_at"]) - time.time()
        assert 50 < ends_in_s < 70, ends_in_s
        result = job_result(job.id, key="skew-result-1", hostname="node-1")
        assert not on_ahead.post_result(job.id, result).duplicate
        assert counts(pg_url, job.id)["attempts"] == [(1, "succeeded")]
        for client in (admin_right, admin_ahead, first, second, on_ahead):
            client.close()
    print(
        f"\nTALLY clock skew: host ahead by {skew_s:.0f} s; live leases taken by it: 0; its lease "
        f"extension ends {ends_in_s:.0f} s from now (asked 60 s); attempts {[(1, 'succeeded')]}"
    )


def _date_s(http_date: str) -> float:
    from email.utils import parsedate_to_datetime

    return parsedate_to_datetime(http_date).timestamp()


def _iso_s(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


# ------------------------------------------------------------------------------------------------
# PostgreSQL outage


@pytest.fixture
def cluster() -> Iterator[Any]:
    from pg_cluster import PgCluster

    own = PgCluster()
    try:
        own.start()
        yield own
    finally:
        own.close()


@pytest.mark.postgres
def test_postgresql_stopped_20_s_mid_run_loses_nothing_and_no_daemon_exits(
    cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KERNELAB_LOG_FORMAT", "json")
    url = cluster.create_database("kernelab")
    server = ServerProcess(
        url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "server.log", workers=2
    )
    daemons: list[subprocess.Popen[bytes]] = []
    with server:
        admin = KernelabClient(server.url, TOKEN)  # polls: retried like a runner would
        jobs = [admin.submit(spec(4000, cells=2)) for _ in range(4)]
        for name in ("pg-1", "pg-2"):
            daemons.append(_runner(server.url, name, tmp_path / name, tmp_path / f"{name}.log", lease_s=60))
        try:
            wait_for(
                lambda: sum(admin.get_job(j.id).status == "running" for j in jobs) == 2, 90, "two claims"
            )
            time.sleep(2.0)  # both workers are measuring
            cluster.stop()
            down_at = time.monotonic()
            time.sleep(20.0)
            alive_during = [d.poll() is None for d in daemons]
            cluster.start()
            outage_s = time.monotonic() - down_at
            wait_for(lambda: all(admin.get_job(j.id).status in ("succeeded", "failed") for j in jobs), 240,
                     "every job to finish")  # fmt: skip
            alive_after = [d.poll() is None for d in daemons]
        finally:
            codes = [_stop(d) for d in daemons]
        finals = [admin.get_job(j.id) for j in jobs]
        admin.close()
    stored = [counts(url, j.id) for j in jobs]
    statuses = _statuses(server.log_path)
    pending = [p for name in ("pg-1", "pg-2") for p in _leftovers(tmp_path / name)[0]]
    rejected = [p for name in ("pg-1", "pg-2") for p in _leftovers(tmp_path / name)[1]]
    print(
        f"\nTALLY PostgreSQL outage: {outage_s:.1f} s down; jobs {[j.status for j in finals]}; results "
        f"per job {[c['results'] for c in stored]}; answers 503: {statuses.count(503)}, 500: "
        f"{statuses.count(500)}; daemons alive during/after {alive_during}/{alive_after}, exit "
        f"codes on SIGTERM {codes}; spool pending {len(pending)}, rejected {len(rejected)}"
    )
    assert alive_during == [True, True] and alive_after == [True, True] and codes == [0, 0]
    assert [j.status for j in finals] == ["succeeded"] * 4
    assert [c["results"] for c in stored] == [1] * 4 and all(c["samples"] > 0 for c in stored)
    assert pending == [] and rejected == []
    assert 500 not in statuses and 503 in statuses
