"""Node health (``kernelab.service.judge.health``) and history (``kernelab.service.server.history``) pages."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
)

from kernelab.service.contract.samples import (
    Side,
)
from kernelab.service.contract.schemas.types import Flag, UtcDatetime

# Node health (kernelab.service.judge.health)
# --------------------------------------------------------------------------------------------------


class HealthBand(BaseModel):
    """A probe figure's healthy band on one node (``scope`` "node") or GPU model ("fleet <model>").

    ``median``/``low``/``high`` over ``n`` healthy probes, in ``unit``; ``limit`` is where the figure
    leaves the band (below it when ``better`` is "higher", above it when "lower").
    """

    figure: str
    unit: str
    better: Literal["higher", "lower"]
    median: float
    low: float
    high: float
    n: int = Field(ge=1)
    limit: float
    scope: str = "node"


class HealthReason(BaseModel):
    """Why a probe report is not healthy: ``code`` (e.g. ``copy-outside-band``, ``other-tenant``),
    the result flag it implies, and a sentence naming the GPU or figure."""

    code: str
    flag: Literal["degraded-node", "contended"]
    message: str
    figure: str | None = None
    device_index: int | None = None
    value: float | None = None
    limit: float | None = None


class NodeHealth(BaseModel):
    """A node's health now, from its latest probe report (``GET /api/v1/nodes/{name}``)."""

    status: Literal["healthy", "degraded", "contended", "unknown"]
    model: str | None = Field(default=None, description="GPU model whose fleet band applies")
    taken_at: UtcDatetime | None = Field(default=None, description="the latest probe report's time")
    reasons: list[HealthReason] = Field(default_factory=list)
    bands: list[HealthBand] = Field(default_factory=list)
    flags: list[Flag] = Field(default_factory=list)
    healthy_probes: int = Field(default=0, ge=0, description="reports that taught the node's band")
    message: str = ""


class HealthJudgementPublic(BaseModel):
    """A result's stored node-health judgement (``GET``/``POST /api/v1/jobs/{id}/health``): judged
    at ``judged_at`` against the node's and the fleet's bands as of ``as_of`` (the job's last probe),
    by ``trigger`` ``ingest`` (the compare worker after ingest, or the first read) or ``rejudge`` (asked
    for explicitly). The latest judgement holds; its ``flags`` and ``notes`` are the comparison's."""

    trigger: Literal["ingest", "rejudge"]
    judged_at: UtcDatetime
    as_of: UtcDatetime
    flags: list[Flag] = Field(default_factory=list)
    reasons: list[HealthReason] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class HealthJudgements(BaseModel):
    """Every judgement of a result, oldest first; ``current`` is the last."""

    current: HealthJudgementPublic
    data: list[HealthJudgementPublic]


# --------------------------------------------------------------------------------------------------
# History (kernelab.service.server.history)
# --------------------------------------------------------------------------------------------------

ChangeReason = Literal["first-point", "fingerprint-changed", "excluded"]
"""Why a history point has no ``change_pct`` (``kernelab.service.server.history.CHANGE_MEANING``)."""
Excluded = Literal["node-flagged", "problem-verdict"]
"""Why history views leave a point out by default (``kernelab.service.server.history.EXCLUDED_MEANING``)."""


class HistoryPoint(BaseModel):
    """One point of a benchmark's history (``kernelab.service.server.history``): one side of one cell of one
    result. ``median_ns``: ns per launch of its kept samples; ``change_pct``: (median / previous
    shown median of its line with the same driver - 1) x 100, None with ``change_reason``."""

    job_id: int | None
    measured_at: UtcDatetime
    side: Side
    code: str = Field(description="branch of a revision side, else variant (params)")
    sha: str = ""
    cell: str
    cell_index: int
    params: dict[str, Any] = Field(default_factory=dict, description="the cell's parameters")
    gpu_model: str
    driver: str | None = None
    timer: str
    state: Literal["cold", "warm"]
    median_ns: float
    ci_low_ns: float | None = Field(default=None, description="95% CI of the median (bootstrap over rounds)")
    ci_high_ns: float | None = None
    n: int
    verdict: str
    node: str
    excluded: Excluded | None = None
    change_pct: float | None = None
    change_reason: ChangeReason | None = None


class ChangePoint(BaseModel):
    """A change point of one line (``kernelab.service.judge.changepoints``): from ``at`` on, the line's
    median time per launch moved from ``before_ns`` to ``after_ns`` (medians of the segments'
    points); ``change_pct`` = (after / before - 1) x 100; ``direction`` ``slower`` when it grew.
    ``job_before``/``job_after``: the last job of the earlier segment and the first of the later."""

    at: UtcDatetime
    index: int = Field(description="position of the first point after the change in the line's points")
    before_ns: float
    after_ns: float
    change_pct: float
    direction: Literal["slower", "faster"]
    job_before: int | None
    job_after: int | None
    points_before: int
    points_after: int


class Series(BaseModel):
    """One line of the history: points of one code and cell on one GPU model, timer and state,
    and the change points detected in it (``kernelab.service.judge.changepoints``)."""

    code: str
    cell: str
    gpu_model: str
    timer: str
    state: Literal["cold", "warm"]
    points: list[HistoryPoint]
    params: dict[str, Any] = Field(default_factory=dict, description="the cell's parameters")
    change_points: list[ChangePoint] = Field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.code} · {self.cell} · {self.gpu_model} · {self.timer}/{self.state}"


class HistoryPage(BaseModel):
    """``GET /api/v1/history``: a benchmark's lines over its ``limit`` latest results."""

    benchmark: str
    include_excluded: bool
    results: int = Field(description="results read (the latest, up to limit)")
    excluded: dict[str, int] = Field(default_factory=dict, description="points left out, per reason")
    series: list[Series]
    method: str = Field(default="", description="how change points were detected, with its source")


class Regression(BaseModel):
    """A line whose latest change point made it slower (``GET /api/v1/history/regressions``)."""

    benchmark: str
    code: str
    cell: str
    params: dict[str, Any] = Field(default_factory=dict)
    gpu_model: str
    timer: str
    state: Literal["cold", "warm"]
    change: ChangePoint


class RegressionsPage(BaseModel):
    """The fleet's regressions, newest first, and the method that found them."""

    method: str
    benchmarks: int = Field(description="benchmarks read (those with the latest results, up to a bound)")
    data: list[Regression]
