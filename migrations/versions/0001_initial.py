"""Initial schema: tokens, runners, jobs and attempts, results, cells, samples, probes.

Revision ID: 0001
Revises:
Create Date: 2026-11-30

Written from ``service.models`` at the time and spelled out here in plain SQLAlchemy types
(migrations never import the app's ORM classes). ``UTC_DATETIME`` is what
``service.models.UTCDateTime`` stores; ``JSON`` is JSONB on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UTC_DATETIME = sa.DateTime(timezone=True)

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "runners",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("node", JSON, nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("last_seen_at", UTC_DATETIME, nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runners")),
        sa.UniqueConstraint("name", name=op.f("uq_runners_name")),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("scopes", JSON, nullable=False),
        sa.Column("runner_id", sa.Integer(), nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("revoked_at", UTC_DATETIME, nullable=True),
        sa.ForeignKeyConstraint(
            ["runner_id"], ["runners.id"], name=op.f("fk_tokens_runner_id_runners"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_tokens_token_sha256")),
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tokens_runner_id"), ["runner_id"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("benchmark", sa.String(length=500), nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("device", sa.String(length=8), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("lease_runner_id", sa.Integer(), nullable=True),
        sa.Column("lease_expires_at", UTC_DATETIME, nullable=True),
        sa.Column("created_at", UTC_DATETIME, nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=True),
        sa.Column("finished_at", UTC_DATETIME, nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("summary", JSON, nullable=True),
        sa.Column("submitted_by", sa.Integer(), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name=op.f("ck_jobs_status")
        ),
        sa.CheckConstraint("attempts >= 0", name=op.f("ck_jobs_attempts_nonnegative")),
        sa.CheckConstraint("max_attempts >= 1", name=op.f("ck_jobs_max_attempts_positive")),
        sa.CheckConstraint("device IN ('auto', 'cpu', 'cuda')", name=op.f("ck_jobs_device")),
        sa.ForeignKeyConstraint(
            ["lease_runner_id"],
            ["runners.id"],
            name=op.f("fk_jobs_lease_runner_id_runners"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["submitted_by"], ["tokens.id"], name=op.f("fk_jobs_submitted_by_tokens"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_status_id", ["status", "id"], unique=False)

    op.create_table(
        "job_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("runner_id", sa.Integer(), nullable=True),
        sa.Column("claimed_at", UTC_DATETIME, nullable=False),
        sa.Column("ended_at", UTC_DATETIME, nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('running', 'succeeded', 'failed', 'expired', 'cancelled')",
            name=op.f("ck_job_attempts_outcome"),
        ),
        sa.CheckConstraint("attempt >= 1", name=op.f("ck_job_attempts_attempt_positive")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_attempts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["runner_id"], ["runners.id"], name=op.f("fk_job_attempts_runner_id_runners"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_attempts")),
        sa.UniqueConstraint("job_id", "attempt", name="uq_job_attempts_job_id_attempt"),
    )
    op.create_table(
        "results",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("runner_id", sa.Integer(), nullable=True),
        sa.Column("node_name", sa.String(length=255), nullable=False),
        sa.Column("node", JSON, nullable=False),
        sa.Column("timer", sa.String(length=64), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("finished_at", UTC_DATETIME, nullable=False),
        sa.Column("received_at", UTC_DATETIME, nullable=False),
        sa.Column("spec", JSON, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_results_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["runner_id"], ["runners.id"], name=op.f("fk_results_runner_id_runners"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_results_idempotency_key")),
        sa.UniqueConstraint("job_id", name=op.f("uq_results_job_id")),
    )
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_results_node_name"), ["node_name"], unique=False)

    op.create_table(
        "cells",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("result_id", sa.Integer(), nullable=False),
        sa.Column("cell_index", sa.Integer(), nullable=False),
        sa.Column("params", JSON, nullable=False),
        sa.Column("baseline_params", JSON, nullable=False),
        sa.Column("candidate_params", JSON, nullable=False),
        sa.Column("work", JSON, nullable=False),
        sa.Column("correctness", JSON, nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint("cell_index >= 0", name=op.f("ck_cells_cell_index_nonnegative")),
        sa.ForeignKeyConstraint(
            ["result_id"], ["results.id"], name=op.f("fk_cells_result_id_results"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cells")),
        sa.UniqueConstraint("result_id", "cell_index", name="uq_cells_result_id_cell_index"),
    )
    op.create_table(
        "probe_reports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("runner_id", sa.Integer(), nullable=True),
        sa.Column("node_name", sa.String(length=255), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("result_id", sa.Integer(), nullable=True),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("taken_at", UTC_DATETIME, nullable=False),
        sa.Column("wall_s", sa.Float(), nullable=False),
        sa.Column("nvml_status", sa.Text(), nullable=False),
        sa.Column("report", JSON, nullable=False),
        sa.Column("received_at", UTC_DATETIME, nullable=False),
        sa.CheckConstraint("phase IN ('before', 'after', 'adhoc')", name=op.f("ck_probe_reports_phase")),
        sa.CheckConstraint("wall_s >= 0", name=op.f("ck_probe_reports_wall_s_nonnegative")),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_probe_reports_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["result_id"], ["results.id"], name=op.f("fk_probe_reports_result_id_results"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["runner_id"],
            ["runners.id"],
            name=op.f("fk_probe_reports_runner_id_runners"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probe_reports")),
    )
    with op.batch_alter_table("probe_reports", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_probe_reports_job_id"), ["job_id"], unique=False)
        batch_op.create_index("ix_probe_reports_node_name_taken_at", ["node_name", "taken_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_probe_reports_result_id"), ["result_id"], unique=False)

    op.create_table(
        "probe_readings",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("report_id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("device_index", sa.Integer(), nullable=True),
        sa.Column("world_size", sa.Integer(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("time_us", sa.Float(), nullable=False),
        sa.Column("value_gbps", sa.Float(), nullable=False),
        sa.Column("busbw_gbps", sa.Float(), nullable=True),
        sa.CheckConstraint("kind IN ('copy_bandwidth', 'all_reduce')", name=op.f("ck_probe_readings_kind")),
        sa.CheckConstraint("busbw_gbps >= 0", name=op.f("ck_probe_readings_busbw_gbps_nonnegative")),
        sa.CheckConstraint("size_bytes >= 0", name=op.f("ck_probe_readings_size_bytes_nonnegative")),
        sa.CheckConstraint("time_us >= 0", name=op.f("ck_probe_readings_time_us_nonnegative")),
        sa.CheckConstraint("value_gbps >= 0", name=op.f("ck_probe_readings_value_gbps_nonnegative")),
        sa.ForeignKeyConstraint(
            ["report_id"],
            ["probe_reports.id"],
            name=op.f("fk_probe_readings_report_id_probe_reports"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_probe_readings")),
    )
    with op.batch_alter_table("probe_readings", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_probe_readings_report_id"), ["report_id"], unique=False)

    op.create_table(
        "samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("cell_id", sa.Integer(), nullable=False),
        sa.Column("variant", sa.String(length=16), nullable=False),
        sa.Column("round", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("duration_ns", sa.Float(), nullable=False),
        sa.Column("launches", sa.Integer(), nullable=False),
        sa.Column("sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("clock_event_reasons", sa.BigInteger(), nullable=True),
        sa.Column("temperature_c", sa.Float(), nullable=True),
        sa.Column("power_w", sa.Float(), nullable=True),
        sa.Column("throttled", sa.Boolean(), nullable=False),
        sa.CheckConstraint("variant IN ('baseline', 'candidate')", name=op.f("ck_samples_variant")),
        sa.CheckConstraint("duration_ns >= 0", name=op.f("ck_samples_duration_ns_nonnegative")),
        sa.CheckConstraint("launches >= 1", name=op.f("ck_samples_launches_positive")),
        sa.CheckConstraint("position >= 0", name=op.f("ck_samples_position_nonnegative")),
        sa.CheckConstraint("power_w >= 0", name=op.f("ck_samples_power_w_nonnegative")),
        sa.CheckConstraint("round >= 0", name=op.f("ck_samples_round_nonnegative")),
        sa.CheckConstraint("sm_clock_mhz >= 0", name=op.f("ck_samples_sm_clock_mhz_nonnegative")),
        sa.ForeignKeyConstraint(
            ["cell_id"], ["cells.id"], name=op.f("fk_samples_cell_id_cells"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
    )
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_samples_cell_id"), ["cell_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_samples_cell_id"))

    op.drop_table("samples")
    with op.batch_alter_table("probe_readings", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_probe_readings_report_id"))

    op.drop_table("probe_readings")
    with op.batch_alter_table("probe_reports", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_probe_reports_result_id"))
        batch_op.drop_index("ix_probe_reports_node_name_taken_at")
        batch_op.drop_index(batch_op.f("ix_probe_reports_job_id"))

    op.drop_table("probe_reports")
    op.drop_table("cells")
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_results_node_name"))

    op.drop_table("results")
    op.drop_table("job_attempts")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_status_id")

    op.drop_table("jobs")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tokens_runner_id"))

    op.drop_table("tokens")
    op.drop_table("runners")
