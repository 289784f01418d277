"""Queued work of kind "pair": job vs job computed by a compare worker, its answer kept.

Revision ID: 0018_pair_tasks
Revises: 0017_job_progress_bisects
Create Date: 2026-12-02

* ``compare_tasks`` holds a second kind, ``pair`` (``kernelab.service.server.job_vs_job``): job
  ``pair_job_id`` (B) against job ``job_id`` (A) on ``side``, its answer in ``output`` (JSON);
  ``result_id`` becomes nullable (a pair task has no one result), a ``compare`` task must still
  name one (``ck_compare_tasks_compare_has_result``); at most one pair task per (A, B, side)
  (``ux_compare_tasks_pair``, a partial unique index on both databases).
* Data: none to move (existing tasks are all ``compare`` tasks with a result).

Downgrade deletes the pair tasks (answers a compare worker computes again on request) and
restores the table. ``compare_tasks`` is referenced by no other table, so SQLite's batch rebuild
of it cascades nowhere.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0018_pair_tasks"
down_revision: str | None = "0017_job_progress_bisects"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
PAIR = sa.text("kind = 'pair'")


def upgrade() -> None:
    with op.batch_alter_table("compare_tasks", recreate="auto") as batch:
        batch.alter_column("result_id", existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column("pair_job_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("side", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("output", JSON, nullable=True))
        batch.create_foreign_key(
            op.f("fk_compare_tasks_pair_job_id_jobs"), "jobs", ["pair_job_id"], ["id"], ondelete="CASCADE"
        )
        batch.drop_constraint(op.f("ck_compare_tasks_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_compare_tasks_kind"), "kind IN ('compare', 'pair')")
        batch.create_check_constraint(
            op.f("ck_compare_tasks_compare_has_result"), "kind <> 'compare' OR result_id IS NOT NULL"
        )
        batch.create_check_constraint(
            op.f("ck_compare_tasks_pair_has_jobs"),
            "kind <> 'pair' OR (job_id IS NOT NULL AND pair_job_id IS NOT NULL AND side IS NOT NULL)",
        )
    op.create_index(
        "ux_compare_tasks_pair", "compare_tasks", ["job_id", "pair_job_id", "side"], unique=True,
        sqlite_where=PAIR, postgresql_where=PAIR,
    )  # fmt: skip


def downgrade() -> None:
    op.drop_index("ux_compare_tasks_pair", table_name="compare_tasks")
    op.execute("DELETE FROM compare_tasks WHERE kind = 'pair'")
    with op.batch_alter_table("compare_tasks", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_compare_tasks_pair_has_jobs"), type_="check")
        batch.drop_constraint(op.f("ck_compare_tasks_compare_has_result"), type_="check")
        batch.drop_constraint(op.f("ck_compare_tasks_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_compare_tasks_kind"), "kind IN ('compare')")
        batch.drop_constraint(op.f("fk_compare_tasks_pair_job_id_jobs"), type_="foreignkey")
        batch.drop_column("output")
        batch.drop_column("side")
        batch.drop_column("pair_job_id")
        batch.alter_column("result_id", existing_type=sa.Integer(), nullable=False)
