"""Node health from the database: a node's probe history judged by ``kernelab.service.judge.health``.

Repository-style functions (``*, session``, never committing). A node's health *now* (its page,
``GET /nodes/{name}``) is computed on read from ``probe_reports`` (the report JSON holds every
figure), so a change of thresholds (``Settings.health_*``) applies to it at once.

A *result* is judged once and the judgement stored (``health_judgements``, ``job_judgement``):
against the node's band and the fleet's band as they stood at the measurement (``AsOf``: reports
taken up to the job's last probe and received up to the result's arrival), so later probes never
change what its comparison says. A re-judgement (``rejudge``: after a change of thresholds or
rules) is explicit and dated: a new row, whose notes say when and that it replaced an earlier one.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast

from pydantic import TypeAdapter
from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    Comparison,
    Flag,
    HealthJudgementPublic,
    HealthReason,
    JobResult,
    NodeHealth,
    NodeInfo,
    ProbeReport,
    read_stored,
)
from kernelab.service.judge import health, verdicts
from kernelab.service.judge.node_change import changed_since
from kernelab.service.server import models
from kernelab.service.server.core.config import Settings
from kernelab.service.server.models import utcnow

if TYPE_CHECKING:
    from kernelab.service.server.crud import StoredComparison

T = TypeVar("T")
HISTORY_FACTOR = 5  # a node's chain is evaluated over its last 5 x band_window reports
BANDS_TTL_S = 60.0  # longest a cached node history or fleet band is used without re-reading it
BANDS_CACHED = 256  # node histories and fleet bands a process keeps


class BandsCache:
    """Node histories (their bands) and fleet bands per GPU model, kept per process.

    An entry is keyed by the database, the node name or GPU model, the ``AsOf`` limit and the
    thresholds, and holds the *generation* it was computed at: the newest probe report id of the
    database (one indexed ``max(id)`` read per lookup). A new probe report (any process, any host)
    changes the generation, so the next lookup recomputes; an entry older than ``ttl_s`` seconds
    of ``clock`` (``time.monotonic``; a fake in tests) is recomputed too (a deleted report or
    result leaves the generation unchanged). At most ``size`` entries, least recently used out.
    """

    def __init__(self, *, ttl_s: float = BANDS_TTL_S, size: int = BANDS_CACHED,
                 clock: Callable[[], float] = time.monotonic):  # fmt: skip
        self.ttl_s = ttl_s
        self.size = size
        self.clock = clock
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, tuple[int | None, float, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<BandsCache entries={len(self._entries)} hits={self.hits} misses={self.misses}>"

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def get(self, session: Session, key: Hashable, compute: Callable[[], T]) -> T:
        """The value cached under ``key`` (made specific to ``session``'s database) if it is of the
        current generation and younger than ``ttl_s``, else ``compute()`` cached."""
        full = (session.get_bind().engine.url.render_as_string(hide_password=True), key)
        generation = session.scalar(select(func.max(models.ProbeReport.id)))
        now = self.clock()
        with self._lock:
            hit = self._entries.get(full)
            if hit is not None and hit[0] == generation and now - hit[1] < self.ttl_s:
                self._entries.move_to_end(full)
                self.hits += 1
                return cast(T, hit[2])
        value = compute()
        with self._lock:
            self.misses += 1
            self._entries[full] = (generation, now, value)
            self._entries.move_to_end(full)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return value


BANDS = BandsCache()
"""The process's cache of node histories and fleet bands (``node_history``, ``fleet_bands``)."""


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
        select(latest_result.c.node_name, models.Result.node).join(
            models.Result, models.Result.id == latest_result.c.id
        )
    ):
        out[name] = model_of(node) or out.get(name)
    return out


@dataclass(frozen=True)
class AsOf:
    """The probe reports a judgement may use: taken at or before ``taken`` and received at or before
    ``received`` (the database's state when a result arrived, whenever the judgement is made)."""

    taken: datetime
    received: datetime

    def where(self) -> ColumnElement[bool]:
        report = models.ProbeReport
        return and_(report.taken_at <= self.taken, report.received_at <= self.received)


