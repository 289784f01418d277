"""Node-health probes: copy bandwidth, all-reduce, NVML telemetry.

``run_probes(spec, phase)`` runs the probes a ``ProbeSpec`` enables and returns one
``ProbeReport``. A probe that fails never raises out of it: its error text lands in
``report.errors[<probe>]`` and the other probes still run, so a sick node yields a report that
says so instead of a crashed job.

Importing this package (or one of its modules without torch, such as ``telemetry`` or ``format``)
does not import torch: ``run_probes`` loads it when first used, and ``node_info`` only where
torch's build cannot tell a CPU node (``kernelab.runners.probes.node``), so a job's orchestrating
process and a runner daemon stay without it (``kernelab.runners.job``).
"""

from __future__ import annotations

import functools
import importlib
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, get_args

from kernelab.runners.probes.format import format_probe_report
from kernelab.runners.probes.telemetry import ContextSampler, read_telemetry
from kernelab.service.contract.schemas import JobSpec, ProbeReport, ProbeSpec
from kernelab.service.contract.schemas.probe_protocol import Probe, registered, runs_generically

if TYPE_CHECKING:
    from kernelab.runners.probes.node import node_info

__all__ = ["ContextSampler", "format_probe_report", "node_info", "probes_enabled", "run_probes"]

_PHASES = get_args(ProbeReport.model_fields["phase"].annotation)
NVML_DISABLED = "disabled"


def _capture(errors: dict[str, str], name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # a failing probe is a finding about the node, not a crash
        errors[name] = f"{type(exc).__name__}: {exc}"


def runner_function(probe: Probe[Any]) -> Callable[..., Any]:
    """The measuring function ``probe.runner`` names (``"module:function"``), imported here.
    Raises ``ImportError``/``AttributeError`` naming it when it is not there."""
    module, _, name = probe.runner.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def _run_generic(probe: Probe[Any], spec: ProbeSpec, device_type: str, fields: dict[str, Any]) -> None:
    fields[probe.name] = list(runner_function(probe)(spec, device_type))


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


def run_probes(spec: ProbeSpec, phase: str = "adhoc", *, device_type: str | None = None) -> ProbeReport:
    """Run the probes ``spec`` enables on this node and return their readings.

    Order: NVML telemetry first (the node as the job found it, before the probes heat it), then copy
    bandwidth (every GPU, or the host) while the all-reduce ranks start, then all-reduce (every GPU;
    gloo x2 on the CPU; none on one GPU, said in ``notes``), see ``probes.links`` for ``spec.mode``
    (quick / full: sub-groups, peer copy, CUDA graphs), then the
    bf16 matmul peak of the current GPU (CUDA only; measured once per process, ``probes.peak``),
    then every registered probe with ``generic_runner`` (``kernelab.service.contract.probes``), whose
    ``runner`` function is called as ``function(spec, device_type)`` when ``spec`` enables any probe.
    ``phase`` is ``"before"``, ``"after"`` or ``"adhoc"``; ``device_type`` ``"cuda"`` or ``"cpu"``
    (None: CUDA when torch sees a GPU). ``wall_s`` is the report's own wall time in seconds
    (``time.perf_counter``). ``nvml_status`` is ``"disabled"`` when ``spec.nvml`` is off.

    Never raises for a probe's failure (an impossible ``device_type`` included): the failure is
    recorded in ``errors`` under ``"nvml"``, ``"copy_bandwidth"``, ``"all_reduce"``,
    ``"matmul_peak"`` or a generic probe's ``errors_key``. Raises
    ``ValueError`` only for an unknown ``phase``, a caller's bug.
    """
    if phase not in _PHASES:
        raise ValueError(f"phase must be one of {list(_PHASES)}, got {phase!r}")
    import torch

    from kernelab.runners.probes.links import measure_links
    from kernelab.runners.probes.peak import cached_matmul_peak

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
    fields["mode"] = spec.mode
    measure_links(spec, device_type, fields, errors, _capture)
    if spec.matmul_peak and device_type == "cuda":

        def matmul_peak() -> None:
            if not torch.cuda.is_available():
                raise RuntimeError("a CUDA matmul peak was asked for, but torch sees no CUDA GPU")
            fields["matmul_peak"] = [cached_matmul_peak(torch.cuda.current_device())]

        _capture(errors, "matmul_peak", matmul_peak)
    if runs_generically(spec):
        for probe in registered():
            if probe.generic_runner:
                _capture(
                    errors,
                    probe.errors_key,
                    functools.partial(_run_generic, probe, spec, device_type, fields),
                )

    return ProbeReport(
        phase=phase,  # type: ignore[arg-type]
        taken_at=taken_at,
        wall_s=time.perf_counter() - t0,
        errors=errors,
        **fields,
    )


def __getattr__(name: str) -> Any:
    """``node_info`` on first use (the module docstring)."""
    if name == "node_info":
        from kernelab.runners.probes.node import node_info

        return node_info
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
