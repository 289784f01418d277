"""The cell pipeline: one sweep cell measured through two sides, whatever process each side is in.

Both job kinds run every cell through ``run_cell``: an in-process job (``kernelab.runners.job``)
with two ``kernelab.runners.sides.LocalSide`` objects in the measuring process, a revision job
(``kernelab.runners.revision_job``) with two ``WorkerSide`` objects that forward each call to the
worker process of their source revision. The pipeline only calls the ``CellSide`` protocol, so
every option of the spec means the same for both kinds. Per cell, in this order:

1. ``pair.prepare(index, cell)``: both sides' parameters, inputs (scaled by
   ``correctness.input_scale``), prepared callables and tolerances (``SidePair``);
2. the integrity of kernelab's timing functions in each side's process (``timer-tampered``): a
   function replaced already (at the benchmark's import, or by its ``prepare``) ends the cell
   there, before any check or sample;
3. correctness, not timed (``correctness.enabled``): each side's float64 reference on the cell's
   inputs, taken on both sides before either runs (sides may share inputs); then per side the
   checks of ``kernelab.runners.checks`` (poisoned output, ``repeats``, ``determinism_runs``,
   ``batch_invariance``) and the ``inputs-modified`` check; then ``bitwise_vs_baseline``: the
   candidate's first output against the baseline's, byte for byte (it fails the candidate);
4. the interleaved rounds (``kernelab.runners.engine.measure_interleaved`` over
   ``LocalPairTimer(sides)``) with the per-sample clock sampler and the contention monitor, and
   the **checked samples** after the first and the last round (``correctness.timed_checks``:
   ``CellSide.checked_sample`` with the seeds of ``check_seed``);
5. the timer kind of each side, the contention readings, the **timer cross-check**
   (``measurement.cross_check``: ``kernelab.runners.engine.cross_check``, a few rounds with the
   other timing method, into ``CellResult.cross_check``), the **energy per launch**
   (``measurement.energy``: ``kernelab.runners.engine.energy_check`` with the sampler's energy
   counter, into ``CellResult.energy``), the device-work findings, the declared
   work (``Benchmark.work``) and the integrity again. ``CellResult.placement`` records how many
   input sets the rounds rotated between the sides (``kernelab.runners.engine.placement_of``).

After the cells, ``attach_static`` puts the static metrics (``static_metrics``) on every cell:
each side compiles its own kernels ahead of time (``SidePair.static_kernels``) and the two are
diffed (``kernelab.runners.static_metrics.pair_comparisons``).

A failure inside a cell (an exception from the benchmark, a side's error answer) is recorded in
``CellResult.error`` with what was measured before it, and the job goes on; an exception of a
type in ``fatal`` (a worker process that died) propagates.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from kernelab.kernels.triton_mode import interpreter_launches
from kernelab.runners.engine import (
    Checkpoint,
    ClockSampler,
    ContentionMonitor,
    LocalPairTimer,
    cross_check,
    energy_check,
    measure_interleaved,
    placement_of,
)
from kernelab.runners.static_metrics import (
    KernelCode,
    StaticMetricsError,
    no_target_message,
    pair_comparisons,
)
from kernelab.service.contract.schemas import (
    BitwiseComparison,
    CellResult,
    CorrectnessResult,
    CorrectnessSpec,
    JobSpec,
    ParamValue,
    Reason,
    Side,
    StaticComparison,
    TimedCheck,
    Work,
)

logger = logging.getLogger(__name__)

SIDES: tuple[Side, Side] = ("baseline", "candidate")
OutputRef = torch.Tensor | Path
"""A side's kept output handed to the other side: the tensor itself (a side in this process) or
a file written with ``torch.save`` (a worker process; read with ``weights_only=True``)."""
Compiled = tuple[list[KernelCode], str | None]
"""One side's compiled kernels of one cell, and the error that stopped the compile (or None)."""
_ERROR_MAX_CHARS = 500  # a cell's error is one short line; the full traceback goes to the log
CHECK_SEED_STRIDE = 7919  # checked sample k draws its fresh inputs with seed + 7919 * (k + 1)


class SideError(RuntimeError):
    """A side could not serve a request (a worker's error answer); the message names the side and is
    recorded as the cell's error as it is."""


