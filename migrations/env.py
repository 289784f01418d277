"""Alembic environment: online migrations on SQLite (batch mode) and PostgreSQL.

``service.core.db.upgrade`` passes an open connection in ``config.attributes["connection"]``;
the ``alembic`` command line uses ``sqlalchemy.url`` instead. Offline (``--sql``) mode is not
supported: kernelab always migrates a live database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from kernelab.service.server.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from kernelab.service.server.core.db import make_engine

    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url (alembic -x or alembic.ini) or pass a connection")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("kernelab migrations run online only (no --sql)")
run_migrations_online()
