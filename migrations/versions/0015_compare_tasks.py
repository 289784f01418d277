"""Queued work of kind "compare": the comparison of a result is computed by a compare worker.

Revision ID: 0015_compare_tasks
Revises: 0013_runner_node
Create Date: 2026-12-01

* ``compare_tasks``: one row per stored result whose comparison a compare worker computes
  (``kernelab.service.server.compare_queue``): ``status`` queued/running/done/failed, ``attempts`` of
  ``max_attempts``, the lease (``worker``, ``lease_expires_at``), ``error`` of a failed one.
* Data: every stored result without a comparison (``results.comparison`` NULL, or the JSON null
  that 0012 left) gets a queued task, so a compare worker computes it (readers no longer compute
  on a miss). Results with a comparison get a ``done`` task. Comparisons judged by older verdict
  rules are re-queued by the compare worker when it starts (``compare_queue.enqueue_stale``): the
  rules' version is code, not schema.

Downgrade drops the table (readers of that version compute a missing comparison themselves).
Plain table constructs through ``op.get_bind()``, never the app's ORM.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0015_compare_tasks"
down_revision: str | None = "0014_runner_benchmarks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TIME = sa.DateTime(timezone=True)  # service.models.UTCDateTime's column type
MAX_ATTEMPTS = 3  # Settings.compare_max_attempts' default

_results = sa.table("results", sa.column("id", sa.Integer), sa.column("job_id", sa.Integer),
                    sa.column("comparison", sa.JSON))  # fmt: skip


def upgrade() -> None:
    tasks = op.create_table(
        "compare_tasks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("lease_expires_at", TIME, nullable=True),
        sa.Column("created_at", TIME, nullable=False),
        sa.Column("finished_at", TIME, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint("kind IN ('compare')", name=op.f("ck_compare_tasks_kind")),
        sa.CheckConstraint("status IN ('queued', 'running', 'done', 'failed')",
                           name=op.f("ck_compare_tasks_status")),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_compare_tasks_attempts_nonnegative")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_compare_tasks_max_attempts_positive")),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_compare_tasks_job_id_jobs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["result_id"], ["results.id"],
                                name=op.f("fk_compare_tasks_result_id_results"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_compare_tasks")),
        sa.UniqueConstraint("result_id", name=op.f("uq_compare_tasks_result_id")),
    )  # fmt: skip
    op.create_index(op.f("ix_compare_tasks_status_id"), "compare_tasks", ["status", "id"])
    bind = op.get_bind()
    created = datetime.now(UTC)
    if bind.dialect.name == "sqlite":  # stored as naive UTC text there (service.models.UTCDateTime)
        created = created.replace(tzinfo=None)
    # A comparison's version, not the whole JSON (MBs for a large sweep): NULL for SQL NULL, for the
    # JSON null that 0012 left when it dropped comparisons, and for one without a version.
    version = _results.c.comparison["method_version"].as_integer()
    rows = bind.execute(sa.select(_results.c.id, _results.c.job_id, version).order_by(_results.c.id))
    tasks_rows = [
        {"kind": "compare", "result_id": rid, "job_id": jid, "status": "queued" if v is None else "done",
         "attempts": 0, "max_attempts": MAX_ATTEMPTS, "created_at": created}
        for rid, jid, v in rows
    ]  # fmt: skip
    if tasks_rows:
        op.bulk_insert(tasks, tasks_rows)


def downgrade() -> None:
    op.drop_index(op.f("ix_compare_tasks_status_id"), table_name="compare_tasks")
    op.drop_table("compare_tasks")
