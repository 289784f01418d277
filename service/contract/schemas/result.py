"""Results and their samples: what a runner posts (``JobResult``, ``CellResult``, checks)."""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    model_validator,
)

from kernelab.service.contract.samples import (
    SampleColumns,
    Side,
    empty_samples,
)
from kernelab.service.contract.schemas.probes import MAX_GPU_PROCESSES
from kernelab.service.contract.schemas.spec import ParamMap
from kernelab.service.contract.schemas.types import (
    MAX_LIST_ITEMS,
    AtDoor,
    Count32,
    ErrorText,
    Int64,
    JsonObject,
    Message,
    Positive64,
    Severity,
    ShortText,
    Size64,
    Text,
    _Posted,
)

MAX_FINDINGS = 256
"""Most findings of one cell or one checked sample."""
MAX_CONTENTION_READINGS = 1024
"""Most contention readings of one cell: one before the first round, one per CI check (a
geometric schedule: ``kernelab.runners.engine``) and one after the last."""
MAX_CROSS_SAMPLES = 20_000
"""Most cross-check samples of one side: one per ABBA round, ``cross_check_rounds`` at most 10,000."""
MAX_KERNELS = 256
"""Most compiled kernels of one cell's static comparison."""
MAX_KERNEL_LOOPS = 256
MAX_OPCODES = 4096
"""Most opcodes (or instruction classes) counted for one kernel, and changes of one kernel diff."""
KernelName = Annotated[Text, AtDoor(max_length=1000)]
"""A compiled kernel's name (a Triton kernel's, with its specialisation): at most 1,000 characters."""
OpcodeCounts = Annotated[dict[ShortText, Size64], AtDoor(max_length=MAX_OPCODES)]
OpcodeDeltas = Annotated[dict[ShortText, Int64], AtDoor(max_length=MAX_OPCODES)]

# Results (what a runner posts)
# --------------------------------------------------------------------------------------------------


class Work(_Posted):
    """Work one launch does, declared by the benchmark: used for throughput and plausibility.
    Finite JSON numbers >= 0 (``true``, ``"1e3"``, NaN: 422)."""

    flops: float = Field(default=0.0, ge=0, strict=True)
    bytes_read: float = Field(default=0.0, ge=0, strict=True)
    bytes_written: float = Field(default=0.0, ge=0, strict=True)