def short_error(exc: BaseException) -> str:
    """``Type: first line`` of ``exc`` (a ``SideError``: its message), at most 500 characters; a NUL
    character (which no stored text may hold, ``kernelab.service.contract.schemas.Text``) is written
    ``\\x00``, so a benchmark's message can never make the job's other cells unreadable."""
    lines = str(exc).replace("\x00", "\\x00").strip().splitlines()
    first = lines[0] if lines else ""
    text = first if isinstance(exc, SideError) else f"{type(exc).__name__}: {first}".rstrip(": ")
    return text if len(text) <= _ERROR_MAX_CHARS else text[: _ERROR_MAX_CHARS - 3] + "..."


def check_seed(seed: int, k: int) -> int:
    """The seed of the fresh inputs of checked sample ``k`` (0-based) of a cell measured with
    ``seed``: apart from the cell's own inputs and from the repeat check's ``seed + i``."""
    return seed + CHECK_SEED_STRIDE * (k + 1)


class CellSide(Protocol):
    """One prepared side of one cell: what the pipeline asks of it (``kernelab.runners.sides.LocalSide``
    in this process, ``kernelab.runners.revision_job.WorkerSide`` in a revision's worker). The first
    four methods are the engine's ``kernelab.runners.engine.TimedSide``. Whatever the benchmark raises
    propagates (a ``SideError`` for a worker's error answer)."""

    side: Side

    @property
    def timer_kind(self) -> str:
        """The timer kind that times this side now (a CUDA-graph capture may have fallen back)."""
        ...

    def time_ns(self, launches: int) -> float:
        """One sample of ``launches`` back-to-back launches; ns per launch."""
        ...

    def launches_for(self, per_launch_ns: float) -> int:
        """Launches per sample for a launch estimated at ``per_launch_ns`` (ns)."""
        ...

    def use_fallback(self) -> bool:
        """Move this side to its timer's fallback; False when there is none."""
        ...

    def take_reference(self) -> None:
        """Compute and keep the float64 reference of the cell's inputs for ``eager_check``."""
        ...

    def eager_check(self, spec: CorrectnessSpec, *, seed: int) -> tuple[CorrectnessResult, list[Reason]]:
        """The checks ``spec`` asks for (``kernelab.runners.checks.run_checks``) and the
        ``inputs-modified`` finding; keeps the first output when ``spec.bitwise_vs_baseline``."""
        ...

    def first_output(self) -> OutputRef:
        """The output kept by ``eager_check`` (handed over once)."""
        ...

    def compare_bitwise(self, baseline: OutputRef) -> BitwiseComparison:
        """This side's kept output against ``baseline``'s, byte for byte, located on this side's
        logical axes."""
        ...

    def checked_sample(
        self, *, seed: int, rounds: int, launches: int, references: dict[Any, Any] | None = None
    ) -> TimedCheck:
        """One sample through the timer on fresh inputs (``seed``), its output verified."""
        ...

    def device_work_findings(self) -> list[Reason]:
        """``no-device-work`` findings after the rounds (empty on a CPU)."""
        ...

    def tamper_findings(self) -> list[Reason]:
        """A ``timer-tampered`` finding when a function kernelab times with was replaced in this
        side's process (``kernelab.runners.integrity``)."""
        ...

    def work(self) -> Work:
        """The work one launch does (``Benchmark.work``)."""
        ...


class SidePair(Protocol):
    """What prepares the two sides of each cell of one job (``kernelab.runners.cells.LocalSides``,
    ``kernelab.runners.revision_job.WorkerSides``)."""

    device: torch.device
    static_target: str | None
    """The ahead-of-time target of the measuring device (``sm_90a`` on an H200), None off CUDA."""

    def prepare(self, index: int, cell: Mapping[str, ParamValue]) -> Mapping[Side, CellSide]:
        """Both sides of sweep cell ``index`` (``cell``: its parameters before each side's own)."""
        ...

    def release(self) -> None:
        """Drop the cell's inputs, callables and timer state; free device memory."""
        ...

    def static_kernels(self, indices: Sequence[int], target: str) -> Mapping[Side, list[Compiled]]:
        """Each side's kernels of the cells ``indices`` compiled ahead of time for ``target``, one
        entry per cell in order. Raises ``StaticMetricsError`` or ``SideError`` when a side's
        compiler failed as a whole."""
        ...


