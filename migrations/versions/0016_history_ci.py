"""History points carry the 95% CI of their median.

Revision ID: 0016_history_ci
Revises: 0015_compare_tasks
Create Date: 2026-12-01

* ``history_points.ci_low_ns``/``ci_high_ns``: the CI of the side's median time per launch, the
  percentile interval of the round bootstrap the comparison's ratio CI is formed from
  (``kernelab.service.judge.estimators.cluster_cis``), copied from the stored comparison's
  ``SideStats.median_ci_low_ns``/``median_ci_high_ns``. NULL for points of comparisons stored
  before those fields existed: the history draws such a point without error bars, never with
  made-up ones.

Downgrade drops the two columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_history_ci"
down_revision: str | None = "0015_compare_tasks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("history_points") as batch:
        batch.add_column(sa.Column("ci_low_ns", sa.Float(), nullable=True))
        batch.add_column(sa.Column("ci_high_ns", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("history_points") as batch:
        batch.drop_column("ci_high_ns")
        batch.drop_column("ci_low_ns")
