"""Workload jobs on the server: the job's kind and node count, runners that run workloads, the
gang seats of a multi-node attempt, the raw results per node, compare tasks of kind "workload".

Revision ID: 0019_workloads
Revises: 0018_pair_tasks
Create Date: 2026-12-02

* ``jobs.kind`` (``benchmark`` | ``workload``, default ``benchmark``: every existing job) and
  ``jobs.nnodes`` (runners that claim the job together, default 1); no CHECK on them: adding one
  on SQLite rebuilds ``jobs``, which cascades to every table that references it.
* ``runners.workloads``: the runner's claims say it runs workload jobs (default false).
* ``gang_members``: one row per runner seat of a workload attempt (``kernelab.service.server.gangs``).
* ``workload_results``: the raw ``WorkloadResult`` of each node of a workload job.
* ``compare_tasks`` gets the kind ``workload`` (one per job: ``ux_compare_tasks_workload``, a
  partial unique index on both databases); its ``output`` holds the ``WorkloadComparison``.

Downgrade drops the workload jobs (their attempts, seats, results and tasks cascade) and restores
the tables.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0019_workloads"
down_revision: str | None = "0018_pair_tasks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
WORKLOAD = sa.text("kind = 'workload'")
UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    # plain ADD COLUMN, no batch rebuild: on SQLite a rebuild of ``jobs`` or ``runners`` (which other
    # tables reference, ON DELETE CASCADE / SET NULL) would delete or unlink their rows
    op.add_column("jobs", sa.Column("kind", sa.String(length=16), server_default="benchmark", nullable=False))
    op.add_column("jobs", sa.Column("nnodes", sa.Integer(), server_default="1", nullable=False))
    op.add_column(
        "runners", sa.Column("workloads", sa.Boolean(), server_default=sa.text("false"), nullable=False)
    )
    op.create_table(
        "gang_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("runner_id", sa.Integer(), nullable=False),
        sa.Column("endpoint", sa.String(length=300), nullable=True),
        sa.Column("joined_at", UTC_DATETIME, nullable=False),
        sa.Column("lease_expires_at", UTC_DATETIME, nullable=False),
        sa.Column("posted_at", UTC_DATETIME, nullable=True),
        sa.CheckConstraint("node_rank >= 0", name=op.f("ck_gang_members_node_rank_nonnegative")),
        sa.CheckConstraint("attempt >= 1", name=op.f("ck_gang_members_attempt_positive")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_gang_members_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["runner_id"], ["runners.id"], name=op.f("fk_gang_members_runner_id_runners"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gang_members")),
        sa.UniqueConstraint("job_id", "attempt", "node_rank", name="uq_gang_members_job_id_attempt_rank"),
        sa.UniqueConstraint("job_id", "attempt", "runner_id", name="uq_gang_members_job_id_attempt_runner"),
    )  # fmt: skip
    op.create_table(
        "workload_results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("node_rank", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("runner_id", sa.Integer(), nullable=True),
        sa.Column("node_name", sa.String(length=255), nullable=False),
        sa.Column("result", JSON, nullable=False),
        sa.Column("received_at", UTC_DATETIME, nullable=False),
        sa.CheckConstraint("node_rank >= 0", name=op.f("ck_workload_results_node_rank_nonnegative")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_workload_results_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["runner_id"], ["runners.id"],
                                name=op.f("fk_workload_results_runner_id_runners"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workload_results")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_workload_results_idempotency_key")),
        sa.UniqueConstraint("job_id", "node_rank", name="uq_workload_results_job_id_node_rank"),
    )  # fmt: skip
    op.create_index(op.f("ix_workload_results_job_id"), "workload_results", ["job_id"])
    with op.batch_alter_table("compare_tasks", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_compare_tasks_kind"), type_="check")
        batch.create_check_constraint(
            op.f("ck_compare_tasks_kind"), "kind IN ('compare', 'pair', 'workload')"
        )
        batch.create_check_constraint(
            op.f("ck_compare_tasks_workload_has_job"), "kind <> 'workload' OR job_id IS NOT NULL"
        )
    op.create_index("ux_compare_tasks_workload", "compare_tasks", ["job_id"], unique=True,
                    sqlite_where=WORKLOAD, postgresql_where=WORKLOAD)  # fmt: skip


def downgrade() -> None:
    op.drop_index("ux_compare_tasks_workload", table_name="compare_tasks")
    op.execute("DELETE FROM compare_tasks WHERE kind = 'workload'")
    op.execute("DELETE FROM jobs WHERE kind = 'workload'")
    with op.batch_alter_table("compare_tasks", recreate="auto") as batch:
        batch.drop_constraint(op.f("ck_compare_tasks_workload_has_job"), type_="check")
        batch.drop_constraint(op.f("ck_compare_tasks_kind"), type_="check")
        batch.create_check_constraint(op.f("ck_compare_tasks_kind"), "kind IN ('compare', 'pair')")
    op.drop_index(op.f("ix_workload_results_job_id"), table_name="workload_results")
    op.drop_table("workload_results")
    op.drop_table("gang_members")
    op.drop_column("runners", "workloads")  # SQLite >= 3.35 drops a column without a rebuild
    op.drop_column("jobs", "nnodes")
    op.drop_column("jobs", "kind")
