"""Cells record how they were measured: timer kind per variant and contention readings.

Revision ID: 0003_timing
Revises: 0001
Create Date: 2026-11-30

Adds the nullable JSON column ``cells.context`` (``{"timers": {variant: kind}, "contention":
[ContentionReading]}``, see ``service.schemas.CellResult``). Results stored before it read back
with no timers and no contention readings.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0003_timing"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cells", schema=None) as batch_op:
        batch_op.add_column(sa.Column("context", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cells", schema=None) as batch_op:
        batch_op.drop_column("context")
