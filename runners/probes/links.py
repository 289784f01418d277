"""Copy bandwidth and all-reduce together, in the order that keeps the probe inside its budget.

The all-reduce ranks' start-up (an interpreter per GPU, ``import torch``, a CUDA context, the NCCL
communicator) costs seconds; the copy probe costs tens of milliseconds of GPU time plus the parent's
own CUDA start-up. ``measure_links`` starts the ranks first, measures the copies (and, in full mode,
peer copies) while the ranks initialise, then lets the ranks measure: the copies' windows never
overlap the ranks' traffic, since a rank measures only after the ``go`` key.

Modes (``ProbeSpec.mode``): ``quick`` (before and after each job; budget 3 s on a 2-GPU node):
all-reduce over all GPUs at 8 B, 1 MiB, 64 MiB. ``full`` (budget 30 s): sizes 8 B x 4^k ... 256 MiB
(CUDA; 8 B ... 4 MiB over gloo), the sub-groups of ``all_reduce.sub_groups`` (pairs; TP4 on 8
GPUs), CUDA-graph readings when ``ProbeSpec.cuda_graph``, and peer copy for every ordered GPU pair.
One GPU: there is no all-reduce to measure (one rank moves no data); the report says so in ``notes``.

With an ``all_reduce.active_pool()`` (the runner daemon keeps one per node; see ``AllReducePool``)
the all-reduce is a request to its ranks, already up, after the copies: no start-up cost. A pool
that fails (a rank died, a timeout) is dropped with a note, and the probe starts ranks of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kernelab.runners.probes.all_reduce import (
    AllReduceRun,
    active_pool,
    full_sizes_bytes,
    set_pool,
    start_all_reduce,
    sub_groups,
)
from kernelab.runners.probes.copy_bandwidth import measure_copy_bandwidth, measure_peer_copy
from kernelab.service.contract.schemas import ProbeSpec

MIB = 1024**2
CPU_FULL_SIZES_BYTES = (8, 1024, 64 * 1024, 1 * MIB, 4 * MIB)
ONE_GPU_NOTE = "all-reduce skipped: this node has one GPU (a one-rank all-reduce moves no data)"
Capture = Callable[[dict[str, str], str, Callable[[], None]], None]


def _world(device_type: str) -> int:
    return torch.cuda.device_count() if device_type == "cuda" and torch.cuda.is_available() else 2


def measure_links(
    spec: ProbeSpec, device_type: str, fields: dict[str, Any], errors: dict[str, str], capture: Capture
) -> None:
    """Fill ``fields`` (``copy_bandwidth``, ``peer_copy``, ``all_reduce``, ``notes``) with the
    probes ``spec`` enables; a probe's failure goes to ``errors[<probe>]`` through ``capture``
    (``run_probes``' error recorder), never out of here."""
    notes: list[str] = fields.setdefault("notes", [])
    run: AllReduceRun | None = None
    full = spec.mode == "full"
    world = _world(device_type)
    sizes = (full_sizes_bytes() if device_type == "cuda" else CPU_FULL_SIZES_BYTES) if full else None
    groups = sub_groups(world) if full else []
    cuda_graph = full and spec.cuda_graph
    pool = active_pool() if spec.all_reduce else None
    if pool is not None and (pool.device_type != device_type or pool.world_size != world):
        pool = None

    def start() -> None:
        nonlocal run
        run = start_all_reduce(device_type, sizes_bytes=sizes, groups=groups, cuda_graph=cuda_graph)

    if spec.all_reduce:
        if device_type == "cuda" and world < 2:
            notes.append(ONE_GPU_NOTE)
        elif pool is None:
            capture(errors, "all_reduce", start)
    try:
        if spec.copy_bandwidth:

            def copy() -> None:
                fields["copy_bandwidth"] = measure_copy_bandwidth(device_type)

            capture(errors, "copy_bandwidth", copy)
            if spec.mode == "full" and device_type == "cuda" and _world(device_type) >= 2:

                def peer() -> None:
                    fields["peer_copy"] = measure_peer_copy()

                capture(errors, "peer_copy", peer)
        if pool is not None:
            try:
                fields["all_reduce"], more = pool.measure(
                    sizes_bytes=sizes, groups=groups, cuda_graph=cuda_graph
                )
                notes.extend(more)
            except (RuntimeError, TimeoutError, OSError) as exc:
                notes.append(f"all-reduce pool failed ({type(exc).__name__}: {exc}); measured with new ranks")
                set_pool(None)
                capture(errors, "all_reduce", start)
        if run is not None:
            active = run

            def all_reduce() -> None:
                active.go()
                fields["all_reduce"], more = active.wait()
                notes.extend(more)

            capture(errors, "all_reduce", all_reduce)
    finally:
        if run is not None:
            run.close()
