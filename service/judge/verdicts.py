"""Verdict policy: what a cell's timing, correctness checks and findings add up to.

Correctness outranks speed. A cell's verdict is the highest class among its deciding reasons, in
the order of ``schemas.VERDICT_CATALOGUE`` (whose entries say what each verdict means)::

    failed > incorrect > nondeterministic > implausible > inconclusive > faster / slower / same

* ``failed``: a side raised or timed out, or the measurement cannot be trusted at all (kernelab's
  timing functions were replaced while the job ran);
* ``incorrect``: a side's output was wrong, in the eager check, under the timed method or when
  the CUDA graph captured from its calls is replayed (even where another timer timed it), or
  the call did something a kernel must not (modified its inputs, left work running after the
  timed window, returned a lazy output); the reason names the side;
* ``nondeterministic``: a bitwise reproducibility the spec asked for does not hold: repeated runs
  on the same inputs differed bitwise (``determinism_runs``, ``repeats``), or a row's output
  changed with the batch it was computed in (``batch_invariance``);
* ``implausible``: a rate above the node's measured peak, a time per launch below what any launch
  takes on the device, or a timed call that launched no device work;
* ``inconclusive``: the numbers stand but cannot decide: no confidence interval, a CI that
  straddles the threshold, sides timed by different methods, a node that changed during the job,
  a candidate far less accurate than the baseline at the same dtype;
* only when no reason decides does the timing verdict (``timing_verdict``) speak: ``faster``,
  ``slower`` or ``same``.

Every deciding reason is a ``schemas.Reason`` with a code from ``REASONS`` and a sentence; the
timing numbers of an ``incorrect`` or ``implausible`` cell are kept (``CellComparison.ratio`` and
``timing_verdict``), shown greyed, never as the verdict. ``FLAG_NOTES`` is the one description of
each flag, used by the text table, the Markdown and the dashboard.

Pure functions over ``kernelab.service.contract.schemas``; no database, no numpy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, get_args

from kernelab.service.contract.probes.telemetry import foreign_processes
from kernelab.service.contract.schemas import (
    MAX_DURATION_NS,
    VERDICT_CATALOGUE,
    BatchInvarianceCheck,
    CellResult,
    ContentionReading,
    CorrectnessResult,
    CrossCheckSummary,
    Flag,
    JobResult,
    ProbeReport,
    Reason,
    Severity,
    Side,
    SideStats,
    TimingVerdict,
    Verdict,
)
from kernelab.service.contract.schemas.probe_protocol import probes_with

METHOD_VERSION = 9
"""Version of these rules. A stored ``Comparison`` with a lower ``method_version`` was judged by
older rules (version 1: a wrong kernel could read ``faster``; version 2: two samples per side could
read ``faster``, a sample throttled by its clock-event reasons counted as clean; version 3: no timer
cross-check, no input-set placement strata; version 4: a verdict the input placements disagreed on
stood, a side's median was the pooled one; version 5: no power state, SM clock or energy per launch
in the comparison; version 6: at most two input sets, no CI across placements; version 7: a
change claimed at 95%, whatever the CI's width against the threshold, a sample power-capped at
its full clock left out as throttled; version 8: a Triton kernel timed in Triton's interpreter got
a timing verdict) and is recomputed from its raw result."""

VERDICT_ORDER: tuple[Verdict, ...] = tuple(e.name for e in VERDICT_CATALOGUE)
"""Every verdict, highest precedence first (the order of ``schemas.VERDICT_CATALOGUE``)."""
PROBLEM_VERDICTS: frozenset[Verdict] = frozenset(e.name for e in VERDICT_CATALOGUE if e.kind == "problem")
"""Verdicts under which the cell's timing is not a result (``VerdictEntry.kind`` ``problem``):
numbers greyed, never a speed-up."""


MIN_ROUNDS = 5
"""Fewest interleaved rounds holding samples of both sides for a ``faster``/``slower``/``same``
verdict. The CI is a bootstrap over rounds: R rounds allow only C(2R-1, R) distinct resamples
(2 rounds: 3, 3: 10, 4: 35, 5: 126), and a 95% percentile interval needs at least 40 of them for
its 2.5% and 97.5% quantiles to be different resamples (Efron & Tibshirani 1993, ch. 13: the
percentile interval is the resampled distribution's quantiles). It is also the spec's default
``measurement.min_rounds``."""
MIN_SAMPLES = 5
"""Fewest kept samples per side for a verdict. With m = n samples per side the smallest two-sided
exact Mann-Whitney p is 2 / C(2n, n): 0.33 for 2, 0.10 for 3, 0.029 for 4 (Hollander & Wolfe 1999,
table A.6): below 4 no sample, however clear, can show a change at 5%; 5 leaves one sample of
margin, and 5 rounds of one sample per side give it."""


class ReasonKind(NamedTuple):
    """A reason code's verdict class (None: told, never decisive), the flag it raises, and what it
    means in one sentence (shown where the code is explained)."""

    verdict: Verdict | None
    flag: Flag | None
    meaning: str


REASONS: dict[str, ReasonKind] = {
    # failed
    "side-failed": ReasonKind("failed", "failed", "a side raised or could not be measured"),
    "job-failed": ReasonKind("failed", "failed", "the job could not be measured"),
    "timer-tampered": ReasonKind(
        "failed", "tampered", "kernelab's timing or checking functions were replaced while the job ran"
    ),
    # incorrect
    "wrong-output": ReasonKind("incorrect", "incorrect", "the output differs from the reference"),
    "wrong-under-timing": ReasonKind(
        "incorrect",
        "incorrect",
        "the output of the timed method (a CUDA-graph replay, a timed launch) differs from the reference",
    ),
    "wrong-under-graph-replay": ReasonKind(
        "incorrect",
        "incorrect",
        "right when called, wrong when the CUDA graph captured from its calls is replayed (whatever "
        "timer timed the cell)",
    ),
    "output-after-window": ReasonKind(
        "incorrect", "incorrect", "the output still changed after the timed window had ended"
    ),
    "work-after-window": ReasonKind(
        "incorrect", "incorrect", "device work the call started was still running after the timed window"
    ),
    "background-work": ReasonKind(
        "incorrect", "incorrect", "the call left a thread running after it returned"
    ),
    "inputs-modified": ReasonKind("incorrect", "incorrect", "the call modified its inputs"),
    "inputs-differ": ReasonKind("incorrect", "incorrect", "the two sides were checked on different inputs"),
    "not-a-tensor": ReasonKind(
        "incorrect", "incorrect", "the call returned no plain tensor (a lazy, deferred or wrapped output)"
    ),
    # nondeterministic
    "nondeterministic": ReasonKind(
        "nondeterministic", "nondeterministic", "repeated runs on the same inputs differed bitwise"
    ),
    "batch-variant": ReasonKind(
        "nondeterministic",
        "nondeterministic",
        "the spec asked for batch invariance, and rows computed alone or in a small batch differed "
        "bitwise from the same rows in the full batch",
    ),
    # implausible
    "rate-above-peak": ReasonKind(
        "implausible", "implausible", "an implied rate exceeds 1.1x the node's measured peak"
    ),
    "below-resolution": ReasonKind(
        "implausible", "implausible", "a time per launch below what any launch takes on this device"
    ),
    "no-device-work": ReasonKind("implausible", "implausible", "a timed call launched no device work"),
    "beyond-job-time": ReasonKind(
        "implausible", "implausible", "a time per launch longer than any job may run (one day)"
    ),
    # inconclusive
    "no-interval": ReasonKind("inconclusive", None, "too few samples or rounds for a confidence interval"),
    "too-few-rounds": ReasonKind(
        "inconclusive",
        None,
        f"fewer than {MIN_ROUNDS} rounds holding both sides, or fewer than {MIN_SAMPLES} kept samples "
        "on a side: too few for a verdict",
    ),
    "non-finite": ReasonKind(
        "inconclusive", None, "a statistic overflowed float64 (samples near 1.8e308 ns): shown as null"
    ),
    "zero-baseline": ReasonKind("inconclusive", None, "the baseline's median time is zero: no ratio"),
    "ci-straddles": ReasonKind("inconclusive", None, "the confidence interval overlaps the threshold"),
    "not-decisive": ReasonKind(
        "inconclusive",
        None,
        "a change beyond the threshold that the 95% CI shows but the 99.8% interval a change verdict "
        "needs does not",
    ),
    "timer-mismatch": ReasonKind(
        "inconclusive", "timer-mismatch", "the two sides were timed by different methods"
    ),
    "interpreted": ReasonKind(
        "inconclusive",
        None,
        "a side's Triton kernels ran in Triton's interpreter (a CPU node): its time is the interpreter's, "
        "not the kernel's; its correctness was checked",
    ),
    "no-run-noise": ReasonKind(
        "inconclusive",
        None,
        "a comparison across runs with neither a side both runs shared nor a stored estimate of how "
        "much the cell moves between runs of unchanged code",
    ),
    "node-changed": ReasonKind(
        "inconclusive", "node-changed", "the node's probes changed during the job beyond their noise"
    ),
    "placement-disagreement": ReasonKind(
        "inconclusive",
        None,
        "a change that one input placement (the input sets swapped between the sides) does not show beyond "
        "the threshold: the buffers' placement moves the timing as much as the change",
    ),
    "timer-disagreement": ReasonKind(
        "inconclusive",
        "timer-disagreement",
        "the other timing method read a side beyond the allowance and the two ratios disagree in "
        "direction or size",
    ),
    "less-accurate": ReasonKind(
        "inconclusive",
        "less-accurate",
        "the candidate's error is far above the baseline's at the same dtype (a precision downgrade?)",
    ),
    # told, never decisive
    "timer-disagreement-ratio-agrees": ReasonKind(
        None,
        None,
        "the other timing method read a side beyond the allowance, but the two ratios agree in "
        "direction and size: the verdict stands",
    ),
    "correctness-off": ReasonKind(None, None, "the spec turned the correctness check off"),
    "metric-not-finite": ReasonKind(
        None, None, "a correctness metric was posted as NaN or Infinity: it is stored and shown as null"
    ),
}

READ_FROM_TIMES = frozenset(
    {
        "below-resolution", "rate-above-peak", "beyond-job-time", "non-finite", "zero-baseline",
        "ci-straddles", "not-decisive", "no-interval", "timer-disagreement",
        "timer-disagreement-ratio-agrees", "placement-disagreement",
    }
)  # fmt: skip
"""The reason codes read from the timed values themselves. Once ``timer-tampered`` is found, the
process's clock was replaced for both sides (the sides share the measuring process), so these say
nothing about either side, and naming the honest side by them would blame it for the cheat:
``tampered_times_reasons`` leaves them out."""


def tampered_times_reasons(found: Sequence[Reason]) -> list[Reason]:
    """``found`` without the ``READ_FROM_TIMES`` reasons when one of them is ``timer-tampered``
    (those times are the tampering's, ``READ_FROM_TIMES``); else ``found`` unchanged."""
    if not any(r.code == "timer-tampered" for r in found):
        return list(found)
    return [r for r in found if r.code not in READ_FROM_TIMES]


NOISY_IQR_FRACTION = 0.10  # torch.utils.benchmark warns when IQR/median > 10%
PEAK_MARGIN = 1.1  # a rate above 1.1x the measured peak is implausible (10% probe error allowance)

FLAG_NOTES: dict[Flag, str] = {
    "noisy": f"the IQR/median of a side's kept samples is above {NOISY_IQR_FRACTION:.0%} "
    "(torch.utils.benchmark's warning threshold).",
    "throttled": "some samples were taken while the GPU was throttled (excluded from the statistics "
    "unless the spec keeps them; the flag says how many were dropped, baseline+candidate).",
    "contended": "another process was on the GPU before or during the measurement.",
    "degraded-node": "the node's health probes were below its healthy band.",
    "node-changed": "the node's probes after the job differ from those before it beyond their noise: "
    "the job may have changed the node; the cells' timing cannot decide.",
    "implausible": "an implied rate exceeds the node's measured peak, a time is below any launch's, or "
    "a call launched no device work: a timing error, never a verdict.",
    "incorrect": "a side's output was wrong (eager check or under the timed method) or the call cheated: "
    "its timing is of a wrong result.",
    "less-accurate": "the candidate's error is far above the baseline's at the same dtype.",
    "nondeterministic": "outputs differed bitwise between identical runs.",
    "timer-mismatch": "the two sides were timed by different methods: their ratio is no verdict.",
    "timer-disagreement": "the cross-check with the other timing method (CUDA events vs CUDA-graph "
    "replay) read a side differently beyond its allowance; the verdict stands only where both methods' "
    "ratios agree in direction and size.",
    "tampered": "kernelab's timing or checking functions were replaced while the job ran.",
    "failed": "the cell (or job) could not be measured; see the error.",
}

_RANK: dict[Verdict, int] = {v: i for i, v in enumerate(VERDICT_ORDER)}

# Defined before REASONS (whose meanings quote them): see ``sample_size_reasons``.


def reason(code: str, message: str, *, side: Side | None = None) -> Reason:
    """A ``Reason`` for ``code``; its severity is ``error`` when the code decides a verdict, else
    ``warning``. Raises ``KeyError`` for a code not in ``REASONS`` (a caller's bug)."""
    severity: Severity = "error" if REASONS[code].verdict is not None else "warning"
    return Reason(code=code, message=message[:2000], side=side, severity=severity)


def deciding_class(r: Reason) -> Verdict | None:
    """The verdict class ``r`` decides (None for an informational or unknown code)."""
    kind = REASONS.get(r.code)
    return None if kind is None else kind.verdict


class Decision(NamedTuple):
    """A cell's verdict, its reasons (deciding first, then by precedence) and the flags they raise."""

    verdict: Verdict
    reasons: list[Reason]
    flags: list[Flag]


def decide(timing: TimingVerdict, reasons: Iterable[Reason]) -> Decision:
    """The verdict of a cell whose timing alone says ``timing``, given everything found.

    The highest class among the deciding reasons wins (module docstring); without one, ``timing``
    stands. Reasons come back sorted by their class (deciding ones first, informational last,
    stable within a class); duplicates (same code, side and message) are dropped. Flags are those
    the reasons' codes raise.
    """
    unique: list[Reason] = []
    seen: set[tuple[str, str | None, str]] = set()
    for r in reasons:
        key = (r.code, r.side, r.message)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    unique.sort(key=lambda r: _RANK.get(deciding_class(r) or "faster", len(_RANK)))
    classes = [c for r in unique if (c := deciding_class(r)) is not None]
    verdict: Verdict = min(classes, key=_RANK.__getitem__) if classes else timing
    flags = [kind.flag for r in unique if (kind := REASONS.get(r.code)) is not None and kind.flag]
    return Decision(verdict, unique, flags)


DECISION_CONFIDENCE = 0.998
"""The confidence at which a change is claimed: ``faster``/``slower`` need the ratio's decision
interval (``decision_interval``: the 95% CI widened to 99.8%) to exclude 1 (two-sided 0.2%: the p
threshold of asv's ``is_different``, ``asv/statistics.py`` in airspeed-velocity/asv), while the CI
shown and ``same`` are 95%. Where the 95% CI is as wide as the threshold or wider (a noisy CPU, a
short budget), the threshold no longer protects against a chance reading: with a calibrated 95%
interval an A/A cell then reads ``faster`` or ``slower`` in up to 5% of cells (CPU softmax A/A,
CIs of +-2% at a 1% threshold: 2 of 40 jobs excluded 1, ``docs/results/2026-12-04-aa-cpu.md``);
at the decision level in at most 0.2% (0.8% where the CI is a Student-t interval of 6 degrees of
freedom, ``decision_interval``), whatever the width."""
_Z_95 = 1.959963984540054  # z(0.975)
_Z_DECISION = 3.090232306167813  # z(0.999)


def decision_interval(ratio: float, ci_low: float, ci_high: float) -> tuple[float, float]:
    """The decision interval of a ratio from its 95% interval (all three > 0): symmetric about
    ln(ratio), its half-width the wider of the 95% interval's two halves in ln units scaled by
    z(0.999) / z(0.975) = 1.577. Symmetric, because a percentile bootstrap interval of medians is
    often lopsided (its narrow side rests on few distinct resamples), and a change claimed at 99.8%
    must not rest on that side: a CPU revision A/A under load read 1.0156 [1.0058, 1.0291], which
    the narrow side's 1.577 times would have claimed ``slower``. For a normal ln(ratio) this is the
    99.8% interval (``DECISION_CONFIDENCE``); where
    the 95% CI is, or holds, a Student-t interval of few degrees of freedom (the paired interval of
    the input sets, ``estimators.paired_sets_ci``) the widened one covers less: 99.2% at 6 degrees
    of freedom (|t| <= 2.447 x 1.577). The one form for every comparison (a job's cells, job vs
    job, workloads), whatever interval it holds. Raises ValueError for a ratio or bound that is not
    positive."""
    if not (ratio > 0 and ci_low > 0 and ci_high > 0):
        raise ValueError(f"a ratio interval needs positive numbers, got {ratio}, [{ci_low}, {ci_high}]")
    centre = math.log(ratio)
    half = _Z_DECISION / _Z_95 * max(0.0, centre - math.log(ci_low), math.log(ci_high) - centre)
    return math.exp(centre - half), math.exp(centre + half)


def timing_verdict(
    ratio: float | None,
    ci_low: float | None,
    ci_high: float | None,
    threshold_pct: float,
    decision: tuple[float, float] | None = None,
) -> tuple[TimingVerdict, Reason | None]:
    """What the ratio candidate/baseline and its CI say against threshold t = threshold_pct / 100.

    * ``faster``: the decision interval's high end < 1 (``DECISION_CONFIDENCE``: the speed-up is
      statistically real at 99.8%) AND ratio < 1 - t (it is large enough to matter);
    * ``slower``: its low end > 1 AND ratio > 1 + t;
    * ``same``: the whole 95% CI lies inside [1 - t, 1 + t] (an equivalence test: any change is
      smaller than the threshold, with the CI's confidence);
    * ``inconclusive`` otherwise, with the reason: no interval, a change beyond the threshold that
      the 95% CI shows but the 99.8% interval does not (``not-decisive``), or a CI that straddles
      1 - t or 1 + t.

    ``decision``: the decision interval (``decision_interval``, stored as
    ``CellComparison.decision_low/high``); None: ``decision_interval`` of the 95% CI.

    Why not "faster only when the whole CI lies beyond 1 - t": a real change close to the
    threshold would then stay inconclusive however many samples are taken. Requiring an interval
    that excludes 1 plus a point estimate beyond the threshold is the rule of nvbench compare (a gap
    that must also exceed a minimum) with a proper interval instead of [min, Q3]; the 99.8% level
    of that interval is ``DECISION_CONFIDENCE``'s.
    """
    if ratio is None or ci_low is None or ci_high is None:
        return "inconclusive", reason("no-interval", "no confidence interval: too few samples or rounds")
    t = threshold_pct / 100
    if decision is None:
        decision = decision_interval(ratio, ci_low, ci_high) if min(ratio, ci_low) > 0 else (ci_low, ci_high)
    low, high = decision
    if high < 1 and ratio < 1 - t:
        return "faster", None
    if low > 1 and ratio > 1 + t:
        return "slower", None
    if 1 - t <= ci_low and ci_high <= 1 + t:
        return "same", None
    if (ci_high < 1 and ratio < 1 - t) or (ci_low > 1 and ratio > 1 + t):
        return "inconclusive", reason(
            "not-decisive",
            f"the ratio {ratio:.4g} lies beyond the ±{threshold_pct:g}% threshold and its 95% CI "
            f"[{ci_low:.4g}, {ci_high:.4g}] excludes 1, but the {DECISION_CONFIDENCE:.1%} interval a "
            f"change verdict needs, [{low:.4g}, {high:.4g}], does not: more rounds (a larger budget_ms) "
            "would decide",
        )
    return "inconclusive", reason(
        "ci-straddles",
        f"the 95% CI [{ci_low:.4g}, {ci_high:.4g}] of the ratio {ratio:.4g} reaches across the "
        f"±{threshold_pct:g}% threshold: neither a change nor its absence is shown",
    )


def sample_size_reasons(
    rounds_with_both: int,
    kept: dict[Side, int],
    per_assignment: tuple[int, int] | None = None,
    input_sets: int = 1,
) -> list[Reason]:
    """``too-few-rounds`` when fewer than ``MIN_ROUNDS`` rounds hold kept samples of both sides or a
    side kept fewer than ``MIN_SAMPLES`` samples (``kept``: samples per side after dropping the
    throttled ones), or, under a rotation of ``input_sets`` sets, when an input-set assignment the
    rounds reached holds fewer than ``MIN_ROUNDS`` such rounds (``per_assignment``: the fewest, and
    how many assignments were reached). The ratio is a mean over the assignments, each bootstrapped
    within itself: an assignment of three rounds allows 10 distinct resamples, and one cut short
    weighs as much as a full one (a CPU A/A whose budget ended after 6 rounds, 3 in each of 2 of 8
    assignments, read ``slower`` 1.10). Below that no timing verdict is given, whatever the ratio
    and p say."""
    short = per_assignment is not None and per_assignment[0] < MIN_ROUNDS
    if rounds_with_both >= MIN_ROUNDS and min(kept.values(), default=0) >= MIN_SAMPLES and not short:
        return []
    if short and rounds_with_both >= MIN_ROUNDS:
        assert per_assignment is not None
        fewest, reached = per_assignment
        return [
            reason(
                "too-few-rounds",
                f"{rounds_with_both} rounds hold samples of both sides, over {reached} of the {input_sets} "
                f"input-set assignments, the fewest {fewest} in one: a verdict under the rotation needs "
                f"{MIN_ROUNDS} rounds in each assignment it reached (a larger budget_ms, or fewer "
                "measurement.input_sets)",
            )
        ]
    return [
        reason(
            "too-few-rounds",
            f"{rounds_with_both} rounds hold samples of both sides and {kept.get('baseline', 0)} baseline / "
            f"{kept.get('candidate', 0)} candidate samples were kept: a verdict needs at least {MIN_ROUNDS} "
            f"rounds and {MIN_SAMPLES} samples per side (a bootstrap over fewer rounds has too few distinct "
            "resamples for a 95% interval)",
        )
    ]


def nonfinite_reason(names: Sequence[str], max_sample_ns: float) -> Reason:
    """``non-finite``: the statistics ``names`` (``ratio``, ``baseline.mean_ns``, ...) overflowed
    float64 and are shown as null."""
    return reason(
        "non-finite",
        f"{', '.join(names)} overflowed float64 (samples up to {max_sample_ns:.3g} ns): shown as null; "
        "no sample a job can take is that long",
    )


def summary(verdicts: Sequence[Verdict]) -> dict[str, int]:
    """``{verdict: count}`` in ``VERDICT_ORDER``, verdicts with no cell left out."""
    counts = {v: 0 for v in VERDICT_ORDER}
    for v in verdicts:
        counts[v] += 1
    return {v: n for v, n in counts.items() if n}


def job_error(result: JobResult) -> str | None:
    """The job-level error of ``result``: the runner's own, or, when every cell failed, ``"all N
    cells failed; first: <error>"``; None when at least one cell was measured. The server applies
    this rule itself, whatever the runner says: a job none of whose cells measured is ``failed``."""
    if result.error:
        return result.error
    return all_cells_failed(result.cells)


def all_cells_failed(cells: Sequence[CellResult]) -> str | None:
    """``"all N cells failed; first: <error>"`` when ``cells`` is non-empty and every one has an
    error, else None."""
    if cells and all(c.error for c in cells):
        return f"all {len(cells)} cells failed; first: {cells[0].error}"
    return None


# --------------------------------------------------------------------------------------------------
# Reasons found in a cell's raw result
# --------------------------------------------------------------------------------------------------

LESS_ACCURATE_FACTOR = 10.0
"""A candidate whose relative error exceeds this many times the larger of the baseline's error and
the dtype's machine epsilon is ``less-accurate`` (e.g. a float32 kernel computing in TF32 or
bfloat16 that passes a loose tolerance)."""

# Machine epsilon (spacing of representable numbers just above 1) per dtype: IEEE 754-2008 for the
# binary formats (float64 2^-52, float32 2^-23, float16 2^-10), bfloat16 2^-7 (7 explicit mantissa
# bits), TF32 2^-10 (NVIDIA A100 whitepaper: 10 explicit mantissa bits), OCP OFP8 rev. 1.0 for fp8
# (E4M3 2^-3, E5M2 2^-2).
MACHINE_EPSILON: dict[str, float] = {
    "float64": 2.0**-52, "float32": 2.0**-23, "tf32": 2.0**-10, "float16": 2.0**-10,
    "bfloat16": 2.0**-7, "float8_e4m3fn": 2.0**-3, "float8_e4m3fnuz": 2.0**-3, "float8_e5m2": 2.0**-2,
    "float8_e5m2fnuz": 2.0**-2,
}  # fmt: skip

MIN_LAUNCH_NS: dict[str, float] = {"cuda": 250.0, "cpu": 10.0}
"""Shortest credible time per launch, ns, per device type. On a GPU no kernel, copy or memset runs
in less: the shortest graph-replayed kernel on an H200 takes about 1 us (a one-element kernel reads
1.02 us per launch under ``triton.testing.do_bench_cudagraph``; docs/results/2026-11-30-h200-timing-
accuracy.md). On a CPU a Python call alone costs more than 10 ns. A median below it is no timing."""


def _dtype_name(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    name = value.strip().lower().removeprefix("torch.")
    return {
        "fp32": "float32",
        "fp16": "float16",
        "half": "float16",
        "bf16": "bfloat16",
        "fp64": "float64",
        "double": "float64",
        "float": "float32",
    }.get(name, name)


def correctness_reasons(result: JobResult, cell: CellResult) -> list[Reason]:
    """The reasons a cell's correctness data gives (each naming its side): a failed eager check
    (``wrong-output``), findings of the checked samples through the timer (``timed_checks``), the
    runner's own findings about the cell, repeated runs that differed (``nondeterministic``), a
    candidate far less accurate than its baseline (``less-accurate``, see ``LESS_ACCURATE_FACTOR``),
    and ``correctness-off`` when the spec turned the check off."""
    out: list[Reason] = []
    for side, check in cell.correctness.items():
        if not check.passed:
            text = check.message or "the output differs from the reference"
            out.append(reason("wrong-output", f"{side}: {text}", side=side))
        if is_nondeterministic(check):
            out.append(reason("nondeterministic", f"{side}: {_nondeterminism_text(check)}", side=side))
        if check.batch_invariance is not None and not check.batch_invariance.invariant:
            out.append(reason("batch-variant", f"{side}: {_batch_text(check.batch_invariance)}", side=side))
        if nonfinite := nonfinite_metrics(check):
            out.append(
                reason(
                    "metric-not-finite",
                    f"{side}: {', '.join(nonfinite)} posted as NaN or Infinity (an output with non-finite "
                    "values, or a difference that overflowed), stored as null",
                    side=side,
                )
            )
    for side, checks in cell.timed_checks.items():
        for timed in checks:
            out += [f if f.side is not None else f.model_copy(update={"side": side}) for f in timed.findings]
    out += cell.findings
    out += _accuracy_reasons(cell)
    if not result.spec.correctness.enabled:
        out.append(reason("correctness-off", "the outputs were not checked (correctness.enabled is false)"))
    return out


def nonfinite_metrics(check: CorrectnessResult) -> list[str]:
    """Names of ``check``'s metrics (and its repeat, determinism, batch and bitwise checks') that
    were posted as NaN or Infinity and are stored as null, e.g. ``["rel_error",
    "repeats.worst_rel_error"]``."""
    out = list(check.nonfinite_metrics)
    for name in ("repeats", "determinism", "batch_invariance", "vs_baseline"):
        sub = getattr(check, name)
        if sub is not None:
            out += [f"{name}.{m}" for m in sub.nonfinite_metrics]
    return out


def is_nondeterministic(check: CorrectnessResult) -> bool:
    """True when repeated runs of one side on the same inputs disagreed (``kernelab.runners.checks``):
    the bitwise determinism check saw differing runs, or the repeat check on fixed inputs failed
    only sometimes or with errors that changed between failures (a race, not a clobber)."""
    if check.determinism is not None and not check.determinism.deterministic:
        return True
    r = check.repeats
    if r is None or r.inputs != "fixed" or r.failures == 0:
        return False
    return r.failures < r.runs or r.failure_errors_identical is False


def _nondeterminism_text(check: CorrectnessResult) -> str:
    d = check.determinism
    if d is not None and not d.deterministic:
        where = f"; {d.where}" if d.where else ""
        return f"{d.differing_runs}/{max(d.runs - 1, 1)} runs on the same inputs differed bitwise{where}"
    r = check.repeats
    assert r is not None
    return f"{r.failures}/{r.runs} runs on the same inputs failed, with errors that moved (a race)"


def _batch_text(b: BatchInvarianceCheck) -> str:
    if b.message:
        return f"not batch-invariant: {b.message}"
    rows = sum(b.mismatched_rows.values())
    return (f"not batch-invariant: {rows} of {b.rows_checked} rows checked differ from the same rows in "
            f"the {b.batch_rows}-row batch ({b.mismatched_elements} elements)")  # fmt: skip


def _accuracy_reasons(cell: CellResult) -> list[Reason]:
    base, cand = cell.correctness.get("baseline"), cell.correctness.get("candidate")
    if base is None or cand is None or not (base.passed and cand.passed):
        return []
    if base.rel_error is None or cand.rel_error is None:
        return []
    sides = ((base, cell.baseline_params or cell.params), (cand, cell.candidate_params or cell.params))
    dtypes = {_dtype_name(c.dtype) or _dtype_name(params.get("dtype")) for c, params in sides}
    if len(dtypes) != 1:
        return []  # the sides compute at different dtypes: their errors are not comparable
    (dtype,) = dtypes
    eps = MACHINE_EPSILON.get(dtype or "")
    if eps is None:
        return []
    floor = max(base.rel_error, eps)
    if cand.rel_error <= LESS_ACCURATE_FACTOR * floor:
        return []
    return [
        reason(
            "less-accurate",
            f"candidate: rel. error {cand.rel_error:.3g} is {cand.rel_error / floor:,.0f}x the baseline's "
            f"{base.rel_error:.3g} at {dtype} (machine epsilon {eps:.3g}); it passed a tolerance of "
            f"rtol={cand.rtol:g}, but a precision downgrade is no speed-up of the same computation",
            side="candidate",
        )
    ]


def resolution_reasons(device_type: str, medians_ns: dict[Side, float | None]) -> list[Reason]:
    """``below-resolution`` for each side whose median time per launch is below
    ``MIN_LAUNCH_NS[device_type]`` (a zero time included)."""
    floor = MIN_LAUNCH_NS.get(device_type)
    if floor is None:
        return []
    return [
        reason(
            "below-resolution",
            f"{side}: {median:.3g} ns per launch is below the {floor:g} ns any launch takes on a "
            f"{device_type} device: the call launched (almost) nothing, or the timing failed",
            side=side,
        )
        for side, median in medians_ns.items()
        if median is not None and median < floor
    ]


def duration_reasons(longest_ns: dict[Side, float]) -> list[Reason]:
    """``beyond-job-time`` for each side whose longest kept sample exceeds
    ``schemas.MAX_DURATION_NS`` (one day, the longest a job may run): such a time is a timing or
    transport error (the door refuses it; results stored before that may hold one)."""
    return [
        reason(
            "beyond-job-time",
            f"{side}: a sample of {longest:.3g} ns per launch is longer than any job may run "
            f"({MAX_DURATION_NS:.3g} ns, one day): a timing error, not a time",
            side=side,
        )
        for side, longest in longest_ns.items()
        if longest > MAX_DURATION_NS
    ]


def timer_reasons(cell: CellResult) -> list[Reason]:
    """``timer-mismatch`` when the two sides were timed by different methods (a capture fallback on
    one side only): their ratio compares two methods, not two kernels."""
    kinds = {cell.timers.get("baseline"), cell.timers.get("candidate")}
    if len(kinds) == 2 and None not in kinds:
        return [
            reason(
                "timer-mismatch",
                f"baseline timed by {cell.timers['baseline']}, candidate by {cell.timers['candidate']}: "
                "the ratio compares two timing methods",
            )
        ]
    return []


def interpreted_reasons(cell: CellResult) -> list[Reason]:
    """``interpreted`` for each side whose calls ran Triton kernels in Triton's interpreter
    (``CellResult.interpreted``, ``TRITON_INTERPRET=1`` on a CPU node): a timing of the interpreter
    against a native side (or another interpreted one) says nothing about the kernels, so the cell
    gets no timing verdict; its correctness verdicts still stand."""
    return [
        reason(
            "interpreted",
            f"{side}: its Triton kernels ran in Triton's interpreter (no GPU: TRITON_INTERPRET=1), so its "
            "time is Python's, not the kernel's; the output was checked. Run it on a GPU node to time it",
            side=side,
        )
        for side in _SIDES
        if side in cell.interpreted
    ]


def _relative_iqr(values: Sequence[float]) -> float:
    """IQR / median of ``values`` (``statistics.quantiles``, inclusive method: numpy's default
    linear interpolation); 0 for fewer than 2 values or a zero median."""
    if len(values) < 2:
        return 0.0
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else 0.0


def cross_check_summary(
    cell: CellResult,
    stats: Mapping[Side, SideStats],
    ratio: float | None,
    tolerance_pct: float,
    threshold_pct: float = 1.0,
    cross_ci: tuple[float, float] | None = None,
) -> CrossCheckSummary | None:
    """The cell's timer cross-check (``CellResult.cross_check``) against its primary statistics.

    Per side: the cross method's median ns per launch against the primary median (``stats``);
    ``difference_pct`` = (cross / primary - 1) x 100; the allowance ``noise_pct`` = ``tolerance_pct``
    (the spec's ``cross_check_pct``, 5 by default) + 100 x (primary IQR/median + cross IQR/median):
    the tolerance beyond both methods' own spread. ``disagrees`` when a side's |difference| exceeds
    its allowance. ``cross_ratio`` = candidate / baseline cross medians, ``cross_ci`` its 95%
    bootstrap interval over the cross rounds (``kernelab.service.judge.stats``); ``ratio_agrees``
    (``ratios_agree``) when ``ratio`` (the primary ratio) is known. None when the cell carries no
    cross-check; a summary holding only ``error`` when the cross measurement could not be taken.
    """
    cc = cell.cross_check
    if cc is None:
        return None
    primary = dict(cell.timers)
    if cc.error is not None or not all(cc.samples_ns.get(v) for v in _SIDES):
        return CrossCheckSummary(
            primary=primary, cross=dict(cc.methods), error=cc.error or "no cross samples on a side"
        )
    out = CrossCheckSummary(primary=primary, cross=dict(cc.methods))
    for v in _SIDES:
        xs = cc.samples_ns[v]
        med_x = statistics.median(xs)
        med_p, iqr_p = stats[v].median_ns, stats[v].iqr_ns
        out.cross_median_ns[v] = med_x
        if med_p is None or med_p <= 0 or not math.isfinite(med_p):
            continue
        out.primary_median_ns[v] = med_p
        spread = (iqr_p or 0.0) / med_p + _relative_iqr(xs)
        out.difference_pct[v] = (med_x / med_p - 1.0) * 100.0
        out.noise_pct[v] = tolerance_pct + 100.0 * spread
        if abs(out.difference_pct[v]) > out.noise_pct[v]:
            out.disagrees = True
    if out.cross_median_ns["baseline"] > 0:
        out.cross_ratio = out.cross_median_ns["candidate"] / out.cross_median_ns["baseline"]
    if cross_ci is not None:
        out.cross_ci_low, out.cross_ci_high = cross_ci
    if ratio is not None and out.cross_ratio is not None:
        out.ratio_agrees = ratios_agree(
            ratio,
            out.cross_ratio,
            tolerance_pct=tolerance_pct,
            threshold_pct=threshold_pct,
            cross_ci=cross_ci,
        )
    return out


def ratio_direction(ratio: float, threshold_pct: float) -> str:
    """``faster`` below 1 - t, ``slower`` above 1 + t, else ``within`` (t = threshold_pct / 100)."""
    t = threshold_pct / 100
    return "faster" if ratio < 1 - t else "slower" if ratio > 1 + t else "within"


def ratios_agree(
    primary: float,
    cross: float,
    *,
    tolerance_pct: float,
    threshold_pct: float = 1.0,
    cross_ci: tuple[float, float] | None = None,
) -> bool:
    """Whether two candidate/baseline ratios agree in direction and size.

    Size: |cross / primary - 1| <= ``tolerance_pct`` / 100, or, given ``cross_ci`` (the cross
    ratio's 95% interval: a short measurement is noisier than the cell's own), that interval
    reaches [primary (1 - tol), primary (1 + tol)]: a disagreement must show beyond the cross
    measurement's own noise (a one-element A/A on an H200, 10 cross rounds: 4 of 4 fresh processes
    read ``inconclusive`` by the point ratios alone). Direction: the primary ratio's
    ``ratio_direction`` region (below 1 - t, within ±t, above 1 + t; t = ``threshold_pct`` / 100)
    holds the cross ratio, or, given ``cross_ci``, overlaps that interval: the other method does
    not show the opposite."""
    tol = tolerance_pct / 100
    if cross_ci is None:
        if abs(cross / primary - 1.0) > tol:
            return False
    elif cross_ci[0] > primary * (1 + tol) or cross_ci[1] < primary * (1 - tol):
        return False
    t = threshold_pct / 100
    low, high = {"faster": (0.0, 1 - t), "slower": (1 + t, math.inf), "within": (1 - t, 1 + t)}[
        ratio_direction(primary, threshold_pct)
    ]
    if cross_ci is None:
        return low <= cross <= high
    return cross_ci[0] <= high and cross_ci[1] >= low


def placement_reasons(
    timing: TimingVerdict,
    ratio: float | None,
    stratum_ratios: Sequence[float],
    threshold_pct: float,
    *,
    covered: bool = False,
    per_set: bool = False,
) -> list[Reason]:
    """``placement-disagreement`` when the timing verdict claims a change (``faster``, ``slower``)
    that some input placement does not itself show beyond the threshold t: a placement's own ratio
    of medians (``stratum_ratios``, ``estimators.cluster_cis``) not below 1 - t for ``faster``, not
    above 1 + t for ``slower``. ``ratio``: the pooled ratio, for the message.

    Swapping the input sets between the sides (a 2x2 crossover) cancels a placement effect that
    multiplies a buffer set's time whoever runs it, but only when that effect is that regular, and
    a layout effect often is not (Mytkowicz et al., "Producing wrong data without doing anything
    obviously wrong!", ASPLOS 2009): A/A jobs on a CPU read ``faster``/``slower`` by their timing
    alone in 3-13 of 40 cells, most with placements on either side of the threshold
    (``docs/results/2026-12-02-aa-cpu.md``). So a change stands only where each placement shows
    it, the rule of the timer cross-check. The cost, accepted (correctness of a verdict before its
    sensitivity): a real change under a set effect as large as its distance from the threshold
    reads ``inconclusive`` (a 7% speed-up under a 6% set effect: placements 0.986 and 0.877), with
    both placements' ratios in the reason. ``same`` is left to the pooled ratio.

    Not when the ratio's CI already spans the sides' own placements (``covered``: three or more
    input sets observed on both sides, ``estimators.paired_sets_ci``): a placement effect widens
    that interval instead. On an H200 output buffers at four places moved a 255 us kernel by
    -0.18% to +0.23%, which no per-placement rule with a 0.25% threshold survives
    (``docs/results/2026-12-03-h200-placement.md``). The rule stays for two sets and for a
    rotation the budget cut before three sets ran on both sides. There (``per_set``) the ratios
    judged are each input set's own (candidate on the set over baseline on the set,
    ``estimators.paired_set_ratios``): in one assignment of three or more sets the sides ran
    different sets, and a set effect both sides share, which only a whole cycle cancels, can push
    every assignment's ratio the same way; a claimed change then needs at least one set seen on
    both sides, each showing it."""
    if covered or timing not in ("faster", "slower") or ratio is None:
        return []
    if not per_set and len(stratum_ratios) < 2:
        return []
    t = threshold_pct / 100
    if all((r < 1 - t) if timing == "faster" else (r > 1 + t) for r in stratum_ratios):
        return []
    if per_set and not stratum_ratios:
        return [
            reason(
                "placement-disagreement",
                f"the timing alone says {timing} (ratio {ratio:.4g}), but the rotation of the input sets "
                "ended before any set ran on both sides, so no placement shows the change",
            )
        ]
    shown = ", ".join(f"{r:.4g}" for r in stratum_ratios)
    return [
        reason(
            "placement-disagreement",
            f"the timing alone says {timing} (ratio {ratio:.4g}), but the ratio per input placement (the "
            f"input sets swapped between the sides) is {shown}: not each {timing} beyond the "
            f"±{threshold_pct:g}% threshold, so the buffers' placement, not the code, may be what was "
            "measured",
        )
    ]


def cross_check_reasons(
    summary: CrossCheckSummary, ratio: float | None, threshold_pct: float, tolerance_pct: float
) -> list[Reason]:
    """``timer-disagreement`` (inconclusive) when the cross-check disagrees on a side and the two
    ratios do not agree (``ratios_agree`` at ``threshold_pct``), or no primary ratio exists;
    ``timer-disagreement-ratio-agrees`` (told: the verdict stands) when they do; nothing when the
    methods agree or no cross measurement exists."""
    if not summary.disagrees:
        return []
    sides = ", ".join(
        f"{v} {summary.primary.get(v, '?')} {summary.primary_median_ns[v]:.4g} ns vs "
        f"{summary.cross.get(v, '?')} {summary.cross_median_ns[v]:.4g} ns "
        f"({summary.difference_pct[v]:+.1f}%, allowance ±{summary.noise_pct[v]:.1f}%)"
        for v in _SIDES
        if v in summary.difference_pct
    )
    cross = summary.cross_ratio
    cross_ci = (
        None
        if summary.cross_ci_low is None or summary.cross_ci_high is None
        else (summary.cross_ci_low, summary.cross_ci_high)
    )
    agree = (
        ratio is not None
        and cross is not None
        and ratios_agree(
            ratio, cross, tolerance_pct=tolerance_pct, threshold_pct=threshold_pct, cross_ci=cross_ci
        )
    )
    ratios = f"ratio {ratio:.4g} vs {cross:.4g}" if ratio is not None and cross is not None else "no ratio"
    if cross_ci is not None and cross is not None:
        ratios += f" [{cross_ci[0]:.4g}, {cross_ci[1]:.4g}]"
    if agree:
        return [
            reason(
                "timer-disagreement-ratio-agrees",
                f"the two timing methods differ ({sides}); the ratios agree ({ratios}): the verdict stands",
            )
        ]
    return [
        reason(
            "timer-disagreement",
            f"the two timing methods differ ({sides}) and their ratios do not agree in direction and "
            f"size within {tolerance_pct:g}% ({ratios}): the method decides the verdict, so none is given",
        )
    ]


# --------------------------------------------------------------------------------------------------
# Flags and plausibility rules of a cell's statistics
# --------------------------------------------------------------------------------------------------

_FLAG_ORDER: tuple[str, ...] = get_args(Flag)
_SIDES: tuple[Side, Side] = ("baseline", "candidate")


def noisy(stats: Iterable[SideStats]) -> bool:
    """The ``noisy`` flag: True when a side's kept samples (``estimators.kept_samples``) have an
    IQR/median above ``NOISY_IQR_FRACTION`` (torch.utils.benchmark's warning threshold)."""
    return any(
        s.median_ns and s.iqr_ns is not None and s.iqr_ns / s.median_ns > NOISY_IQR_FRACTION for s in stats
    )


def node_peaks(result: JobResult, peaks: Mapping[str, float] | None = None) -> dict[str, float]:
    """Physical peaks for the plausibility guard: ``copy_gbps`` and ``matmul_tflops``.

    ``probe_peaks`` of the result's probes; values in ``peaks`` override them. Missing keys mean
    "no bound".
    """
    out = probe_peaks(result.probes)
    out.update({k: float(v) for k, v in (peaks or {}).items() if k in ("copy_gbps", "matmul_tflops")})
    return out


def probe_peaks(probes: Iterable[ProbeReport]) -> dict[str, float]:
    """The node's probed peaks: per registered probe that declares a ``peak``
    (``kernelab.service.contract.probes``)
    the highest positive reading of ``probes`` under its key: ``copy_gbps``, the highest device-local
    copy reading (read + written, GB/s), and ``matmul_tflops``, the highest matmul reading
    (``kernelab.runners.probes.peak``, TFLOP/s); a key is missing when no positive reading exists."""
    out: dict[str, float] = {}
    reports = list(probes)
    for probe in probes_with("peak"):
        assert probe.peak is not None
        key, rate = probe.peak
        values = [v for report in reports for r in probe.readings(report) if (v := rate(r)) > 0]
        if values:
            out[key] = max(out.get(key, 0.0), *values)
    return out


def implausible(rates: Mapping[str, float], peaks: Mapping[str, float], *, bound_bytes: bool) -> list[str]:
    """The keys of ``rates`` (from ``throughput``) that exceed 1.1x the node's peak; empty when none
    does (so the result reads as a truth value).

    A result faster than the hardware can go is a timing error: ``triton.testing.do_bench`` once
    returned 0.003 ms for a bf16 4096^3 matmul on an H200, i.e. 46 PFLOP/s against the datasheet's
    989 TFLOP/s (dense bf16). ``bound_bytes`` applies the copy-bandwidth bound;
    pass False when caches may be warm (no L2 flush, a CPU, or samples of several launches each of
    which only the first follows the flush), where cache-resident kernels can legitimately exceed
    DRAM copy bandwidth.
    """
    out: list[str] = []
    for key, rate in rates.items():
        if key.endswith("_gbps") and bound_bytes and "copy_gbps" in peaks:
            if rate > PEAK_MARGIN * peaks["copy_gbps"]:
                out.append(key)
        if key.endswith("_tflops") and "matmul_tflops" in peaks:
            if rate > PEAK_MARGIN * peaks["matmul_tflops"]:
                out.append(key)
    return out


def implausible_reasons(
    rates: Mapping[str, float], peaks: Mapping[str, float], keys: list[str]
) -> list[Reason]:
    out = []
    for key in keys:
        side, _, unit = key.partition("_")
        peak_key = "copy_gbps" if unit == "gbps" else "matmul_tflops"
        label = "GB/s" if unit == "gbps" else "TFLOP/s"
        out.append(
            reason(
                "rate-above-peak",
                f"{side}: {rates[key]:,.1f} {label} from the declared work exceeds 1.1x the node's measured "
                f"peak of {peaks[peak_key]:,.1f} {label}: a timing error, not a speed",
                side=side if side in _SIDES else None,  # type: ignore[arg-type]
            )
        )
    return out


def contention_seen(readings: Iterable[ContentionReading]) -> bool:
    """True when a reading taken during the cell shows a process that is not kernelab's own.

    Same rule as the probes' ``other_processes`` (``foreign_processes``): any foreign compute
    process, idle or busy, or any other process with SM-utilisation samples.
    """
    return any(foreign_processes(r.processes) for r in readings)


def probe_flags(probes: Iterable[ProbeReport]) -> list[Flag]:
    """Job-level flags from node-health probes: ``contended`` when a registered probe's ``contended``
    rule saw another tenant (the telemetry probe: a GPU ran another process)."""
    flags: list[Flag] = []
    reports = list(probes)
    for probe in probes_with("contended"):
        rule = probe.contended
        if rule is not None and any(rule(probe.readings(p)) for p in reports):
            flags.append("contended")
            break
    return flags


def sorted_flags(flags: Iterable[Flag]) -> list[Flag]:
    """Flags without duplicates, in the order the schema's ``Flag`` literal declares them."""
    present = set(flags)
    return sorted(present, key=_FLAG_ORDER.index)