class CellMonitor(ContentionMonitor, Protocol):
    """The engine's contention monitor with a cell's start and end
    (``kernelab.runners.probes.contention.GpuContentionMonitor``)."""

    def start(self) -> None: ...

    def take(self) -> list[Any]: ...


@contextlib.contextmanager
def phase(result: CellResult, name: str) -> Iterator[None]:
    """Add the wall time of the block to ``result.phase_s[name]`` (s)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        result.phase_s[name] = round(result.phase_s.get(name, 0.0) + time.perf_counter() - t0, 6)


def _add(result: CellResult, found: Sequence[Reason]) -> None:
    result.findings += [f for f in found if f not in result.findings]


def _integrity(result: CellResult, sides: Mapping[Side, CellSide]) -> None:
    for side in sides.values():
        _add(result, side.tamper_findings())


def _eager_checks(spec: JobSpec, result: CellResult, sides: Mapping[Side, CellSide]) -> None:
    """Step 3 of the module docstring, into ``result.correctness`` and ``result.findings``."""
    for side in sides.values():
        side.take_reference()  # before any side runs: the two may share their inputs
    for v, side in sides.items():
        launched = interpreter_launches()
        result.correctness[v], found = side.eager_check(spec.correctness, seed=spec.measurement.seed)
        # its calls ran Triton kernels in the interpreter: here, or in its revision worker
        if interpreter_launches() > launched or getattr(side, "interpreted", False):
            result.interpreted.append(v)
        _add(result, found)
    if spec.correctness.bitwise_vs_baseline:
        candidate = result.correctness["candidate"]
        candidate.vs_baseline = sides["candidate"].compare_bitwise(sides["baseline"].first_output())
        if not candidate.vs_baseline.identical:
            candidate.passed = False
            candidate.message += f"; differs bitwise from the baseline: {candidate.vs_baseline.where}"


def _checkpoint(
    spec: JobSpec, result: CellResult, sides: Mapping[Side, CellSide]
) -> Callable[[int, Mapping[Side, int]], None]:
    """The engine's checkpoint: one checked sample per side into ``result.timed_checks``, and the
    integrity of each side's timing functions."""
    taken = [0]

    def checkpoint(rounds: int, launches: Mapping[Side, int]) -> None:
        seed = check_seed(spec.measurement.seed, taken[0])
        taken[0] += 1
        references: dict[Any, Any] = {}  # sides that read the same inputs share the reference
        with phase(result, "checks"):
            for v, side in sides.items():
                check = side.checked_sample(
                    seed=seed, rounds=rounds, launches=launches[v], references=references
                )
                result.timed_checks.setdefault(v, []).append(check)
            _integrity(result, sides)

    return checkpoint


def _announced(progress: Callable[[str], None], checkpoint: Checkpoint) -> Checkpoint:
    """``checkpoint`` that reports ``"checks"`` before it runs (and ``"measuring"`` after)."""

    def run(rounds: int, launches: Mapping[Side, int]) -> None:
        progress("checks")
        checkpoint(rounds, launches)
        progress("measuring")

    return run


