"""The last live admin token is never revoked or rotated away (issue 15: an admin rotated its own,
only token and locked itself out).

``other_live_admins`` counts the live admin tokens other than one, with the live tokens' rows
locked (``SELECT ... FOR UPDATE`` on PostgreSQL) so that two admins revoking each other at the
same moment cannot both succeed: the second waits for the first's commit and then counts
again. SQLite serialises writers (the second transaction's write fails with "database is
locked" and the request is a 503), so the check holds there too.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service import models

LAST_ADMIN = (
    "token {id} is the only live admin token: revoking or rotating it would leave no admin. Create "
    "another admin token first (POST /api/v1/tokens, `kernelab token create --scope admin`), then "
    "rotate or revoke this one with it"
)
"""The 409 detail of ``service.api.routes.tokens`` for the last admin token (``.format(id=...)``)."""


def other_live_admins(session: Session, token_id: int) -> int:
    """Live (unrevoked) tokens with the ``admin`` scope other than ``token_id``, read with the
    live tokens' rows locked until the transaction ends. Does not commit."""
    rows = session.execute(
        select(models.Token.id, models.Token.scopes)
        .where(models.Token.revoked_at.is_(None))
        .with_for_update()
    ).all()
    return sum(1 for row_id, scopes in rows if row_id != token_id and "admin" in scopes)


def is_last_admin(session: Session, row: models.Token) -> bool:
    """Whether ``row`` is a live admin token and no other live admin token exists (see
    ``other_live_admins`` for the locking). Does not commit."""
    return row.revoked_at is None and "admin" in row.scopes and other_live_admins(session, row.id) == 0