def fleet_bands(
    *, session: Session, model: str | None, settings: Settings, as_of: AsOf | None = None
) -> dict[str, Any]:
    """Bands of GPU ``model`` over the fleet's last ``health_fleet_window`` reports of that model
    (of those ``as_of`` allows); cached per model until a probe report lands (``BANDS``). The
    answer is shared: do not mutate it."""
    if model is None:
        return {}
    key = ("fleet", model, as_of, settings.health_thresholds(), settings.health_fleet_window)
    return BANDS.get(session, key, lambda: _fleet_bands(session, model, settings, as_of))


def _fleet_bands(session: Session, model: str, settings: Settings, as_of: AsOf | None) -> dict[str, Any]:
    names = [n for n, m in node_models(session=session).items() if m == model]
    if not names:
        return {}
    query = select(models.ProbeReport.report).where(models.ProbeReport.node_name.in_(names))
    if as_of is not None:
        query = query.where(as_of.where())
    rows = session.scalars(
        query.order_by(models.ProbeReport.taken_at.desc(), models.ProbeReport.id.desc())
        .limit(settings.health_fleet_window)
    )  # fmt: skip
    reports = [read_stored(ProbeReport, r) for r in rows]
    return health.fleet_bands(reports, model, settings.health_thresholds())


def node_history(
    *,
    session: Session,
    name: str,
    settings: Settings,
    node: dict[str, Any] | None = None,
    as_of: AsOf | None = None,
) -> NodeHistory:
    """Node ``name``'s last ``HISTORY_FACTOR x health_band_window`` reports judged oldest first.

    ``node``: its fingerprint (``NodeInfo`` JSON) when the caller has it, for the fleet model.
    ``as_of``: only the reports it allows, node's and fleet's (a past job is judged by the bands of
    its day). Cached per node until a probe report lands (``BANDS``); the answer is shared: do not
    mutate it.
    """
    model = model_of(node) if node is not None else None
    key = ("node", name, node is not None, model, as_of, settings.health_thresholds())
    return BANDS.get(session, key, lambda: _node_history(session, name, settings, node, as_of))


def _node_history(
    session: Session, name: str, settings: Settings, node: dict[str, Any] | None, as_of: AsOf | None
) -> NodeHistory:
    thresholds = settings.health_thresholds()
    query = select(models.ProbeReport.id, models.ProbeReport.job_id, models.ProbeReport.report).where(
        models.ProbeReport.node_name == name
    )
    if as_of is not None:
        query = query.where(as_of.where())
    rows = list(session.execute(
        query.order_by(models.ProbeReport.taken_at.desc(), models.ProbeReport.id.desc())
        .limit(HISTORY_FACTOR * settings.health_band_window)
    ))[::-1]  # fmt: skip
    model = model_of(node) if node is not None else node_models(session=session).get(name)
    fleet = fleet_bands(session=session, model=model, settings=settings, as_of=as_of)
    reports = [read_stored(ProbeReport, r.report) for r in rows]
    history = health.evaluate_history(reports, fleet_bands=fleet, thresholds=thresholds)
    return NodeHistory([r.id for r in rows], [r.job_id for r in rows], reports, history, fleet, model)


def node_health(
    *, session: Session, name: str, settings: Settings, node: dict[str, Any] | None = None
) -> NodeHealth:
    """Node ``name``'s health now (``kernelab.service.judge.health.node_health`` over its stored history)."""
    h = node_history(session=session, name=name, settings=settings, node=node)
    thresholds = settings.health_thresholds()
    state = health.node_health(
        h.reports, fleet=h.fleet, thresholds=thresholds, model=h.model, history=h.history
    )
    device_type = str((node or {}).get("device_type") or "cuda")
    # fixed tolerances: the node's band may have learned from the changed reports themselves
    left = changed_since(h.reports, h.job_ids, device_type=device_type)
    if not left:
        return state
    reasons = [*state.reasons, *left]
    return state.model_copy(
        update={
            "status": health.status_of(reasons),
            "reasons": reasons,
            "flags": health.flags_of(reasons),
            "message": "; ".join(r.message for r in reasons),
        }
    )


