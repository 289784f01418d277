"""SQLAlchemy 2.0 ORM of the result database (tokens, runners, jobs, results, samples, probes).

What a result *is* (spec, node fingerprint, timer) is stored apart from its raw samples, as
conbench does. Units are in column names; ``CHECK (x >= 0)`` where it holds. Times are UTC
(``UTCDateTime``: aware datetimes in and out, on SQLite too). JSON columns are JSONB on PostgreSQL.
The schema is created only by Alembic (``migrations/``); ``tests/service/test_migrations.py``
checks that the migrations and these classes agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JOB_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
ATTEMPT_OUTCOMES = ("running", "succeeded", "failed", "expired", "cancelled")
PROBE_PHASES = ("before", "after", "adhoc")
READING_KINDS = ("copy_bandwidth", "all_reduce")
SIDES = ("baseline", "candidate")
JOB_DEVICES = ("auto", "cpu", "cuda")
JUDGEMENT_TRIGGERS = ("ingest", "rejudge")
TIMING_STATES = ("cold", "warm")
TASK_KINDS = ("compare", "pair", "workload")
JOB_KINDS = ("benchmark", "workload")
TASK_STATUSES = ("queued", "running", "done", "failed")
BISECT_STATUSES = ("running", "found", "stopped")


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """``DateTime(timezone=True)`` that always returns aware UTC datetimes.

    SQLite has no time zones: values are stored as naive UTC text (so ``<`` compares correctly)
    and given ``tzinfo=UTC`` when read. Naive datetimes passed in are taken to be UTC.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType, list[Any]: JSONType}


TOKEN_NAME_CHARS = 200  # tokens.name


class Token(Base):
    """A bearer token: only its SHA-256 hex digest is stored (tokens are 32 random bytes)."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(TOKEN_NAME_CHARS))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]]
    runner_id: Mapped[int | None] = mapped_column(ForeignKey("runners.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


class Runner(Base):
    """The server's record of a runner daemon (``kernelab.runners.daemon.RunnerDaemon``, one per
    node); ``node`` is its last ``NodeInfo`` as JSON; ``node_name``
    the node its tokens are bound to (``service.runner_identity``; NULL: not bound yet)."""

    __tablename__ = "runners"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    node: Mapped[dict[str, Any] | None]
    node_name: Mapped[str | None] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_seen_at: Mapped[datetime | None]
    benchmarks_sha256: Mapped[str | None] = mapped_column(
        String(64), doc="digest of the runner's advertisement (runner_benchmarks); NULL: never sent one"
    )
    workloads: Mapped[bool] = mapped_column(
        server_default=text("false"), doc="its claims say it runs workload jobs (0019; the server's default)"
    )


class RunnerBenchmark(Base):
    """One ``benchmark`` string a runner advertised (``kernelab.service.contract.adverts.BenchmarkAdvert``,
    one row per name it answers to): the schema its claims are routed by (``service.offers``)."""

    __tablename__ = "runner_benchmarks"
    __table_args__ = (
        UniqueConstraint("runner_id", "benchmark", name="uq_runner_benchmarks_runner_id_benchmark"),
        Index("ix_runner_benchmarks_benchmark", "benchmark"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    runner_id: Mapped[int] = mapped_column(ForeignKey("runners.id", ondelete="CASCADE"))
    benchmark: Mapped[str] = mapped_column(String(500))
    variants: Mapped[list[Any]]
    params_schema: Mapped[dict[str, Any]]
    schema_sha256: Mapped[str] = mapped_column(String(64))
    code_version: Mapped[str | None] = mapped_column(String(200))


class Job(Base):
    """A queued benchmark job; the lease columns say which runner holds it and until when."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(_in("status", JOB_STATUSES), name="status"),
        CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
        CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
        CheckConstraint(_in("device", JOB_DEVICES), name="device"),
        Index("ix_jobs_status_id", "status", "id"),
        Index("ix_jobs_status_needs_benchmark_id", "status", "needs_benchmark", "id"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    benchmark: Mapped[str] = mapped_column(String(500))
    spec: Mapped[dict[str, Any]]
    device: Mapped[str] = mapped_column(String(8), default="auto", doc="spec.device, for claim filters")
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    lease_runner_id: Mapped[int | None] = mapped_column(ForeignKey("runners.id", ondelete="SET NULL"))
    lease_expires_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)
    summary: Mapped[dict[str, Any] | None]
    submitted_by: Mapped[int | None] = mapped_column(ForeignKey("tokens.id", ondelete="SET NULL"))
    needs_benchmark: Mapped[str | None] = mapped_column(
        String(500), doc="the benchmark a claiming runner must advertise; NULL: any runner (sourced jobs)"
    )
    schema_sha256: Mapped[str | None] = mapped_column(
        String(64), doc="digest of the advertised Params schema the spec was accepted against"
    )
    progress: Mapped[dict[str, Any] | None] = mapped_column(
        doc="schemas.JobProgress of the runner's last heartbeat with one; NULL until then (reset per claim)"
    )
    progress_at: Mapped[datetime | None] = mapped_column(doc="when that heartbeat arrived (database clock)")
    rerun_of: Mapped[int | None] = mapped_column(
        Integer, doc="the id of the job this one re-runs (no FK: migration 0017)"
    )
    kind: Mapped[str] = mapped_column(
        String(16), default="benchmark", server_default="benchmark", doc="benchmark or workload (0019)"
    )
    nnodes: Mapped[int] = mapped_column(
        Integer,
        default=1,
        server_default="1",
        doc="runners that claim it together (a workload's launch.nnodes)",
    )


