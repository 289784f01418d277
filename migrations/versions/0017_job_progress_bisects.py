"""Job progress and re-runs; bisects.

Revision ID: 0017_job_progress_bisects
Revises: 0016_history_ci
Create Date: 2026-12-01

* ``jobs.progress`` (JSON, ``schemas.JobProgress``) and ``jobs.progress_at``: a running job's
  progress from its runner's heartbeats, reset by each claim; ``jobs.rerun_of``: the job a
  re-run copies (``POST /jobs/{id}/rerun``; a plain integer: no foreign key, which SQLite could
  only add by rebuilding ``jobs``).
* ``bisects``: one row per ``kernelab bisect`` (``kernelab.service.server.bisects``).

Downgrade drops them. Existing jobs get NULLs (no progress, no re-run).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017_job_progress_bisects"
down_revision: str | None = "0016_history_ci"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.DateTime(timezone=True)  # service.models.UTCDateTime's column type
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    # plain ADD/DROP COLUMN on both databases (as 0014): a batch rebuild of ``jobs`` drops the
    # table, and with foreign keys on, its ON DELETE CASCADE would take every result with it
    op.add_column("jobs", sa.Column("progress", JSON, nullable=True))
    op.add_column("jobs", sa.Column("progress_at", TIME, nullable=True))
    op.add_column("jobs", sa.Column("rerun_of", sa.Integer(), nullable=True))
    op.create_table(
        "bisects",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("benchmark", sa.String(length=500), nullable=False),
        sa.Column("repo", sa.Text(), nullable=False),
        sa.Column("good", sa.String(length=64), nullable=False),
        sa.Column("bad", sa.String(length=64), nullable=False),
        sa.Column("good_ref", sa.String(length=500), nullable=False),
        sa.Column("bad_ref", sa.String(length=500), nullable=False),
        sa.Column("commits", JSON, nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("steps", JSON, nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("first_bad", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("submitted_by", sa.Integer(), nullable=True),
        sa.CheckConstraint("status IN ('running', 'found', 'stopped')", name=op.f("ck_bisects_status")),
        sa.ForeignKeyConstraint(["submitted_by"], ["tokens.id"], name=op.f("fk_bisects_submitted_by_tokens"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bisects")),
    )  # fmt: skip


def downgrade() -> None:
    op.drop_table("bisects")
    for column in ("rerun_of", "progress_at", "progress"):
        op.execute(f"ALTER TABLE jobs DROP COLUMN {column}")  # not a batch rebuild: see upgrade()
