"""Structured logs and Prometheus metrics of the server.

Logs: ``KERNELAB_LOG_FORMAT=json`` makes every record of the ``service`` and ``uvicorn`` loggers
one JSON object per line: ``ts`` (UTC ISO 8601), ``level``, ``logger``, ``message`` and any
``extra={...}`` fields (``event``, ``job_id``, ``method``, ``path``, ``status``, ``duration_ms``).
Tokens never reach a log record (only token row ids and names do): our request log leaves out
query strings and headers. Each request is logged once, by ``RequestLogMiddleware`` (client,
method, path, status, duration): uvicorn's access log is silenced, as it would say the same again
(should a deployment turn it back on, its line loses its query string, ``RedactQueryFilter``:
``GET /login?token=...`` is logged as ``GET /login?<redacted>``).

Metrics (``GET /metrics``, Prometheus text format 0.0.4, rendered by ``prometheus_client``) are
read from the database at scrape time, so every uvicorn worker behind one PostgreSQL answers the
same numbers (no per-process counters, no ``PROMETHEUS_MULTIPROC_DIR``):

* ``kernelab_jobs{status}`` — jobs per status; ``kernelab_queue_depth`` — queued jobs;
* ``kernelab_runners_alive`` — runners seen (claim, heartbeat, registration) within
  ``KERNELAB_RUNNER_ALIVE_S``; ``kernelab_runners`` — all registered runners;
* ``kernelab_job_attempts{outcome}`` — claims by how they ended (``expired`` = lost leases);
* ``kernelab_job_duration_seconds`` — histogram of finished jobs' ``finished_at - started_at``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import Float, case, cast, func, select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelab.service.server.core.clock import db_now
from kernelab.service.server.models import JOB_STATUSES, Job, JobAttempt, Runner

JOB_DURATION_BUCKETS_S = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
"""Upper bounds of the job-duration histogram, seconds (a CPU smoke job .. a long GPU sweep)."""

_STANDARD_ATTRS = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

_OURS = "kernelab"  # the logger above every kernelab module's (``logging.getLogger(__name__)``)


class RedactQueryFilter(logging.Filter):
    """Replaces the query string of uvicorn's access-log records with ``<redacted>``.

    ``uvicorn.access`` logs ``'%s - "%s %s HTTP/%s" %d'`` with ``(client, method, full_path,
    http_version, status)`` (uvicorn ``httptools_impl``/``h11_impl``); ``full_path`` carries the
    query, where ``/login?token=`` puts a token. Records of other shapes pass unchanged.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str) and "?" in args[2]:
            record.args = (args[0], args[1], args[2].split("?", 1)[0] + "?<redacted>", *args[3:])
        return True


