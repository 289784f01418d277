"""One side of a cell, prepared in this process: its eager checks and its checked samples.

``LocalSide`` implements the cell pipeline's side protocol (``kernelab.runners.pipeline.CellSide``)
in the process that holds the prepared callable: the measuring process of an in-process job, or a
revision's worker (``kernelab.runners.revision_worker``, which serves each call as a request).
Its **eager check** (``eager_check``) runs the checks of ``kernelab.runners.checks`` on the cell's
own inputs against the reference taken before either side ran (``take_reference``) and reports
inputs the call modified; its output is kept for ``bitwise_vs_baseline`` (``first_output``,
``compare_bitwise``).

The engine (``kernelab.runners.engine``) times a side by asking for samples; ``LocalSide`` serves them
with a ``kernelab.runners.timing.Timer`` and can also take a **checked sample**: one sample timed exactly
as the others (the same CUDA graph replay, the same event window), whose output is verified.
That closes the gap between what is checked and what is timed: a kernel that is right when
launched directly but wrong under graph replay, a result cached across calls, an output written
after the window, are all caught by looking at what the timed method produced. Per checked sample:

1. the inputs are **refilled in place** with fresh random values (``bench.make_inputs`` with a new
   seed, scaled by ``correctness.input_scale`` as the cell's own inputs are, copied into the same
   tensors, so a CUDA graph's replays read them and a result cached by pointer, shape or ``id`` is
   stale), and the float64 reference is computed on them first;
2. a bitwise copy of the inputs is kept; the previous output is **poisoned** (NaN; an output that
   aliases an input, an in-place kernel, is not poisoned and not checked here);
3. **one sample** through the timer, with the engine's launch count, its time recorded;
4. right after the window: the output is copied on the timing stream (``at_stop``), then the
   device is drained and the time the drain took is measured; threads the call started and left
   running are listed and joined (up to ``_THREAD_JOIN_S``); the output is read again (``at_rest``);
5. findings (``kernelab.service.judge.verdicts.REASONS`` codes, each ending the cell ``incorrect``):
   ``not-a-tensor`` (the call returned no plain ``torch.Tensor``: a wrapped, lazy or deferred
   output), ``wrong-under-timing`` (``at_stop`` differs from the reference; the message names the
   method: "under cuda-graph replay", "in a timed cuda-event window", ...), ``output-after-window``
   (``at_rest`` differs bitwise from ``at_stop``), ``work-after-window`` (the drain took longer
   than ``_DRAIN_SLACK_NS`` and 20x the idle device's own synchronisation, twice in a row: device
   work the call started outside the timed stream was still running), ``background-work``,
   ``inputs-modified`` (the inputs' bytes changed).

Sources: the cheats are those published by kernel-evaluation services (KernelBench, "KernelBench:
Can LLMs Write Efficient GPU Kernels?", Ouyang et al. 2025, and GPU MODE's leaderboard reviews):
work on another stream, cached results, deferred outputs, modified inputs, partial writes.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from kernelab.kernels.check import check_output, mismatch_mask, poison_
from kernelab.kernels.preflight import as_work
from kernelab.kernels.tolerances import Tolerance
from kernelab.runners import integrity
from kernelab.runners.checks import (
    bitwise_diff,
    compare_bitwise,
    describe_where,
    logical_view,
    run_checks,
    scale_inputs,
)
from kernelab.runners.devicework import device_work_per_call
from kernelab.runners.timing import Timer
from kernelab.service.contract.schemas import (
    BitwiseComparison,
    CorrectnessResult,
    CorrectnessSpec,
    Reason,
    Side,
    TimedCheck,
    Work,
)
from kernelab.service.judge.verdicts import reason

_DRAIN_SLACK_NS = 100_000  # 100 us: an idle device's synchronize returns in ~2-20 us
_DRAIN_IDLE_FACTOR = 20.0
_THREAD_JOIN_S = 2.0  # how long a checked sample waits for threads the call left running
References = dict[tuple[int, int], Any]
"""Float64 references of one checkpoint, keyed by (seed, ``id`` of the inputs dict)."""
_METHOD = {
    "cuda-graph": "under CUDA-graph replay",
    "cuda-event": "in a timed CUDA-event window",
    "perf_counter": "in a timed perf_counter window",
}


def _timed_method(kind: str) -> str:
    return _METHOD.get(kind, f"under the {kind} timer")


def refill_inputs(inputs: dict[str, Any], fresh: Mapping[str, Any]) -> list[str]:
    """Copy ``fresh``'s tensors into ``inputs``' tensors of the same key, shape and dtype (in place:
    the same storage, new values); return the keys that could not be refilled (not a tensor, or
    of another shape or dtype). Non-tensor inputs are left alone."""
    kept = []
    with torch.no_grad():
        for key, tensor in inputs.items():
            if not isinstance(tensor, torch.Tensor):
                continue
            new = fresh.get(key)
            if isinstance(new, torch.Tensor) and new.shape == tensor.shape and new.dtype == tensor.dtype:
                tensor.copy_(new)
            else:
                kept.append(key)
    return kept


def _aliases(out: torch.Tensor, inputs: Mapping[str, Any]) -> bool:
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr for t in inputs.values())


def snapshot_inputs(inputs: Mapping[str, Any]) -> dict[str, torch.Tensor] | None:
    """A copy of every tensor input (None when the copies do not fit in device memory)."""
    try:
        return {k: t.detach().clone() for k, t in inputs.items() if isinstance(t, torch.Tensor)}
    except torch.OutOfMemoryError:
        return None


def modified_inputs(before: Mapping[str, torch.Tensor], inputs: Mapping[str, Any]) -> list[str]:
    """Keys of ``inputs`` whose bytes differ from the copies in ``before`` (``bitwise_diff``)."""
    return [
        k
        for k, old in before.items()
        if isinstance(inputs.get(k), torch.Tensor) and bool(bitwise_diff(old, inputs[k]).any())
    ]


def is_output(tensor: Any, out: torch.Tensor) -> bool:
    """Whether input ``tensor`` now holds exactly ``out`` (an in-place kernel wrote its output there)."""
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.shape == out.shape
        and tensor.dtype == out.dtype
        and not bool(bitwise_diff(tensor, out).any())
    )


def _idle_sync_ns(device: torch.device) -> float:
    """How long ``torch.cuda.synchronize`` takes on this idle device (ns, the worst of three)."""
    torch.cuda.synchronize(device)
    worst = 0
    for _ in range(3):
        t0 = time.perf_counter_ns()
        torch.cuda.synchronize(device)
        worst = max(worst, time.perf_counter_ns() - t0)
    return float(worst)


class LocalSide:
    """One side of a cell in this process: the prepared callable, its inputs, its timer.

    ``bench``/``variant``/``params``: what ``bench.prepare`` was called with; ``inputs``: the dict
    the callable reads (refilled in place by checked samples; shared with the other side when
    their parameters are equal); ``tolerance``: the cell's (``kernelab.kernels.tolerances.Tolerance``);
    ``input_scale``: the spec's ``correctness.input_scale``, applied to the fresh inputs of checked
    samples as it was to the cell's own. Implements the cell
    pipeline's side protocol (``kernelab.runners.pipeline.CellSide``), whose first four methods
    (``time_ns``, ``launches_for``, ``timer_kind``, ``use_fallback``) are the engine's.
    """

    def __init__(
        self,
        *,
        side: Side,
        bench: Any,
        variant: str,
        params: Any,
        inputs: dict[str, Any],
        fn: Callable[[], Any],
        timer: Timer,
        device: torch.device,
        tolerance: Tolerance,
        input_scale: float = 1.0,
        cross_timers: Mapping[str, Timer] | None = None,
    ) -> None:
        self.side, self.bench, self.variant, self.params = side, bench, variant, params
        self.inputs, self.fn, self.timer, self.device = inputs, fn, timer, device
        self.tolerance, self.input_scale = tolerance, input_scale
        # Input set 0 is (inputs, fn); ``add_input_set`` adds sets 1, 2, ... (``input_sets``, ``use_inputs``).
        self._fns: list[Callable[[], Any]] = [fn]
        self._alternate_inputs: list[dict[str, Any]] = []
        self._current = 0
        # The other timing method, by the kind that times this side: {"cuda-graph": an event timer, ...}
        self.cross_timers = dict(cross_timers or {})
        self._at_stop: torch.Tensor | None = None  # the output copied at a checked window's end
        self._reference: Any = None  # the float64 reference of the cell's inputs (take_reference)
        self._first_out: torch.Tensor | None = None  # the eager check's output (bitwise_vs_baseline)

    def __repr__(self) -> str:
        return f"<LocalSide {self.side} {self.variant!r} timer={self.timer_kind}>"

    @property
    def timer_kind(self) -> str:
        """The timer kind that times this side (a CUDA-graph capture may have fallen back)."""
        return self.timer.kind_for(self.fn)

    def add_input_set(self, inputs: dict[str, Any], fn: Callable[[], Any]) -> None:
        """Add the next input set: the same variant prepared on another copy of the inputs,
        allocated alike (``kernelab.runners.cells.LocalSides.prepare``), timed in the rounds the
        engine's rotating placement gives it (``kernelab.runners.engine.input_set``). The checks
        (eager and checked samples) run on set 0."""
        self._alternate_inputs.append(inputs)
        self._fns.append(fn)

    @property
    def input_sets(self) -> int:
        """Input sets this side was prepared on (1, plus one per ``add_input_set``)."""
        return len(self._fns)

    def use_inputs(self, index: int) -> None:
        """Time input set ``index`` from now on. Raises ``IndexError`` for a set it lacks."""
        if not 0 <= index < len(self._fns):
            raise IndexError(f"{self.side} has {len(self._fns)} input set(s), not {index + 1}")
        self._current = index

    @property
    def _timed_fn(self) -> Callable[[], Any]:
        return self._fns[self._current]

    def time_ns(self, launches: int) -> float:
        """One sample of ``launches`` launches of the current input set; ns per launch
        (``Timer.time_ns``). When the timer fell back for one input set only, every set moves to
        the fallback (``use_fallback``): a side is timed by one method."""
        ns = self.timer.time_ns(self._timed_fn, launches)
        if len(self._fns) > 1 and len({self.timer.kind_for(f) for f in self._fns}) > 1:
            self.use_fallback()
        return ns

    def launches_for(self, per_launch_ns: float) -> int:
        """Launches per sample for a launch estimated at ``per_launch_ns`` (``Timer.launches_for``)."""
        return self.timer.launches_for(per_launch_ns, self._timed_fn)

    def heat(self, per_launch_ns: float, sustain_ns: float) -> int:
        """``Timer.heat`` of the current input set (``measurement.state: sustained``)."""
        return self.timer.heat(self._timed_fn, per_launch_ns, sustain_ns)

    def use_fallback(self) -> bool:
        """Move this side (every input set) to its timer's fallback method
        (``FallbackTimer.use_fallback``); False when the timer has none."""
        use = getattr(self.timer, "use_fallback", None)
        if use is None:
            return False
        for fn in self._fns:
            use(fn)
        return True

    @property
    def cross_kind(self) -> str | None:
        """The other timing method's kind for this side now (``cross_timers`` of ``timer_kind``),
        None when there is none (a CPU)."""
        timer = self.cross_timers.get(self.timer_kind)
        return None if timer is None else timer.name

    def _cross_timer(self) -> Timer:
        timer = self.cross_timers.get(self.timer_kind)
        if timer is None:
            raise RuntimeError(f"no other timing method for {self.timer_kind} on {self.device}")
        return timer

    def cross_launches_for(self, per_launch_ns: float) -> int:
        """Launches per cross sample for a launch estimated at ``per_launch_ns`` (the other
        method's ``Timer.launches_for``). Raises ``RuntimeError`` without another method."""
        return self._cross_timer().launches_for(per_launch_ns, self._timed_fn)

    def cross_time_ns(self, launches: int) -> float:
        """One sample of the current input set by the other timing method; ns per launch. Raises
        ``RuntimeError`` without another method, ``TimerUnsupported`` when it cannot time the call."""
        return self._cross_timer().time_ns(self._timed_fn, launches)

    def take_reference(self) -> None:
        """Compute and keep the float64 reference of the cell's inputs (``bench.reference``) for
        ``eager_check``; the pipeline calls it on both sides before either runs, since sides with
        equal parameters share their inputs."""
        self._reference = self.bench.reference(self.params, self.inputs)

    def eager_check(self, spec: CorrectnessSpec, *, seed: int) -> tuple[CorrectnessResult, list[Reason]]:
        """``kernelab.runners.checks.run_checks`` on the cell's inputs (``spec.repeats``,
        ``determinism_runs``, ``batch_invariance``; fresh repeat inputs with seeds ``seed + i``,
        scaled by ``spec.input_scale``) against the kept reference, and an ``inputs-modified``
        finding when the call changed an input other than the one it wrote its output to (the
        inputs are then restored). With ``spec.bitwise_vs_baseline`` the first output is kept for
        ``first_output``/``compare_bitwise``. Whatever the benchmark raises propagates."""
        if self._reference is None:
            self.take_reference()
        ref, self._reference = self._reference, None
        before = snapshot_inputs(self.inputs)
        result, out = run_checks(
            self.bench,
            self.variant,
            self.params,
            self.inputs,
            self.fn,
            ref,
            spec,
            seed=seed,
            device=self.device,
            tolerance=self.tolerance,
        )
        found: list[Reason] = []
        if before is not None:
            # An in-place kernel's output is one of its inputs: that one may change (to the output).
            modified = [k for k in modified_inputs(before, self.inputs) if not is_output(self.inputs[k], out)]
            if modified:
                found.append(
                    reason(
                        "inputs-modified",
                        f"{self.side}: the call modified its inputs {', '.join(modified)} (eager check)",
                        side=self.side,
                    )
                )
                refill_inputs(self.inputs, before)  # the other side must see the inputs as made
        self._first_out = out if spec.bitwise_vs_baseline else None
        return result, found

    def first_output(self) -> torch.Tensor:
        """The output ``eager_check`` kept (``bitwise_vs_baseline``), handed over once. Raises
        ``RuntimeError`` when none is kept."""
        out, self._first_out = self._first_out, None
        if out is None:
            raise RuntimeError(f"{self.side}: no output kept (eager_check with bitwise_vs_baseline first)")
        return out

    def compare_bitwise(self, baseline: torch.Tensor | Path) -> BitwiseComparison:
        """This side's kept output against ``baseline`` (a tensor, or a file ``torch.save`` wrote,
        read with ``weights_only=True``) byte for byte, the differences located on this side's
        logical axes (``kernelab.runners.checks.compare_bitwise``)."""
        other = (
            torch.load(baseline, map_location=self.device, weights_only=True)
            if isinstance(baseline, Path)
            else baseline
        )
        if not isinstance(other, torch.Tensor):
            raise TypeError(f"{self.side}: the baseline's output is a {type(other).__name__}, not a tensor")
        return compare_bitwise(self.first_output(), other, self.bench, self.params)

    def tamper_findings(self) -> list[Reason]:
        """``timer-tampered`` when a function kernelab times or checks with was replaced in this
        process since ``kernelab.runners.integrity.take_snapshot``."""
        found = integrity.tamper_reason()
        return [] if found is None else [found]

    def work(self) -> Work:
        """The work one launch does (``bench.work``: a ``Work``, a mapping of its fields, or a
        revision's own ``Work`` class, read back into kernelab's; anything else raises
        ``BenchmarkError`` naming the method, ``kernelab.kernels.preflight.as_work``)."""
        value = self.bench.work(self.params, self.variant)
        if not isinstance(value, Work | Mapping) and hasattr(value, "model_dump"):
            value = value.model_dump()
        return as_work(self.bench, value)

    def checked_sample(
        self, *, seed: int, rounds: int, launches: int, references: References | None = None
    ) -> TimedCheck:
        """One sample timed as the others, its output verified (module docstring). ``launches``:
        the engine's launches per sample (a CUDA graph is replayed with them; another timer takes
        one launch, see below). ``references``: float64 references already computed for fresh
        inputs, shared by the two sides of a cell that read the same inputs (a dict kept for one
        checkpoint). Whatever the benchmark or the timer raises propagates (the cell is then
        ``failed``)."""
        kind = self.timer_kind
        unfilled, ref = self._refill(seed, references)
        before = snapshot_inputs(self.inputs)
        previous = self.timer.output_of(self.fn)
        in_place = isinstance(previous, torch.Tensor) and _aliases(previous, self.inputs)
        if isinstance(previous, torch.Tensor) and previous.dtype != torch.bool and not in_place:
            poison_(previous)
        if kind != "cuda-graph":
            # A graph's replays rewrite its static output: poisoned above. A callable that allocates
            # its output gets a new block per call; released here, the poisoned block is what the
            # caching allocator hands to the next allocation of its size: one launch, then.
            self.timer.forget_output(self.fn)
            launches = 1
        del previous
        idle_ns = _idle_sync_ns(self.device) if self.device.type == "cuda" else 0.0
        threads = set(threading.enumerate())
        ns = self.time_ns(launches)
        out = self.timer.output_of(self.fn)
        if type(out) is not torch.Tensor:
            what = f"{type(out).__module__}.{type(out).__qualname__}"
            found = [
                reason(
                    "not-a-tensor",
                    f"{self.side}: the timed call returned {what}, not a plain "
                    "torch.Tensor: a wrapped, lazy or deferred output",
                    side=self.side,
                )
            ]
            return self._result(kind, rounds, seed, launches, ns, None, found)
        findings = self._after_window(out, kind, launches, threads, idle_ns)
        if before is not None and not in_place:
            modified = modified_inputs(before, self.inputs)
            if modified:
                findings.append(
                    reason(
                        "inputs-modified",
                        f"{self.side}: the timed call modified its inputs {', '.join(modified)}",
                        side=self.side,
                    )
                )
        check = None
        if not in_place:
            assert self._at_stop is not None
            check = self._check(self._at_stop, ref)
            if kind == "cuda-graph":
                findings += self._one_fresh_call(seed + 1, references)
            else:
                findings += self._rejected_graph(seed + 2, references)
            if not check.passed:
                findings.append(
                    reason(
                        "wrong-under-timing",
                        f"{self.side}: wrong {_timed_method(kind)} "
                        f"(fresh inputs, seed {seed}): {check.message}"
                        + (f"; where: {check.where}" if check.where else ""),
                        side=self.side,
                    )
                )
            if unfilled:
                check.message += f"; not refilled (no tensor of a fixed shape): {', '.join(unfilled)}"
        return self._result(kind, rounds, seed, launches, ns, check, findings)

    def _refill(
        self, seed: int, references: References | None, inputs: dict[str, Any] | None = None
    ) -> tuple[list[str], Any]:
        """Refill the inputs (set 0's, or ``inputs``) with those of ``seed``; the keys not refilled
        and the float64 reference of the refilled inputs (computed before any call can touch them,
        or taken from ``references`` when the other side of the cell computed it for the same
        inputs)."""
        inputs = self.inputs if inputs is None else inputs
        fresh = scale_inputs(self.bench.make_inputs(self.params, self.device, seed), self.input_scale)
        unfilled = refill_inputs(inputs, fresh)
        key = (seed, id(inputs))
        if references is not None and key in references:
            return unfilled, references[key]
        ref = self.bench.reference(self.params, inputs)
        if references is not None:
            references[key] = ref
        return unfilled, ref

    def _one_fresh_call(self, seed: int, references: References | None) -> list[Reason]:
        """A graph's replays of ``launches`` calls hide an output that lags one call behind its
        inputs (each launch but the first reads the inputs the previous one saw): one eager call
        right after a refill must be right too (``wrong-output`` otherwise)."""
        _, ref = self._refill(seed, references)
        out = self.fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        what = f"one call right after its inputs changed (fresh inputs, seed {seed}) returned a wrong output"
        return self._finding("wrong-output", out, ref, what)

    def _rejected_graph(self, seed: int, references: References | None) -> list[Reason]:
        """The CUDA graph the auto timer captured from this side's calls but would not time with
        (``Timer.replay_rejected``: it holds memcpy/memset nodes), replayed once on fresh inputs and
        checked: a call that is right eagerly but wrong when its graph is replayed is wrong for a
        user who replays it (``wrong-under-graph-replay``), whatever timer times the cell."""
        # the graph of whichever input set's callable was captured: once one set's capture is
        # refused, the engine moves the side's other sets to the fallback before their capture
        rejected = [(k, self.timer.rejected_graph(fn)) for k, fn in enumerate(self._fns)]
        found = [(k, why) for k, why in rejected if why is not None]
        if not found:
            return []
        k, why = found[0]
        _, ref = self._refill(seed, references, self.inputs if k == 0 else self._alternate_inputs[k - 1])
        out = self.timer.replay_rejected(self._fns[k])
        what = (f"right when called, wrong when the CUDA graph captured from its calls is replayed (fresh "
                f"inputs, seed {seed}; the cell was timed by {self.timer_kind}, since {why})")  # fmt: skip
        return self._finding("wrong-under-graph-replay", out, ref, what)

    def _finding(self, code: str, out: Any, ref: Any, what: str) -> list[Reason]:
        """A ``code`` finding naming this side when ``out`` fails its check against ``ref``
        (``what`` the sentence before the check's message); none for a right output or one that
        is no tensor (the timed check tells ``not-a-tensor``)."""
        if not isinstance(out, torch.Tensor):
            return []
        check = self._check(out, ref)
        if check.passed:
            return []
        where = f"; where: {check.where}" if check.where else ""
        return [reason(code, f"{self.side}: {what}: {check.message}{where}", side=self.side)]

    def _after_window(
        self, out: torch.Tensor, kind: str, launches: int, threads: set[threading.Thread], idle_ns: float
    ) -> list[Reason]:
        """Steps 4-5 of the module docstring for the output ``out`` of a sample that just ended:
        keeps the copy taken at the window's end in ``self._at_stop``; returns the findings."""
        findings: list[Reason] = []
        self._at_stop = at_stop = out.detach().clone()
        drain_ns = self._drain_ns()
        left = [t for t in threading.enumerate() if t not in threads and t.is_alive()]
        for t in left:
            t.join(_THREAD_JOIN_S)
        if left:
            names = ", ".join(sorted(t.name for t in left))
            findings.append(
                reason(
                    "background-work",
                    f"{self.side}: the call left {len(left)} thread(s) "
                    f"running after the timed window ({names})",
                    side=self.side,
                )
            )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if at_stop.shape == out.shape:
            changed = bitwise_diff(at_stop, out)
            if bool(changed.any()):
                view, axes = logical_view(changed, self.bench, self.params)
                findings.append(
                    reason(
                        "output-after-window",
                        f"{self.side}: the output changed after the "
                        f"timed window had ended {_timed_method(kind)}: "
                        f"{describe_where(view, axes)}",
                        side=self.side,
                    )
                )
        limit = max(_DRAIN_SLACK_NS, _DRAIN_IDLE_FACTOR * idle_ns)
        if self.device.type == "cuda" and drain_ns > limit:
            again = self._drain_after_sample(launches)  # a second look: a busy host can delay a sync
            if again > limit:
                findings.append(
                    reason(
                        "work-after-window",
                        f"{self.side}: device work was still running "
                        f"{min(drain_ns, again) / 1e3:,.0f} us after "
                        f"the timed window had ended {_timed_method(kind)} (an idle device synchronises in "
                        f"{idle_ns / 1e3:,.0f} us): work on another stream, or queued past the stop event",
                        side=self.side,
                    )
                )
        return findings

    def _check(self, out: torch.Tensor, ref: Any) -> CorrectnessResult:
        """``check_output`` of the output at the window's end, with the bad elements located."""
        check = check_output(out, ref, self.tolerance)
        if not check.passed and isinstance(ref, torch.Tensor) and out.shape == ref.shape:
            bad = mismatch_mask(out, ref, self.tolerance)
            view, axes = logical_view(bad, self.bench, self.params)
            check.where = describe_where(view, axes)
        return check

    def device_work_findings(self) -> list[Reason]:
        """``no-device-work`` when the CUDA graph captured from this side's timed calls holds no
        node, or when an eager call launched no kernel, copy or memset (``kernelab.runners.devicework``);
        empty on a CPU or when the profiler cannot count."""
        if self.device.type != "cuda":
            return []
        if self.timer.empty_capture(self.fn):
            return [
                reason(
                    "no-device-work",
                    f"{self.side}: the CUDA graph captured from its timed calls "
                    "holds no node: the calls launched no device work",
                    side=self.side,
                )
            ]
        nodes = self.timer.graph_nodes(self.fn)
        if nodes is not None:  # counted at capture: no profiler needed
            n, launches = nodes
            if n >= launches:
                return []
            return [
                reason(
                    "no-device-work",
                    f"{self.side}: the CUDA graph of its {launches} timed calls "
                    f"holds {n} nodes: at least {launches - n} of the calls launched no kernel, copy "
                    "or memset",
                    side=self.side,
                )
            ]
        counts = device_work_per_call(self.fn, self.device)
        if counts is None or min(counts) > 0:
            return []
        return [
            reason(
                "no-device-work",
                f"{self.side}: {counts.count(0)} of {len(counts)} profiled calls "
                "launched no kernel, copy or memset (device activities per call: "
                f"{', '.join(map(str, counts))})",
                side=self.side,
            )
        ]

    def _drain_ns(self) -> float:
        """After a sample: wait for the ``at_stop`` copy on the timing stream, then time how long
        a device-wide synchronize still takes (ns; 0 on a CPU)."""
        if self.device.type != "cuda":
            return 0.0
        copied = torch.cuda.Event()
        copied.record()
        copied.synchronize()
        t0 = time.perf_counter_ns()
        torch.cuda.synchronize(self.device)
        return float(time.perf_counter_ns() - t0)

    def _drain_after_sample(self, launches: int) -> float:
        """A second look: one more (unchecked) sample and the drain after it (ns)."""
        self.time_ns(launches)
        return self._drain_ns()

    def _result(
        self,
        kind: str,
        rounds: int,
        seed: int,
        launches: int,
        ns: float,
        check: CorrectnessResult | None,
        findings: list[Reason],
    ) -> TimedCheck:
        self._at_stop = None
        return TimedCheck(
            timer=kind,
            round=rounds,
            seed=seed,
            launches=launches,
            duration_ns=ns if math.isfinite(ns) and ns >= 0 else None,
            passed=not any(f.severity == "error" for f in findings),
            correctness=check,
            findings=findings,
        )
