"""A workload job on this node: the arms' runs interleaved (ABBA or seeded random, pair by pair),
the quick probe before the first run and after every run, each run bounded by its timeout and the
job by its wall-time budget; a run that crashes or times out is recorded and the job goes on."""

from __future__ import annotations

import socket
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from kernelab.runners.workload.launch import Rendezvous, launch, run_env, torchrun_command
from kernelab.runners.workload.probe import probe_between
from kernelab.runners.workload.records import bounded_log, read_records
from kernelab.service.contract.schemas import (
    NodeInfo,
    ProbeReport,
    Side,
    WorkloadResult,
    WorkloadRun,
    WorkloadSpec,
)

WorkloadProgress = Callable[[int, int, str], None]
"""``progress(run_index, run_count, message)`` after each run."""


def run_order(spec: WorkloadSpec) -> list[Side]:
    """The arm of every run, ``2 * spec.runs`` entries: pairs of one run of each arm, ABBA (pair k is
    baseline, candidate when k is even, candidate, baseline when odd: a linear drift cancels over
    two pairs) or each pair in an order drawn from ``numpy.random.default_rng(spec.seed)``."""
    rng = np.random.default_rng(spec.seed)
    out: list[Side] = []
    for k in range(spec.runs):
        pair: list[Side] = ["baseline", "candidate"]
        if (spec.order == "abba" and k % 2 == 1) or (spec.order == "random" and rng.integers(2) == 1):
            pair.reverse()
        out.extend(pair)
    return out


def _device_type(spec: WorkloadSpec) -> str:
    if spec.device != "auto":
        return spec.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _node(device_type: str) -> NodeInfo:
    import torch

    from kernelab.runners.probes import node_info

    return node_info(torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu"))


def run_workload(
    spec: WorkloadSpec,
    *,
    job_id: int | None = None,
    gpus: list[int] | None = None,
    rdzv: Rendezvous | None = None,
    progress: WorkloadProgress | None = None,
    work_dir: Path | None = None,
    stop: threading.Event | None = None,
) -> WorkloadResult:
    """Run ``spec`` on this node and return every run's outcome and records.

    ``gpus``: the device indices this node hands over (None: ``0 .. nproc_per_node - 1`` on CUDA,
    none on a CPU); ``rdzv``: the rendezvous of an ``nnodes > 1`` job (``Rendezvous``); ``stop``:
    set to end the job now (the run in flight is killed and recorded). No run starts once the
    elapsed time plus the longest run so far would pass ``budget_s`` (``stopped = "budget"``).
    Raises ValueError when a CUDA job asks for more ranks than GPUs handed over."""
    device_type = _device_type(spec)
    if device_type == "cuda":
        import torch

        gpus = list(range(torch.cuda.device_count())) if gpus is None else gpus
        if len(gpus) < spec.launch.nproc_per_node:
            raise ValueError(
                f"nproc_per_node = {spec.launch.nproc_per_node} but this node hands over {len(gpus)} GPUs"
            )
    else:
        gpus = []
    order = run_order(spec)
    probing = spec.probes.between_runs
    probe_before = probe_between(spec.probes, device_type) if probing else None
    runs: list[WorkloadRun] = []
    t0 = time.perf_counter()
    stopped: str = "all-runs"
    with tempfile.TemporaryDirectory(prefix="kernelab-workload-", dir=work_dir) as tmp:
        for index, side_name in enumerate(order):
            longest = max((r.wall_s for r in runs), default=0.0)
            if runs and time.perf_counter() - t0 + longest > spec.budget_s:
                stopped = "budget"
                break
            if stop is not None and stop.is_set():
                break
            side = getattr(spec, side_name)
            records = Path(tmp, f"run-{index}")
            records.mkdir()
            started = datetime.now(UTC)
            rdzv_run = (
                None if rdzv is None else Rendezvous(rdzv.endpoint, f"{rdzv.run_id}-{index}", rdzv.node_rank)
            )
            done = launch(
                torchrun_command(side, spec.launch, rdzv_run),
                run_env(spec, side, arm=side_name, records=records, gpus=gpus),
                timeout_s=min(
                    spec.run_timeout_s,
                    max(1.0, spec.budget_s + spec.run_timeout_s - (time.perf_counter() - t0)),
                ),
                log_path=Path(tmp, f"run-{index}.log"),
                stop=stop,
            )
            recs, bad = read_records(records, done.output)
            error = done.error
            if bad:
                error = (error + "; " if error else "") + f"{bad} record line(s) could not be read"
            probe_after: ProbeReport | None = probe_between(spec.probes, device_type) if probing else None
            runs.append(
                WorkloadRun(
                    index=index,
                    side=side_name,
                    started_at=started,
                    wall_s=done.wall_s,
                    outcome=done.outcome,
                    exit_code=done.exit_code,
                    error=error[:2000],
                    log=bounded_log(done.output, spec.log_max_bytes),
                    records=recs,
                    probe_after=probe_after,
                )
            )
            if progress is not None:
                progress(index, len(order), f"{side_name}: {done.outcome} in {done.wall_s:.1f} s")
    return WorkloadResult(
        job_id=job_id,
        spec=spec,
        node=_node(device_type),
        probe_before=probe_before,
        runs=runs,
        stopped=stopped,  # type: ignore[arg-type]
    )


def free_endpoint(host: str = "127.0.0.1") -> str:
    """``host:port`` of a port free now on ``host`` (for node rank 0's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return f"{host}:{s.getsockname()[1]}"