class JobAttempt(Base):
    """One claim of a job by a runner, and how it ended."""

    __tablename__ = "job_attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", name="uq_job_attempts_job_id_attempt"),
        CheckConstraint(_in("outcome", ATTEMPT_OUTCOMES), name="outcome"),
        CheckConstraint("attempt >= 1", name="attempt_positive"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    runner_id: Mapped[int | None] = mapped_column(ForeignKey("runners.id", ondelete="SET NULL"))
    claimed_at: Mapped[datetime] = mapped_column(default=utcnow)
    ended_at: Mapped[datetime | None]
    outcome: Mapped[str] = mapped_column(String(16), default="running")
    error: Mapped[str | None] = mapped_column(Text)


class Result(Base):
    """What one job measured: the spec as run, the node fingerprint, the timer. One per job."""

    __tablename__ = "results"
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    idempotency_key: Mapped[str] = mapped_column(String(200), unique=True)
    runner_id: Mapped[int | None] = mapped_column(ForeignKey("runners.id", ondelete="SET NULL"))
    node_name: Mapped[str] = mapped_column(String(255), index=True)
    node: Mapped[dict[str, Any]]
    timer: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime]
    finished_at: Mapped[datetime]
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    spec: Mapped[dict[str, Any]]
    error: Mapped[str | None] = mapped_column(Text)
    # ``stats.compare`` of the result without node-health flags (applied on read); NULL until computed.
    comparison: Mapped[dict[str, Any] | None]
    # ``verdicts.METHOD_VERSION`` of the result's ``history_points``; NULL until they are built.
    history_version: Mapped[int | None] = mapped_column(Integer)


