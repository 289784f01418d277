"""Statistics of a result, computed by ``kernelab.service.judge.stats`` (``Comparison``)."""

from __future__ import annotations

from typing import Literal

from pydantic import (
    BaseModel,
    Field,
)

from kernelab.service.contract.samples import (
    Side,
)
from kernelab.service.contract.schemas.probes import ProbeReport
from kernelab.service.contract.schemas.result import CorrectnessResult, Reason, StaticComparison, TimedCheck
from kernelab.service.contract.schemas.result_job import NodeInfo
from kernelab.service.contract.schemas.types import Flag, ParamValue, TimingVerdict, Verdict

# Statistics (computed by kernelab.service.judge.stats from a JobResult)
# --------------------------------------------------------------------------------------------------


class SideStats(BaseModel):
    """Robust summary of one variant's kept samples, nanoseconds per launch."""

    n: int
    dropped_throttled: int = 0
    median_ns: float | None = Field(
        default=None,
        description="the side's centre, which the ratio is formed from (ratio = candidate median / "
        "baseline median): the median of the kept samples, or, under input-set rotation, the "
        "set-balanced median: the geometric mean of each input-set assignment's median (``estimator``)",
    )
    estimator: Literal["median", "set-balanced median"] = Field(
        default="median", description="what median_ns is: the plain median, or the set-balanced one"
    )
    pooled_median_ns: float | None = Field(
        default=None,
        description="the median of all kept samples, pooled over input sets: what the box plot and the "
        "raw samples show (equal to median_ns without rotation)",
    )
    min_ns: float | None = None
    q1_ns: float | None = None
    q3_ns: float | None = None
    iqr_ns: float | None = None
    mean_ns: float | None = None
    median_ci_low_ns: float | None = Field(
        default=None, description="95% CI of the median: bootstrap over whole rounds (estimators.cluster_cis)"
    )
    median_ci_high_ns: float | None = None
    sm_clock_mhz: float | None = Field(
        default=None, description="median SM clock read after this side's samples (NVML), MHz; None: not read"
    )


class CellComparison(BaseModel):
    """Before/after for one cell: ratio = candidate median / baseline median (< 1 is faster)."""

    index: int
    params: dict[str, ParamValue]
    label: str
    baseline: SideStats
    candidate: SideStats
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    decision_low: float | None = Field(
        default=None,
        description="the ratio's decision interval (the 95% CI widened to 99.8%), which a faster/slower "
        "verdict needs to exclude 1 (kernelab.service.judge.verdicts.decision_interval)",
    )
    decision_high: float | None = None
    delta_pct: float | None = Field(default=None, description="(ratio - 1) * 100")
    hl_shift_ns: float | None = Field(default=None, description="Hodges-Lehmann candidate - baseline")
    hl_ci_low_ns: float | None = None
    hl_ci_high_ns: float | None = None
    p_value: float | None = Field(default=None, description="Mann-Whitney U, two-sided")
    p_adjusted: float | None = Field(default=None, description="Benjamini-Hochberg over the sweep")
    mde_pct: float | None = Field(default=None, description="minimum detectable effect, percent")
    verdict: Verdict
    timing_verdict: TimingVerdict | None = Field(
        default=None,
        description="what the timing alone says; the verdict outranks it (kernelab.service.judge.verdicts)",
    )
    reasons: list[Reason] = Field(
        default_factory=list,
        description=(
            "why the verdict is what it is, deciding reason first (kernelab.service.judge.verdicts.REASONS)"
        ),
    )
    flags: list[Flag] = Field(default_factory=list)
    correctness: dict[Side, CorrectnessResult] = Field(default_factory=dict)
    timed_checks: dict[Side, list[TimedCheck]] = Field(default_factory=dict)
    throughput: dict[str, float] = Field(default_factory=dict, description="e.g. candidate_tflops")
    error: str | None = None
    static: StaticComparison | None = None
    timers: dict[Side, str] = Field(default_factory=dict, description="timer kind per variant")
    cross_check: CrossCheckSummary | None = Field(
        default=None, description="the same cell under the other timing method (None: not taken)"
    )
    energy: EnergySummary | None = Field(default=None, description="energy per launch (None: not measured)")


