"""``/nodes``: probe reports in (runner), node list and node detail with recent probes (read; the
detail also to the node's own runner token).

A node is named by its hostname (``NodeInfo.hostname``), the name results carry.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, HTTPException, Request, Response, status
from pydantic import BaseModel

from kernelab.service.contract.schemas import NodeHealth, ProbeReport, read_stored
from kernelab.service.server import crud, node_health
from kernelab.service.server.api.deps import (
    DEFAULT_LIMIT,
    Limit,
    NodeName,
    NodeReaderToken,
    Offset,
    ReadToken,
    RunnerToken,
    SessionDep,
    SettingsDep,
    page_headers,
)
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.runner_identity import check_node

router = APIRouter(prefix="/nodes", tags=["nodes"], route_class=DoorRoute)


class ProbeStored(BaseModel):
    id: int
    node: str


class NodePublic(BaseModel):
    """A node: its last known fingerprint (``NodeInfo`` as JSON), last probe time, counts."""

    name: str
    node: dict[str, Any] | None = None
    last_probe_at: datetime | None = None
    probe_reports: int = 0
    results: int = 0


class NodesPage(BaseModel):
    data: list[NodePublic]
    count: int


class ProbeReportPublic(BaseModel):
    id: int
    job_id: int | None = None
    report: ProbeReport


class NodeDetail(NodePublic):
    """A node with its recent probe reports and its health: status (healthy / degraded /
    contended / unknown), the reasons, and the bands each probe figure is judged by."""

    probes: list[ProbeReportPublic]
    health: NodeHealth


@router.post("/{name}/probes", status_code=status.HTTP_201_CREATED)
def post_probe(
    name: NodeName, report: ProbeReport, principal: RunnerToken, session: SessionDep
) -> ProbeStored:
    """Store an on-demand (or periodic) probe report of node ``name``; 403 (``loc`` path/name)
    when the runner token is bound to another node (``kernelab.service.server.runner_identity``)."""
    check_node(session, principal, name, loc=("path", "name"))
    row = crud.store_probe_report(
        session=session, report=report, node_name=name, runner_id=principal.runner_id
    )
    return ProbeStored(id=row.id, node=name)


@router.get("")
def list_nodes(
    request: Request,
    response: Response,
    _: ReadToken,
    session: SessionDep,
    offset: Offset = 0,
    limit: Limit = DEFAULT_LIMIT,
) -> NodesPage:
    """Nodes that sent a probe report or a result, by name."""
    nodes, count = crud.list_nodes(session=session, offset=offset, limit=limit)
    response.headers.update(page_headers(request, total=count, offset=offset, limit=limit))
    return NodesPage(data=[NodePublic(**vars(n)) for n in nodes], count=count)


@router.get("/{name}")
def get_node(
    name: NodeName,
    _: NodeReaderToken,
    session: SessionDep,
    settings: SettingsDep,
    limit: Limit = DEFAULT_LIMIT,
) -> NodeDetail:
    """One node with its ``limit`` most recent probe reports, newest first, and its health
    (``kernelab.service.judge.health``; thresholds from ``KERNELAB_HEALTH_*``). 404 if unknown. A read
    token, or the node's own runner token (``deps.read_or_node_runner``)."""
    summary = crud.node_summary(session=session, name=name)
    if summary is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"node {name!r} has sent no probe report or result")
    rows = crud.recent_probe_reports(session=session, node_name=name, limit=limit)
    probes = [
        ProbeReportPublic(id=r.id, job_id=r.job_id, report=read_stored(ProbeReport, r.report)) for r in rows
    ]
    node_state = node_health.node_health(session=session, name=name, settings=settings, node=summary.node)
    return NodeDetail(**vars(summary), probes=probes, health=node_state)
