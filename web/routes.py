"""Dashboard pages: jobs list, job page, node page (server-rendered Jinja2, plotly figures).

``router`` is included by ``kernelab.app.create_app``, which also mounts ``/static`` from
``web/static``. Every page depends on the dashboard-access dependency of ``kernelab.service.server.api.deps``;
plotly.js itself is served from the plotly Python package at ``/assets/plotly.min.js`` (no CDN:
nodes may be offline). Autoescaping is on for every template; figures are embedded as JSON made
safe for ``<script>`` by ``kernelab.web.figures.figure_json``.

Pages read the database through ``kernelab.service.server.crud``. The job page shows the comparison a
compare worker stored (``results.comparison``; "comparing…" until then, never computed here) with
node-health flags applied on read; what it derives from a result is cached per process
(``kernelab.web.job_view``), since a stored result never changes. The view helpers here only
reshape schemas for the templates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import jinja2
import plotly
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.templating import Jinja2Templates
from sqlalchemy import func, select

from kernelab.service.contract.probes.all_reduce import PROBE as ALL_REDUCE
from kernelab.service.contract.probes.copy_bandwidth import PROBE as COPY
from kernelab.service.contract.schemas import (
    MAX_INT32,
    AtDoor,
    JobPublic,
    JobResult,
    JobSpec,
    JobStatus,
    NodeInfo,
    ProbeReport,
    Text,
    as_utc,
    read_stored,
)
from kernelab.service.contract.schemas.probe_protocol import probes_with
from kernelab.service.contract.units import format_bytes, format_seconds, format_sig3
from kernelab.service.judge import health
from kernelab.service.judge.report import (
    EXPLAINED_VERDICTS,
    STATE_NOTES,
    cell_speedup,
    estimator_note,
    void_timing,
    why,
)
from kernelab.service.judge.verdicts import FLAG_NOTES, VERDICT_ORDER
from kernelab.service.server import crud, history, models, node_health
from kernelab.service.server.api.deps import (
    DEFAULT_LIMIT,
    Limit,
    NodeName,
    Offset,
    SessionDep,
    SettingsDep,
    dashboard_access,
)
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.models import JOB_STATUSES
from kernelab.web import figures, job_view, sweep_view, verdict_style
from kernelab.web.job_view import CellOrder

API_PREFIX = "/api/v1"
STATIC_URL = "/static"
PLOTLY_JS_URL = "/assets/plotly.min.js"
PLOTLY_JS_PATH = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
NODE_READINGS = 100  # probe reports shown on a node page, newest first
RAW_FIGURE_SAMPLES = 20_000  # above this many samples a job page draws per-cell summaries, not samples
RAW_FIGURE_CELLS = 100  # above this many cells too: 2,000 boxes are neither readable nor light to draw
PENDING_REFRESH_S = 3  # the "comparison being computed" page reloads itself this often
TIMELINE_LINKS = 50  # up to this many cells the timeline lists a link per cell; above, previous/next
VERDICTS = VERDICT_ORDER
PHASE_ORDER = {"before": 0, "after": 1, "adhoc": 2}


def _duration(value_ns: float | None) -> str:
    """``1234.5`` (ns) → ``"1.23 µs"``, ``999.7`` → ``"1,000 ns"`` (three significant figures,
    ``format_sig3``: never ``"1e+03 ns"``); ``"—"`` for None."""
    if value_ns is None:
        return "—"
    unit, scale = figures.time_unit([value_ns])
    return f"{format_sig3(value_ns / scale)} {unit}"


def _pct(value: float | None) -> str:
    """Signed percentage to three significant figures (``format_sig3``, as the CLI and the Markdown
    write it): ``-12.34`` → ``"−12.3 %"``, ``327512.8`` → ``"+328,000 %"``, ``0.0412`` →
    ``"+0.0412 %"``; ``"—"`` for None."""
    if value is None:
        return "—"
    return f"{format_sig3(value, sign=True)} %".replace("-", "\u2212")


def _sci(value: float | None) -> str:
    return "—" if value is None else f"{value:.2e}"


def _num(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _rate(value: float | None) -> str:
    """A rate with 3 significant digits and thousands separators: ``812.4`` -> ``"812"``,
    ``0.01234`` -> ``"0.0123"``, ``12345.6`` -> ``"12,346"``; ``"—"`` for None."""
    if value is None:
        return "—"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _dt(value: datetime | None) -> str:
    """An aware datetime as ``"2026-12-01 02:00:00 UTC"`` (converted to UTC first); ``"—"`` for None."""
    return "—" if value is None else as_utc(value).strftime("%Y-%m-%d %H:%M:%S UTC")


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("kernelab.web", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(duration=_duration, pct=_pct, sci=_sci, num=_num, dt=_dt, bytes=format_bytes, why=why,
                       speedup=cell_speedup, rate=_rate, seconds=format_seconds)  # fmt: skip
    env.filters.update(devices=figures.device_text)
    env.filters.update(verdict_style.template_filters())
    env.tests.update(void_timing=void_timing, explained=lambda cell: cell.verdict in EXPLAINED_VERDICTS)
    env.globals.update(verdict_style.template_globals())
    env.globals.update(
        static_url=STATIC_URL,
        plotly_js_url=PLOTLY_JS_URL,
        api_prefix=API_PREFIX,
        verdicts=VERDICTS,
        flag_help=FLAG_NOTES,
        has_figures=False,
        estimator_note=estimator_note,
    )
    return env


templates = Jinja2Templates(env=_environment())
# Compile every page template now, when the app is imported (before it serves), not on a page's first
# request: job.html's first compile took ~0.9 s when it met the ingest's background comparison.
for _name in templates.env.list_templates(filter_func=lambda name: name.endswith(".html")):
    templates.env.get_template(_name)
router = APIRouter(include_in_schema=False, route_class=DoorRoute)


class SignInRequired(Exception):
    """A dashboard page asked without a token that may read it: answered with the sign-in form
    (``sign_in_page``), with the status and message the API would give (401, 403)."""

    def __init__(self, status_code: int, message: str):
        super().__init__(message)
        self.status_code = status_code
        self.message = message


def page_access(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))],
) -> None:
    """``dashboard_access`` for pages: its 401/403 become ``SignInRequired`` (the form, not JSON)."""
    try:
        dashboard_access(request, credentials)
    except HTTPException as exc:
        if exc.status_code not in (401, 403):
            raise
        raise SignInRequired(exc.status_code, str(exc.detail)) from None


async def sign_in_page(request: Request, exc: Exception) -> HTMLResponse:
    """The sign-in form for ``SignInRequired``, returning to the page asked for after signing in."""
    from kernelab.web.login import sign_in_form  # login renders this module's templates: imported late

    assert isinstance(exc, SignInRequired)
    asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    fresh = exc.status_code == 401 and not request.cookies.get("kernelab_token")
    message = "Sign in to see this page." if fresh else f"Your token cannot open this page ({exc.message})."
    return sign_in_form(request, message=message, status_code=exc.status_code, next_url=asked)


def install(app: Any) -> None:
    """Register the dashboard's exception handler on ``app`` (``create_app`` calls it)."""
    app.add_exception_handler(SignInRequired, sign_in_page)