@dataclass(frozen=True)
class Subject:
    """What ``job_health`` reads of a result: the node that measured it and its probes."""

    node: NodeInfo
    probes: list[ProbeReport]


def as_of(*, session: Session, result_id: int) -> AsOf:
    """What a result is judged against: reports taken up to its last stored probe (its
    ``finished_at`` without one) and received up to its own arrival (its probes included)."""
    row = session.get(models.Result, result_id)
    assert row is not None
    own = session.execute(
        select(func.max(models.ProbeReport.taken_at), func.max(models.ProbeReport.received_at))
        .where(models.ProbeReport.result_id == result_id)
    ).one()  # fmt: skip
    taken = own[0] if own[0] is not None else row.finished_at
    received = max(row.received_at, own[1]) if own[1] is not None else row.received_at
    return AsOf(taken=taken, received=received)


def job_health(
    *,
    session: Session,
    result: JobResult | Comparison | Subject,
    job_id: int | None,
    settings: Settings,
    as_of: AsOf | None = None,
) -> tuple[list[Flag], list[HealthReason]]:
    """Flags and reasons of the node that measured ``result``: its before/after probes stored under
    ``job_id`` judged in the node's history ``as_of`` (the bands of that day), or, for a result
    whose probes are not stored under a job, its probes judged against the node's bands ``as_of``
    (now, when None)."""
    h = node_history(
        session=session,
        name=result.node.hostname,
        settings=settings,
        node=result.node.model_dump(mode="json"),
        as_of=as_of,
    )
    reasons: list[HealthReason] = []
    if job_id is not None and job_id in h.job_ids:
        for jid, rs in zip(h.job_ids, h.history.reasons, strict=True):
            if jid == job_id:
                reasons += rs
    else:
        thresholds = settings.health_thresholds()
        previous: ProbeReport | None = None
        for report in sorted(result.probes, key=lambda r: r.taken_at):
            reasons += health.evaluate(
                report,
                node_bands=h.history.bands,
                fleet_bands=h.fleet,
                previous=previous,
                thresholds=thresholds,
            )
            previous = report
    return health.flags_of(reasons), reasons


def compare_job(
    *,
    session: Session,
    result: JobResult,
    job_id: int | None,
    settings: Settings,
    peaks: Mapping[str, float] | None = None,
) -> Comparison:
    """``kernelab.service.judge.stats.compare`` with the node-health flags and the note that says so (bands as
    they stand now: for a result that is not stored)."""
    from kernelab.service.judge.stats import compare

    flags, reasons = job_health(session=session, result=result, job_id=job_id, settings=settings)
    return compare(
        result, job_id=job_id, peaks=peaks, health_flags=flags, notes=health.report_notes(flags, reasons)
    )


_REASONS = TypeAdapter(list[HealthReason])


def _public(row: models.HealthJudgement) -> HealthJudgementPublic:
    return HealthJudgementPublic(
        trigger=row.trigger,  # type: ignore[arg-type]
        judged_at=row.judged_at,
        as_of=row.as_of,
        flags=row.flags,
        reasons=_REASONS.validate_python(row.reasons),
        notes=row.notes,
    )


def judgements(*, session: Session, result_id: int) -> list[HealthJudgementPublic]:
    """Every stored judgement of a result, oldest first (the last one holds)."""
    rows = session.scalars(
        select(models.HealthJudgement).where(models.HealthJudgement.result_id == result_id)
        .order_by(models.HealthJudgement.id)
    )  # fmt: skip
    return [_public(r) for r in rows]


