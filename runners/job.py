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
   compared with ``kernelab.kernels.check.check_output`` at the spec's or the benchmark's tolerances; the
   repeat, determinism, batch-invariance and bitwise-vs-baseline checks the spec asks for follow
   (``kernelab.runners.checks``); ``correctness.input_scale`` scales the inputs of the whole cell;
5. ``kernelab.runners.engine.measure_pair`` with the node's per-sample clock sampler and contention
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
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any, Literal

import torch

from kernelab.kernels import Benchmark, get_benchmark
from kernelab.kernels._device import configure_triton_env
from kernelab.kernels.check import check_output, poison_
from kernelab.kernels.preflight import as_work, check_benchmark, check_inputs, check_prepared, check_work
from kernelab.runners import integrity
from kernelab.runners.checks import bitwise_diff, compare_bitwise, run_checks, scale_inputs
from kernelab.runners.engine import ClockSampler, LocalPairTimer, measure_interleaved
from kernelab.runners.probes import node_info, run_probes
from kernelab.runners.probes.contention import GpuContentionMonitor
from kernelab.runners.probes.copy_bandwidth import measure_cuda_copy
from kernelab.runners.probes.telemetry import ContextSampler
from kernelab.runners.sides import LocalSide, References, modified_inputs, refill_inputs, snapshot_inputs
from kernelab.runners.timing import Timer, TimerKind, make_timer
from kernelab.service.schemas import (
    CellResult,
    CorrectnessResult,
    JobResult,
    JobSpec,
    NodeInfo,
    ParamValue,
    ProbeReport,
    Variant,
)
from kernelab.service.verdicts import all_cells_failed, reason

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int, str], None]
_PROBE_TIMEOUT_S = 600.0  # a probe process that takes longer is killed; its report says so
_ERROR_MAX_CHARS = 500  # a cell's error is one short line; the full traceback goes to the log


def resolve_device(requested: str | torch.device | None, spec_device: str = "auto") -> torch.device:
    """The device a job runs on: ``requested`` if given, else the spec's ``device``.

    ``"auto"`` is ``cuda:0`` when torch sees a GPU, else ``cpu``; a bare ``cuda`` is ``cuda:0``
    (the first visible GPU: ``CUDA_VISIBLE_DEVICES`` chooses). No CUDA context is created here: the
    orchestrating process of a job must not hold the GPU (``kernelab.runners.measure``). Raises
    ``RuntimeError`` for a CUDA device on a node without CUDA.
    """
    value = requested if requested is not None else spec_device
    if value == "auto":
        value = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"the job asks for device {value!r} but torch sees no CUDA GPU here")
        if device.index is None:
            device = torch.device("cuda", 0)
    return device


def _short_error(exc: BaseException) -> str:
    """``Type: first line`` of ``exc``, at most ``_ERROR_MAX_CHARS``; a NUL character (which no
    stored text may hold, ``kernelab.service.schemas.Text``) is written ``\\x00``, so a benchmark's message
    can never make the job's other cells unreadable."""
    lines = str(exc).replace("\x00", "\\x00").strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= _ERROR_MAX_CHARS else text[: _ERROR_MAX_CHARS - 3] + "..."


def probes_enabled(spec: JobSpec, device_type: str) -> bool:
    """Whether ``spec`` asks for any probe report on a ``device_type`` node: only the on/off
    switches count (not ``mode``, not the in-process ``canary``); the matmul peak counts on CUDA
    only (``run_probes`` measures no CPU peak)."""
    enabled = {k: v for k, v in spec.probes.model_dump().items() if isinstance(v, bool)}
    enabled.pop("canary")
    enabled.pop("cuda_graph")
    if device_type != "cuda":
        enabled.pop("matmul_peak", None)
    return any(enabled.values())


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


def _probes(spec: JobSpec, phase: Literal["before", "after"], device: torch.device) -> list[ProbeReport]:
    """The ``phase`` probe reports of ``spec`` on ``device``, taken in a fresh process that never
    imports benchmark code and then exits (``kernelab.runners.measure.probes_in_child``); none when no probe
    is enabled."""
    if not probes_enabled(spec, device.type):
        return []
    from kernelab.runners.measure import probes_in_child

    return probes_in_child(spec, phase=phase, device_type=device.type, timeout_s=_PROBE_TIMEOUT_S)


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
    rtol: float,
    atol: float,
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
    return check_output(out, ref, rtol=rtol, atol=atol)


