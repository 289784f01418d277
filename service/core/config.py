"""Server settings, read from the environment (prefix ``KERNELAB_``) by pydantic-settings.

``Settings()`` is built by the app factory (``service.app.create_app``) or by the CLI, never at
import time, so tests and several apps in one process each get their own.

Example::

    KERNELAB_DATABASE_URL=postgresql+psycopg://kernelab@db/kernelab \\
    KERNELAB_ADMIN_TOKEN=... kernelab serve
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

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
    admin_token: SecretStr | None = Field(
        default=None,
        description="bootstrap admin token: stored hashed with scope admin at start-up if absent",
    )
    lease_s: float = Field(default=120.0, ge=5, le=3600, description="lease when a claim names none")
    max_attempts: int = Field(default=3, ge=1, le=100, description="claims of one job before it fails")
    claim_wait_max_s: float = Field(default=30.0, ge=0, le=60, description="longest claim long-poll")
    claim_poll_s: float = Field(default=0.25, gt=0, le=10, description="sleep between claim attempts")
    max_request_bytes: int = Field(
        default=64 * 1024 * 1024, ge=1024, description="larger request bodies are refused with 413"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"


def get_settings() -> Settings:
    """Read the settings from the environment now. Raises ``pydantic.ValidationError`` if invalid."""
    return Settings()