class CompareTask(Base):
    """Queued statistics, computed off the request path (``kernelab.service.server.compare_queue``). Kind
    ``compare``: compute and store the comparison of one stored result (``result_id``, its
    ``job_id``). Kind ``pair``: job vs job, job ``pair_job_id`` against job ``job_id`` on ``side``
    (``kernelab.service.server.job_vs_job``), its answer kept in ``output``. Leased like a job
    (``worker`` holds it until ``lease_expires_at``, by the database's clock); ``attempts``
    counts claims."""

    __tablename__ = "compare_tasks"
    __table_args__ = (
        CheckConstraint(_in("kind", TASK_KINDS), name="kind"),
        CheckConstraint(_in("status", TASK_STATUSES), name="status"),
        CheckConstraint("attempts >= 0", name="attempts_nonnegative"),
        CheckConstraint("max_attempts >= 1", name="max_attempts_positive"),
        CheckConstraint("kind <> 'compare' OR result_id IS NOT NULL", name="compare_has_result"),
        CheckConstraint(
            "kind <> 'pair' OR (job_id IS NOT NULL AND pair_job_id IS NOT NULL AND side IS NOT NULL)",
            name="pair_has_jobs",
        ),
        CheckConstraint("kind <> 'workload' OR job_id IS NOT NULL", name="workload_has_job"),
        Index("ix_compare_tasks_status_id", "status", "id"),
        Index(
            "ux_compare_tasks_workload",
            "job_id",
            unique=True,
            sqlite_where=text("kind = 'workload'"),
            postgresql_where=text("kind = 'workload'"),
        ),
        Index(
            "ux_compare_tasks_pair",
            "job_id",
            "pair_job_id",
            "side",
            unique=True,
            sqlite_where=text("kind = 'pair'"),
            postgresql_where=text("kind = 'pair'"),
        ),  # fmt: skip
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), default="compare")
    result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"), unique=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    pair_job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), doc="kind pair: job B, compared against job_id (A)"
    )
    side: Mapped[str | None] = mapped_column(String(16), doc="kind pair: the side of both jobs compared")
    output: Mapped[dict[str, Any] | None] = mapped_column(
        doc="kind pair: the job-vs-job answer (JobVsJob JSON) and the verdict rules' method_version"
    )
    status: Mapped[str] = mapped_column(String(16), default="queued")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer)
    worker: Mapped[str | None] = mapped_column(String(255), doc="the lease holder (host:pid)")
    lease_expires_at: Mapped[datetime | None]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    error: Mapped[str | None] = mapped_column(Text)