def run_cell(
    pair: SidePair,
    spec: JobSpec,
    index: int,
    cell: dict[str, ParamValue],
    *,
    sampler: ClockSampler | None = None,
    monitor: CellMonitor | None = None,
    progress: Callable[[str], None] = lambda message: None,
    fatal: tuple[type[Exception], ...] = (),
) -> CellResult:
    """Measure sweep cell ``index`` (parameters ``cell``) through ``pair``'s two sides (module
    docstring, steps 1-5). ``sampler`` reads the GPU context after each sample, ``monitor`` who
    else uses the GPU (``CellResult.contention``). Never raises but for an exception of a type in
    ``fatal``; ``pair.release()`` is left to the caller."""
    merged = {"baseline": {**cell, **spec.baseline.params}, "candidate": {**cell, **spec.candidate.params}}
    result = CellResult(
        index=index, params=cell, baseline_params=merged["baseline"], candidate_params=merged["candidate"]
    )
    try:
        progress("preparing")
        with phase(result, "prepare"):
            sides = pair.prepare(index, cell)
        _integrity(result, sides)
        if any(f.code == "timer-tampered" for f in result.findings):
            # replaced before the first timing (at the benchmark's import, or by its prepare): no
            # check or sample taken with those functions can mean anything, and a timer that reads a
            # constant would keep the warm-up from ever reaching its target
            return result
        if spec.correctness.enabled:
            progress("correctness")
            with phase(result, "correctness"):
                _eager_checks(spec, result, sides)
        if monitor is not None:
            monitor.start()
        checks = spec.correctness.enabled and spec.correctness.timed_checks
        timed = LocalPairTimer(sides)
        result.placement = placement_of(timed, spec.measurement)
        t_measure = time.perf_counter()
        try:
            result.samples = measure_interleaved(
                timed,
                spec.measurement,
                sampler=sampler,
                progress=progress,
                monitor=monitor,
                checkpoint=_announced(progress, _checkpoint(spec, result, sides)) if checks else None,
            )
        finally:
            result.phase_s["measure"] = round(
                time.perf_counter() - t_measure - result.phase_s.get("checks", 0.0), 6
            )
            result.contention = monitor.take() if monitor is not None else []
            result.placement = placement_of(timed, spec.measurement)  # the sets the rounds rotated
            with contextlib.suppress(Exception):  # a side that cannot say keeps the cell's first error
                result.timers = {v: side.timer_kind for v, side in sides.items()}
        if spec.measurement.cross_check:
            progress("cross-check with the other timing method")
            with phase(result, "cross_check"):
                result.cross_check = cross_check(timed, result.samples, spec.measurement)
        if spec.measurement.energy:
            progress("energy per launch")
            with phase(result, "energy"):
                result.energy = energy_check(timed, result.samples, spec.measurement, sampler)
        with phase(result, "device_work"):
            for side in sides.values():
                _add(result, side.device_work_findings())
        result.work = {v: side.work() for v, side in sides.items()}
        _integrity(result, sides)
    except fatal:
        raise
    except Exception as exc:  # one cell's failure must not lose the job's other cells
        logger.exception("cell %d %s failed", index, cell)
        result.error = short_error(exc)
    return result


def attach_static(pair: SidePair, spec: JobSpec, cells: Sequence[CellResult]) -> None:
    """Set ``cell.static`` on every cell (``JobSpec.static_metrics``), in place: each side's kernels
    compiled for ``static_metrics.target`` (or the measuring device's own) and diffed. Without a
    target (a CPU run that names none) each cell's ``StaticComparison.error`` says so; a compiler
    that failed as a whole puts its error on every cell. Never raises."""
    target = spec.static_metrics.target or pair.static_target
    if target is None:
        for cell in cells:
            cell.static = StaticComparison(error=no_target_message(pair.device))
        return
    try:
        compiled = pair.static_kernels([cell.index for cell in cells], target)
        comparisons = pair_comparisons(target, compiled["baseline"], compiled["candidate"])
    except (StaticMetricsError, SideError, ValueError) as exc:
        comparisons = [StaticComparison(target=target, error=str(exc)) for _ in cells]
    for cell, comparison in zip(cells, comparisons, strict=True):
        cell.static = comparison


def run_cells(
    pair: SidePair,
    spec: JobSpec,
    *,
    sampler: ClockSampler | None = None,
    monitor: CellMonitor | None = None,
    progress: Callable[[int, int, str], None] = lambda i, n, message: None,
    after_cell: Callable[[CellResult], None] | None = None,
    fatal: tuple[type[Exception], ...] = (),
) -> list[CellResult]:
    """Every sweep cell of ``spec`` on ``pair.device`` through ``run_cell``, ``pair.release()``
    after each (then ``after_cell(result)``), then the static metrics when
    ``spec.static_metrics.enabled`` (after the timing: compiling loads the CPU). ``progress(cell
    index, cell count, message)`` as each cell advances."""
    cells = spec.cells(pair.device.type)  # type: ignore[arg-type]
    results: list[CellResult] = []
    for index, cell in enumerate(cells):
        progress(index, len(cells), f"cell {index + 1}/{len(cells)} {cell}")
        try:
            result = run_cell(
                pair,
                spec,
                index,
                cell,
                sampler=sampler,
                monitor=monitor,
                progress=partial(progress, index, len(cells)),
                fatal=fatal,
            )
        finally:
            pair.release()
        if after_cell is not None:
            after_cell(result)
        progress(index, len(cells), f"done: {result.error or f'{len(result.samples)} samples'}")
        results.append(result)
    if spec.static_metrics.enabled and cells:
        progress(len(cells) - 1, len(cells), "static metrics of the compiled kernels")
        attach_static(pair, spec, results)
    return results
