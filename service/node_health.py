"""Node health from the database: a node's probe history judged by ``service.health``.

Repository-style functions (``*, session``, never committing). Nothing is stored: bands and
verdicts are computed on read from ``probe_reports`` (the report JSON holds every figure), so a
change of thresholds (``Settings.health_*``) applies to the whole history at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service import health, models
from service.core.config import Settings
from service.schemas import Comparison, Flag, HealthReason, JobResult, NodeHealth, ProbeReport

HISTORY_FACTOR = 5  # a node's chain is evaluated over its last 5 x band_window reports


@dataclass(frozen=True)
class NodeHistory:
    """A node's recent reports oldest first, with their database ids, job ids and verdicts."""

    ids: list[int]
    job_ids: list[int | None]
    reports: list[ProbeReport]
    history: health.History
    fleet: dict[str, Any]
    model: str | None

    def reasons_by_id(self) -> dict[int, list[HealthReason]]:
        """Report id -> the reasons it was judged by (empty: healthy)."""
        return dict(zip(self.ids, self.history.reasons, strict=True))


def model_of(node: dict[str, Any] | None) -> str | None:
    """The GPU model a node's fingerprint (``NodeInfo`` JSON) names: ``device_name``, else its type."""
    if not node:
        return None
    return node.get("device_name") or node.get("device_type")


def node_models(*, session: Session) -> dict[str, str | None]:
    """Node name -> model, from each node's latest result, else the runner that sent its latest probe."""
    out: dict[str, str | None] = {}
    latest_probe = (
        select(models.ProbeReport.node_name, func.max(models.ProbeReport.id).label("id"))
        .group_by(models.ProbeReport.node_name).subquery()
    )  # fmt: skip
    rows = session.execute(
        select(latest_probe.c.node_name, models.Runner.node)
        .join(models.ProbeReport, models.ProbeReport.id == latest_probe.c.id)
        .join(models.Runner, models.Runner.id == models.ProbeReport.runner_id, isouter=True)
    )
    for name, node in rows:
        out[name] = model_of(node)
    latest_result = (
        select(models.Result.node_name, func.max(models.Result.id).label("id"))
        .group_by(models.Result.node_name).subquery()
    )  # fmt: skip
    for name, node in session.execute(
        select(latest_result.c.node_name, models.Result.node)
        .join(models.Result, models.Result.id == latest_result.c.id)
    ):
        out[name] = model_of(node) or out.get(name)
    return out


def fleet_bands(*, session: Session, model: str | None, settings: Settings) -> dict[str, Any]:
    """Bands of GPU ``model`` over the fleet's last ``health_fleet_window`` reports of that model."""
    if model is None:
        return {}
    names = [n for n, m in node_models(session=session).items() if m == model]
    if not names:
        return {}
    rows = session.scalars(
        select(models.ProbeReport.report).where(models.ProbeReport.node_name.in_(names))
        .order_by(models.ProbeReport.taken_at.desc()).limit(settings.health_fleet_window)
    )  # fmt: skip
    reports = [ProbeReport.model_validate(r) for r in rows]
    return health.fleet_bands(reports, model, settings.health_thresholds())


def node_history(
    *, session: Session, name: str, settings: Settings, node: dict[str, Any] | None = None,
    until_job: int | None = None,
) -> NodeHistory:
    """Node ``name``'s last ``HISTORY_FACTOR x health_band_window`` reports judged oldest first.

    ``node``: its fingerprint (``NodeInfo`` JSON) when the caller has it, for the fleet model.
    ``until_job``: end the history at that job's last stored report (a past job is judged by the
    band of its day).
    """
    thresholds = settings.health_thresholds()
    query = select(models.ProbeReport.id, models.ProbeReport.job_id, models.ProbeReport.report).where(
        models.ProbeReport.node_name == name
    )
    if until_job is not None:
        end = session.scalar(
            select(func.max(models.ProbeReport.taken_at)).where(models.ProbeReport.job_id == until_job)
        )
        if end is not None:
            query = query.where(models.ProbeReport.taken_at <= end)
    rows = list(session.execute(
        query.order_by(models.ProbeReport.taken_at.desc(), models.ProbeReport.id.desc())
        .limit(HISTORY_FACTOR * settings.health_band_window)
    ))[::-1]  # fmt: skip
    model = model_of(node) if node is not None else node_models(session=session).get(name)
    fleet = fleet_bands(session=session, model=model, settings=settings)
    reports = [ProbeReport.model_validate(r.report) for r in rows]
    history = health.evaluate_history(reports, fleet_bands=fleet, thresholds=thresholds)
    return NodeHistory([r.id for r in rows], [r.job_id for r in rows], reports, history, fleet, model)