DashboardAccess = [Depends(page_access)]


def device_word(device_type: str | None) -> str:
    """What a node's probed devices are called on the pages: ``"CPU"`` on a CPU node, ``"GPU"``
    on a CUDA or ROCm one, ``"device"`` when the node is not known."""
    return {"cpu": "CPU", "cuda": "GPU", "rocm": "GPU", "hip": "GPU"}.get(device_type or "", "device")


def probe_tables(reports: Iterable[ProbeReport], device_type: str | None = None) -> dict[str, Any]:
    """Probe readings pivoted for the templates: per registered probe that declares a ``pivot``
    (``kernelab.service.contract.probes``), one row per reading key, one group of columns per phase.

    Returns ``{"phases": [...], "reports": [...], "tables": [...], "device": device_word(device_type)}``:
    phases in before/after/adhoc order (reports too); each table ``{"probe", "id", "caption",
    "headers", "rows"}`` in report order, with ``headers`` the label headers (``{device}``
    replaced) and then ``f"{phase}{suffix}"`` per phase and value suffix, and each row
    ``{"key", "labels", "by_phase", "cells"}`` sorted by key: ``by_phase`` maps a phase to its
    reading, ``cells`` to its value cells (``probe_protocol.Cell``; a phase without a reading has
    none). A probe with no readings in any report has no table. When a phase was probed twice the
    later report wins.
    """
    ordered = sorted(reports, key=lambda r: (PHASE_ORDER[r.phase], r.taken_at))
    phases = list(dict.fromkeys(r.phase for r in ordered))
    word = device_word(device_type)
    tables = []
    for probe in probes_with("pivot"):
        pivot = probe.pivot
        assert pivot is not None
        rows: dict[tuple[Any, ...], dict[str, Any]] = {}
        for report in ordered:
            for reading in probe.readings(report):
                key = pivot.key(reading)
                row = rows.setdefault(
                    key, {"key": key, "labels": pivot.labels(reading), "by_phase": {}, "cells": {}}
                )
                row["by_phase"][report.phase] = reading
                row["cells"][report.phase] = pivot.values(reading)
        if not rows:
            continue
        headers = [h.format(device=word) for h in pivot.label_headers]
        tables.append(
            {
                "probe": probe.name,
                "id": pivot.table_id,
                "caption": pivot.caption,
                "label_headers": headers,
                "value_headers": [f"{phase}{suffix}" for phase in phases for suffix in pivot.value_suffixes],
                "width": len(pivot.value_suffixes),
                "rows": [rows[k] for k in sorted(rows)],
            }
        )
    return {"phases": phases, "reports": ordered, "tables": tables, "device": word}


