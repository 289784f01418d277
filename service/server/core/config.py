"""Server settings, read from the environment (prefix ``KERNELAB_``) by pydantic-settings.

``Settings()`` is built by the app factory (``kernelab.app.create_app``) or by the CLI, never at
import time, so tests and several apps in one process each get their own.

Example::

    KERNELAB_DATABASE_URL=postgresql+psycopg://kernelab@db/kernelab \\
    KERNELAB_ADMIN_TOKEN=... kernelab serve
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from kernelab.service.judge import health

DEFAULT_DATABASE_URL = "sqlite:///./kernelab-data/kernelab.db"


class Settings(BaseSettings):
    """Everything the server reads from its environment.

    Durations are seconds (``*_s``), sizes bytes (``*_bytes``). Unknown ``KERNELAB_*`` variables
    are ignored (the runner and the CLI read their own).
    """

    model_config = SettingsConfigDict(env_prefix="KERNELAB_", extra="ignore")

    database_url: str = Field(
        default=DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL; a SQLite file's folder is created on first use",
    )
    public_dashboard: bool = Field(default=False, description="serve dashboard pages without a token")
    public_url: str | None = Field(
        default=None,
        pattern=r"^https?://[^/?#\s]+(/[^?#\s]*)?$",
        description="the server's URL as clients reach it (e.g. https://kernelab.example.org); "
        "absolute Link headers start with it. Unset: relative links (never the request's Host)",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="bootstrap admin token: stored hashed with scope admin at start-up if absent",
    )
    lease_s: float = Field(default=120.0, ge=5, le=3600, description="lease when a claim names none")
    max_attempts: int = Field(default=3, ge=1, le=100, description="claims of one job before it fails")
    compare_lease_s: float = Field(
        default=60.0,
        ge=5,
        le=3600,
        description="a compare worker's lease of a comparison task (s); it heartbeats every third of it",
    )
    compare_max_attempts: int = Field(
        default=3, ge=1, le=100, description="claims of one comparison task before it fails"
    )
    job_vs_job_inline_samples: int = Field(
        default=20_000,
        ge=0,
        le=10_000_000,
        description="job vs job of at most this many raw samples (both jobs) is computed in the request "
        "(about a second at the default: docs/results/2026-12-01-job-vs-job-cost.md); a larger pair is "
        "queued for a compare worker (202 until its answer is stored)",
    )
    job_vs_job_max_samples: int = Field(
        default=2_000_000,
        ge=1,
        le=100_000_000,
        description="job vs job of more raw samples (both jobs) is refused (413): a compare worker holds "
        "them in memory and the queue waits behind it (about 90 s at the default on a 2-core machine, "
        "extrapolated from 4.4 s per 100,000 samples: docs/results/2026-12-01-job-vs-job-cost.md)",
    )
    compare_poll_s: float = Field(
        default=1.0, gt=0, le=60, description="an idle compare worker reads the task queue this often (s)"
    )
    claim_wait_max_s: float = Field(default=30.0, ge=0, le=60, description="longest claim long-poll")
    claim_poll_s: float = Field(
        default=0.25,
        gt=0,
        le=10,
        description="while claims wait, a process reads the queue at least this often (s); a job queued "
        "meanwhile wakes them at once (PostgreSQL NOTIFY; on SQLite within one server process)",
    )
    max_request_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="larger request bodies are refused with 413"
    )
    max_spec_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=64 * 1024 * 1024,
        description="larger job specs (POST /api/v1/jobs) are refused with 413 before they are decoded "
        "(kernelab.service.server.api.spec_body)",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        le=1_000_000,
        description="open connections per server process; more are answered 503 and closed at once "
        "(lowered to fit the process's open-file limit: kernelab.service.server.serve.connection_budget)",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="a connection whose request line and headers have not arrived within this many "
        "seconds is closed (idle and slowloris connections: kernelab.service.server.connection_guard)",
    )
    body_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=300,
        description="while a request body is arriving, each window of this many seconds must bring at "
        "least KERNELAB_BODY_MIN_BYTES of it, or the connection is closed (slow bodies: "
        "kernelab.service.server.connection_guard)",
    )
    body_min_bytes: int = Field(
        default=16 * 1024,
        ge=1,
        le=1 << 30,
        description="bytes of a request body that must arrive per KERNELAB_BODY_TIMEOUT_S window",
    )
    downloads_per_client: int = Field(
        default=4,
        ge=1,
        le=1000,
        description="raw-sample downloads one token may run at once per server process (more: 429)",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    log_format: Literal["text", "json"] = Field(
        default="text",
        description="json: one JSON object per log line (kernelab.service.server.observability)",
    )
    public_metrics: bool = Field(default=False, description="serve /metrics without a token")
    runner_alive_s: float = Field(
        default=300.0,
        gt=0,
        description="a runner seen within this many seconds counts as alive (/metrics, a job's waiting_for)",
    )
    require_offered_benchmark: bool = Field(
        default=False,
        description="refuse (422 on benchmark) a job whose benchmark no runner advertised, not queue it",
    )
    # Node health (kernelab.service.judge.health): where a probe figure leaves the node's / the fleet's band.
    health_copy_min_fraction: float = Field(
        default=health.COPY_MIN_FRACTION, gt=0, le=1, description="copy/peer GB/s below this x band median"
    )
    health_busbw_min_fraction: float = Field(
        default=health.BUSBW_MIN_FRACTION, gt=0, le=1, description="all-reduce busbw below this x median"
    )
    health_latency_max_factor: float = Field(
        default=health.LATENCY_MAX_FACTOR, ge=1, description="small all-reduce time above this x median"
    )
    health_band_window: int = Field(default=health.BAND_WINDOW, ge=1, description="healthy probes per band")
    health_band_min_probes: int = Field(default=health.BAND_MIN_PROBES, ge=1, description="fewer: no band")
    health_fleet_window: int = Field(
        default=health.FLEET_WINDOW, ge=1, description="recent probe reports of the fleet read per GPU model"
    )
    health_ignored_clock_reasons: list[str] = Field(
        default_factory=lambda: list(health.IGNORED_CLOCK_REASONS),
        description="NVML throttle reasons that still do not make a node degraded (informational "
        "reasons such as gpu_idle never do)",
    )
    health_peer_min_fraction: float = Field(
        default=health.PEER_MIN_FRACTION,
        gt=0,
        le=1,
        description="a GPU's copy or a pair's peer GB/s below this x the median of its peers in one report",
    )
    health_cold_factor: float = Field(
        default=health.COLD_FACTOR,
        ge=1,
        description="leading calls of an all-reduce series slower than this x the rest are warm-up",
    )

    def health_thresholds(self) -> health.Thresholds:
        """The node-health thresholds these settings name (``kernelab.service.judge.health.Thresholds``)."""
        return health.Thresholds(
            copy_min_fraction=self.health_copy_min_fraction,
            busbw_min_fraction=self.health_busbw_min_fraction,
            latency_max_factor=self.health_latency_max_factor,
            band_window=self.health_band_window,
            band_min_probes=self.health_band_min_probes,
            ignored_clock_reasons=tuple(self.health_ignored_clock_reasons),
            peer_min_fraction=self.health_peer_min_fraction,
            cold_factor=self.health_cold_factor,
        )


def get_settings() -> Settings:
    """Read the settings from the environment now. Raises ``pydantic.ValidationError`` if invalid."""
    return Settings()