class _Metrics(_Posted):
    """Base of the correctness checks' results: a metric posted as NaN or +-Infinity (a norm of an
    output full of NaN, an overflowing difference) is stored as None, and its field name is listed
    in ``nonfinite_metrics``; ``kernelab.service.judge.verdicts`` tells it with the reason
    ``metric-not-finite``.
    The number describes a broken output, which is the measurement: refusing it would lose the
    result of the very kernel it condemns. Fields listed in ``_NULLABLE`` get this treatment; any
    other non-finite float is refused (``_Posted``)."""

    _NULLABLE: ClassVar[tuple[str, ...]] = ()

    nonfinite_metrics: Annotated[list[ShortText], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list, description="metrics posted as NaN or Infinity, stored as null"
    )

    @model_validator(mode="before")
    @classmethod
    def _nonfinite_to_null(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        bad = [k for k in cls._NULLABLE if isinstance(v := data.get(k), float) and not math.isfinite(v)]
        if not bad:
            return data
        listed = data.get("nonfinite_metrics") or []
        return {**data, **dict.fromkeys(bad, None),
                "nonfinite_metrics": list(dict.fromkeys([*listed, *bad]))}  # fmt: skip


class CorrectnessResult(_Metrics):
    """One variant's output compared with the reference (float64)."""

    _NULLABLE = ("rel_error", "max_abs_error", "cosine_similarity", "rtol", "atol")

    passed: bool
    rel_error: float | None = Field(default=None, description="||out-ref|| / ||ref||")
    max_abs_error: float | None = None
    cosine_similarity: float | None = None
    rtol: float | None = Field(
        default=None, description="the isclose rtol used: the dtype's, plus a reduction's"
    )
    atol: float | None = Field(default=None, description="the isclose atol used, in the output's units")
    nonfinite: Size64 = Field(default=0, description="NaN/Inf elements in the output")
    dtype: ShortText | None = Field(default=None, description="the output's dtype, e.g. 'float32'")
    message: ErrorText = ""
    tolerance: ErrorText = Field(
        default="",
        description="the rule the output was held to, with where each term comes from "
        "(kernelab.kernels.tolerances); empty in results stored before it was recorded",
    )
    # Results of kernelab.runners.checks; None where the check did not run.
    where: ErrorText = Field(default="", description="bad elements in the output's logical coordinates")
    repeats: RepeatCheck | None = None
    determinism: DeterminismCheck | None = None
    batch_invariance: BatchInvarianceCheck | None = None
    vs_baseline: BitwiseComparison | None = Field(
        default=None, description="candidate only: bitwise comparison with the baseline's output"
    )


class RepeatCheck(_Metrics):
    """``runs`` poisoned runs against the reference: how often and how the failure shows."""

    _NULLABLE = ("worst_rel_error", "worst_max_abs_error", "bad_set_jaccard")

    runs: Count32
    inputs: Literal["fixed", "fresh"] = "fixed"
    failures: Count32 = 0
    worst_rel_error: float | None = None
    worst_max_abs_error: float | None = None
    failure_errors_identical: bool | None = Field(
        default=None, description="True: every failure had the same rel. error and bad elements (a clobber)"
    )
    bad_set_jaccard: float | None = Field(
        default=None, description="mean Jaccard of consecutive failures' bad-element sets (fixed inputs)"
    )
    where: ErrorText = ""


class DeterminismCheck(_Metrics):
    """``runs`` runs on the same inputs compared bitwise with the first run."""

    _NULLABLE = ("max_abs_difference", "bad_set_jaccard")

    runs: Count32
    deterministic: bool
    differing_runs: Count32 = Field(default=0, description="runs whose bytes differ from run 0")
    max_differing_elements: Size64 = 0
    max_abs_difference: float | None = None
    bad_set_jaccard: float | None = Field(
        default=None, description="mean Jaccard of consecutive differing runs' element sets (1: fixed)"
    )
    where: ErrorText = ""


class BatchInvarianceCheck(_Metrics):
    """Rows computed alone, in a small batch and in the full batch, compared bitwise."""

    _NULLABLE = ("max_abs_difference",)

    batch_rows: Size64 = Field(description="rows of the full batch")
    rows_checked: Size64
    invariant: bool
    mismatched_rows: Annotated[dict[ShortText, Size64], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=dict, description="'alone' / 'small' -> rows not bitwise equal to the full batch"
    )
    mismatched_elements: Size64 = 0
    max_abs_difference: float | None = None
    message: ErrorText = ""


class BitwiseComparison(_Metrics):
    """Two outputs of one shape compared byte for byte."""

    _NULLABLE = ("max_abs_difference",)

    identical: bool
    differing_elements: Size64 = 0
    max_abs_difference: float | None = None
    where: ErrorText = ""


class ContentionReading(_Posted):
    """Who else used the GPU, read at one moment of a cell's measurement (NVML).

    ``processes``: one entry per process seen on the GPU (compute processes and processes with
    SM-utilisation samples since the previous reading): ``{"pid", "own", "used_memory_bytes",
    "sm_util_pct"}``, ``own`` True for the measuring process, values None where NVML refuses.
    """

    round: Count32 = Field(description="rounds completed when read")
    processes: Annotated[list[JsonObject], AtDoor(max_length=MAX_GPU_PROCESSES)] = Field(default_factory=list)


class Reason(_Posted):
    """Why a verdict or a number is what it is: a machine-readable ``code`` (the catalogue is
    ``kernelab.service.judge.verdicts.REASONS``), one sentence for a person, the side it concerns (None: the
    cell
    or job) and a severity (``error``: decides the verdict; ``warning``/``info``: told, not
    decisive). The shape of nvbench_compare's ``DecisionReason``."""

    code: Annotated[Text, Field(min_length=1, pattern=r"^[a-z0-9-]+$"), AtDoor(max_length=64)]
    message: Message
    side: Side | None = None
    severity: Severity = "error"


class TimedCheck(_Posted):
    """One checked sample of one side: the output of the timed method, verified.

    The runner refills the inputs in place with fresh values (``seed``), poisons the output,
    takes one sample exactly as the timing does (``timer``: a CUDA-graph replay, a CUDA-event
    window, a ``perf_counter`` window), and checks what came out: the output at the window's end
    against the reference, the output at rest against the output at the window's end (work that
    ran on after the window), the inputs' fingerprint before and after (a call that modified its
    inputs), threads the call left running, device work still queued after the window.
    ``findings`` holds the failures as ``Reason`` codes (``kernelab.service.judge.verdicts.REASONS``).
    """

    timer: ShortText
    round: Count32 = Field(description="rounds completed when the check ran")
    seed: Size64
    launches: Positive64 = 1
    duration_ns: float | None = Field(default=None, ge=0, allow_inf_nan=False, description="ns per launch")
    passed: bool
    correctness: CorrectnessResult | None = None
    findings: Annotated[list[Reason], AtDoor(max_length=MAX_FINDINGS)] = Field(default_factory=list)


class TimerCrossCheck(_Posted):
    """A cell's short second measurement with the other timing method (``engine.cross_check``).

    ``methods``: the method that took each side's cross samples (``cuda-event`` when the cell was
    timed by CUDA-graph replay, ``cuda-graph`` when it was timed by events); ``samples_ns``: ns per
    launch of each cross sample, per side, in the order taken (interleaved ABBA rounds, one sample
    per side per round); ``launches``: launches per cross sample, per side. ``error``: why no cross
    measurement exists (no other method on this device, the other method cannot time the call
    faithfully, it raised); then ``samples_ns`` is empty.
    """

    methods: Annotated[dict[Side, ShortText], AtDoor(max_length=2)] = Field(default_factory=dict)
    rounds: Count32 = 0
    launches: Annotated[dict[Side, Positive64], AtDoor(max_length=2)] = Field(default_factory=dict)
    samples_ns: Annotated[
        dict[Side, Annotated[list[float], AtDoor(max_length=MAX_CROSS_SAMPLES)]], AtDoor(max_length=2)
    ] = Field(default_factory=dict)
    error: ErrorText | None = None

    @model_validator(mode="after")
    def _finite_nonnegative(self) -> TimerCrossCheck:
        for side, values in self.samples_ns.items():
            for i, v in enumerate(values):
                if not (math.isfinite(v) and v >= 0):
                    raise ValueError(f"samples_ns.{side}[{i}] must be a finite number >= 0, got {v}")
        return self


class EnergyBlock(_Posted):
    """One block of the energy measurement (``kernelab.runners.engine.energy_check``): one side's
    launches, back to back, between two updates of the device's energy counter.

    ``joules``: the counter's difference between the two updates; ``launches``: the launches that
    completed between them; ``seconds``: host time between the two updates; ``ticks``: counter
    updates inside the block (its resolution: the energy of one update period).
    """

    side: Side
    joules: float = Field(ge=0, allow_inf_nan=False)
    launches: Positive64
    seconds: float = Field(gt=0, allow_inf_nan=False)
    ticks: Positive64


class EnergyMeasurement(_Posted):
    """A cell's energy per launch, from a device's total-energy counter (``measurement.energy``).

    ``counter``: what was read (``nvml-total-energy``: ``nvmlDeviceGetTotalEnergyConsumption``, mJ
    since the driver loaded, the whole board); ``blocks``: the blocks in the order taken (ABBA over
    the sides); ``step_mj``: the smallest counter step seen, ``period_ms``: the median time between
    updates (the counter's real resolution: on an H200 it updates about every 100 ms); ``error``:
    why no energy was measured (no counter on this device, the counter did not change).
    """

    counter: ShortText = "nvml-total-energy"
    blocks: list[EnergyBlock] = Field(default_factory=list, max_length=10_000)
    step_mj: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    period_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    error: ErrorText | None = None


PlacementSchedule = Literal["pairs", "cyclic"]
"""Which input set each side runs in an assignment of a rotating placement
(``kernelab.service.judge.estimators.candidate_set``): ``pairs`` (what runners write) or ``cyclic``
(results written before it: a result without the field was measured so)."""


class Placement(_Posted):
    """How the cell's input sets were placed (``kernelab.runners.engine.input_set``).

    ``input_sets``: 1 (each side times its own buffers throughout), or K >= 2: each side was
    prepared on K input sets allocated alike (each set holds its own inputs and whatever the side's
    ``prepare`` allocated, its output buffers too), and round r uses assignment
    ``a = (r // swap_every_rounds) % K``, in which the baseline runs set a and the candidate the
    set ``schedule`` gives (``kernelab.service.judge.estimators.candidate_set``): under ``pairs`` (K
    even) set ``a XOR 1``, a 2x2 crossover within each pair of sets (0, 1), (2, 3), ...; under
    ``cyclic`` (results measured before 2026-12-04) set ``(a + 1) % K``, a cyclic Latin square. In
    both, over K assignments each side meets each set once and each set serves both sides; with
    K = 2 both are the same 2x2 crossover. With K >= 3 the ratio's CI also spans the spread of the
    sides' differences per set (``kernelab.service.judge.estimators.cluster_cis``), so a buffer-placement
    effect is inside the interval; with K = 2 a change must show in both assignments
    (``kernelab.service.judge.verdicts.placement_reasons``).
    """

    input_sets: int = Field(default=1, ge=1, le=16)
    swap_every_rounds: int = Field(default=2, ge=1, le=1_000_000)
    schedule: PlacementSchedule = "cyclic"

    @model_validator(mode="after")
    def _pairs_need_an_even_count(self) -> Placement:
        if self.schedule == "pairs" and self.input_sets > 1 and self.input_sets % 2:
            raise ValueError(
                f"input_sets: the 'pairs' schedule rotates an even number of sets, got {self.input_sets}"
            )
        return self


StaticVerdict = Literal["identical", "different", "only-baseline", "only-candidate"]


class KernelLoopStats(_Posted):
    """An innermost loop of a kernel's machine code: byte offsets (SASS) or instruction indices."""

    start_offset: Size64
    end_offset: Size64
    instructions: Size64
    by_class: OpcodeCounts = Field(default_factory=dict)


class KernelStatic(_Posted):
    """Static metrics of one compiled kernel (``kernelab.runners.static_metrics``).

    ``isa``: ``sass`` (from the cubin with nvdisasm/cuobjdump) or ``ptx`` (fallback: no registers).
    ``spill_stores``/``spill_loads`` count local-memory store/load instructions (``STL``/``LDL``);
    ``stack_bytes`` is local memory per thread; ``shared_bytes`` static + dynamic per block;
    occupancy is the CUDA Occupancy Calculator's, from registers, shared memory and warps.
    ``code_sha256`` digests the machine code (encodings; no names, no absolute addresses).
    """

    name: KernelName
    isa: Literal["sass", "ptx", "amdgcn"]
    target: ShortText
    num_warps: Count32 | None = None
    num_stages: Count32 | None = None
    registers: Size64 | None = Field(default=None, description="per thread")
    spill_stores: Size64 | None = None
    spill_loads: Size64 | None = None
    stack_bytes: Size64 | None = Field(default=None, description="local memory per thread")
    shared_bytes: Size64 | None = Field(default=None, description="per block")
    occupancy_blocks_per_sm: Size64 | None = None
    occupancy_pct: float | None = Field(default=None, ge=0, le=100)
    instructions: Size64
    predicated: Size64 = Field(default=0, description="instructions under a guard predicate")
    by_class: OpcodeCounts = Field(default_factory=dict)
    by_opcode: OpcodeCounts = Field(default_factory=dict)
    loops: Annotated[list[KernelLoopStats], AtDoor(max_length=MAX_KERNEL_LOOPS)] = Field(
        default_factory=list, description="innermost loops"
    )
    code_sha256: ShortText = ""


class StaticChange(_Posted):
    """Instructions added (``+``) or removed (``-``) by the candidate, per opcode and code region
    (``prologue``, ``loop``, ``epilogue``, ``between`` loops, ``body`` when loop-free)."""

    sign: Literal["+", "-"]
    opcode: ShortText
    count: Positive64
    region: ShortText


class KernelDiff(_Posted):
    """Baseline vs candidate for one kernel: deltas are candidate - baseline."""

    name: KernelName
    verdict: StaticVerdict
    baseline: KernelStatic | None = None
    candidate: KernelStatic | None = None
    class_delta: OpcodeDeltas = Field(default_factory=dict)
    opcode_delta: OpcodeDeltas = Field(default_factory=dict)
    resource_delta: Annotated[dict[ShortText, float], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=dict
    )
    changes: Annotated[list[StaticChange], AtDoor(max_length=MAX_OPCODES)] = Field(default_factory=list)
    summary: ErrorText = ""


class StaticComparison(_Posted):
    """Static comparison of one cell's kernels; ``identical`` when every kernel's code is equal."""

    target: ShortText = ""
    verdict: Literal["identical", "different"] | None = None
    kernels: Annotated[list[KernelDiff], AtDoor(max_length=MAX_KERNELS)] = Field(default_factory=list)
    error: ErrorText | None = None


class CellResult(_Posted):
    """All raw data measured for one sweep cell."""

    index: Count32
    params: ParamMap
    baseline_params: ParamMap = Field(default_factory=dict)
    candidate_params: ParamMap = Field(default_factory=dict)
    work: Annotated[dict[Side, Work], AtDoor(max_length=2)] = Field(default_factory=dict)
    samples: SampleColumns = Field(
        default_factory=empty_samples,
        description="raw samples: base64 columns (the JSON-list columns and the row form are accepted)",
    )
    correctness: Annotated[dict[Side, CorrectnessResult], AtDoor(max_length=2)] = Field(default_factory=dict)
    error: ErrorText | None = Field(default=None, description="set when the cell could not be measured")
    timers: Annotated[dict[Side, ShortText], AtDoor(max_length=2)] = Field(
        default_factory=dict, description="timer that measured each variant (a graph fallback shows)"
    )
    interpreted: Annotated[list[Side], AtDoor(max_length=2)] = Field(
        default_factory=list,
        description="sides whose calls ran Triton kernels in Triton's interpreter (TRITON_INTERPRET=1, "
        "a CPU node): their time is the interpreter's, so the cell gets no timing verdict",
    )
    contention: Annotated[list[ContentionReading], AtDoor(max_length=MAX_CONTENTION_READINGS)] = Field(
        default_factory=list
    )
    static: StaticComparison | None = None
    timed_checks: Annotated[
        dict[Side, Annotated[list[TimedCheck], AtDoor(max_length=MAX_LIST_ITEMS)]], AtDoor(max_length=2)
    ] = Field(default_factory=dict, description="checked samples through the timer, per side")
    findings: Annotated[list[Reason], AtDoor(max_length=MAX_FINDINGS)] = Field(
        default_factory=list,
        description="what the runner found about the cell's measurement (timer fallback, empty graph, "
        "patched timer, node changed during the job, ...); codes in kernelab.service.judge.verdicts.REASONS",
    )
    cross_check: TimerCrossCheck | None = Field(
        default=None, description="the short measurement with the other timing method (None: not asked)"
    )
    placement: Placement = Field(default_factory=Placement, description="how the input sets were placed")
    energy: EnergyMeasurement | None = Field(
        default=None, description="energy per launch from the device's energy counter (None: not asked)"
    )
    phase_s: Annotated[dict[ShortText, float], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=dict,
        description="wall time of the cell's phases on the runner, s: prepare, correctness, measure "
        "(the rounds), checks (the checked samples), device_work, canary",
    )
