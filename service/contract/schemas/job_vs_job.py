"""Job vs job (``kernelab.service.server.job_vs_job``): two stored jobs of one benchmark, cell by cell."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from kernelab.service.contract.samples import Side
from kernelab.service.contract.schemas.comparison import SideStats
from kernelab.service.contract.schemas.health import HealthJudgementPublic
from kernelab.service.contract.schemas.result import Reason
from kernelab.service.contract.schemas.result_job import NodeInfo
from kernelab.service.contract.schemas.types import Flag, ParamValue, TimingVerdict, Verdict


class JobSide(BaseModel):
    """One of the two jobs: what it measured, where, and the node's health judgement."""

    job_id: int
    name: str
    label: str = Field(description="the compared side's label in that job, e.g. 'triton @ main 1a2b3c4d'")
    node_name: str
    node: NodeInfo
    timer: str
    state: Literal["cold", "warm"]
    threshold_pct: float
    copy_gbps: dict[str, float] = Field(default_factory=dict, description="probe phase -> mean copy GB/s")
    health: HealthJudgementPublic | None = None


class RunNoisePublic(BaseModel):
    """How much the cell moves between runs of unchanged code (``kernelab.service.judge.between_runs``):
    ``sigma_pct`` the pooled standard deviation of one run's median (ln units x 100), with ``df``
    degrees of freedom, from ``runs`` stored runs of ``codes`` codes, on the jobs' ``node`` or on
    their ``gpu-model``."""

    sigma_pct: float
    df: int
    runs: int
    codes: int
    scope: Literal["node", "gpu-model"]


class JobVsJobCell(BaseModel):
    """One cell present in both jobs (matched by its full parameters): ``ratio`` B against A (< 1:
    B faster) with its 95% CI on the footing ``basis`` names (``kernelab.service.judge.between_runs``):
    ``control``, the compared side's change relative to the other side that both jobs ran
    unchanged (the ratio of the jobs' own paired ratios); ``run-noise``, B's median over A's with
    an interval that holds the cell's stored between-run noise (``noise``); ``none``, no footing
    (the verdict is ``inconclusive``, ``no-run-noise``). ``medians_ratio``: B's median over A's as
    measured, whatever the basis; the Hodges-Lehmann shift B - A (ns) with its CI, Mann-Whitney p
    (Benjamini-Hochberg adjusted over the matched cells; within-run statistics, shown, never the
    verdict), and the verdict."""

    params: dict[str, ParamValue]
    label: str
    index_a: int
    index_b: int
    a: SideStats
    b: SideStats
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    delta_pct: float | None = None
    basis: Literal["control", "run-noise", "none"] = "none"
    medians_ratio: float | None = None
    noise: RunNoisePublic | None = None
    hl_shift_ns: float | None = None
    hl_ci_low_ns: float | None = None
    hl_ci_high_ns: float | None = None
    p_value: float | None = None
    p_adjusted: float | None = None
    verdict: Verdict
    timing_verdict: TimingVerdict | None = None
    reasons: list[Reason] = Field(default_factory=list)
    flags: list[Flag] = Field(default_factory=list)
    verdict_a: Verdict | None = Field(default=None, description="the cell's verdict within job A")
    verdict_b: Verdict | None = None


class JobVsJob(BaseModel):
    """``GET /api/v1/compare?a=&b=``: job B against job A, ``side`` of each (default the candidate)."""

    benchmark: str
    side: Side
    method: str
    a: JobSide
    b: JobSide
    threshold_pct: float
    cells: list[JobVsJobCell]
    only_in_a: list[str] = Field(default_factory=list, description="labels of cells job B lacks")
    only_in_b: list[str] = Field(default_factory=list)
    summary: dict[str, int] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
