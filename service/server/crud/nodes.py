"""Runners and nodes: registration, probe reports and readings, node summaries."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, union, update
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    NodeInfo,
    ProbeReport,
)
from kernelab.service.contract.schemas.probe_protocol import probes_with
from kernelab.service.server import models
from kernelab.service.server.auth import create_token
from kernelab.service.server.core.clock import db_now
from kernelab.service.server.models import TOKEN_NAME_CHARS, ProbeReading, Result, Runner


def register_runner(*, session: Session, name: str, node: NodeInfo | None) -> tuple[Runner, str]:
    """Create (or re-register) the runner ``name`` and issue its per-runner token (scope runner).

    Re-registering revokes the runner's earlier tokens. A ``node`` binds the runner (and so its
    token) to ``node.hostname``: probe reports and results for another node are refused
    (``kernelab.service.server.runner_identity``); a registration without a node keeps the earlier binding.
    Returns the row and the plain token.
    """
    runner = session.scalar(select(Runner).where(Runner.name == name))
    now = db_now()  # the queue's clock: kernelab_runners_alive compares last_seen_at with it
    if runner is None:
        runner = Runner(name=name)
        session.add(runner)
    else:
        session.execute(
            update(models.Token)
            .where(models.Token.runner_id == runner.id, models.Token.revoked_at.is_(None))
            .values(revoked_at=now)
        )
    if node is not None:
        runner.node = node.model_dump(mode="json")
        runner.node_name = node.hostname
    runner.last_seen_at = now
    session.flush()
    label = f"runner:{name}"[:TOKEN_NAME_CHARS]  # a runner's name may have 200 characters: 207
    return runner, create_token(session, label, ["runner"], runner_id=runner.id)


def runner_device_type(*, session: Session, runner_id: int) -> str | None:
    """The device type ("cpu"/"cuda") the runner registered with, None when unknown."""
    node = session.scalar(select(Runner.node).where(Runner.id == runner_id))
    return node.get("device_type") if node else None


def store_probe_report(
    *, session: Session, report: ProbeReport, node_name: str, runner_id: int | None,
    job_id: int | None = None, result_id: int | None = None,
) -> models.ProbeReport:  # fmt: skip
    """Store a probe report whole (JSON) and the readings of every probe that declares ``flat`` in
    the flat table (``probe_readings``: kind = the probe's name, one of ``models.READING_KINDS``)."""
    row = models.ProbeReport(
        runner_id=runner_id, node_name=node_name, job_id=job_id, result_id=result_id, phase=report.phase,
        taken_at=report.taken_at, wall_s=report.wall_s, nvml_status=report.nvml_status,
        report=report.model_dump(mode="json"),
    )  # fmt: skip
    session.add(row)
    session.flush()
    readings: list[dict[str, Any]] = [
        {"report_id": row.id, "kind": probe.name, **asdict(flat(r))}
        for probe in probes_with("flat")
        if (flat := probe.flat) is not None
        for r in probe.readings(report)
    ]
    if readings:
        session.execute(insert(ProbeReading), readings)
    return row


def recent_probe_reports(*, session: Session, node_name: str, limit: int = 50) -> list[models.ProbeReport]:
    """The node's latest probe reports, newest first."""
    return list(
        session.scalars(
            select(models.ProbeReport)
            .where(models.ProbeReport.node_name == node_name)
            .order_by(models.ProbeReport.taken_at.desc(), models.ProbeReport.id.desc())
            .limit(limit)
        )
    )


def probe_readings(*, session: Session, node_name: str, kind: str) -> list[dict[str, Any]]:
    """Flat readings of one kind for a node over time (for history plots), oldest first.

    Each row: ``taken_at`` (UTC), ``phase``, ``job_id``, ``device_index``, ``world_size``,
    ``size_bytes``, ``time_us``, ``value_gbps`` (copy: read+written GB/s; all-reduce: algbw),
    ``busbw_gbps``.
    """
    rows = session.execute(
        select(
            models.ProbeReport.taken_at,
            models.ProbeReport.phase,
            models.ProbeReport.job_id,
            ProbeReading.device_index,
            ProbeReading.world_size,
            ProbeReading.size_bytes,
            ProbeReading.time_us,
            ProbeReading.value_gbps,
            ProbeReading.busbw_gbps,
        )  # fmt: skip
        .join(models.ProbeReport, models.ProbeReport.id == ProbeReading.report_id)
        .where(models.ProbeReport.node_name == node_name, ProbeReading.kind == kind)
        .order_by(models.ProbeReport.taken_at, ProbeReading.id)
    )
    return [dict(r._mapping) for r in rows]


@dataclass(frozen=True)
class NodeSummary:
    """What the server knows about one node (hostname): last probe, counts, fingerprint."""

    name: str
    node: dict[str, Any] | None
    last_probe_at: datetime | None
    probe_reports: int
    results: int


def _node_names(session: Session) -> Any:
    return union(select(models.ProbeReport.node_name.label("name")), select(Result.node_name.label("name")))


def count_nodes(*, session: Session) -> int:
    """How many distinct nodes sent a probe report or a result."""
    return session.scalar(select(func.count()).select_from(_node_names(session).subquery())) or 0


def node_summary(*, session: Session, name: str) -> NodeSummary | None:
    """One node's summary; None when no probe report or result names it."""
    reports, last = session.execute(
        select(func.count(models.ProbeReport.id), func.max(models.ProbeReport.taken_at)).where(
            models.ProbeReport.node_name == name
        )
    ).one()
    results = session.scalar(select(func.count(Result.id)).where(Result.node_name == name)) or 0
    if not reports and not results:
        return None
    node = session.scalar(
        select(Result.node).where(Result.node_name == name).order_by(Result.id.desc()).limit(1)
    )
    if node is None:
        node = session.scalar(
            select(Runner.node).join(models.ProbeReport, models.ProbeReport.runner_id == Runner.id)
            .where(models.ProbeReport.node_name == name).order_by(models.ProbeReport.id.desc()).limit(1)
        )  # fmt: skip
    return NodeSummary(name, node, last, reports, results)


def list_nodes(*, session: Session, offset: int = 0, limit: int = 50) -> tuple[list[NodeSummary], int]:
    """A page of nodes by name, and the total count."""
    sub = _node_names(session).subquery()
    names = session.scalars(select(sub.c.name).order_by(sub.c.name).offset(offset).limit(limit))
    summaries = [node_summary(session=session, name=n) for n in names]
    return [s for s in summaries if s is not None], count_nodes(session=session)