CHECK_SEED_STRIDE = 7919  # checked sample k draws its fresh inputs with seed + 7919 * (k + 1)


def check_seed(seed: int, k: int) -> int:
    """The seed of the fresh inputs of checked sample ``k`` (0-based) of a cell measured with
    ``seed``: apart from the cell's own inputs and from the repeat check's ``seed + i``."""
    return seed + CHECK_SEED_STRIDE * (k + 1)


def _prepare_sides(
    bench: Benchmark[Any],
    spec: JobSpec,
    cell: dict[str, ParamValue],
    device: torch.device,
    timer: Timer,
) -> tuple[dict[Variant, Any], dict[Variant, dict[str, Any]], dict[Variant, LocalSide]]:
    """Each side's parameters, inputs (shared when the parameters are equal, scaled by
    ``correctness.input_scale``) and prepared ``LocalSide`` with the cell's tolerances."""
    specs: dict[Variant, Any] = {"baseline": spec.baseline, "candidate": spec.candidate}
    params = {v: bench.parse_params({**cell, **s.params}) for v, s in specs.items()}
    inputs: dict[Variant, dict[str, Any]] = {
        "baseline": check_inputs(bench, bench.make_inputs(params["baseline"], device, spec.measurement.seed))
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
    sides: dict[Variant, LocalSide] = {}
    for v, side_spec in specs.items():
        default_rtol, default_atol = bench.tolerances(params[v])
        rtol = spec.correctness.rtol if spec.correctness.rtol is not None else default_rtol
        atol = spec.correctness.atol if spec.correctness.atol is not None else default_atol
        fn = check_prepared(bench, side_spec.variant, bench.prepare(side_spec.variant, params[v], inputs[v]))
        sides[v] = LocalSide(
            side=v,
            bench=bench,
            variant=side_spec.variant,
            params=params[v],
            inputs=inputs[v],
            fn=fn,
            timer=timer,
            device=device,
            rtol=rtol,
            atol=atol,
        )
    return params, inputs, sides


def _eager_checks(
    bench: Benchmark[Any],
    spec: JobSpec,
    result: CellResult,
    params: dict[Variant, Any],
    sides: dict[Variant, LocalSide],
    device: torch.device,
) -> None:
    """Step 4 of the module docstring, into ``result.correctness`` and ``result.findings``."""
    refs = {v: bench.reference(params[v], sides[v].inputs) for v in sides}  # before any run
    outs: dict[Variant, torch.Tensor] = {}
    for v, side in sides.items():
        before = snapshot_inputs(side.inputs)
        result.correctness[v], outs[v] = run_checks(
            bench,
            side.variant,
            params[v],
            side.inputs,
            side.fn,
            refs[v],
            spec.correctness,
            seed=spec.measurement.seed,
            device=device,
            rtol=side.rtol,
            atol=side.atol,
        )
        if before is not None:
            # An in-place kernel's output is one of its inputs: that one may change (to the output).
            modified = [
                k for k in modified_inputs(before, side.inputs) if not _is_output(side.inputs[k], outs[v])
            ]
            if modified:
                result.findings.append(
                    reason(
                        "inputs-modified",
                        f"{v}: the call modified its inputs {', '.join(modified)} (eager check)",
                        side=v,
                    )
                )
                refill_inputs(side.inputs, before)  # the other side must see the inputs as made
    if spec.correctness.bitwise_vs_baseline:
        candidate = result.correctness["candidate"]
        candidate.vs_baseline = compare_bitwise(
            outs["candidate"], outs["baseline"], bench, params["candidate"]
        )
        if not candidate.vs_baseline.identical:
            candidate.passed = False
            candidate.message += f"; differs bitwise from the baseline: {candidate.vs_baseline.where}"


def _is_output(tensor: Any, out: torch.Tensor) -> bool:
    """Whether input ``tensor`` now holds exactly ``out`` (an in-place kernel wrote its output there)."""
    return (
        isinstance(tensor, torch.Tensor)
        and tensor.shape == out.shape
        and tensor.dtype == out.dtype
        and not bool(bitwise_diff(tensor, out).any())
    )


@contextlib.contextmanager
def _phase(result: CellResult, name: str) -> Iterator[None]:
    """Add the wall time of the block to ``result.phase_s[name]`` (s)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        result.phase_s[name] = round(result.phase_s.get(name, 0.0) + time.perf_counter() - t0, 6)


def _checked_samples(
    spec: JobSpec, result: CellResult, sides: dict[Variant, LocalSide]
) -> Callable[[int, Mapping[Variant, int]], None]:
    """The engine's checkpoint: one checked sample per side through the timer (``kernelab.runners.sides``)
    into ``result.timed_checks``, and the integrity of kernelab's timing functions."""
    taken = [0]

    def checkpoint(rounds: int, launches: Mapping[Variant, int]) -> None:
        seed = check_seed(spec.measurement.seed, taken[0])
        taken[0] += 1
        references: References = {}  # sides that read the same inputs share the reference
        with _phase(result, "checks"):
            for v, side in sides.items():
                check = side.checked_sample(
                    seed=seed, rounds=rounds, launches=launches[v], references=references
                )
                result.timed_checks.setdefault(v, []).append(check)
            _integrity(result)

    return checkpoint


def _integrity(result: CellResult) -> None:
    """A ``timer-tampered`` finding when a function kernelab times or checks with was replaced."""
    found = integrity.tamper_reason()
    if found is not None and not any(f.code == "timer-tampered" for f in result.findings):
        result.findings.append(found)


def _run_cell(
    bench: Benchmark[Any],
    spec: JobSpec,
    index: int,
    cell: dict[str, ParamValue],
    device: torch.device,
    timer: Timer,
    sampler: ClockSampler | None,
    progress: Callable[[str], None],
    monitor: GpuContentionMonitor | None = None,
) -> CellResult:
    """Measure one cell; an exception is recorded in ``CellResult.error`` with what came before."""
    merged = {"baseline": {**cell, **spec.baseline.params}, "candidate": {**cell, **spec.candidate.params}}
    result = CellResult(
        index=index, params=cell, baseline_params=merged["baseline"], candidate_params=merged["candidate"]
    )
    sides: dict[Variant, LocalSide] = {}
    try:
        _integrity(result)
        with _phase(result, "prepare"):
            params, _, sides = _prepare_sides(bench, spec, cell, device, timer)
        if spec.correctness.enabled:
            progress("correctness")
            with _phase(result, "correctness"):
                _eager_checks(bench, spec, result, params, sides, device)
        progress("measuring")
        if monitor is not None:
            monitor.start()
        checkpoint = (
            _checked_samples(spec, result, sides)
            if spec.correctness.enabled and spec.correctness.timed_checks
            else None
        )
        t_measure = time.perf_counter()
        try:
            result.samples = measure_interleaved(
                LocalPairTimer(sides),
                spec.measurement,
                sampler=sampler,
                progress=progress,
                monitor=monitor,
                checkpoint=checkpoint,
            )
        finally:
            result.phase_s["measure"] = round(
                time.perf_counter() - t_measure - result.phase_s.get("checks", 0.0), 6
            )
            result.timers = {v: side.timer_kind for v, side in sides.items()}
            result.contention = monitor.take() if monitor is not None else []
        with _phase(result, "device_work"):
            for side in sides.values():
                result.findings += side.device_work_findings()
        result.work = {v: as_work(bench, bench.work(params[v], sides[v].variant)) for v in sides}
        _integrity(result)
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


CANARY_TOLERANCE = 0.15
"""A cell after which the in-process copy-bandwidth canary reads more than 15% away from the
reading taken before the benchmark was imported (either way) gets a ``node-changed`` finding.
The H200 copy probe varies by well under 1% between readings (4,184-4,190 GB/s over a day,
docs/results/2026-11-30-h200x2-probe-accuracy.md); the cheats it is for moved it by 3x and 100x."""
_CANARY_SAMPLES = 3


def _canary_gbps(device: torch.device) -> float | None:
    """Device-local copy bandwidth (GB/s) measured in this process with kernelab's own timing code
    (``kernelab.runners.probes.copy_bandwidth``, 3 samples); None off CUDA or when it cannot run."""
    if device.type != "cuda":
        return None
    try:
        index = device.index if device.index is not None else torch.cuda.current_device()
        return measure_cuda_copy(index, samples=_CANARY_SAMPLES).bandwidth_gbps
    except RuntimeError:
        logger.warning("copy-bandwidth canary failed", exc_info=True)
        return None


def _canary_check(result: CellResult, reference_gbps: float | None, device: torch.device) -> None:
    """After a cell: the canary again; a ``node-changed`` finding when it left the band."""
    if reference_gbps is None or result.error is not None:
        return
    with _phase(result, "canary"):
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
        cells = spec.cells(device.type)  # type: ignore[arg-type]
        results: list[CellResult] = []
        with _cpu_threads(1) if device.type == "cpu" else contextlib.nullcontext():
            for index, cell in enumerate(cells):
                report(index, len(cells), f"cell {index + 1}/{len(cells)} {cell}")
                result = _run_cell(
                    bench,
                    spec,
                    index,
                    cell,
                    device,
                    timer,
                    sampler,
                    partial(report, index, len(cells)),
                    monitor,
                )
                _free_device_memory(device, timer)
                _canary_check(result, canary, device)
                report(index, len(cells), f"done: {result.error or f'{len(result.samples)} samples'}")
                results.append(result)
        if spec.static_metrics.enabled and cells:  # after the timing: compiling loads the CPU
            from kernelab.runners.static_metrics import attach_static

            report(len(cells) - 1, len(cells), "static metrics of the compiled kernels")
            attach_static(spec, results, device)
        # After the cells: the fingerprint then shows whether Triton kernels ran interpreted.
        return results, node_info(device), timer.label


def run_job(
    spec: JobSpec,
    *,
    job_id: int | None = None,
    idempotency_key: str | None = None,
    device: str | torch.device | None = None,
    progress: ProgressCallback | None = None,
    timer_kind: TimerKind | None = None,
    isolate: bool = True,
    bench: Benchmark[Any] | None = None,
) -> JobResult:
    """Run ``spec`` on this node and return every raw result (see the module docstring).

    The probes before and after, and the cells, each run in a fresh child process (``python -m
    kernelab.runners.measure``; this process never touches the GPU); the measuring child is killed once
    ``spec.timeout_s`` has passed. With ``isolate`` False the cells are measured in this process
    (tests of the engine). ``bench``, a ``Benchmark`` object in place of ``spec.benchmark`` (the
    Python API), is always measured in this process (an object cannot be handed to a child), so
    ``timeout_s`` is then not enforced.
    ``device`` overrides ``spec.device`` (``"auto"``: the GPU when there is one). ``progress(cell
    index, cell count, message)`` is called as each cell advances. ``timer_kind`` overrides
    ``spec.measurement.timer`` (``kernelab.runners.timing.make_timer``). ``idempotency_key`` defaults to a
    fresh ``uuid4().hex``; timestamps are UTC. Raises ``RuntimeError`` for a CUDA device without
    CUDA, ``kernelab.kernels.BenchmarkError`` for an unknown benchmark,
    ``kernelab.runners.measure.MeasureError``
    when the child fails or overruns ``timeout_s``; failures inside a cell never raise.
    """
    started_at = datetime.now(UTC)
    dev = resolve_device(device, spec.device)
    configure_triton_env(dev)  # inherited by the child, before anything imports triton
    probes = _probes(spec, "before", dev)
    if isolate and bench is None:
        from kernelab.runners.measure import measure_in_child

        results, node, timer_label = measure_in_child(
            spec,
            device=dev,
            progress=progress,
            timer_kind=timer_kind,
            timeout_s=spec.timeout_s,
        )
    else:
        results, node, timer_label = measure_cells(
            spec, device=dev, progress=progress, timer_kind=timer_kind, bench=bench
        )
    probes += _probes(spec, "after", dev)
    return JobResult(
        idempotency_key=idempotency_key or uuid.uuid4().hex,
        job_id=job_id,
        spec=spec,
        node=node,
        timer=timer_label,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        cells=results,
        probes=probes,
        error=all_cells_failed(results),
    )