_REDACT = RedactQueryFilter()
_NOT_FIELDS = frozenset({"color_message"})  # uvicorn's ANSI-coloured copy of the message


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts``, ``level``, ``logger``, ``message``, the record's
    ``extra`` fields, and ``exc`` (formatted traceback) when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and key not in _NOT_FIELDS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure_logging(log_format: str, level: str) -> None:
    """Give the ``kernelab`` logger (above every kernelab module's) and the ``uvicorn`` loggers
    one stderr handler with the chosen format
    (``"json"`` or ``"text"``) at ``level``; silence uvicorn's access log (no handler, no
    propagation: uvicorn's HTTP protocol logs access lines only while ``uvicorn.access`` has a
    handler, and ``RequestLogMiddleware`` logs every request already) and give it the
    ``RedactQueryFilter`` should it be turned on again; idempotent (an app built twice adds no
    handler and no second filter)."""
    formatter: logging.Formatter = (
        JsonFormatter()
        if log_format == "json"
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    access = logging.getLogger("uvicorn.access")
    if _REDACT not in access.filters:
        access.addFilter(_REDACT)
    for handler in list(access.handlers):
        access.removeHandler(handler)
    access.propagate = False
    for name in (_OURS, "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if log_format != "json" and name != _OURS:
            continue  # uvicorn keeps its own text format
        ours = [h for h in logger.handlers if getattr(h, "_kernelab", False)]
        handler = ours[0] if ours else logging.StreamHandler()
        handler.setFormatter(formatter)
        handler._kernelab = True  # type: ignore[attr-defined]
        if not ours:
            logger.addHandler(handler)
        if name != _OURS:
            for other in [h for h in logger.handlers if not getattr(h, "_kernelab", False)]:
                logger.removeHandler(other)
            logger.propagate = False


class RequestLogMiddleware:
    """Logs every HTTP request once it is answered: ``event=request``, ``client`` (address:port),
    ``method``, ``path``, ``status``, ``duration_ms`` (logger ``kernelab.service.http``, level
    INFO; DEBUG for ``/healthz``, ``/readyz`` and ``/metrics`` so probes do not flood the log).
    The query string and headers are not logged (a ``/login?token=`` would leak)."""

    _QUIET = frozenset({"/healthz", "/readyz", "/metrics"})

    def __init__(self, app: ASGIApp):
        self.app = app
        self.log = logging.getLogger("kernelab.service.http")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def record_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, record_status)
        finally:
            path = scope.get("path", "")
            level = logging.DEBUG if path in self._QUIET else logging.INFO
            if self.log.isEnabledFor(level):  # skip building the record's fields when it is dropped
                self._log(level, scope, path, status, started)

    def _log(self, level: int, scope: Scope, path: str, status: int, started: float) -> None:
        method = scope.get("method", "")
        client = scope.get("client")
        address = f"{client[0]}:{client[1]}" if client else "-"
        duration_ms = round((time.perf_counter() - started) * 1e3, 3)
        self.log.log(
            level, "%s %s %s %d %.1f ms", address, method, path, status, duration_ms,
            extra={"event": "request", "client": address, "method": method, "path": path, "status": status,
                   "duration_ms": duration_ms},
        )  # fmt: skip


def _duration_s_expr(dialect: str) -> Any:
    """SQL expression of ``finished_at - started_at`` in seconds on ``dialect``."""
    if dialect == "postgresql":
        return func.extract("epoch", Job.finished_at - Job.started_at)
    return (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0  # SQLite: days


class DatabaseCollector(Collector):
    """A ``prometheus_client`` collector that reads the queue's state from the database on each
    scrape (4 small aggregate queries). ``alive_s``: how recently a runner must have been seen."""

    def __init__(self, factory: sessionmaker[Session], alive_s: float):
        self.factory = factory
        self.alive_s = alive_s

    def collect(self) -> Iterator[Any]:
        with self.factory() as session:
            by_status = dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
            jobs = GaugeMetricFamily("kernelab_jobs", "Jobs per status.", labels=["status"])
            for status in JOB_STATUSES:
                jobs.add_metric([status], by_status.get(status, 0))
            yield jobs
            yield GaugeMetricFamily("kernelab_queue_depth", "Jobs waiting for a runner.",
                                    value=by_status.get("queued", 0))  # fmt: skip
            since = db_now(-self.alive_s)  # last_seen_at is written by the database's clock
            alive = session.scalar(
                select(func.count()).select_from(Runner).where(Runner.last_seen_at >= since)
            )
            yield GaugeMetricFamily(
                "kernelab_runners_alive",
                f"Runners seen within the last {self.alive_s:g} s.",
                value=alive or 0,
            )
            total = session.scalar(select(func.count()).select_from(Runner))
            yield GaugeMetricFamily("kernelab_runners", "Registered runners.", value=total or 0)
            outcomes = dict(
                session.execute(select(JobAttempt.outcome, func.count()).group_by(JobAttempt.outcome)).all()
            )
            attempts = GaugeMetricFamily(
                "kernelab_job_attempts", "Job claims by outcome.", labels=["outcome"]
            )
            for outcome, n in sorted(outcomes.items()):
                attempts.add_metric([outcome], n)
            yield attempts
            yield self._durations(session)

    def _durations(self, session: Session) -> HistogramMetricFamily:
        duration = cast(_duration_s_expr(session.get_bind().dialect.name), Float)
        finished = (
            select(duration.label("d"))
            .where(
                Job.status.in_(("succeeded", "failed")),
                Job.started_at.is_not(None),
                Job.finished_at.is_not(None),
            )
            .subquery()
        )
        columns = [func.count(), func.coalesce(func.sum(finished.c.d), 0.0)] + [
            func.coalesce(func.sum(case((finished.c.d <= b, 1), else_=0)), 0) for b in JOB_DURATION_BUCKETS_S
        ]
        count, total, *cumulative = session.execute(select(*columns).select_from(finished)).one()
        buckets = [(f"{b:g}", float(c)) for b, c in zip(JOB_DURATION_BUCKETS_S, cumulative, strict=True)]
        buckets.append(("+Inf", float(count)))
        return HistogramMetricFamily(
            "kernelab_job_duration_seconds", "Wall time of finished jobs, started to finished.",
            buckets=buckets, sum_value=float(total),
        )  # fmt: skip


def metrics_registry(factory: sessionmaker[Session], *, alive_s: float) -> CollectorRegistry:
    """A registry holding only ``DatabaseCollector`` (no process metrics: they would differ by
    worker and mislead behind a load balancer)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DatabaseCollector(factory, alive_s))
    return registry


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry in Prometheus text format and its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST
