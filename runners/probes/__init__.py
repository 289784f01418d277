"""Node-health probes: copy bandwidth, all-reduce, NVML telemetry.

``run_probes(spec, phase)`` runs the probes a ``ProbeSpec`` enables and returns one
``ProbeReport``. A probe that fails never raises out of it: its error text lands in
``report.errors[<probe>]`` and the other probes still run, so a sick node yields a report that
says so instead of a crashed job.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, get_args

import torch

from runners.probes.all_reduce import measure_all_reduce
from runners.probes.copy_bandwidth import measure_copy_bandwidth
from runners.probes.format import format_probe_report
from runners.probes.node import node_info
from runners.probes.telemetry import ContextSampler, read_telemetry
from service.schemas import ProbeReport, ProbeSpec

__all__ = ["ContextSampler", "format_probe_report", "node_info", "run_probes"]

_PHASES = get_args(ProbeReport.model_fields["phase"].annotation)
NVML_DISABLED = "disabled"


def _capture(errors: dict[str, str], name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # a failing probe is a finding about the node, not a crash
        errors[name] = f"{type(exc).__name__}: {exc}"


def run_probes(spec: ProbeSpec, phase: str = "adhoc", *, device_type: str | None = None) -> ProbeReport:
    """Run the probes ``spec`` enables on this node and return their readings.

    Order: NVML telemetry first (the node as the job found it, before the probes heat it), then copy
    bandwidth (every GPU, or the host), then all-reduce (every GPU; gloo x2 on the CPU).
    ``phase`` is ``"before"``, ``"after"`` or ``"adhoc"``; ``device_type`` ``"cuda"`` or ``"cpu"``
    (None: CUDA when torch sees a GPU). ``wall_s`` is the report's own wall time in seconds
    (``time.perf_counter``). ``nvml_status`` is ``"disabled"`` when ``spec.nvml`` is off.

    Never raises for a probe's failure (an impossible ``device_type`` included): the failure is
    recorded in ``errors`` under ``"nvml"``, ``"copy_bandwidth"`` or ``"all_reduce"``. Raises
    ``ValueError`` only for an unknown ``phase``, a caller's bug.
    """
    if phase not in _PHASES:
        raise ValueError(f"phase must be one of {list(_PHASES)}, got {phase!r}")
    t0 = time.perf_counter()
    taken_at = datetime.now(UTC)
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    fields: dict[str, Any] = {"nvml_status": NVML_DISABLED}
    errors: dict[str, str] = {}

    if spec.nvml:
        def telemetry() -> None:
            fields["nvml_status"] = "error"
            fields["telemetry"], fields["nvml_status"] = read_telemetry()

        _capture(errors, "nvml", telemetry)
    if spec.copy_bandwidth:
        def copy() -> None:
            fields["copy_bandwidth"] = measure_copy_bandwidth(device_type)

        _capture(errors, "copy_bandwidth", copy)
    if spec.all_reduce:
        def all_reduce() -> None:
            fields["all_reduce"] = measure_all_reduce(device_type)

        _capture(errors, "all_reduce", all_reduce)

    return ProbeReport(
        phase=phase,  # type: ignore[arg-type]
        taken_at=taken_at,
        wall_s=time.perf_counter() - t0,
        errors=errors,
        **fields,
    )
