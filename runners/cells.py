"""The cells of a job measured in this process: ``measure_cells`` (the measuring child of
``kernelab.runners.job.run_job``, ``python -m kernelab.runners.measure cells``) and its pieces.

The cells are measured by the cell pipeline
(``kernelab.runners.pipeline.run_cells``: correctness with every ``correctness`` option,
interleaved timing with checked samples, contention readings, device-work findings, declared
work, static metrics), the same code that measures a revision job
(``kernelab.runners.revision_job``); here its two sides are ``kernelab.runners.sides.LocalSide``
objects prepared in the measuring process by ``LocalSides``:

1. the cell's parameters merged with each side's overrides, validated by the benchmark;
2. inputs from ``bench.make_inputs(params, device, seed=spec.measurement.seed)``, shared by both
   sides when their parameters are equal, scaled by ``correctness.input_scale``;
3. both variants prepared (allocation and compilation happen here, outside any timing), with the
   spec's or the benchmark's tolerances and its declared reduction (``cell_tolerance``).

A cell that fails (exception, out-of-memory, compile error) keeps what it measured so far,
records a one-line ``error`` and the job goes on; device memory is released between cells, and
after each cell the in-process copy-bandwidth canary is read again (``CANARY_TOLERANCE``).
``check_variant`` is the single poisoned comparison with the reference (the Python API).

On a CPU the cells run with one intra-op torch thread (see ``_cpu_threads``). This module imports
torch; the orchestrating process of a job (``kernelab.runners.job``) does not import it.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import torch

from kernelab.kernels import Benchmark, get_benchmark
from kernelab.kernels._device import configure_triton_env
from kernelab.kernels.check import check_output, poison_
from kernelab.kernels.preflight import check_benchmark, check_inputs, check_prepared, check_work, tolerance_of
from kernelab.kernels.tolerances import Tolerance
from kernelab.runners import integrity
from kernelab.runners.checks import scale_inputs
from kernelab.runners.devices import device_name
from kernelab.runners.pipeline import (
    CHECK_SEED_STRIDE,
    SIDES,
    Compiled,
    check_seed,
    phase,
    run_cells,
    short_error,
)
from kernelab.runners.probes import node_info, probes_enabled, run_probes
from kernelab.runners.probes.contention import GpuContentionMonitor
from kernelab.runners.probes.copy_bandwidth import measure_cuda_copy
from kernelab.runners.probes.telemetry import ContextSampler
from kernelab.runners.progress import ProgressCallback
from kernelab.runners.sides import LocalSide
from kernelab.runners.static_metrics import compile_kernels, default_target, side_items
from kernelab.runners.timing import Timer, TimerKind, make_cross_timers, make_timer
from kernelab.service.contract.schemas import (
    CellResult,
    CorrectnessResult,
    JobSpec,
    NodeInfo,
    ParamValue,
    ProbeReport,
    Side,
)
from kernelab.service.judge.verdicts import reason

logger = logging.getLogger(__name__)

__all__ = [
    "CHECK_SEED_STRIDE",
    "LocalSides",
    "check_seed",
    "check_variant",
    "measure_cells",
    "probe_reports",
    "resolve_device",
]


def resolve_device(requested: str | torch.device | None, spec_device: str = "auto") -> torch.device:
    """``torch.device(kernelab.runners.devices.device_name(requested, spec_device))``: the device a job
    runs on (``"auto"``: ``cuda:0`` when torch sees a GPU, else the CPU). Raises ``RuntimeError``
    for a CUDA device on a node without CUDA."""
    return torch.device(device_name(requested, spec_device))


_short_error = short_error  # the pipeline's one-line error of a cell, used for probe errors too


def probe_reports(spec: JobSpec, phase: str, device_type: str) -> list[ProbeReport]:
    """``run_probes`` when ``probes_enabled``; a failure becomes a report holding its error."""
    if not probes_enabled(spec, device_type):
        return []
    try:
        return [run_probes(spec.probes, phase, device_type=device_type)]
    except Exception as exc:
        logger.exception("probes (%s) failed", phase)
        error = {"run_probes": _short_error(exc)}
        return [ProbeReport(phase=phase, taken_at=datetime.now(UTC), errors=error)]  # type: ignore[arg-type]


def _aliases_input(out: torch.Tensor, inputs: Mapping[str, Any]) -> bool:
    """True when ``out`` shares storage with an input tensor (an in-place kernel): never poison it."""
    ptr = out.untyped_storage().data_ptr()
    return any(isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr for t in inputs.values())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_variant(
    fn: Callable[[], Any],
    ref: torch.Tensor,
    inputs: Mapping[str, Any],
    *,
    tolerance: Tolerance,
    device: torch.device,
) -> CorrectnessResult:
    """Run ``fn`` once, poison its output (NaN), run it again and compare with ``ref``.

    ``ref`` is the benchmark's float64 reference for ``inputs``. An output that aliases an input
    (in-place kernel) or is boolean is not poisoned. Raises ``TypeError`` (from ``check_output``)
    when ``fn`` does not return a tensor; whatever ``fn`` raises propagates.
    """
    out = fn()
    if isinstance(out, torch.Tensor) and out.dtype != torch.bool and not _aliases_input(out, inputs):
        poison_(out)
    # Dropping the poisoned tensor lets an allocating kernel get the same (poisoned) block back.
    del out
    out = fn()
    _synchronize(device)
    return check_output(out, ref, tolerance)


class LocalSides:
    """The cell pipeline's ``SidePair`` of an in-process job: both sides of each cell prepared in
    this process (``kernelab.runners.sides.LocalSide``) on ``device``, timed by ``timer``."""

    def __init__(self, bench: Benchmark[Any], spec: JobSpec, device: torch.device, timer: Timer) -> None:
        self.bench, self.spec, self.device, self.timer = bench, spec, device, timer
        self.static_target = default_target(device)
        self.cross_timers = make_cross_timers(device, spec.measurement)

    def __repr__(self) -> str:
        return f"<LocalSides {self.spec.benchmark!r} device={self.device} timer={self.timer.label}>"

    def prepare(self, index: int, cell: Mapping[str, ParamValue]) -> dict[Side, LocalSide]:
        """Each side's parameters, inputs (shared when the parameters are equal, scaled by
        ``correctness.input_scale``) and prepared ``LocalSide`` with the cell's tolerances.

        With ``measurement.placement: rotate`` each side is prepared on up to
        ``measurement.input_sets`` input sets drawn from the same seed (equal values) and allocated
        alike, in turn: set k's inputs, then both sides' ``prepare`` (whatever it allocates, its
        output buffers too), the baseline first in even sets and the candidate first in odd ones,
        so neither side's buffers come first in the allocation order more often. Sets are added
        while they fit in half the memory free after set 0 (``sets_that_fit``; a set that still
        runs out of memory ends the list), so the cell may rotate fewer (``CellResult.placement``
        says how many the rounds used)."""
        before = allocated_bytes(self.device)
        sides = self._prepare_set(cell, list(SIDES))
        wanted = self.spec.measurement.input_sets if self.spec.measurement.placement == "rotate" else 1
        if wanted < 2:
            return sides
        sets = sets_that_fit(set_bytes(self.device, before, sides), free_bytes(self.device), wanted)
        for k in range(1, sets):
            try:
                more = self._prepare_set(cell, list(SIDES) if k % 2 == 0 else list(reversed(SIDES)))
            except torch.OutOfMemoryError:
                logger.warning("cell %d: input set %d does not fit in device memory; %d sets", index, k, k)
                break
            for v, side in sides.items():
                side.add_input_set(more[v].inputs, more[v].fn)
        if sets < wanted:
            logger.info("cell %d: %d of %d input sets fit in half the free memory", index, sets, wanted)
        return sides

    def _prepare_set(self, cell: Mapping[str, ParamValue], order: list[Side]) -> dict[Side, LocalSide]:
        """One input set and both sides prepared on it, ``prepare`` called in ``order``."""
        bench, spec, device = self.bench, self.spec, self.device
        specs: dict[Side, Any] = {"baseline": spec.baseline, "candidate": spec.candidate}
        params = {v: bench.parse_params({**cell, **s.params}) for v, s in specs.items()}
        inputs: dict[Side, dict[str, Any]] = {
            "baseline": check_inputs(
                bench, bench.make_inputs(params["baseline"], device, spec.measurement.seed)
            )
        }
        inputs["candidate"] = (
            inputs["baseline"]
            if params["candidate"] == params["baseline"]
            else check_inputs(bench, bench.make_inputs(params["candidate"], device, spec.measurement.seed))
        )
        scale = spec.correctness.input_scale
        if scale != 1.0:
            shared = inputs["candidate"] is inputs["baseline"]
            inputs["baseline"] = scale_inputs(inputs["baseline"], scale)
            inputs["candidate"] = inputs["baseline"] if shared else scale_inputs(inputs["candidate"], scale)
        sides: dict[Side, LocalSide] = {}
        for v in order:
            side_spec = specs[v]
            tolerance = cell_tolerance(bench, spec, params[v])
            sides[v] = LocalSide(
                side=v,
                bench=bench,
                variant=side_spec.variant,
                params=params[v],
                inputs=inputs[v],
                fn=check_prepared(
                    bench, side_spec.variant, bench.prepare(side_spec.variant, params[v], inputs[v])
                ),
                timer=self.timer,
                device=device,
                tolerance=tolerance,
                input_scale=scale,
                cross_timers=self.cross_timers,
            )
        return {v: sides[v] for v in SIDES}

    def release(self) -> None:
        """Free the cell's timer state and device memory (the sides go with the cell)."""
        for timer in self.cross_timers.values():
            timer.reset()
        _free_device_memory(self.device, self.timer)

    def static_kernels(self, indices: Sequence[int], target: str) -> dict[Side, list[Compiled]]:
        """Both sides' kernels of cells ``indices``, compiled in one child process
        (``kernelab.runners.static_metrics.compile_kernels``)."""
        cells = [self.spec.cell(self.device.type, i) for i in indices]  # type: ignore[arg-type]
        merged = {v: [{**c, **getattr(self.spec, v).params} for c in cells] for v in SIDES}
        items = [item for v in SIDES for item in side_items(self.spec, v, merged[v])]
        compiled = compile_kernels(items, target)
        return {v: [compiled[f"{i}/{v}"] for i in range(len(cells))] for v in SIDES}


