"""A runner's node: the node name its token is bound to.

Revision ID: 0013_runner_node
Revises: 0012_history_health
Create Date: 2026-12-01

* ``runners.node_name``: the node (``NodeInfo.hostname``) a runner, and so every token of that
  runner, speaks for. Probe reports and results for another node are refused with 403
  (``service.runner_identity``).
* Data: a runner registered with a node (``runners.node`` JSON with a ``hostname``) is bound to
  that hostname now, so existing tokens keep working for their own node and no other. A runner
  registered without a node stays unbound (NULL) until its next registration names one, or until
  its first probe report or result binds it (first use).

Downgrade drops the column. Plain table constructs through ``op.get_bind()``, never the app's ORM.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_runner_node"
down_revision: str | None = "0012_history_health"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

MAX_NODE_NAME = 255  # NodeInfo.hostname's max_length

_runners = sa.table("runners", sa.column("id", sa.Integer), sa.column("node", sa.JSON),
                    sa.column("node_name", sa.String))  # fmt: skip


def upgrade() -> None:
    with op.batch_alter_table("runners") as batch:
        batch.add_column(sa.Column("node_name", sa.String(length=MAX_NODE_NAME), nullable=True))
    bind = op.get_bind()
    for row_id, node in bind.execute(sa.select(_runners.c.id, _runners.c.node)).all():
        hostname = node.get("hostname") if isinstance(node, dict) else None
        if isinstance(hostname, str) and 0 < len(hostname) <= MAX_NODE_NAME:
            bind.execute(sa.update(_runners).where(_runners.c.id == row_id).values(node_name=hostname))


def downgrade() -> None:
    with op.batch_alter_table("runners") as batch:
        batch.drop_column("node_name")
