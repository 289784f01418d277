"""Alembic is the only way the schema is made: up/down/up works, and it matches the models."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from service.app import create_app
from service.core.config import Settings
from service.core.db import (
    SchemaNotCurrentError,
    check_at_head,
    downgrade,
    head_revision,
    make_engine,
    upgrade,
)
from service.models import Base

TABLES = {
    "tokens", "runners", "jobs", "job_attempts", "results", "cells", "samples", "probe_reports",
    "probe_readings",
}  # fmt: skip


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    upgrade(db_url)
    assert _tables(db_url) == TABLES
    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    upgrade(db_url)
    assert _tables(db_url) == TABLES
    engine = make_engine(db_url)
    try:
        check_at_head(engine)
    finally:
        engine.dispose()


def test_models_match_migrations(db_url: str) -> None:
    """Autogenerate finds no difference: the migrations create exactly what the models declare."""
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            opts = {"compare_type": True, "compare_server_default": True}
            context = MigrationContext.configure(conn, opts=opts)
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_app_refuses_a_database_not_at_head(db_url: str) -> None:
    with pytest.raises(SchemaNotCurrentError, match=head_revision()):
        create_app(Settings(database_url=db_url))
    upgrade(db_url)
    downgrade(db_url, "base")
    with pytest.raises(SchemaNotCurrentError, match="kernelab serve"):
        create_app(Settings(database_url=db_url))


def test_sqlite_folder_is_created(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'k.db'}"
    upgrade(url)
    assert (tmp_path / "a" / "b" / "k.db").is_file()
