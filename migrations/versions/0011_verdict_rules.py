"""Verdict rules 2 (correctness outranks speed): stored judgements of the old rules are dropped.

Revision ID: 0011_verdict_rules
Revises: 0010_sample_blocks
Create Date: 2026-12-01

Under the first verdict rules a cell whose output was wrong kept its timing verdict (a wrong kernel
could read ``faster``), and a job none of whose cells measured could be ``succeeded``. Data only:

* ``results.comparison`` and ``jobs.summary`` are set to NULL for every stored result: readers
  judge the raw result again under the current rules and store the new comparison (the app also
  recomputes any stored comparison whose ``method_version`` is older);
* a ``succeeded`` job whose result has cells that all failed becomes ``failed`` with the error
  ``"all N cells failed; first: <error>"`` (the rule of ``service.verdicts.job_error``).

Downgrade changes nothing: the old rules recompute what they need from the raw results.
Plain table constructs through ``op.get_bind()``, never the app's ORM.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_verdict_rules"
down_revision: str | None = "0010_sample_blocks"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_jobs = sa.table(
    "jobs", sa.column("id", sa.Integer), sa.column("status", sa.String), sa.column("error", sa.Text),
    sa.column("summary", sa.JSON),
)  # fmt: skip
_results = sa.table(
    "results", sa.column("id", sa.Integer), sa.column("job_id", sa.Integer), sa.column("comparison", sa.JSON)
)
_cells = sa.table(
    "cells",
    sa.column("result_id", sa.Integer),
    sa.column("cell_index", sa.Integer),
    sa.column("error", sa.Text),
)


def upgrade() -> None:
    bind = op.get_bind()
    bind.execute(sa.update(_results).values(comparison=sa.null()))
    bind.execute(
        sa.update(_jobs).where(_jobs.c.id.in_(sa.select(_results.c.job_id))).values(summary=sa.null())
    )
    failed = (
        sa.select(_results.c.job_id, sa.func.count().label("n"))
        .select_from(_results.join(_cells, _cells.c.result_id == _results.c.id))
        .group_by(_results.c.job_id)
        .having(sa.func.count() == sa.func.count(_cells.c.error))
    )
    for job_id, n in bind.execute(failed).all():
        first = bind.execute(
            sa.select(_cells.c.error)
            .select_from(_cells.join(_results, _cells.c.result_id == _results.c.id))
            .where(_results.c.job_id == job_id)
            .order_by(_cells.c.cell_index)
            .limit(1)
        ).scalar_one()
        bind.execute(
            sa.update(_jobs)
            .where(_jobs.c.id == job_id, _jobs.c.status == "succeeded")
            .values(status="failed", error=f"all {n} cells failed; first: {first}")
        )


def downgrade() -> None:
    """Nothing to undo: the dropped judgements are recomputed from the raw results on read."""
