"""One job end to end on this node: the single code path of ``kernelab run`` and the runner daemon.

``run_job`` resolves the device, probes the node before, measures every sweep cell (inputs,
correctness, interleaved timing, declared work), probes the node after, and returns the whole
``JobResult``. A cell that fails (exception, out-of-memory, compile error) keeps what it measured
so far, records a one-line ``error`` and the job goes on; device memory is released between cells.

Per cell, in this order:

1. the cell's parameters merged with each side's overrides, validated by the benchmark;
2. inputs from ``bench.make_inputs(params, device, seed=spec.measurement.seed)``, shared by both
   sides when their parameters are equal;
3. both variants prepared (allocation and compilation happen here, outside any timing);
4. correctness, not timed: the reference (float64) is computed first, then each variant runs
   once, its output is poisoned (NaN) unless it aliases an input, it runs again and the output is
   compared with ``kernels.check.check_output`` at the spec's or the benchmark's tolerances; the
   repeat, determinism, batch-invariance and bitwise-vs-baseline checks the spec asks for follow
   (``runners.checks``); ``correctness.input_scale`` scales the inputs of the whole cell;
5. ``runners.engine.measure_pair`` with the node's per-sample clock sampler and contention
   monitor on a GPU; the timer kind that measured each variant (``CellResult.timers``: a callable
   that CUDA-graph capture refuses falls back to CUDA events) and who else used the GPU
   (``CellResult.contention``) are recorded;
6. the work one launch of each variant does (``bench.work``).

On a CPU the cells run with one intra-op torch thread (see ``_cpu_threads``).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

import torch

from kernels import Benchmark, get_benchmark
from kernels._device import configure_triton_env
from kernels.check import check_output, poison_
from runners.checks import compare_bitwise, run_checks, scale_inputs
from runners.engine import ClockSampler, measure_pair
from runners.probes import node_info, run_probes
from runners.probes.contention import GpuContentionMonitor
from runners.probes.telemetry import ContextSampler
from runners.timing import Timer, TimerKind, make_timer
from service.schemas import (
    CellResult,
    CorrectnessResult,
    JobResult,
    JobSpec,
    ParamValue,
    ProbeReport,
    Variant,
)
from service.verdicts import all_cells_failed

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int, str], None]
_ERROR_MAX_CHARS = 500  # a cell's error is one short line; the full traceback goes to the log


def resolve_device(requested: str | torch.device | None, spec_device: str = "auto") -> torch.device:
    """The device a job runs on: ``requested`` if given, else the spec's ``device``.

    ``"auto"`` is ``cuda:<current>`` when torch sees a GPU, else ``cpu``; a bare ``cuda`` gets the
    current device index. Raises ``RuntimeError`` for a CUDA device on a node without CUDA.
    """
    value = requested if requested is not None else spec_device
    if value == "auto":
        value = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"the job asks for device {value!r} but torch sees no CUDA GPU here")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def _short_error(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= _ERROR_MAX_CHARS else text[: _ERROR_MAX_CHARS - 3] + "..."


def _probes(spec: JobSpec, phase: Literal["before", "after"], device: torch.device) -> list[ProbeReport]:
    """``run_probes`` when any probe is enabled; a failure becomes a report holding its error.

    Only the on/off switches count (not ``mode``); the matmul peak counts on CUDA only
    (``run_probes`` measures no CPU peak)."""
    enabled = {k: v for k, v in spec.probes.model_dump().items() if isinstance(v, bool)}
    if device.type != "cuda":
        enabled.pop("matmul_peak", None)
    if not any(enabled.values()):
        return []
    try:
        return [run_probes(spec.probes, phase, device_type=device.type)]
    except Exception as exc:
        logger.exception("probes (%s) failed", phase)
        error = {"run_probes": _short_error(exc)}
        return [ProbeReport(phase=phase, taken_at=datetime.now(UTC), errors=error)]


def _aliases_input(out: torch.Tensor, inputs: Mapping[str, Any]) -> bool:
    """True when ``out`` shares storage with an input tensor (an in-place kernel): never poison it."""
    ptr = out.untyped_storage().data_ptr()
    return any(
        isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() == ptr for t in inputs.values()
    )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_variant(
    fn: Callable[[], Any], ref: torch.Tensor, inputs: Mapping[str, Any], *,
    rtol: float, atol: float, device: torch.device,
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
    return check_output(out, ref, rtol=rtol, atol=atol)


def _run_cell(
    bench: Benchmark[Any], spec: JobSpec, index: int, cell: dict[str, ParamValue], device: torch.device,
    timer: Timer, sampler: ClockSampler | None, progress: Callable[[str], None],
    monitor: GpuContentionMonitor | None = None,
) -> CellResult:
    """Measure one cell; an exception is recorded in ``CellResult.error`` with what came before."""
    sides: dict[Variant, Any] = {"baseline": spec.baseline, "candidate": spec.candidate}
    merged = {v: {**cell, **side.params} for v, side in sides.items()}
    result = CellResult(
        index=index, params=cell, baseline_params=merged["baseline"], candidate_params=merged["candidate"]
    )
    try:
        params = {v: bench.parse_params(merged[v]) for v in sides}
        inputs: dict[Variant, dict[str, Any]] = {
            "baseline": bench.make_inputs(params["baseline"], device, spec.measurement.seed)
        }
        inputs["candidate"] = (
            inputs["baseline"]
            if params["candidate"] == params["baseline"]
            else bench.make_inputs(params["candidate"], device, spec.measurement.seed)
        )
        scale = spec.correctness.input_scale
        if scale != 1.0:
            inputs = {"baseline": scale_inputs(inputs["baseline"], scale),
                      "candidate": scale_inputs(inputs["candidate"], scale)}
        fns = {v: bench.prepare(sides[v].variant, params[v], inputs[v]) for v in sides}
        if spec.correctness.enabled:
            progress("correctness")
            refs = {v: bench.reference(params[v], inputs[v]) for v in sides}  # before any run
            outs: dict[Variant, torch.Tensor] = {}
            for v in sides:
                default_rtol, default_atol = bench.tolerances(params[v])
                rtol = spec.correctness.rtol if spec.correctness.rtol is not None else default_rtol
                atol = spec.correctness.atol if spec.correctness.atol is not None else default_atol
                result.correctness[v], outs[v] = run_checks(
                    bench, sides[v].variant, params[v], inputs[v], fns[v], refs[v], spec.correctness,
                    seed=spec.measurement.seed, device=device, rtol=rtol, atol=atol,
                )
            if spec.correctness.bitwise_vs_baseline:
                candidate = result.correctness["candidate"]
                candidate.vs_baseline = compare_bitwise(
                    outs["candidate"], outs["baseline"], bench, params["candidate"]
                )
                if not candidate.vs_baseline.identical:
                    candidate.passed = False
                    candidate.message += f"; differs bitwise from the baseline: {candidate.vs_baseline.where}"
            del refs, outs
        progress("measuring")
        if monitor is not None:
            monitor.start()
        try:
            result.samples = measure_pair(
                fns["baseline"], fns["candidate"], spec.measurement, timer, sampler=sampler,
                progress=progress, monitor=monitor,
            )
        finally:
            result.timers = {v: timer.kind_for(fns[v]) for v in sides}
            result.contention = monitor.take() if monitor is not None else []
        result.work = {v: bench.work(params[v], sides[v].variant) for v in sides}
    except Exception as exc:  # one cell's failure must not lose the job's other cells
        logger.exception("cell %d %s failed", index, cell)
        result.error = _short_error(exc)
    return result


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


def _free_device_memory(device: torch.device, timer: Timer) -> None:
    timer.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def run_job(
    spec: JobSpec,
    *,
    job_id: int | None = None,
    idempotency_key: str | None = None,
    device: str | torch.device | None = None,
    progress: ProgressCallback | None = None,
    timer_kind: TimerKind | None = None,
) -> JobResult:
    """Run ``spec`` on this node and return every raw result (see the module docstring).

    ``device`` overrides ``spec.device`` (``"auto"``: the GPU when there is one). ``progress(cell
    index, cell count, message)`` is called as each cell advances. ``timer_kind`` overrides
    ``spec.measurement.timer`` (``runners.timing.make_timer``). ``idempotency_key`` defaults to a
    fresh ``uuid4().hex``; timestamps are UTC. Raises ``RuntimeError`` for a CUDA device without CUDA and
    ``kernels.BenchmarkError`` for an unknown benchmark; failures inside a cell never raise.
    """
    started_at = datetime.now(UTC)
    dev = resolve_device(device, spec.device)
    configure_triton_env(dev)  # TRITON_INTERPRET for the CPU, before anything imports triton
    bench = get_benchmark(spec.benchmark)
    timer = make_timer(dev, spec.measurement, kind=timer_kind)
    sampler = ContextSampler(dev.index) if dev.type == "cuda" else None
    monitor = GpuContentionMonitor(dev.index) if dev.type == "cuda" else None
    cells = spec.cells(dev.type)  # type: ignore[arg-type]
    report: ProgressCallback = progress if progress is not None else (lambda i, n, msg: None)
    guard = torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()
    with guard:
        probes = _probes(spec, "before", dev)
        results: list[CellResult] = []
        with _cpu_threads(1) if dev.type == "cpu" else contextlib.nullcontext():
            for index, cell in enumerate(cells):
                report(index, len(cells), f"cell {index + 1}/{len(cells)} {cell}")
                result = _run_cell(
                    bench, spec, index, cell, dev, timer, sampler,
                    partial(report, index, len(cells)), monitor,
                )
                _free_device_memory(dev, timer)
                report(index, len(cells), f"done: {result.error or f'{len(result.samples)} samples'}")
                results.append(result)
        if spec.static_metrics.enabled and cells:  # after the timing: compiling loads the CPU
            from runners.static_metrics import attach_static

            report(len(cells) - 1, len(cells), "static metrics of the compiled kernels")
            attach_static(spec, results, dev)
        # After the cells: the fingerprint then shows whether Triton kernels ran interpreted.
        node = node_info(dev)
        probes += _probes(spec, "after", dev)
    return JobResult(
        idempotency_key=idempotency_key or uuid.uuid4().hex,
        job_id=job_id,
        spec=spec,
        node=node,
        timer=timer.label,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        cells=results,
        probes=probes,
        error=all_cells_failed(results),
    )
