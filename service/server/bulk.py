"""Bulk inserts inside the caller's transaction (the caller commits, as in ``kernelab.service.server.crud``).

On PostgreSQL rows go through ``COPY ... FROM STDIN (FORMAT BINARY)`` on the session's own psycopg
connection: psycopg parses a multi-row ``INSERT ... VALUES`` of N parameters in Python (~50 us per
parameter on a loaded 2-core machine), so the 1,000 cells (9,000 parameters) and 1,000 sample
blocks (12,000) of a sweep took ~0.5 s each as ``INSERT``s and take ~0.1 s as ``COPY``. Elsewhere
(SQLite) a SQLAlchemy ``INSERT`` executemany. Either way the rows are part of the open transaction:
a rollback (or a killed server) leaves none of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Integer, Table, func, insert, select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from kernelab.service.server.models import Base


def _pg_type(table: Table, column: str, session: Session) -> str:
    """The PostgreSQL type name of ``table.column`` for psycopg's ``Copy.set_types`` (``integer``,
    ``jsonb``, ``bytea``, ``text``, ``varchar``...)."""
    compiled = table.c[column].type.compile(dialect=session.get_bind().dialect)
    return compiled.split("(")[0].strip().lower()


def _copy(session: Session, table: Table, columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """COPY ``rows`` into ``table``; psycopg's errors come out as SQLAlchemy's (``IntegrityError``,
    ``DataError``...), as they do from ``session.execute``."""
    import psycopg

    types = [_pg_type(table, c, session) for c in columns]
    driver = session.connection().connection.driver_connection  # the psycopg connection of this transaction
    assert driver is not None
    statement = f"COPY {table.name} ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
    try:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            copy.set_types(types)
            for row in rows:
                copy.write_row([row[c] for c in columns])
    except psycopg.Error as exc:
        dialect = session.get_bind().dialect
        raise DBAPIError.instance(statement, None, exc, psycopg.Error, dialect=dialect) from exc


def _table(model: type[Base]) -> Table:
    table = model.__table__
    assert isinstance(table, Table)
    return table


def insert_rows(session: Session, model: type[Base], rows: Sequence[dict[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys: column names of ``model``'s table) in the
    session's transaction. Raises what the database raises (``sqlalchemy.exc.IntegrityError`` on SQLite,
    ``psycopg`` errors wrapped by SQLAlchemy on PostgreSQL) for a row that breaks a constraint."""
    table = _table(model)
    if not rows:
        return
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(table), list(rows))
        return
    _copy(session, table, list(rows[0]), rows)


def insert_rows_returning_ids(
    session: Session, model: type[Base], rows: Sequence[dict[str, Any]]
) -> list[int]:
    """``insert_rows`` for a table with an integer ``id`` primary key: the new ids, in ``rows``
    order. On PostgreSQL the ids are drawn from the column's sequence first (``nextval``), then
    the rows copied with them."""
    table = _table(model)
    if not rows:
        return []
    if session.get_bind().dialect.name != "postgresql":
        id_column = table.c.id
        stmt = insert(table).returning(id_column, sort_by_parameter_order=True)
        return list(session.scalars(stmt, list(rows)).all())
    assert isinstance(table.c.id.type, Integer)
    sequence = func.pg_get_serial_sequence(table.name, "id")
    numbers = func.generate_series(1, len(rows))
    ids = list(session.scalars(select(func.nextval(sequence)).select_from(numbers)))
    _copy(session, table, ["id", *rows[0]], [{"id": i, **row} for i, row in zip(ids, rows, strict=True)])
    return ids