def node_health(
    *, session: Session, name: str, settings: Settings, node: dict[str, Any] | None = None
) -> NodeHealth:
    """Node ``name``'s health now (``service.health.node_health`` over its stored history)."""
    h = node_history(session=session, name=name, settings=settings, node=node)
    thresholds = settings.health_thresholds()
    return health.node_health(h.reports, fleet=h.fleet, thresholds=thresholds, model=h.model)


def job_health(
    *, session: Session, result: JobResult | Comparison, job_id: int | None, settings: Settings
) -> tuple[list[Flag], list[HealthReason]]:
    """Flags and reasons of the node that measured ``result``: its before/after probes judged
    against the node's band as it stood then (stored reports of ``job_id``), or, for a result whose
    probes are not stored under a job, against the node's current band."""
    h = node_history(session=session, name=result.node.hostname, settings=settings,
                     node=result.node.model_dump(mode="json"), until_job=job_id)
    reasons: list[HealthReason] = []
    if job_id is not None and job_id in h.job_ids:
        for jid, rs in zip(h.job_ids, h.history.reasons, strict=True):
            if jid == job_id:
                reasons += rs
    else:
        thresholds = settings.health_thresholds()
        previous: ProbeReport | None = None
        for report in sorted(result.probes, key=lambda r: r.taken_at):
            reasons += health.evaluate(report, node_bands=h.history.bands, fleet_bands=h.fleet,
                                       previous=previous, thresholds=thresholds)
            previous = report
    return health.flags_of(reasons), reasons


def compare_job(
    *, session: Session, result: JobResult, job_id: int | None, settings: Settings,
    peaks: Mapping[str, float] | None = None,
) -> Comparison:
    """``service.stats.compare`` with the node-health flags and the note that says so."""
    from service.stats import compare

    flags, reasons = job_health(session=session, result=result, job_id=job_id, settings=settings)
    return compare(result, job_id=job_id, peaks=peaks, health_flags=flags,
                   notes=health.report_notes(flags, reasons))


def with_health(
    comparison: Comparison, flags: Sequence[Flag], reasons: Sequence[HealthReason]
) -> Comparison:
    """``comparison`` (computed without ``health_flags``) as ``compare(..., health_flags=flags,
    notes=report_notes(flags, reasons))`` would have given it: the flags added to every cell and to
    the job, the notes set. ``comparison`` is not changed; the copy shares its unchanged parts
    (cell statistics, probes), so neither may be mutated in place (a deep copy of a 1,000-cell
    comparison costs ~80 ms, more than the page that shows it)."""
    from service.stats import _sorted_flags

    update: dict[str, Any] = {"notes": list(health.report_notes(list(flags), list(reasons)))}
    if flags:
        update["cells"] = [c.model_copy(update={"flags": _sorted_flags([*c.flags, *flags])})
                           for c in comparison.cells]  # fmt: skip
        update["flags"] = _sorted_flags([*comparison.flags, *flags])
    return comparison.model_copy(update=update)


def job_comparison(
    *, session: Session, job_id: int, settings: Settings, result: JobResult | None = None
) -> Comparison | None:
    """``compare_job`` of the job's stored result, from its stored comparison (computed and stored
    on a miss, ``crud.base_comparison``) with the node-health flags applied now; None without a
    result."""
    from service import crud

    base = crud.base_comparison(session=session, job_id=job_id, result=result)
    if base is None:
        return None
    flags, reasons = job_health(session=session, result=base, job_id=job_id, settings=settings)
    return with_health(base, flags, reasons)


def excluded_job_ids(*, session: Session, job_ids: Sequence[int], settings: Settings) -> set[int]:
    """Of ``job_ids``, those whose probes made their node ``degraded`` or ``contended``: history views
    leave them out unless asked to include them."""
    wanted = set(job_ids)
    names = session.execute(
        select(models.ProbeReport.node_name).where(models.ProbeReport.job_id.in_(wanted)).distinct()
    ).scalars().all()
    out: set[int] = set()
    for name in names:
        h = node_history(session=session, name=name, settings=settings)
        out |= {jid for jid, rs in zip(h.job_ids, h.history.reasons, strict=True) if jid in wanted and rs}
    return out
