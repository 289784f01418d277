"""Fixtures of the server tests: every DB test runs on a temp SQLite file and on a fresh
PostgreSQL database of its own (created per test on the server of KERNELAB_TEST_PG_URL and
dropped after), so no state is shared between tests."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from kernelab.service.app import create_app
from kernelab.service.auth import Scope, create_token
from kernelab.service.core.config import Settings
from kernelab.service.core.db import upgrade

with warnings.catch_warnings():
    # starlette asks for the `httpx2` fork; the plain httpx it falls back to works the same.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

PG_URL = os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
ADMIN_TOKEN = "test-admin-token-0123456789abcdef0123456789"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database, dropped after the test."""
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"kl_test_{uuid.uuid4().hex[:16]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        if os.environ.get("CI"):  # .ci/run starts PostgreSQL: there, unreachable is a failure
            pytest.fail(f"PostgreSQL at {PG_URL} is not reachable: {exc.orig}")
        pytest.skip(f"PostgreSQL at {PG_URL} is not reachable: {exc.orig}")
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database: a temp SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'data' / 'kernelab.db'}"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def migrated_url(db_url: str) -> str:
    """``db_url`` upgraded to the migrations' head."""
    upgrade(db_url)
    return db_url


@pytest.fixture
def settings(migrated_url: str) -> Settings:
    return Settings(database_url=migrated_url, admin_token=ADMIN_TOKEN, claim_poll_s=0.02, claim_wait_max_s=5)


@dataclass
class Api:
    """A TestClient on a real app and database, with helpers to make tokens and runners."""

    client: TestClient

    @property
    def factory(self):  # type: ignore[no-untyped-def]
        return self.client.app.state.session_factory  # type: ignore[attr-defined]

    def token(self, *scopes: Scope) -> dict[str, str]:
        """Authorization header of a new token with ``scopes``."""
        with self.factory.begin() as session:
            return {"Authorization": f"Bearer {create_token(session, 'test', scopes)}"}

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def runner(self, name: str = "node-a", device_type: str = "cpu") -> dict[str, str]:
        """Register a runner through the API; its Authorization header. Its node's hostname is
        ``name``, so its token reports for that node only (``factories.job_result``'s default
        hostname is ``node-a``)."""
        node = {"hostname": name, "device_type": device_type}
        body = {"name": name, "node": node}
        r = self.client.post("/api/v1/runners/register", json=body, headers=self.admin)
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}

    def post_result(self, job_id: int, result, headers: dict[str, str], *, compare: bool = True):  # type: ignore[no-untyped-def]
        """POST a ``JobResult`` as its JSON (datetimes as ISO 8601, as a runner sends it); then,
        with ``compare``, compute the queued comparison as a compare worker does (``compare()``)."""
        r = self.client.post(
            f"/api/v1/jobs/{job_id}/results",
            content=result.model_dump_json(),
            headers={**headers, "content-type": "application/json"},
        )
        if compare and r.status_code in (200, 201):
            self.compare()
        return r

    def compare(self):  # type: ignore[no-untyped-def]
        """Run a compare worker in burst mode in this process (``compare_worker.drain``): every
        queued comparison is computed and stored; returns the worker."""
        from kernelab.service.compare_worker import drain

        return drain(self.factory, self.client.app.state.settings)  # type: ignore[attr-defined]

    def submit(self, spec: dict | None = None) -> int:
        from factories import spec_dict

        r = self.client.post("/api/v1/jobs", json=spec or spec_dict(), headers=self.admin)
        assert r.status_code == 201, r.text
        return r.json()["id"]


@pytest.fixture
def client_class() -> type[TestClient]:
    """Starlette's ``TestClient`` (imported once here, with its deprecation notice silenced)."""
    return TestClient


@pytest.fixture
def admin_token() -> str:
    """The bootstrap admin token of ``settings``."""
    return ADMIN_TOKEN


@pytest.fixture
def api(settings: Settings) -> Iterator[Api]:
    with TestClient(create_app(settings)) as client:
        yield Api(client)