def _workload_page(request: Request, session: Any, job: JobPublic) -> HTMLResponse:
    """A workload job's page: its gang and status while it waits or runs; then the tables of its
    stored comparison (``workload_report.tables``: phases and metrics with Δ% [CI] and verdict,
    per-rank times with the slowest rank, consistency, the runs with the probe after each), or
    "comparing…" (reloading) while a compare worker computes it. Never computes it."""
    from kernelab.service.judge.workload_report import tables, why_lines
    from kernelab.service.server import workload_store

    state = workload_store.comparison_state(session, job.id)
    c = state.comparison
    context: dict[str, Any] = {
        "job": job, "state": state.status, "comparison": c, "error": state.error,
        "tables": tables(c) if c is not None else [], "why": why_lines(c) if c is not None else [],
        "attempts": crud.attempts_page(session=session, job_id=job.id).data,
        "refresh_s": PENDING_REFRESH_S,
        "slowest": [(q.name, r.side, r.slowest_rank) for q in (c.quantities if c else []) for r in q.ranks
                    if r.slowest_rank is not None],
    }  # fmt: skip
    return templates.TemplateResponse(request, "job_workload.html", context)


def _not_found(request: Request, message: str) -> HTMLResponse:
    return templates.TemplateResponse(request, "not_found.html", {"message": message}, status_code=404)


@router.get(PLOTLY_JS_URL)
def plotly_js() -> FileResponse:
    """plotly.js from the installed plotly package (the version plotly.py's JSON is made for)."""
    return FileResponse(
        PLOTLY_JS_PATH, media_type="text/javascript", headers={"Cache-Control": "public, max-age=86400"}
    )


