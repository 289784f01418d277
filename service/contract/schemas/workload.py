"""Workload jobs: whole programs A/B'd under ``torchrun`` (``WorkloadSpec``), what their runs
recorded (``WorkloadResult``) and their judgement (``WorkloadComparison``).

A workload side is a command (an argv list, no shell) or a ``module:function`` reference; the
server validates both for form only and never imports either (``kernelab.runners.workload``
launches them). The records a run's ranks report (``kernelab.workload``: phases, metrics,
digests) travel as ``WorkloadRecord`` lines.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, StringConstraints, model_validator

from kernelab.service.contract.schemas.probes import ProbeReport, Rank
from kernelab.service.contract.schemas.result_job import NodeInfo
from kernelab.service.contract.schemas.spec import BenchmarkRef
from kernelab.service.contract.schemas.types import (
    MAX_SEED,
    AtDoor,
    Count32,
    ErrorText,
    Int64,
    Name,
    RowId,
    Size64,
    Text,
    UtcDatetime,
    _Answer,
    _Posted,
    _Strict,
    storable_text,
)

WORKLOAD_SCHEMA_VERSION = 1
"""Version of ``WorkloadResult`` and of the record lines (``kernelab.workload.RECORD_VERSION``)."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESERVED_ENV = re.compile(
    r"^(CUDA_VISIBLE_DEVICES|HIP_VISIBLE_DEVICES|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|"
    r"MASTER_ADDR|MASTER_PORT|TORCHELASTIC_.*|KERNELAB_.*)$"
)
"""Variables the runner sets for every run (the GPUs it hands over, torchrun's rank variables, the
record directory): a side may not set them."""


def _env_name(value: str) -> str:
    if not _ENV_NAME.match(value):
        raise ValueError(f"{value[:60]!r} is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")
    if _RESERVED_ENV.match(value):
        raise ValueError(
            f"{value!r} is set by the runner for every run (the GPUs, torchrun's ranks, the records)"
        )
    return value


EnvName = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_env_name)]
Arg = Annotated[str, StringConstraints(max_length=4000), AfterValidator(storable_text)]


class WorkloadSide(_Strict):
    """One arm of a workload: exactly one of ``command`` (argv: a script path or ``-m``-less
    program; torchrun runs ``command[0]`` with ``command[1:] + args``; a ``.py`` file runs under the
    runner's Python) or ``function`` (``module:function``, called as ``function(args)`` in every
    rank: ``args`` a list of strings), with ``env`` added to every rank's environment.

    Raises (422): both or neither of ``command``/``function``, an environment name the runner sets
    itself (``CUDA_VISIBLE_DEVICES``, ``RANK``, ``MASTER_ADDR``, ``KERNELAB_*`` ...)."""

    command: list[Arg] | None = Field(default=None, min_length=1, max_length=200)
    function: BenchmarkRef | None = None
    args: list[Arg] = Field(default_factory=list, max_length=500)
    env: dict[EnvName, Arg] = Field(default_factory=dict, max_length=200)

    @model_validator(mode="after")
    def _one_entry(self) -> WorkloadSide:
        if (self.command is None) == (self.function is None):
            raise ValueError("a workload side names exactly one of 'command' and 'function'")
        return self


class LaunchSpec(_Strict):
    """How ``torchrun`` starts each run: ``nproc_per_node`` ranks on each of ``nnodes`` nodes (the
    runner hands ``nproc_per_node`` of its GPUs over through ``CUDA_VISIBLE_DEVICES``; on a CPU the
    ranks share the host). ``nnodes > 1`` is claimed by that many runners together."""

    nproc_per_node: int = Field(default=1, ge=1, le=64)
    nnodes: int = Field(default=1, ge=1, le=64)
    rdzv_timeout_s: float = Field(default=120.0, gt=0, le=3600, description="c10d rendezvous join timeout")