def cell_tolerance(bench: Any, spec: JobSpec, params: Any) -> Tolerance:
    """The ``Tolerance`` of a side (``kernelab.kernels.preflight.tolerance_of``): the spec's
    ``correctness.rtol``/``atol`` where given, else the benchmark's (``Benchmark.tolerances``, the
    dtype's defaults unless it has its own), and the reduction the benchmark declares
    (``Benchmark.reduction``). Raises ``BenchmarkError`` for an unusable declaration."""
    return tolerance_of(bench, params, rtol=spec.correctness.rtol, atol=spec.correctness.atol)


@contextlib.contextmanager
def _cpu_threads(n: int) -> Iterator[None]:
    """Run with ``n`` intra-op torch threads, then restore the previous count.

    CPU timings use one thread, as ``torch.utils.benchmark.Timer`` does by default: on a small
    machine a spinning OpenMP pool left by one variant (the Triton interpreter) otherwise slows the
    other variant's next calls by milliseconds.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


SET_MEMORY_FRACTION = 0.5
"""Input sets beyond the first may take at most this fraction of the memory free after the first
(device memory on a GPU, available RAM on a CPU): the rest stays for the kernel's own work space."""


def sets_that_fit(set_bytes: int, free_bytes: int | None, wanted: int) -> int:
    """How many input sets to prepare: ``wanted``, or fewer when sets 2..n of ``set_bytes`` bytes
    each would take more than ``SET_MEMORY_FRACTION`` of ``free_bytes`` (unknown: ``wanted``);
    at least 1."""
    if wanted <= 1 or free_bytes is None or set_bytes <= 0:
        return max(1, wanted)
    extra = int(SET_MEMORY_FRACTION * free_bytes // set_bytes)
    return max(1, min(wanted, 1 + extra))


def allocated_bytes(device: torch.device) -> int:
    """Bytes the caching allocator has handed out on a GPU (``torch.cuda.memory_allocated``); 0 on a CPU."""
    return int(torch.cuda.memory_allocated(device)) if device.type == "cuda" else 0


def set_bytes(device: torch.device, before: int, sides: Mapping[Side, LocalSide]) -> int:
    """Bytes one input set took: on a GPU what the allocator handed out while preparing it; on a
    CPU twice its input tensors (the outputs a ``prepare`` allocates are not visible there)."""
    if device.type == "cuda":
        return max(0, allocated_bytes(device) - before)
    seen: dict[int, int] = {}
    for side in sides.values():
        for value in side.inputs.values():
            if isinstance(value, torch.Tensor):
                seen[id(value)] = value.numel() * value.element_size()
    return 2 * sum(seen.values())


def free_bytes(device: torch.device) -> int | None:
    """Free device memory (``torch.cuda.mem_get_info``), or available RAM on a CPU
    (``sysconf``), or None where neither can be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _free_device_memory(device: torch.device, timer: Timer) -> None:
    timer.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


CANARY_TOLERANCE = 0.15
"""A cell after which the in-process copy-bandwidth canary reads more than 15% away from the
reading taken before the benchmark was imported (either way) gets a ``node-changed`` finding.
The H200 copy probe varies by well under 1% between readings (4,184-4,190 GB/s over a day,
docs/results/2026-11-30-h200x2-probe-accuracy.md); the cheats it is for moved it by 3x and 100x."""
_CANARY_SAMPLES = 3


def _canary_gbps(device: torch.device) -> float | None:
    """Device-local copy bandwidth (GB/s) measured in this process with kernelab's own timing code
    (``kernelab.runners.probes.copy_bandwidth``, 3 samples); None off CUDA or when it cannot run
    (a CUDA error, or a reading no copy gives: events that read no time)."""
    if device.type != "cuda":
        return None
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        return measure_cuda_copy(index, samples=_CANARY_SAMPLES).bandwidth_gbps
    except (RuntimeError, ValueError):
        logger.warning("copy-bandwidth canary failed", exc_info=True)
        return None


def _canary_check(result: CellResult, reference_gbps: float | None, device: torch.device) -> None:
    """After a cell: the canary again; a ``node-changed`` finding when it left the band. Not after
    a cell whose timing functions were replaced (``timer-tampered``): the canary times with them."""
    if reference_gbps is None or result.error is not None:
        return
    if any(f.code == "timer-tampered" for f in result.findings):
        return
    with phase(result, "canary"):
        now = _canary_gbps(device)
    if now is None:
        return
    change = now / reference_gbps - 1
    if abs(change) > CANARY_TOLERANCE:
        result.findings.append(
            reason(
                "node-changed",
                f"device copy bandwidth in the measuring process read {now:,.0f} GB/s after this cell "
                f"against "
                f"{reference_gbps:,.0f} GB/s before the benchmark was loaded ({100 * change:+.0f}%, beyond "
                f"±{100 * CANARY_TOLERANCE:.0f}%): the cell changed the device's state "
                "(a cache or clock policy, "
                "a patched timer, another tenant); its timing cannot decide",
            )
        )


def measure_cells(
    spec: JobSpec,
    *,
    device: torch.device,
    progress: ProgressCallback | None = None,
    timer_kind: TimerKind | None = None,
    bench: Benchmark[Any] | None = None,
) -> tuple[list[CellResult], NodeInfo, str]:
    """Measure every sweep cell of ``spec`` in this process: ``(cells, node fingerprint, timer
    label)`` (module docstring, steps 1-8). Imports the benchmark: run it in a process of its own
    (``run_job`` does, through ``python -m kernelab.runners.measure``). ``bench`` is the benchmark
    object itself instead of ``spec.benchmark`` (the Python API, ``kernelab.runners.api``).
    Raises ``kernelab.kernels.BenchmarkError``
    for an unknown benchmark or one whose methods do not fit (``kernelab.kernels.preflight``), before
    any cell is measured; failures inside a cell never raise."""
    configure_triton_env(device)  # TRITON_INTERPRET for the CPU, before anything imports triton
    integrity.take_snapshot()  # before the benchmark module is imported
    report: ProgressCallback = progress if progress is not None else (lambda i, n, msg: None)
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    with guard:
        canary = _canary_gbps(device) if spec.probes.canary else None  # before the benchmark's import
        bench = bench if bench is not None else get_benchmark(spec.benchmark)
        check_benchmark(bench)
        check_work(bench, spec, device.type)
        timer = make_timer(device, spec.measurement, kind=timer_kind)
        sampler = ContextSampler(device.index) if device.type == "cuda" else None
        monitor = GpuContentionMonitor(device.index) if device.type == "cuda" else None
        with _cpu_threads(1) if device.type == "cpu" else contextlib.nullcontext():
            results = run_cells(
                LocalSides(bench, spec, device, timer),
                spec,
                sampler=sampler,
                monitor=monitor,
                progress=report,
                after_cell=lambda result: _canary_check(result, canary, device),
            )
        # After the cells: the fingerprint then shows whether Triton kernels ran interpreted.
        return results, node_info(device), timer.label