@router.get("/", response_class=HTMLResponse, dependencies=DashboardAccess)
def jobs_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    offset: Offset = 0,
    limit: Limit = DEFAULT_LIMIT,
    status: Annotated[JobStatus | Literal[""] | None, Query()] = None,
    benchmark: Annotated[Annotated[Text, AtDoor(max_length=500)] | None, Query()] = None,
) -> HTMLResponse:
    """Jobs, newest first, with status, node and verdict counts; paginated by offset/limit and
    filtered by ``status`` and ``benchmark`` (empty: all; an unknown status is a 422 naming it)."""
    filters = {k: v for k, v in (("status", status), ("benchmark", benchmark)) if v}
    page = crud.list_jobs(session=session, offset=offset, limit=limit, alive_s=settings.runner_alive_s,
                          **filters)  # fmt: skip
    return templates.TemplateResponse(
        request, "jobs.html", {"jobs": page.data, "count": page.count, "offset": offset, "limit": limit,
                               "filters": filters, "statuses": JOB_STATUSES,
                               "benchmarks": crud.job_benchmarks(session=session)},
    )  # fmt: skip


@router.get("/jobs/{job_id}", response_class=HTMLResponse, dependencies=DashboardAccess)
def job_page(
    request: Request,
    job_id: int,
    session: SessionDep,
    settings: SettingsDep,
    cell: Annotated[int | None, Query(ge=0, le=MAX_INT32)] = None,
    order: Annotated[CellOrder, Query()] = job_view.DEFAULT_ORDER,
    offset: Offset = 0,
    table: Annotated[Literal["cells", "axes"], Query()] = "cells",
) -> HTMLResponse:
    """One job: header, before/after table, sample and timeline figures, probe readings.

    ``cell`` picks the sweep cell whose timeline is drawn (default: the first with samples).
    ``order`` (``worst``, the default, ``index``, ``slowest``, ``fastest``, ``flagged``) and
    ``offset`` page the before/after table, ``job_view.CELLS_PER_PAGE`` rows at a time; the
    summary figure always shows every cell. A queued or running job shows its status and no
    table; a result whose comparison a compare worker has not stored yet shows "comparing…" and
    reloads itself (this process never computes it); one whose comparison failed says why. An
    unknown id answers the 404 page; a bad ``cell``/``order``/``offset`` a 422 naming the field.
    ``table``: ``cells`` (a column of cell labels) or ``axes`` (one column per sweep axis, as
    nvbench's tables).
    """
    job_row = session.get(models.Job, job_id)
    if job_row is None:
        return _not_found(request, f"There is no job #{job_id}.")
    job = crud.job_public(session=session, job=job_row, alive_s=settings.runner_alive_s)
    if not isinstance(job.spec, JobSpec):  # a workload job: its own page
        return _workload_page(request, session, job)
    row = job_view.result_row(session=session, job_id=job_id)
    context: dict[str, Any] = {
        "job": job, "has_result": row is not None, "result_error": row.error if row else None,
        "comparison": None, "pending": False, "comparison_error": None, "probes": probe_tables([]),
        "node_name": job.node_name,
        "attempts": crud.attempts_page(session=session, job_id=job_id).data,
        "threshold_pct": job.spec.measurement.threshold_pct, "state_notes": STATE_NOTES,
        "labels": dict(zip(("baseline", "candidate"), (job.spec.baseline.variant, job.spec.candidate.variant),
                           strict=True)),
    }  # fmt: skip
    if row is None:
        return templates.TemplateResponse(request, "job.html", context)
    context["node_name"] = row.node_name
    entry = job_view.JobPageCache.of(request.app).entry(row)
    if entry.n_samples is None:
        entry.n_samples = crud.count_samples(session=session, job_id=job_id)
    base = entry.base
    if base is None:
        stored = crud.stored_comparison(session=session, job_id=job_id)
        if stored.comparison is None:  # comparing (queued or being computed), or it failed
            context.update(pending=stored.status == "comparing", refresh_s=PENDING_REFRESH_S,
                           comparison_error=stored.error)  # fmt: skip
            return templates.TemplateResponse(request, "job.html", context)
        base = stored.comparison
    loaded: list[JobResult | None] = []

    def load() -> JobResult | None:  # a raw-sized result is read whole, once
        if not loaded:
            loaded.append(crud.load_result(session=session, job_id=job_id))
        return loaded[0]

    view = job_view.job_view(session=session, job_id=job_id, entry=entry, settings=settings, base=base)
    comparison = view.comparison
    raw = entry.n_samples <= RAW_FIGURE_SAMPLES and len(comparison.cells) <= RAW_FIGURE_CELLS
    if entry.samples_json is None and view.drawable:  # no samples: no empty chart
        if raw:
            result = load()
            assert result is not None
            entry.samples_json = figures.figure_json(figures.samples_figure_dict(result))
        else:  # a large sweep: the stored comparison draws the summary figure
            entry.samples_json = figures.figure_json(figures.samples_figure_dict(comparison))
    timeline_cell = cell if cell in view.drawable else (view.drawable[0] if view.drawable else None)
    timeline = None
    if timeline_cell is not None:
        timeline = job_view.timeline_json(session=session, job_id=job_id, entry=entry, comparison=comparison,
                                          cell=timeline_cell, load=load if raw else None)  # fmt: skip
    page = job_view.cell_page(view, order, offset)
    context.update(sweep_view.context(view, page.cells, request.query_params))
    context.update({
        "comparison": comparison, "has_figures": True, "page": page, "orders": job_view.CELL_ORDERS,
        # the table's order and page, kept by the links that pick a timeline cell or page on
        "query": {k: v for k, v in (("order", page.order), ("offset", page.offset), ("table", table))
                  if v not in (job_view.DEFAULT_ORDER, 0, "cells")},
        "table": table,
        "probes": probe_tables(comparison.probes, comparison.node.device_type),
        "labels": {"baseline": comparison.baseline_label, "candidate": comparison.candidate_label},
        "samples_json": entry.samples_json if view.drawable else None,
        "timeline_cell": timeline_cell, "timeline_json": timeline,
        "timeline_nav": _timeline_nav(view.drawable, timeline_cell),
        "timeline_label": next((c.label for c in comparison.cells if c.index == timeline_cell), None),
        "cell_labels": {c.index: c.label for c in comparison.cells} if len(comparison.cells) <= TIMELINE_LINKS
        else None,
    })  # fmt: skip
    return templates.TemplateResponse(request, "job.html", context)


