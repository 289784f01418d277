"""The stored comparison of a result: ``results.comparison`` (JSON, nullable).

Revision ID: 0009_comparison
Revises: 0008_static
Create Date: 2026-11-30

Holds ``service.stats.compare(result)`` (``schemas.Comparison`` without node-health flags, which
are applied on read), computed once after the result is stored. NULL until then (or when computing
it failed): readers recompute it on a miss and store it.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0009_comparison"
down_revision: str | None = "0008_static"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("comparison", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.drop_column("comparison")