class EnergySummary(BaseModel):
    """A cell's energy per launch (``kernelab.service.judge.stats.energy_summary`` of ``CellResult.energy``).

    ``joules_per_launch``: per side, the median over its blocks of block joules / block launches;
    ``watts``: per side, the median block power (joules / seconds); ``ratio``: candidate / baseline
    joules per launch (< 1: the candidate costs less energy), ``ci_low``/``ci_high``: its 95%
    interval (Student t over the paired blocks' log ratios; None with fewer than 2 pairs);
    ``blocks``: pairs of blocks; ``step_mj``/``period_ms``: the counter's smallest step and median
    update period (its resolution); ``error``: why there is no energy figure.
    """

    counter: str = "nvml-total-energy"
    joules_per_launch: dict[Side, float] = Field(default_factory=dict)
    watts: dict[Side, float] = Field(default_factory=dict)
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    blocks: int = 0
    step_mj: float | None = None
    period_ms: float | None = None
    error: str | None = None


class CrossCheckSummary(BaseModel):
    """The cell's timer cross-check as judged (``kernelab.service.judge.verdicts.cross_check_summary``).

    ``methods``: the spec's method and the other one per side (``{"baseline": "cuda-graph", ...}``
    for ``primary``, likewise ``cross``); ``primary_median_ns``/``cross_median_ns``: each side's
    median ns per launch under each method; ``difference_pct``: per side, (cross / primary - 1) x 100;
    ``noise_pct``: per side, the allowance the difference is held against (the spec's
    ``cross_check_pct`` plus both methods' IQR/median, percent); ``cross_ratio``: candidate /
    baseline under the other method, ``cross_ci_low``/``cross_ci_high`` its 95% bootstrap interval
    over the cross rounds; ``disagrees``: a side's difference exceeds its allowance;
    ``ratio_agrees``: the two ratios agree in direction (the same side of the threshold) and size
    (within ``cross_check_pct`` of each other), None when no ratio could be formed; ``error``: why no
    cross measurement exists.
    """

    primary: dict[Side, str] = Field(default_factory=dict)
    cross: dict[Side, str] = Field(default_factory=dict)
    primary_median_ns: dict[Side, float] = Field(default_factory=dict)
    cross_median_ns: dict[Side, float] = Field(default_factory=dict)
    difference_pct: dict[Side, float] = Field(default_factory=dict)
    noise_pct: dict[Side, float] = Field(default_factory=dict)
    cross_ratio: float | None = None
    cross_ci_low: float | None = None
    cross_ci_high: float | None = None
    disagrees: bool = False
    ratio_agrees: bool | None = None
    error: str | None = None


class Comparison(BaseModel):
    """A job's before/after comparison, as JSON (``GET /api/v1/jobs/{id}/comparison``)."""

    job_id: int | None = None
    name: str = ""
    benchmark: str
    baseline_label: str
    candidate_label: str
    threshold_pct: float
    timer: str
    state: str = Field(
        default="cold", description="the power state the samples were taken in (measurement.state)"
    )
    node: NodeInfo
    cells: list[CellComparison]
    probes: list[ProbeReport] = Field(default_factory=list)
    flags: list[Flag] = Field(default_factory=list, description="job-level flags")
    summary: dict[str, int] = Field(default_factory=dict, description="verdict -> count")
    notes: list[str] = Field(default_factory=list, description="e.g. why the result is excluded")
    reasons: list[Reason] = Field(
        default_factory=list, description="job-level findings (e.g. the node changed during the job)"
    )
    method_version: int = Field(
        default=1,
        description="version of the verdict rules that computed this comparison "
        "(kernelab.service.judge.verdicts.METHOD_VERSION); a stored comparison of an older version "
        "is recomputed",
    )


# --------------------------------------------------------------------------------------------------
