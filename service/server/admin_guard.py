"""The last live admin token is never revoked or rotated away (an admin that rotated or revoked
its own, only token would lock everyone out).

``other_live_admins`` counts the live admin tokens other than one, with the live tokens' rows
locked (``SELECT ... FOR UPDATE`` on PostgreSQL) so that two admins revoking each other at the
same moment cannot both succeed: the second waits for the first's commit and then counts
again. SQLite has no row locks, and pysqlite opens its transaction only at the first write, so the
two reads would both see two live admins and both revokes would succeed. There ``take_write_lock``
first runs a no-op ``UPDATE`` of the token's own row: that begins the
transaction and takes SQLite's database write lock (``RESERVED``) before anything is read; the
second transaction waits for it (``busy_timeout``, ``kernelab.service.server.core.db``) and then reads the
committed state, as ``BEGIN IMMEDIATE`` would.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from kernelab.service.server import models

LAST_ADMIN = (
    "token {id} is the only live admin token: revoking or rotating it would leave no admin. Create "
    "another admin token first (POST /api/v1/tokens, `kernelab token create --scope admin`), then "
    "rotate or revoke this one with it"
)
"""The 409 detail of ``kernelab.service.server.api.routes.tokens`` for the last admin token
(``.format(id=...)``)."""


def take_write_lock(session: Session, token_id: int) -> None:
    """On SQLite, begin the transaction with the database write lock held (a no-op ``UPDATE`` of
    token ``token_id``), waiting up to the busy timeout for another writer; nothing elsewhere (the
    PostgreSQL path locks rows with ``FOR UPDATE``). Does not commit."""
    if session.get_bind().dialect.name != "sqlite":
        return
    session.execute(
        update(models.Token)
        .where(models.Token.id == token_id)
        .values(id=models.Token.id)
        .execution_options(synchronize_session=False)
    )


def other_live_admins(session: Session, token_id: int) -> int:
    """Live (unrevoked) tokens with the ``admin`` scope other than ``token_id``, read with the
    live tokens' rows locked until the transaction ends (``take_write_lock`` on SQLite). Does not
    commit."""
    take_write_lock(session, token_id)
    rows = session.execute(
        select(models.Token.id, models.Token.scopes)
        .where(models.Token.revoked_at.is_(None))
        .with_for_update()
    ).all()
    return sum(1 for row_id, scopes in rows if row_id != token_id and "admin" in scopes)


def is_last_admin(session: Session, row: models.Token) -> bool:
    """Whether ``row`` is a live admin token and no other live admin token exists (see
    ``other_live_admins`` for the locking; ``row`` is read again once the lock is held). Does not
    commit."""
    if "admin" not in row.scopes:
        return False
    take_write_lock(session, row.id)
    session.refresh(row)
    return row.revoked_at is None and "admin" in row.scopes and other_live_admins(session, row.id) == 0
