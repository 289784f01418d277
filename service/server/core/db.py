"""Engine and session factory; ``upgrade`` runs Alembic to head (the only way the schema is made).

SQLite is the zero-set-up default and PostgreSQL the fleet database. On SQLite every connection
gets ``foreign_keys=ON`` (SQLite ignores foreign keys otherwise), WAL journaling (readers do not
block the writer) and a busy timeout so that several processes wait for the write lock instead
of failing. pysqlite's default transaction mode is kept: it opens a transaction before the first
write of a unit of work, which is what the queue's conditional ``UPDATE ... WHERE status='queued'``
claim relies on.

Every SQLite connection also gets TEMP triggers on ``jobs`` that set ``QUEUE_CHANGED`` when a row
is inserted or updated with ``status = 'queued'`` (``kernelab.service.server.queue_watch`` wakes waiting
claims of this process after the commit; PostgreSQL has a real trigger and NOTIFY instead).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_S = 30.0  # how long a SQLite writer waits for the lock before "database is locked"


class SchemaNotCurrentError(RuntimeError):
    """The database's Alembic revision is not the code's head revision."""


def _ensure_sqlite_folder(url: str) -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)


QUEUE_CHANGED = threading.Event()
"""Set by a SQLite connection of this process that inserted or updated a job to ``queued``; cleared
by ``kernelab.service.server.queue_watch`` once the session committed."""

_QUEUE_TRIGGERS = (
    "CREATE TEMP TRIGGER IF NOT EXISTS kernelab_job_queued AFTER INSERT ON main.jobs"
    " WHEN NEW.status = 'queued' BEGIN SELECT kernelab_queue_changed(); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS kernelab_job_requeued AFTER UPDATE OF status ON main.jobs"
    " WHEN NEW.status = 'queued' BEGIN SELECT kernelab_queue_changed(); END",
)


def _sqlite_queue_triggers(dbapi_connection: Any, record: Any) -> None:
    """Give the connection its TEMP triggers once ``jobs`` exists (a connection opened before the
    first migration gets them at a later checkout)."""
    if record.info.get("kernelab_queue_triggers"):
        return
    cursor = dbapi_connection.cursor()
    try:
        for statement in _QUEUE_TRIGGERS:
            cursor.execute(statement)
    except sqlite3.OperationalError:  # no jobs table yet
        return
    finally:
        cursor.close()
    record.info["kernelab_queue_triggers"] = True


def _sqlite_on_connect(dbapi_connection: Any, record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
    finally:
        cursor.close()
    dbapi_connection.create_function("kernelab_queue_changed", 0, QUEUE_CHANGED.set)
    _sqlite_queue_triggers(dbapi_connection, record)


def _sqlite_on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    _sqlite_queue_triggers(dbapi_connection, record)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine for ``url`` (a SQLAlchemy URL, e.g. ``sqlite:///./kernelab-data/k.db`` or
    ``postgresql+psycopg://user@host/db``).

    For a SQLite file its folder is created. ``kwargs`` go to ``sqlalchemy.create_engine``.
    Raises ``sqlalchemy.exc.ArgumentError`` for a malformed URL; connecting is lazy.
    """
    _ensure_sqlite_folder(url)
    if make_url(url).get_backend_name() == "sqlite":
        connect_args = {"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_S}
        connect_args.update(kwargs.pop("connect_args", {}))
        engine = create_engine(url, connect_args=connect_args, **kwargs)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "checkout", _sqlite_on_checkout)
        return engine
    kwargs.setdefault("pool_pre_ping", True)
    return create_engine(url, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """A ``sessionmaker`` bound to ``engine``; objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=True)


def alembic_config(url: str | None = None) -> Config:
    """Alembic ``Config`` whose script location is the installed ``migrations`` package.

    Resolved with ``importlib.resources`` so it works from an installed wheel, not only from a
    checkout. ``url`` (optional) becomes ``sqlalchemy.url``.
    """
    package_dir = files("kernelab.migrations")
    config = Config(str(package_dir / "alembic.ini"))
    config.set_main_option("script_location", str(package_dir))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


@contextmanager
def _config_with_connection(url: str) -> Iterator[Config]:
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            config = alembic_config(url)
            config.attributes["connection"] = connection
            yield config
    finally:
        engine.dispose()


def upgrade(database_url: str, revision: str = "head") -> None:
    """Run ``alembic upgrade <revision>`` on ``database_url`` (creates the schema on a new DB).

    Raises ``sqlalchemy.exc.OperationalError`` when the database is unreachable and
    ``alembic.util.CommandError`` for an unknown revision.
    """
    with _config_with_connection(database_url) as config:
        command.upgrade(config, revision)


def upgrade_told(database_url: str) -> str:
    """``upgrade(database_url)`` and one line saying what it did, the URL without its password:
    ``"database sqlite:///k.db: schema created at 0013_x"``, ``"... upgraded from 0011_y to
    0013_x"`` or ``"... schema at 0013_x (current)"``. Raises as ``upgrade``."""
    engine = make_engine(database_url)
    try:
        before = current_revision(engine)
    finally:
        engine.dispose()
    upgrade(database_url)
    head = head_revision()
    shown = make_url(database_url).render_as_string(hide_password=True)
    if before is None:
        return f"database {shown}: schema created at {head}"
    if before != head:
        return f"database {shown}: schema upgraded from {before} to {head}"
    return f"database {shown}: schema at {head} (current)"


def downgrade(database_url: str, revision: str) -> None:
    """Run ``alembic downgrade <revision>`` (``"base"`` drops every table Alembic made)."""
    with _config_with_connection(database_url) as config:
        command.downgrade(config, revision)


def head_revision() -> str:
    """The code's head Alembic revision id. Raises ``RuntimeError`` if there are several heads."""
    heads = ScriptDirectory.from_config(alembic_config()).get_heads()
    if len(heads) != 1:
        raise RuntimeError(f"migrations have {len(heads)} heads: {heads}")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    """The database's Alembic revision, None for a database Alembic never touched."""
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def check_at_head(engine: Engine) -> None:
    """Raise ``SchemaNotCurrentError`` (with the fix in the message) unless the DB is at head."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaNotCurrentError(
            f"database {engine.url.render_as_string(hide_password=True)} is at revision {current!r}, "
            f"the code needs {head!r}: run `kernelab serve` (it upgrades first) or "
            "`python -c 'from kernelab.service.server.core.db import upgrade; upgrade(URL)'`"
        )