class GangMember(Base):
    """One runner's seat in a workload job's attempt (``kernelab.service.server.gangs``): its node rank,
    the rendezvous endpoint it offered (rank 0's is the gang's), its own lease (the job's lease is
    the earliest of its members' that have not posted), and when it posted its result."""

    __tablename__ = "gang_members"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", "node_rank", name="uq_gang_members_job_id_attempt_rank"),
        UniqueConstraint("job_id", "attempt", "runner_id", name="uq_gang_members_job_id_attempt_runner"),
        CheckConstraint("node_rank >= 0", name="node_rank_nonnegative"),
        CheckConstraint("attempt >= 1", name="attempt_positive"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    node_rank: Mapped[int] = mapped_column(Integer)
    runner_id: Mapped[int] = mapped_column(ForeignKey("runners.id", ondelete="CASCADE"))
    endpoint: Mapped[str | None] = mapped_column(String(300), doc="host:port of its c10d rendezvous offer")
    joined_at: Mapped[datetime] = mapped_column(default=utcnow)
    lease_expires_at: Mapped[datetime]
    posted_at: Mapped[datetime | None]


class WorkloadResultRow(Base):
    """The raw ``schemas.WorkloadResult`` one node of a workload job's attempt posted (one row per
    node rank); the compare worker merges the nodes' rows and judges them (``compare_tasks`` of
    kind ``workload``, the ``WorkloadComparison`` in the task's ``output``)."""

    __tablename__ = "workload_results"
    __table_args__ = (
        UniqueConstraint("job_id", "node_rank", name="uq_workload_results_job_id_node_rank"),
        CheckConstraint("node_rank >= 0", name="node_rank_nonnegative"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    node_rank: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str] = mapped_column(String(200), unique=True)
    runner_id: Mapped[int | None] = mapped_column(ForeignKey("runners.id", ondelete="SET NULL"))
    node_name: Mapped[str] = mapped_column(String(255))
    result: Mapped[dict[str, Any]]
    received_at: Mapped[datetime] = mapped_column(default=utcnow)


class Cell(Base):
    """One sweep cell of a result: parameters, declared work, correctness per variant."""

    __tablename__ = "cells"
    __table_args__ = (
        UniqueConstraint("result_id", "cell_index", name="uq_cells_result_id_cell_index"),
        CheckConstraint("cell_index >= 0", name="cell_index_nonnegative"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"))
    cell_index: Mapped[int] = mapped_column(Integer)
    params: Mapped[dict[str, Any]]
    baseline_params: Mapped[dict[str, Any]]
    candidate_params: Mapped[dict[str, Any]]
    work: Mapped[dict[str, Any]]
    correctness: Mapped[dict[str, Any]]
    error: Mapped[str | None] = mapped_column(Text)
    # How the cell was measured: {"timers": {variant: timer kind}, "contention": [ContentionReading]}
    # (migration 0003_timing; None for results stored before it).
    context: Mapped[dict[str, Any] | None]
    # schemas.StaticComparison of the cell (migration 0008_static); None without static metrics.
    static: Mapped[dict[str, Any] | None]


class SampleBlock(Base):
    """The raw samples of one cell, columnar: ``n`` values per array column, sample ``i`` at index
    ``i`` in the order taken. Arrays are little-endian numpy bytes (``service.sample_blocks``):
    ``variant`` u1 (0 baseline, 1 candidate), ``round``/``position``/``launches`` int32,
    ``duration_ns`` float64 (ns per launch), ``sm_clock_mhz``/``temperature_c``/``power_w`` float64
    with NaN for null, ``clock_event_reasons`` int64 with -1 for null, ``throttled`` u1. A nullable
    column is NULL when every sample's value is null. Cells without samples have no block.
    """

    __tablename__ = "sample_blocks"
    __table_args__ = (CheckConstraint("n >= 0", name="n_nonnegative"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    cell_id: Mapped[int] = mapped_column(ForeignKey("cells.id", ondelete="CASCADE"), unique=True)
    n: Mapped[int] = mapped_column(Integer)
    variant: Mapped[bytes] = mapped_column(LargeBinary)
    round: Mapped[bytes] = mapped_column(LargeBinary)
    position: Mapped[bytes] = mapped_column(LargeBinary)
    duration_ns: Mapped[bytes] = mapped_column(LargeBinary)
    launches: Mapped[bytes] = mapped_column(LargeBinary)
    sm_clock_mhz: Mapped[bytes | None] = mapped_column(LargeBinary)
    clock_event_reasons: Mapped[bytes | None] = mapped_column(LargeBinary)
    temperature_c: Mapped[bytes | None] = mapped_column(LargeBinary)
    power_w: Mapped[bytes | None] = mapped_column(LargeBinary)
    throttled: Mapped[bytes] = mapped_column(LargeBinary)


class ProbeReport(Base):
    """A node-health report; ``report`` holds the whole ``schemas.ProbeReport`` as JSON."""

    __tablename__ = "probe_reports"
    __table_args__ = (
        CheckConstraint(_in("phase", PROBE_PHASES), name="phase"),
        CheckConstraint("wall_s >= 0", name="wall_s_nonnegative"),
        Index("ix_probe_reports_node_name_taken_at", "node_name", "taken_at"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    runner_id: Mapped[int | None] = mapped_column(ForeignKey("runners.id", ondelete="SET NULL"))
    node_name: Mapped[str] = mapped_column(String(255))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"), index=True)
    phase: Mapped[str] = mapped_column(String(16))
    taken_at: Mapped[datetime]
    wall_s: Mapped[float] = mapped_column(Float, default=0.0)
    nvml_status: Mapped[str] = mapped_column(Text, default="absent")
    report: Mapped[dict[str, Any]]
    received_at: Mapped[datetime] = mapped_column(default=utcnow)


class ProbeReading(Base):
    """One flat probe reading (copy bandwidth or one all-reduce size) for history plots."""

    __tablename__ = "probe_readings"
    __table_args__ = (
        CheckConstraint(_in("kind", READING_KINDS), name="kind"),
        CheckConstraint("size_bytes >= 0", name="size_bytes_nonnegative"),
        CheckConstraint("time_us >= 0", name="time_us_nonnegative"),
        CheckConstraint("value_gbps >= 0", name="value_gbps_nonnegative"),
        CheckConstraint("busbw_gbps >= 0", name="busbw_gbps_nonnegative"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    report_id: Mapped[int] = mapped_column(ForeignKey("probe_reports.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    device_index: Mapped[int | None] = mapped_column(Integer)
    world_size: Mapped[int | None] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    time_us: Mapped[float] = mapped_column(Float)
    value_gbps: Mapped[float] = mapped_column(Float, doc="copy: read+write GB/s; all-reduce: algbw")
    busbw_gbps: Mapped[float | None] = mapped_column(Float)


class HealthJudgement(Base):
    """A result's node-health judgement, stored (``service.node_health.job_judgement``): the flags,
    reasons and notes its comparison carries. Judged once, against the node's and the fleet's bands
    as they stood at the measurement (``as_of``: the last probe of the job; reports taken later or
    received after the result are not used), so it never drifts as later probes arrive. A
    re-judgement (``trigger`` ``rejudge``, explicit: ``POST /jobs/{id}/health``) adds a row dated
    ``judged_at``; the latest row holds."""

    __tablename__ = "health_judgements"
    __table_args__ = (CheckConstraint(_in("trigger", JUDGEMENT_TRIGGERS), name="trigger"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"), index=True)
    trigger: Mapped[str] = mapped_column(String(16))
    judged_at: Mapped[datetime] = mapped_column(default=utcnow)
    as_of: Mapped[datetime]
    flags: Mapped[list[Any]]
    reasons: Mapped[list[Any]]  # schemas.HealthReason as JSON
    notes: Mapped[list[Any]]


class HistoryPoint(Base):
    """One side of one cell of one result, as the history shows it (``service.history``): what code
    (``code``: the branch of a revision side, else the variant label), on what hardware
    (``gpu_model``, ``fingerprint``: the driver), timed how (``timer``, ``state`` cold/warm), its
    median time per launch, and whether history views leave it out by default (``excluded``: a
    reason code, NULL when shown). Built from the stored comparison and health judgement."""

    __tablename__ = "history_points"
    __table_args__ = (
        UniqueConstraint("result_id", "cell_index", "side", name="uq_history_points_result_id_cell_side"),
        CheckConstraint(_in("side", SIDES), name="side"),
        CheckConstraint(_in("state", TIMING_STATES), name="state"),
        CheckConstraint("n >= 0", name="n_nonnegative"),
        CheckConstraint("cell_index >= 0", name="cell_index_nonnegative"),
        Index("ix_history_points_benchmark_measured_at", "benchmark", "measured_at"),
    )
    id: Mapped[int] = mapped_column(primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    benchmark: Mapped[str] = mapped_column(String(500))
    cell_index: Mapped[int] = mapped_column(Integer)
    cell: Mapped[str] = mapped_column(Text, doc="the cell's label, e.g. 'M=4, N=64'")
    params: Mapped[dict[str, Any]]
    side: Mapped[str] = mapped_column(String(16))
    code: Mapped[str] = mapped_column(Text, doc="branch of a revision side, else the variant label")
    sha: Mapped[str] = mapped_column(String(64), default="")
    gpu_model: Mapped[str] = mapped_column(String(255))
    fingerprint: Mapped[dict[str, Any]]
    timer: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    median_ns: Mapped[float] = mapped_column(Float)
    ci_low_ns: Mapped[float | None] = mapped_column(Float, doc="95% CI of the median, bootstrap over rounds")
    ci_high_ns: Mapped[float | None] = mapped_column(Float)
    n: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(32))
    measured_at: Mapped[datetime]
    node_name: Mapped[str] = mapped_column(String(255))
    excluded: Mapped[str | None] = mapped_column(String(64))


class Bisect(Base):
    """A ``kernelab bisect``: the commits between a good and a bad revision of one repository, the
    revision jobs its client ran over them (``steps``: ``schemas.BisectStep`` JSON, in order) and
    its outcome (``first_bad`` once ``found``; ``message`` says why it ``stopped``)."""

    __tablename__ = "bisects"
    __table_args__ = (CheckConstraint(_in("status", BISECT_STATUSES), name="status"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    benchmark: Mapped[str] = mapped_column(String(500))
    repo: Mapped[str] = mapped_column(Text)
    good: Mapped[str] = mapped_column(String(64), doc="the good end's commit sha")
    bad: Mapped[str] = mapped_column(String(64), doc="the bad end's commit sha")
    good_ref: Mapped[str] = mapped_column(String(500), doc="the good end as the user named it")
    bad_ref: Mapped[str] = mapped_column(String(500))
    commits: Mapped[list[Any]]  # schemas.BisectCommit JSON: after good, up to and including bad
    spec: Mapped[dict[str, Any]]
    steps: Mapped[list[Any]]
    status: Mapped[str] = mapped_column(String(16), default="running")
    first_bad: Mapped[str | None] = mapped_column(String(64))
    message: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[datetime | None]
    submitted_by: Mapped[int | None] = mapped_column(ForeignKey("tokens.id", ondelete="SET NULL"))
