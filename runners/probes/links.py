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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from runners.probes.all_reduce import AllReduceRun, full_sizes_bytes, start_all_reduce, sub_groups
from runners.probes.copy_bandwidth import measure_copy_bandwidth, measure_peer_copy
from service.schemas import ProbeSpec

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
    if spec.all_reduce:
        world = _world(device_type)
        if device_type == "cuda" and world < 2:
            notes.append(ONE_GPU_NOTE)
        else:
            def start() -> None:
                nonlocal run
                full = spec.mode == "full"
                sizes = None
                if full:
                    sizes = full_sizes_bytes() if device_type == "cuda" else CPU_FULL_SIZES_BYTES
                groups = sub_groups(world) if full else []
                run = start_all_reduce(device_type, sizes_bytes=sizes, groups=groups,
                                       cuda_graph=full and spec.cuda_graph)

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
