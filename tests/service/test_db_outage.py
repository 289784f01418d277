"""The database going away under a running app: every endpoint that needs it answers 503 with
``Retry-After`` (never 500), and the same requests succeed once it is back. The database is a
PostgreSQL cluster of the test's own (``pg_cluster.PgCluster``), really stopped and started."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from factories import job_result
from service_api import ADMIN_TOKEN, Api

from kernelab.app import create_app
from kernelab.service.server.api.errors import DB_RETRY_AFTER_S
from kernelab.service.server.core.config import Settings
from kernelab.service.server.core.db import upgrade

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


@pytest.fixture
def cluster() -> Iterator[object]:
    from pg_cluster import PgCluster

    own = PgCluster()
    try:
        own.start()
        yield own
    finally:
        own.close()


def test_database_down_is_503_with_retry_after_and_back_to_normal_after(cluster, client_class) -> None:  # type: ignore[no-untyped-def]
    url = cluster.create_database("kernelab")
    upgrade(url)
    settings = Settings(database_url=url, admin_token=ADMIN_TOKEN, claim_poll_s=0.02, claim_wait_max_s=2)
    with client_class(create_app(settings)) as client:
        api = Api(client)
        job_id = api.submit()
        runner = api.runner()
        assert client.post("/api/v1/runners/claim", json={"lease_s": 600}, headers=runner).status_code == 200
        result = job_result(job_id)
        beat = f"/api/v1/runners/jobs/{job_id}/heartbeat"
        calls = {
            "list jobs": lambda: client.get("/api/v1/jobs", headers=api.admin),
            "read job": lambda: client.get(f"/api/v1/jobs/{job_id}", headers=api.admin),
            "submit": lambda: client.post("/api/v1/jobs", json={}, headers=api.admin),
            "claim": lambda: client.post("/api/v1/runners/claim", json={"wait_s": 1}, headers=runner),
            "heartbeat": lambda: client.post(beat, json={}, headers=runner),
            "result": lambda: api.post_result(job_id, result, runner),
            "samples": lambda: client.get(f"/api/v1/jobs/{job_id}/samples", headers=api.admin),
            "metrics": lambda: client.get("/metrics", headers=api.admin),
            "dashboard": lambda: client.get("/", headers=api.admin),
        }  # fmt: skip
        cluster.stop()
        answers = {name: call() for name, call in calls.items()}
        for name, answer in answers.items():
            assert answer.status_code == 503, (name, answer.status_code, answer.text[:300])
            assert answer.headers["retry-after"] == str(DB_RETRY_AFTER_S), name
            assert "database is unavailable" in answer.json()["detail"], name
        assert client.get("/readyz").status_code == 503
        cluster.start()  # the pool's dead connections are replaced (pre-ping): the same calls work
        assert client.post(beat, json={}, headers=runner).status_code == 200
        assert api.post_result(job_id, result, runner).status_code == 201
        assert client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["status"] == "succeeded"
        assert client.get(f"/api/v1/jobs/{job_id}/samples", headers=api.admin).status_code == 200
