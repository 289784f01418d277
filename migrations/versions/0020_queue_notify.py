"""PostgreSQL: ``NOTIFY kernelab_queue`` when a job becomes queued, so waiting claims wake at once.

Revision ID: 0020_queue_notify
Revises: 0019_workloads
Create Date: 2026-12-04

A row trigger of ``jobs`` (after INSERT, and after UPDATE of ``status``, when the new status is
``queued``) calls ``pg_notify('kernelab_queue', '')``. PostgreSQL delivers a notification when the
writing transaction commits and folds identical ones of one transaction into one, so a sweep of
many jobs submitted together is one wake-up. Every server process listens on the channel
(``kernelab.service.server.queue_watch``). SQLite has no cross-process notification: its server processes
make TEMP triggers per connection instead (``kernelab.service.server.core.db``), so there is nothing to
migrate there. Source: PostgreSQL manual, "NOTIFY" and "CREATE TRIGGER".

Downgrade drops the trigger and its function.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0020_queue_notify"
down_revision: str | None = "0019_workloads"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        "CREATE FUNCTION kernelab_job_queued_notify() RETURNS trigger LANGUAGE plpgsql AS $$ "
        "BEGIN PERFORM pg_notify('kernelab_queue', ''); RETURN NULL; END $$"
    )
    op.execute(
        "CREATE TRIGGER kernelab_job_queued AFTER INSERT OR UPDATE OF status ON jobs "
        "FOR EACH ROW WHEN (NEW.status = 'queued') EXECUTE FUNCTION kernelab_job_queued_notify()"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("DROP TRIGGER IF EXISTS kernelab_job_queued ON jobs")
    op.execute("DROP FUNCTION IF EXISTS kernelab_job_queued_notify()")
