"""Stored health judgements, history points, and stored timestamps made aware.

Revision ID: 0012_history_health
Revises: 0011_verdict_rules
Create Date: 2026-12-01

* ``health_judgements``: a result's node-health judgement (flags, reasons, notes), judged once
  against the bands as of its measurement; a re-judgement adds a dated row.
* ``history_points``: one row per side and cell of a result, per GPU model, driver, timer and
  cold/warm state, for the history of revision and ordinary jobs; ``results.history_version``
  says which verdict rules built a result's points (NULL: not built yet; readers build them).
* Data: every ``taken_at`` in the stored probe report JSON is rewritten as aware UTC
  (``...Z``). A zone-less one is taken as UTC, as the ``probe_reports.taken_at`` column always
  stored it; one with an offset is converted (07:00+05:00 -> 02:00Z). Reports that mixed the two
  made every read of the node answer 500. Stored comparisons (which copy the probes) and the jobs'
  verdict summaries are set to NULL and recomputed by readers under the current rules (version 3:
  minimum rounds, per-sample clock-event reasons).

Downgrade drops the tables and the column; the rewritten timestamps stay aware (the older code
reads them too). Plain table constructs through ``op.get_bind()``, never the app's ORM.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0012_history_health"
down_revision: str | None = "0011_verdict_rules"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
TIME = sa.DateTime(timezone=True)  # service.models.UTCDateTime's column type
_BATCH = 500

_reports = sa.table("probe_reports", sa.column("id", sa.Integer), sa.column("report", sa.JSON))
_results = sa.table(
    "results", sa.column("id", sa.Integer), sa.column("job_id", sa.Integer), sa.column("comparison", sa.JSON)
)
_jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("summary", sa.JSON))


def _utc_text(value: Any) -> Any:
    """An ISO 8601 timestamp as aware UTC text (zone-less read as UTC); other values unchanged."""
    if not isinstance(value, str):
        return value
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return moment.isoformat().replace("+00:00", "Z")


def _normalise_reports(bind: sa.Connection) -> None:
    last = 0
    while True:
        rows = bind.execute(
            sa.select(_reports.c.id, _reports.c.report).where(_reports.c.id > last)
            .order_by(_reports.c.id).limit(_BATCH)
        ).all()  # fmt: skip
        if not rows:
            return
        for row_id, report in rows:
            fixed = _utc_text(report.get("taken_at")) if isinstance(report, dict) else None
            if fixed is not None and fixed != report.get("taken_at"):
                bind.execute(sa.update(_reports).where(_reports.c.id == row_id)
                             .values(report={**report, "taken_at": fixed}))  # fmt: skip
        last = rows[-1][0]


def upgrade() -> None:
    op.create_table(
        "health_judgements",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("trigger", sa.String(length=16), nullable=False),
        sa.Column("judged_at", TIME, nullable=False),
        sa.Column("as_of", TIME, nullable=False),
        sa.Column("flags", JSON, nullable=False),
        sa.Column("reasons", JSON, nullable=False),
        sa.Column("notes", JSON, nullable=False),
        sa.CheckConstraint("trigger IN ('ingest', 'rejudge')", name=op.f("ck_health_judgements_trigger")),
        sa.ForeignKeyConstraint(
            ["result_id"],
            ["results.id"],
            name=op.f("fk_health_judgements_result_id_results"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_health_judgements")),
    )
    op.create_index(op.f("ix_health_judgements_result_id"), "health_judgements", ["result_id"])
    op.create_table(
        "history_points",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("benchmark", sa.String(length=500), nullable=False),
        sa.Column("cell_index", sa.Integer(), nullable=False),
        sa.Column("cell", sa.Text(), nullable=False),
        sa.Column("params", JSON, nullable=False),
        sa.Column("side", sa.String(length=16), nullable=False),
        sa.Column("code", sa.Text(), nullable=False),
        sa.Column("sha", sa.String(length=64), nullable=False),
        sa.Column("gpu_model", sa.String(length=255), nullable=False),
        sa.Column("fingerprint", JSON, nullable=False),
        sa.Column("timer", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("median_ns", sa.Float(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        sa.Column("verdict", sa.String(length=32), nullable=False),
        sa.Column("measured_at", TIME, nullable=False),
        sa.Column("node_name", sa.String(length=255), nullable=False),
        sa.Column("excluded", sa.String(length=64), nullable=True),
        sa.CheckConstraint("side IN ('baseline', 'candidate')", name=op.f("ck_history_points_side")),
        sa.CheckConstraint("state IN ('cold', 'warm')", name=op.f("ck_history_points_state")),
        sa.CheckConstraint("n >= 0", name=op.f("ck_history_points_n_nonnegative")),
        sa.CheckConstraint("cell_index >= 0", name=op.f("ck_history_points_cell_index_nonnegative")),
        sa.ForeignKeyConstraint(
            ["result_id"],
            ["results.id"],
            name=op.f("fk_history_points_result_id_results"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_history_points_job_id_jobs"), ondelete="CASCADE"
        ),  # fmt: skip
        sa.PrimaryKeyConstraint("id", name=op.f("pk_history_points")),
        sa.UniqueConstraint("result_id", "cell_index", "side", name="uq_history_points_result_id_cell_side"),
    )
    op.create_index(op.f("ix_history_points_job_id"), "history_points", ["job_id"])
    op.create_index("ix_history_points_benchmark_measured_at", "history_points", ["benchmark", "measured_at"])
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("history_version", sa.Integer, nullable=True))

    bind = op.get_bind()
    _normalise_reports(bind)
    bind.execute(sa.update(_results).values(comparison=sa.null()))
    bind.execute(
        sa.update(_jobs).where(_jobs.c.id.in_(sa.select(_results.c.job_id))).values(summary=sa.null())
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        # Not a batch copy: recreating ``results`` would drop the old table, and SQLite's implicit
        # DELETE of a dropped table cascades to every cell and sample block (foreign_keys=ON).
        op.execute("ALTER TABLE results DROP COLUMN history_version")  # SQLite >= 3.35
    else:
        op.drop_column("results", "history_version")
    op.drop_index("ix_history_points_benchmark_measured_at", "history_points")
    op.drop_index(op.f("ix_history_points_job_id"), "history_points")
    op.drop_table("history_points")
    op.drop_index(op.f("ix_health_judgements_result_id"), "health_judgements")
    op.drop_table("health_judgements")
