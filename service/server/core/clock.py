"""The database's clock as a SQL expression: ``db_now()``, ``db_now(seconds)``.

Every lease decision (is a lease over, when does a new one end) is made by the database, not by
the app host that happens to serve the request: with several hosts on one PostgreSQL, a host
whose clock runs ahead would otherwise take live leases as expired (and one behind would hand
out leases that outlive their runner). The expression is evaluated by the database inside the
statement, so it costs no extra round trip.

* PostgreSQL: ``statement_timestamp()`` (the start of the current statement; ``now()`` is the
  start of the transaction, which a lock wait can leave seconds behind), plus ``seconds *
  interval '1 second'`` (PostgreSQL manual, "Date/Time Functions and Operators").
* SQLite: ``strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%.6f seconds', s)) || '000'``: UTC with
  millisecond resolution (``CURRENT_TIMESTAMP`` has whole seconds only), padded to the six
  fraction digits SQLAlchemy writes for ``DateTime`` values, so stored times compare as text in
  time order (SQLite manual, "Date And Time Functions"). 'now' is fixed within one
  ``sqlite3_step()``, i.e. for the rows of one statement.

The value has the type ``models.UTCDateTime``: an aware UTC datetime when read back.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import BindParameter, Float, bindparam
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from kernelab.service.server.models import UTCDateTime


class db_now(FunctionElement[Any]):  # noqa: N801  (reads as a function in SQL expressions)
    """The database's current time (aware UTC), plus ``offset_s`` seconds when given.

    ``offset_s``: a float, or a bound parameter / SQL expression of seconds (``bindparam("p_s")``).
    """

    type = UTCDateTime()
    name = "db_now"
    inherit_cache = True

    def __init__(self, offset_s: float | ColumnElement[Any] | None = None):
        if offset_s is None:
            super().__init__()
        else:
            seconds = offset_s if isinstance(offset_s, ColumnElement) else _seconds(offset_s)
            super().__init__(seconds)


def _seconds(value: float) -> BindParameter[float]:
    return bindparam(None, float(value), type_=Float())


def _offset(element: db_now) -> ColumnElement[Any] | None:
    clauses = list(element.clauses)
    return clauses[0] if clauses else None


@compiles(db_now, "postgresql")
def _postgresql(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    offset = _offset(element)
    if offset is None:
        return "statement_timestamp()"
    return f"(statement_timestamp() + ({compiler.process(offset, **kw)}) * interval '1 second')"


@compiles(db_now)  # SQLite, and how str(statement) shows it
def _sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    offset = _offset(element)
    if offset is None:
        return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"
    modifier = f"printf('%.6f seconds', {compiler.process(offset, **kw)})"
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', {modifier}) || '000')"
