"""The benchmarks each runner advertises, and the benchmark each job needs.

Revision ID: 0014_runner_benchmarks
Revises: 0013_runner_node
Create Date: 2026-12-01

* ``runner_benchmarks``: one row per ``benchmark`` string a runner advertised with its claims
  (variants, the JSON Schema of its parameters and its digest, the code version;
  ``kernelab.service.contract.adverts``), replaced whenever the advertisement changes.
* ``runners.benchmarks_sha256``: the digest of the runner's whole advertisement (NULL: the runner
  never sent one, as every runner before this revision: it still claims any job).
* ``jobs.needs_benchmark``, ``jobs.schema_sha256``: the benchmark a runner must advertise to claim
  the job, and the digest of the schema it was accepted against; NULL for existing jobs and for
  jobs whose code comes from git revisions, which any runner may claim as before. Index
  ``(status, needs_benchmark, id)`` for the claim.

Downgrade drops the table, the columns and the index. Plain table constructs, never the app's ORM.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0014_runner_benchmarks"
down_revision: str | None = "0013_runner_node"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "runner_benchmarks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("runner_id", sa.Integer(), nullable=False),
        sa.Column("benchmark", sa.String(length=500), nullable=False),
        sa.Column("variants", _JSON, nullable=False),
        sa.Column("params_schema", _JSON, nullable=False),
        sa.Column("schema_sha256", sa.String(length=64), nullable=False),
        sa.Column("code_version", sa.String(length=200), nullable=True),
        sa.ForeignKeyConstraint(["runner_id"], ["runners.id"], ondelete="CASCADE",
                                name=op.f("fk_runner_benchmarks_runner_id_runners")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runner_benchmarks")),
        sa.UniqueConstraint("runner_id", "benchmark", name="uq_runner_benchmarks_runner_id_benchmark"),
    )  # fmt: skip
    op.create_index("ix_runner_benchmarks_benchmark", "runner_benchmarks", ["benchmark"])
    # plain ADD/DROP COLUMN on both databases (SQLite >= 3.35): a batch rebuild of ``jobs`` drops
    # the table, and with foreign keys on, its ON DELETE CASCADE would take every result with it
    op.add_column("runners", sa.Column("benchmarks_sha256", sa.String(length=64), nullable=True))
    op.add_column("jobs", sa.Column("needs_benchmark", sa.String(length=500), nullable=True))
    op.add_column("jobs", sa.Column("schema_sha256", sa.String(length=64), nullable=True))
    op.create_index("ix_jobs_status_needs_benchmark_id", "jobs", ["status", "needs_benchmark", "id"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_needs_benchmark_id", table_name="jobs")
    for table, column in (
        ("jobs", "schema_sha256"),
        ("jobs", "needs_benchmark"),
        ("runners", "benchmarks_sha256"),
    ):
        op.execute(f"ALTER TABLE {table} DROP COLUMN {column}")  # not a batch rebuild: see upgrade()
    op.drop_index("ix_runner_benchmarks_benchmark", table_name="runner_benchmarks")
    op.drop_table("runner_benchmarks")