class WorkloadProbes(_Strict):
    """The quick node probe between runs (and before the first): telemetry (other processes on the
    GPUs), copy bandwidth and all-reduce, each off-able (a CPU's all-reduce costs two gloo
    processes per probe)."""

    between_runs: bool = True
    copy_bandwidth: bool = True
    all_reduce: bool = True
    nvml: bool = True
    timeout_s: float = Field(default=120.0, gt=0, le=3600)


class WorkloadSpec(_Strict):
    """A workload job: two arms run whole, interleaved (``order``: ABBA or seeded random), ``runs``
    of each, within ``budget_s`` of wall time; each run killed after ``run_timeout_s``.

    The pair of runs ``2k, 2k+1`` (one of each arm) is one *round* of the paired bootstrap
    (``kernelab.service.judge.workload_stats``). Raises (422): ``kind`` other than ``workload``, bad sides
    (``WorkloadSide``), a budget shorter than one run's timeout."""

    kind: Literal["workload"]
    name: Name = ""
    baseline: WorkloadSide
    candidate: WorkloadSide
    launch: LaunchSpec = Field(default_factory=LaunchSpec)
    runs: int = Field(default=5, ge=1, le=1000, description="runs of each arm")
    order: Literal["abba", "random"] = "abba"
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    run_timeout_s: float = Field(default=600.0, gt=0, le=86_400, description="one run; then it is killed")
    budget_s: float = Field(default=3600.0, gt=0, le=7 * 86_400, description="no run starts past this")
    threshold_pct: float = Field(default=2.0, gt=0, le=100, description="smallest change that counts")
    probes: WorkloadProbes = Field(default_factory=WorkloadProbes)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    log_max_bytes: int = Field(default=65_536, ge=1024, le=4 << 20, description="kept of each run's output")
    digest_max_bytes: int = Field(
        default=4 << 20, ge=0, le=64 << 20, description="a digest's tensor is kept up to this size"
    )

    @model_validator(mode="after")
    def _budget(self) -> WorkloadSpec:
        if self.budget_s < self.run_timeout_s:
            raise ValueError("budget_s must be at least run_timeout_s (one run must fit in the budget)")
        return self

    @property
    def timeout_s(self) -> float:
        """The whole job's hard limit: the budget plus one run's timeout and the probes' time."""
        return self.budget_s + self.run_timeout_s + 2 * self.probes.timeout_s


def is_workload(data: Any) -> bool:
    """True when ``data`` (a decoded spec mapping) asks for a workload (``kind: workload``)."""
    return isinstance(data, dict) and data.get("kind") == "workload"


# Records (what the ranks report)
# --------------------------------------------------------------------------------------------------