def judge(
    *, session: Session, job_id: int, settings: Settings, trigger: Literal["ingest", "rejudge"] = "ingest"
) -> HealthJudgementPublic | None:
    """Judge the node health of ``job_id``'s stored result against the bands as of its measurement
    and store the judgement (a new ``health_judgements`` row dated now); None without a result.
    ``ingest``: the reports ``as_of`` allows (taken up to the job's last probe, received up to the
    result's arrival), so the first judgement is the same whenever it is made. ``rejudge``: the
    reports taken up to the job's last probe that are known now (late arrivals included), under
    the current thresholds, with a dated note naming the judgement it replaces."""
    row = session.scalar(select(models.Result).where(models.Result.job_id == job_id))
    if row is None:
        return None
    when = as_of(session=session, result_id=row.id)
    now = utcnow()
    if trigger == "rejudge":  # the node's state up to the measurement, as far as it is known now
        when = AsOf(taken=when.taken, received=now)
    probes = [read_stored(ProbeReport, r) for r in session.scalars(
        select(models.ProbeReport.report).where(models.ProbeReport.result_id == row.id)
        .order_by(models.ProbeReport.id))]  # fmt: skip
    subject = Subject(node=read_stored(NodeInfo, row.node), probes=probes)
    flags, reasons = job_health(session=session, result=subject, job_id=job_id, settings=settings, as_of=when)
    notes = health.report_notes(flags, reasons)
    if trigger == "rejudge":
        earlier = judgements(session=session, result_id=row.id)
        first = f" (first judged {earlier[0].judged_at:%Y-%m-%d %H:%M:%S} UTC)" if earlier else ""
        verdict = "not healthy" if flags else "healthy"
        notes.append(f"Node health re-judged on {now:%Y-%m-%d %H:%M:%S} UTC{first} against the bands as of "
                     f"{when.taken:%Y-%m-%d %H:%M:%S} UTC: {verdict}.")  # fmt: skip
    judgement = models.HealthJudgement(
        result_id=row.id, trigger=trigger, judged_at=now, as_of=when.taken, flags=list(flags),
        reasons=[r.model_dump(mode="json") for r in reasons], notes=notes,
    )  # fmt: skip
    session.add(judgement)
    session.flush()
    return _public(judgement)


def job_judgement(*, session: Session, job_id: int, settings: Settings) -> HealthJudgementPublic | None:
    """The judgement in force for ``job_id``'s result: the latest stored one, or (first read) one
    judged now against the bands as of the measurement and stored (the caller commits). None
    without a result."""
    latest = session.scalar(
        select(models.HealthJudgement)
        .join(models.Result, models.Result.id == models.HealthJudgement.result_id)
        .where(models.Result.job_id == job_id).order_by(models.HealthJudgement.id.desc()).limit(1)
    )  # fmt: skip
    if latest is not None:
        return _public(latest)
    return judge(session=session, job_id=job_id, settings=settings)


def with_health(
    comparison: Comparison,
    flags: Sequence[Flag],
    reasons: Sequence[HealthReason],
    notes: Sequence[str] | None = None,
) -> Comparison:
    """``comparison`` (computed without ``health_flags``) as ``compare(..., health_flags=flags,
    notes=...)`` would have given it: the flags added to every cell and to the job, the notes set
    (``notes``, else ``report_notes(flags, reasons)``). ``comparison`` is not changed; the copy
    shares its unchanged parts (cell statistics, probes), so neither may be mutated in place (a deep
    copy of a 1,000-cell comparison costs ~80 ms, more than the page that shows it)."""
    said = list(notes) if notes is not None else health.report_notes(list(flags), list(reasons))
    update: dict[str, Any] = {"notes": said}
    if flags:
        update["cells"] = [c.model_copy(update={"flags": verdicts.sorted_flags([*c.flags, *flags])})
                           for c in comparison.cells]  # fmt: skip
        update["flags"] = verdicts.sorted_flags([*comparison.flags, *flags])
    return comparison.model_copy(update=update)


def job_comparison(*, session: Session, job_id: int, settings: Settings) -> StoredComparison:
    """The job's stored comparison (``crud.stored_comparison``: computed by a compare worker, never
    here) with its stored node-health judgement applied (``job_judgement``) when it is ``ready``;
    its status (``none``, ``comparing``, ``failed``) otherwise."""
    from kernelab.service.server import crud

    stored = crud.stored_comparison(session=session, job_id=job_id)
    if stored.comparison is None:
        return stored
    judgement = job_judgement(session=session, job_id=job_id, settings=settings)
    if judgement is None:
        return stored
    applied = with_health(stored.comparison, judgement.flags, judgement.reasons, judgement.notes)
    return replace(stored, comparison=applied)
