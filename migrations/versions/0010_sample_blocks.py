"""Raw samples stored columnar: ``sample_blocks`` (one row of arrays per cell) replaces ``samples``.

Revision ID: 0010_sample_blocks
Revises: 0009_comparison
Create Date: 2026-12-01

Each array column holds ``n`` little-endian numpy values, sample ``i`` at index ``i`` in posting
order (the old ``samples.id`` order): ``variant`` u1 (0 baseline, 1 candidate), ``round``,
``position``, ``launches`` <i4, ``duration_ns`` <f8, ``sm_clock_mhz``/``temperature_c``/``power_w``
<f8 with NaN for null, ``clock_event_reasons`` <i8 with -1 for null, ``throttled`` u1; a nullable
column is NULL when every value is null (``service.sample_blocks`` documents the same encoding).

Data: upgrade moves every cell's rows of ``samples`` into its block, downgrade writes the rows back
(same order, new ids); both work through ``op.get_bind()`` on plain table constructs, in chunks of
cells, and the code here is a frozen copy of the encoding (never the app's ORM or codec).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any

import numpy as np
import sqlalchemy as sa
from alembic import op

revision: str = "0010_sample_blocks"
down_revision: str | None = "0009_comparison"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FIELDS = (
    "variant", "round", "position", "duration_ns", "launches", "sm_clock_mhz", "clock_event_reasons",
    "temperature_c", "power_w", "throttled",
)  # fmt: skip
_DTYPES = {
    "variant": "u1", "round": "<i4", "position": "<i4", "duration_ns": "<f8", "launches": "<i4",
    "sm_clock_mhz": "<f8", "clock_event_reasons": "<i8", "temperature_c": "<f8", "power_w": "<f8",
    "throttled": "u1",
}  # fmt: skip
_NULLABLE = ("sm_clock_mhz", "clock_event_reasons", "temperature_c", "power_w")
_VARIANTS = ("baseline", "candidate")
_CELLS_PER_CHUNK = 500

samples = sa.table(
    "samples",
    sa.column("id", sa.BigInteger()), sa.column("cell_id", sa.Integer()), sa.column("variant", sa.String()),
    sa.column("round", sa.Integer()), sa.column("position", sa.Integer()),
    sa.column("duration_ns", sa.Float()), sa.column("launches", sa.Integer()),
    sa.column("sm_clock_mhz", sa.Float()), sa.column("clock_event_reasons", sa.BigInteger()),
    sa.column("temperature_c", sa.Float()), sa.column("power_w", sa.Float()),
    sa.column("throttled", sa.Boolean()),
)  # fmt: skip
blocks = sa.table(
    "sample_blocks",
    sa.column("id", sa.Integer()),
    sa.column("cell_id", sa.Integer()),
    sa.column("n", sa.Integer()),
    *(sa.column(name, sa.LargeBinary()) for name in _FIELDS),
)


def _create_samples_table() -> None:
    """``samples`` exactly as 0001 made it."""
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


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), _CELLS_PER_CHUNK):
        yield ids[i : i + _CELLS_PER_CHUNK]


def _encode(cell_id: int, rows: list[Any]) -> dict[str, Any]:
    """One block from one cell's ``samples`` rows (in id order)."""
    out: dict[str, Any] = {"cell_id": cell_id, "n": len(rows)}
    for name in _FIELDS:
        values = [getattr(r, name) for r in rows]
        if name == "variant":
            values = [_VARIANTS.index(v) for v in values]
        elif name in _NULLABLE:
            if all(v is None for v in values):
                out[name] = None
                continue
            # SQLite keeps no NaN (it reads back as NULL): NaN never is a value, only the null marker.
            null = -1 if name == "clock_event_reasons" else float("nan")
            values = [null if v is None else v for v in values]
        out[name] = np.array(values, dtype=_DTYPES[name]).tobytes()
    return out


def _decode(block: Any) -> list[dict[str, Any]]:
    """The ``samples`` rows of one block, in order."""
    n = block.n
    columns: dict[str, list[Any]] = {}
    for name in _FIELDS:
        data = getattr(block, name)
        if data is None:
            columns[name] = [None] * n
            continue
        values = np.frombuffer(data, dtype=_DTYPES[name], count=n).tolist()
        if name == "variant":
            values = [_VARIANTS[v] for v in values]
        elif name == "throttled":
            values = [bool(v) for v in values]
        elif name == "clock_event_reasons":
            values = [None if v < 0 else v for v in values]
        elif name in _NULLABLE:
            values = [None if v != v else v for v in values]
        columns[name] = values
    return [
        {"cell_id": block.cell_id, **dict(zip(_FIELDS, values, strict=True))}
        for values in zip(*(columns[name] for name in _FIELDS), strict=True)
    ]


def upgrade() -> None:
    op.create_table(
        "sample_blocks",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cell_id", sa.Integer(), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        *(sa.Column(name, sa.LargeBinary(), nullable=name in _NULLABLE) for name in _FIELDS),
        sa.CheckConstraint("n >= 0", name=op.f("ck_sample_blocks_n_nonnegative")),
        sa.ForeignKeyConstraint(
            ["cell_id"], ["cells.id"], name=op.f("fk_sample_blocks_cell_id_cells"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sample_blocks")),
        sa.UniqueConstraint("cell_id", name=op.f("uq_sample_blocks_cell_id")),
    )
    bind = op.get_bind()
    cell_ids = list(bind.scalars(sa.select(samples.c.cell_id).distinct().order_by(samples.c.cell_id)))
    for chunk in _chunks(cell_ids):
        query = sa.select(*samples.c).where(samples.c.cell_id.in_(chunk))
        rows = bind.execute(query.order_by(samples.c.cell_id, samples.c.id)).all()
        new = [_encode(cell_id, list(group)) for cell_id, group in groupby(rows, key=lambda r: r.cell_id)]
        bind.execute(blocks.insert(), new)
    with op.batch_alter_table("samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_samples_cell_id"))
    op.drop_table("samples")


def downgrade() -> None:
    _create_samples_table()
    bind = op.get_bind()
    block_ids = list(bind.scalars(sa.select(blocks.c.id).order_by(blocks.c.cell_id)))
    for chunk in _chunks(block_ids):
        query = sa.select(*blocks.c).where(blocks.c.id.in_(chunk)).order_by(blocks.c.cell_id)
        rows = [row for block in bind.execute(query).all() for row in _decode(block)]
        if rows:
            bind.execute(samples.insert(), rows)
    op.drop_table("sample_blocks")