RecordName = Annotated[Text, Field(min_length=1), AtDoor(max_length=200)]
MAX_DIGEST_B64_CHARS = 4 * ((64 << 20) // 3 + 1)
"""Longest ``values_b64``: base64 of ``digest_max_bytes``' largest value, 64 MiB."""


class PhaseRecord(_Posted):
    """One timed phase of one rank: ``seconds`` between two device syncs (``time.perf_counter``)."""

    type: Literal["phase"]
    name: RecordName
    rank: Rank = 0
    seconds: float = Field(ge=0)
    synced: bool = Field(default=False, description="a CUDA sync at both edges")


class MetricRecord(_Posted):
    """One value a rank reports (e.g. ``tokens_per_gpu_s``); ``better`` says which way is good."""

    type: Literal["metric"]
    name: RecordName
    rank: Rank = 0
    value: float
    unit: Annotated[Text, AtDoor(max_length=50)] = ""
    better: Literal["higher", "lower"] = "higher"


class DigestRecord(_Posted):
    """A tensor's exact fingerprint: SHA-256 of its bytes (C-contiguous, on the host) with dtype and
    shape, and, within the spec's ``digest_max_bytes``, its values as float64 (exact for every
    float dtype up to float64 and integers up to 2**53) base64-encoded little-endian."""

    type: Literal["digest"]
    name: RecordName
    rank: Rank = 0
    dtype: Annotated[Text, AtDoor(max_length=50)]
    shape: list[Size64] = Field(max_length=32)
    sha256: Annotated[Text, Field(pattern=r"^[0-9a-f]{64}$"), AtDoor(max_length=64)]
    values_b64: Annotated[Text, AtDoor(max_length=MAX_DIGEST_B64_CHARS)] | None = Field(
        default=None, description="float64 little-endian, or None past the cap"
    )


WorkloadRecord = Annotated[PhaseRecord | MetricRecord | DigestRecord, Field(discriminator="type")]
MAX_RUN_RECORDS = 100_000
"""Most records of one run (phases, metrics and digests of all its ranks): a runner keeps the first
``MAX_RUN_RECORDS`` (``kernelab.runners.workload.records``)."""
MAX_WORKLOAD_RUNS = 2_000
"""Most runs of one workload result: ``runs`` is at most 1,000 per arm."""


# Results
# --------------------------------------------------------------------------------------------------

RunOutcome = Literal["ok", "crashed", "timeout", "not-started"]


class WorkloadRun(_Posted):
    """One whole run of one arm: its position in the interleaved order, wall time, outcome, the
    records of its ranks, a bounded tail of its output, and the probe taken after it."""

    index: Count32 = Field(description="position in the interleaved order")
    side: Literal["baseline", "candidate"]
    started_at: UtcDatetime
    wall_s: float = Field(ge=0)
    outcome: RunOutcome
    exit_code: Int64 | None = None
    error: ErrorText = ""
    log: Text = Field(default="", description="head and tail of the run's output, at most log_max_bytes")
    records: Annotated[list[WorkloadRecord], AtDoor(max_length=MAX_RUN_RECORDS)] = Field(default_factory=list)
    probe_after: ProbeReport | None = None


class WorkloadResult(_Posted):
    """What a workload job measured: the spec as run, the node, the probe before the first run, every
    run in order, and why it stopped (``all-runs`` or ``budget``). A runner's post carries its
    ``idempotency_key`` and, in a job of several nodes, its ``node_rank``: each node posts the
    records of its own ranks (``kernelab.service.server.workload_store.merge`` joins them)."""

    schema_version: Annotated[int, Field(ge=1), AtDoor(le=WORKLOAD_SCHEMA_VERSION)] = WORKLOAD_SCHEMA_VERSION
    kind: Literal["workload"] = "workload"
    job_id: RowId | None = None
    idempotency_key: Annotated[Text, Field(min_length=8), AtDoor(max_length=200)] | None = Field(
        default=None, description="a runner's post: the server stores the first"
    )
    node_rank: int = Field(default=0, ge=0, le=63, description="which node of an nnodes > 1 job measured it")
    spec: WorkloadSpec
    node: NodeInfo
    probe_before: ProbeReport | None = None
    runs: Annotated[list[WorkloadRun], AtDoor(max_length=MAX_WORKLOAD_RUNS)]
    stopped: Literal["all-runs", "budget"] = "all-runs"
    error: ErrorText | None = None


# Comparison
# --------------------------------------------------------------------------------------------------

WorkloadVerdict = Literal["failed", "inconclusive", "faster", "slower", "better", "worse", "same"]


class WorkloadReason(_Answer):
    """Why a number is what it is (a code of ``kernelab.service.judge.workload_stats.REASONS``)."""

    code: Text
    message: Text
    severity: Literal["error", "warning", "info"] = "warning"


class SideSummary(_Answer):
    """One arm's values of a phase or metric across its completed runs (seconds for a phase)."""

    runs: int = Field(ge=0)
    median: float | None = None
    values: list[float] = Field(default_factory=list, description="per run, in run order")


class RankTime(_Answer):
    """A phase's median seconds per rank of one arm, and the slowest rank."""

    side: Literal["baseline", "candidate"]
    medians_s: dict[int, float]
    slowest_rank: int | None = None


class QuantityVerdict(_Answer):
    """A phase (lower is better: ``faster``/``slower``) or metric (``better``/``worse``) judged across
    runs: ratio candidate/baseline of the medians and its paired-bootstrap CI."""

    kind: Literal["phase", "metric"]
    name: Text
    unit: Text = "s"
    better: Literal["higher", "lower"] = "lower"
    baseline: SideSummary
    candidate: SideSummary
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    delta_pct: float | None = None
    verdict: WorkloadVerdict
    reasons: list[WorkloadReason] = Field(default_factory=list)
    ranks: list[RankTime] = Field(default_factory=list)


class ConsistencyRow(_Answer):
    """A digest compared between arms (``against: "arms"``: baseline's first completed run against the
    candidate's, rank by rank) or within one arm across its runs (``against: "runs"``)."""

    name: Text
    against: Literal["arms", "runs"]
    side: Literal["baseline", "candidate"] | None = None
    elements: int | None = None
    mismatches: int | None = None
    max_abs_diff: float | None = None
    bitwise_equal: bool | None = None
    note: Text = ""


class RunLine(_Answer):
    """One run on the timeline: outcome, wall time, the phases' slowest-rank seconds, and what the
    probe after it said (copy bandwidth, all-reduce, other processes on the GPUs)."""

    index: int
    side: Literal["baseline", "candidate"]
    outcome: RunOutcome
    wall_s: float
    phases_s: dict[str, float] = Field(default_factory=dict)
    copy_gbps: float | None = None
    all_reduce_us: float | None = None
    other_processes: int | None = None
    flags: list[Text] = Field(default_factory=list)


class WorkloadComparison(_Answer):
    """The judgement of a workload result: phase and metric verdicts, the consistency table, the
    timeline, and the node flags (``sick-node``, ``probe-changed``)."""

    schema_version: int = WORKLOAD_SCHEMA_VERSION
    job_id: int | None = None
    name: Text = ""
    pairing: Text = Field(description="how runs were paired for the CI")
    quantities: list[QuantityVerdict]
    consistency: list[ConsistencyRow]
    timeline: list[RunLine]
    flags: list[Text] = Field(default_factory=list)
    notes: list[WorkloadReason] = Field(default_factory=list)
    summary: dict[str, int] = Field(default_factory=dict)


# The server and runner path (kernelab.service.server.gangs)
# --------------------------------------------------------------------------------------------------

Endpoint = Annotated[
    str, StringConstraints(min_length=3, max_length=300, pattern=r"^[A-Za-z0-9._\-\[\]:]+:[0-9]{1,5}$")
]
"""``host:port`` (a c10d rendezvous endpoint)."""


class GangSeat(_Answer):
    """A runner's seat in a workload job's attempt: its ``node_rank`` of ``nnodes``; ``ready`` once
    every seat is taken (then ``endpoint`` is node rank 0's rendezvous ``host:port`` and the job is
    ``running``); until then the runner polls ``POST /runners/jobs/{id}/gang``, which keeps its
    seat, until ``deadline`` (the first seat's time plus ``launch.rdzv_timeout_s``)."""

    job_id: int
    attempt: int = Field(ge=1)
    node_rank: int = Field(ge=0)
    nnodes: int = Field(ge=1)
    joined: int = Field(ge=0, description="seats taken")
    ready: bool
    endpoint: Text | None = None
    deadline: UtcDatetime | None = None


class GangPublic(_Answer):
    """A workload job's gang as readers see it: the attempt it gathers or runs, the seats taken (node
    rank -> runner name), whether it waits for more, and until when."""

    attempt: int
    nnodes: int
    members: dict[int, Text] = Field(default_factory=dict)
    gathering: bool = False
    deadline: UtcDatetime | None = None
    endpoint: Text | None = None


class WorkloadAccepted(_Answer):
    """The answer to a posted workload result: stored (``duplicate`` for a repeated key), and
    whether every node of the attempt has now posted (the job is finished and queued for comparison)."""

    job_id: int
    node_rank: int
    duplicate: bool = False
    complete: bool = False
