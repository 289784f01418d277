"""Static kernel metrics per cell: ``cells.static`` (JSON, nullable).

Revision ID: 0008_static
Revises: 0003_timing
Create Date: 2026-12-01

Holds ``schemas.StaticComparison`` of the cell (``runners.static_metrics``): registers, spills,
instruction mix and loops of both sides' compiled kernels and their diff. NULL when the job did not
ask for static metrics. JSON is JSONB on PostgreSQL, as everywhere in the schema.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision: str = "0008_static"
down_revision: str | None = "0003_timing"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cells") as batch:
        batch.add_column(sa.Column("static", JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("cells") as batch:
        batch.drop_column("static")
