"""Fixtures of the server tests: every DB test runs on a temp SQLite file and on a fresh
PostgreSQL database of its own (created per test on the server of KERNELAB_TEST_PG_URL and
dropped after), so no state is shared between tests, nor between parallel test processes
(pytest-xdist workers: their temp folders and database names are their own)."""

from __future__ import annotations

import os
import sqlite3
import uuid
import warnings
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from pathlib import Path

import httpx
import pytest
from service_api import ADMIN_TOKEN, FLEET_TOKEN, Api, Fleet
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from kernelab.app import create_app
from kernelab.service.server.core.config import Settings
from kernelab.service.server.core.db import upgrade

with warnings.catch_warnings():
    # starlette asks for the `httpx2` fork; the plain httpx it falls back to works the same.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

PG_URL = os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _pg_unreachable(exc: OperationalError) -> None:
    if os.environ.get("CI"):  # .ci/run starts PostgreSQL: there, unreachable is a failure
        pytest.fail(f"PostgreSQL at {PG_URL} is not reachable: {exc.orig}")
    pytest.skip(f"PostgreSQL at {PG_URL} is not reachable: {exc.orig}")


class _PgDatabases:
    """Databases of this test process on the server of ``PG_URL``: made empty or as a copy of a
    template migrated to head once per process (``CREATE DATABASE ... TEMPLATE``: ~0.2 s instead of
    ~0.7 s of Alembic per test), each dropped after its test by a background thread (a drop is
    ~0.5 s of the server's I/O the next test need not wait for). Names carry the xdist worker, so
    parallel workers never touch each other's databases."""

    def __init__(self) -> None:
        self.admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT", poolclass=NullPool)
        self.prefix = f"kl_test_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_"
        self.template: str | None = None
        self.dropper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-drop")
        self.drops: list[Future[None]] = []

    def url(self, name: str) -> str:
        return make_url(PG_URL).set(database=name).render_as_string(hide_password=False)

    def _execute(self, sql: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(sql))

    def create(self, *, migrated: bool) -> str:
        """A new database's name: empty, or at the migrations' head. Fails/skips the test when the
        server is unreachable (``_pg_unreachable``)."""
        name = f"{self.prefix}{uuid.uuid4().hex[:16]}"
        try:
            if migrated and self.template is None:
                template = f"{self.prefix}template_{uuid.uuid4().hex[:8]}"
                self._execute(f'CREATE DATABASE "{template}"')
                upgrade(self.url(template))  # disposes its engine: no connection is left on it
                self.template = template
            suffix = f' TEMPLATE "{self.template}"' if migrated else ""
            self._execute(f'CREATE DATABASE "{name}"{suffix}')
        except OperationalError as exc:
            _pg_unreachable(exc)
        return name

    def drop_later(self, name: str) -> None:
        self.drops.append(
            self.dropper.submit(self._execute, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        )

    def close(self) -> None:
        self.dropper.shutdown(wait=True)
        if self.template is not None:
            self._execute(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
        self.admin.dispose()
        for drop in self.drops:
            drop.result()  # a drop that failed fails here, at the end of the session


@pytest.fixture(scope="session")
def _pg_databases() -> Iterator[_PgDatabases]:
    databases = _PgDatabases()
    try:
        yield databases
    finally:
        databases.close()


def _pg_database(databases: _PgDatabases, *, migrated: bool) -> Iterator[str]:
    name = databases.create(migrated=migrated)
    try:
        yield databases.url(name)
    finally:
        databases.drop_later(name)


@pytest.fixture
def pg_url(_pg_databases: _PgDatabases) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database of this test's own, dropped after the test."""
    yield from _pg_database(_pg_databases, migrated=False)


@pytest.fixture
def pg_migrated_url(_pg_databases: _PgDatabases) -> Iterator[str]:
    """URL of a fresh PostgreSQL database of this test's own at the migrations' head (a copy of a
    template that ``upgrade`` made once per process), dropped after the test."""
    yield from _pg_database(_pg_databases, migrated=True)


@pytest.fixture(scope="session")
def _sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file ``upgrade`` took to the migrations' head, once per test process."""
    path = tmp_path_factory.mktemp("sqlite-template") / "kernelab.db"
    upgrade(f"sqlite:///{path}")
    return path


def _copy_sqlite(source: Path, target: Path) -> None:
    """``source`` copied to ``target`` page by page (sqlite3's online backup: consistent whatever
    the journal mode)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(source)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of this test's own: a temp SQLite file, or a fresh PostgreSQL database. Empty,
    unless the test asks for ``migrated_url``: then it is already at the migrations' head (a copy
    of a template migrated once per process; ``test_migrations`` runs the migrations themselves)."""
    migrated = "migrated_url" in request.fixturenames
    if request.param == "sqlite":
        path = tmp_path / "data" / "kernelab.db"
        if migrated:
            _copy_sqlite(request.getfixturevalue("_sqlite_template"), path)
        return f"sqlite:///{path}"
    return str(request.getfixturevalue("pg_migrated_url" if migrated else "pg_url"))


@pytest.fixture
def migrated_url(db_url: str) -> str:
    """``db_url`` at the migrations' head."""
    return db_url


@pytest.fixture
def settings(migrated_url: str) -> Settings:
    return Settings(database_url=migrated_url, admin_token=ADMIN_TOKEN, claim_poll_s=0.02, claim_wait_max_s=5)


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


@pytest.fixture(scope="session")
def _pg_fleet(_pg_databases: _PgDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    from kernelab.runners.local import ServerProcess, free_port

    name = _pg_databases.create(migrated=False)
    log_path = tmp_path_factory.mktemp("pg-fleet") / "server.log"
    server = ServerProcess(
        _pg_databases.url(name), port=free_port(), admin_token=FLEET_TOKEN, log_path=log_path, workers=2,
        env={"KERNELAB_CLAIM_POLL_S": "0.1"},
    )  # fmt: skip
    try:
        with server:
            yield Fleet(server.url, FLEET_TOKEN, log_path)
    finally:
        _pg_databases.drop_later(name)


@pytest.fixture
def pg_fleet(_pg_fleet: Fleet) -> Fleet:
    """The PostgreSQL multi-worker set-up, one per test process (its two workers start once),
    with an empty queue: jobs an earlier test left queued or running are cancelled first, so a
    test that drains the queue sees its own jobs only. Runners and tokens of earlier tests stay
    (register yours under names of your own)."""
    with httpx.Client(base_url=_pg_fleet.url, headers=_pg_fleet.admin, timeout=60) as http:
        for status in ("queued", "running"):
            for _ in range(100):  # pages of 100; a job that ended meanwhile answers 409 and is left
                jobs = http.get("/api/v1/jobs", params={"status": status, "limit": 100}).json()["data"]
                if not jobs:
                    break
                for job in jobs:
                    http.post(f"/api/v1/jobs/{job['id']}/cancel")
    return _pg_fleet