def _timeline_nav(drawable: Sequence[int], current: int | None) -> dict[str, int | None]:
    """The drawable cells before and after ``current`` (None at the ends or without one)."""
    if current is None or current not in drawable:
        return {"previous": None, "next": None}
    i = drawable.index(current)
    return {"previous": drawable[i - 1] if i > 0 else None,
            "next": drawable[i + 1] if i + 1 < len(drawable) else None}  # fmt: skip


@router.get("/nodes/{name}", response_class=HTMLResponse, dependencies=DashboardAccess)
def node_page(request: Request, name: NodeName, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    """A node's health (status, reasons, bands) and recent probe readings: a history figure drawn
    against the healthy band and a table, newest first."""
    summary = crud.node_summary(session=session, name=name)
    if summary is None:
        return _not_found(request, f"No node named {name!r} has reported probes or results.")
    rows_db = crud.recent_probe_reports(session=session, node_name=name, limit=NODE_READINGS)
    reports = [(r.job_id, read_stored(ProbeReport, r.report)) for r in rows_db]
    readings = [report for _, report in reports]
    node = read_stored(NodeInfo, summary.node) if summary.node else None
    rows, small, large = _node_rows(reports)
    history = node_health.node_history(session=session, name=name, settings=settings, node=summary.node)
    state = health.node_health(
        history.reports,
        fleet=history.fleet,
        thresholds=settings.health_thresholds(),
        model=history.model,
        history=history.history,
    )
    device = device_word(node.device_type if node else None)
    unhealthy = [
        (r, health.status_of(rs) + ": " + "; ".join(figures.device_text(x.message, device) for x in rs))
        for r, rs in zip(history.reports, history.history.reasons, strict=True)
        if rs
    ]
    small_key = f" {health.size_label(small)} time" if small is not None else None
    drawn = [
        b
        for b in state.bands
        if b.figure.startswith("copy")
        or (small_key is not None and b.unit == "us" and b.figure.endswith(small_key))
    ]
    return templates.TemplateResponse(
        request,
        "node.html",
        {
            "node_name": name,
            "node": node,
            "rows": rows,
            "has_figures": True,
            "health": state,
            "small_label": format_bytes(small) if small is not None else "smallest",
            "large_label": format_bytes(large) if large is not None else "largest",
            "device": device,
            "history_json": figures.figure_json(
                figures.probe_history_figure(readings, drawn, unhealthy, device=device)
            ),
        },
    )


def _node_rows(
    reports: Sequence[tuple[int | None, ProbeReport]],
) -> tuple[list[dict[str, Any]], int | None, int | None]:
    """Table rows (newest first) with the mean copy GB/s, the smallest all-reduce size's time and
    the largest size's bus bandwidth; also returns those two sizes in bytes (None without data)."""
    sizes = sorted({a.size_bytes for _, r in reports for a in ALL_REDUCE.readings(r)})
    small, large = (sizes[0], sizes[-1]) if sizes else (None, None)
    rows = []
    for job_id, report in sorted(reports, key=lambda jr: jr[1].taken_at, reverse=True):
        copies = [c.bandwidth_gbps for c in COPY.readings(report)]
        by_size = {a.size_bytes: a for a in ALL_REDUCE.readings(report)}
        rows.append(
            {
                "job_id": job_id,
                "report": report,
                "copy_gbps": sum(copies) / len(copies) if copies else None,
                "small_us": by_size[small].time_us if small in by_size else None,
                "large_busbw_gbps": by_size[large].busbw_gbps if large in by_size else None,
            }
        )
    return rows, small, large


@router.get("/history", response_class=HTMLResponse, dependencies=DashboardAccess)
def history_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    benchmark: Annotated[Annotated[Text, AtDoor(max_length=500)] | None, Query(min_length=1)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = history.DEFAULT_JOBS,
    include_excluded: bool = False,
) -> HTMLResponse:
    """History of one benchmark, revision and ordinary jobs alike: median per launch of each side
    over time, one line per code, cell, GPU model, timer and state (``kernelab.service.server.history``), a
    figure
    and a table, newest first. Flagged and problem points are left out unless ``include_excluded``.
    Without ``benchmark``: the list of benchmarks that have history (``history_index``)."""
    if benchmark is None:
        return history_index(request, session)
    page = history.history(session=session, benchmark=benchmark, settings=settings,
                           include_excluded=include_excluded, limit=limit)  # fmt: skip
    return templates.TemplateResponse(
        request,
        "history.html",
        {
            "benchmark": benchmark,
            "page": page,
            "points": history.all_points(page),
            "has_figures": True,
            "limit": limit,
            "excluded_meaning": history.EXCLUDED_MEANING,
            "change_meaning": history.CHANGE_MEANING,
            "history_json": figures.figure_json(figures.history_figure(page.series)),
        },
    )


def history_index(request: Request, session: SessionDep) -> HTMLResponse:
    """``/history`` without a benchmark: every benchmark with history points, with its number of
    results and when it was last measured, newest first (one grouped query of ``history_points``)."""
    rows = session.execute(
        select(models.HistoryPoint.benchmark, func.count(func.distinct(models.HistoryPoint.result_id)),
               func.max(models.HistoryPoint.measured_at))
        .group_by(models.HistoryPoint.benchmark)
        .order_by(func.max(models.HistoryPoint.measured_at).desc())
    ).all()  # fmt: skip
    benchmarks = [{"name": name, "results": n, "last": last} for name, n, last in rows]
    return templates.TemplateResponse(request, "history_index.html", {"benchmarks": benchmarks})


from kernelab.web import history_pages  # noqa: E402  (its pages use this module's templates)

router.include_router(history_pages.router, dependencies=DashboardAccess)
