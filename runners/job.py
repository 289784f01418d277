"""One job end to end on this node: the single code path of ``kernelab run`` and the runner daemon.

``run_job`` resolves the device, probes the node before (``python -m kernelab.runners.measure
probes``), measures every sweep cell in a fresh child process (``python -m kernelab.runners.measure
cells``, which runs ``kernelab.runners.cells.measure_cells``), probes the node after, and returns
the whole ``JobResult``. The children are started and read by ``kernelab.runners.children``.

This process only orchestrates: it never touches the GPU and never imports benchmark code when the
cells run in a child. Whether torch sees a CUDA GPU (the ``auto`` device) is answered without
importing torch where the installed build settles it (``kernelab.runners.devices.torch_sees_cuda``:
a CPU build of torch, or a CUDA build without a loadable driver), so on such a node a runner's job
costs one torch import (the measuring child's), not two; on a GPU node torch is imported here to
ask, as before.

The runner's modules import in one direction (``tests/runners/test_import_graph.py``): the daemon
and its worker, then this module and ``kernelab.runners.revision_job``, then the children
(``children`` -> ``forkserver`` -> ``measure``), the measuring process's ``cells``, the cell
``pipeline``, and below it ``engine``, ``sides``, ``static_metrics`` and ``timing``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kernelab.kernels.triton_mode import configure_triton_env
from kernelab.runners.children import job_fork_server, measure_in_child, phase_probes
from kernelab.runners.devices import device_name
from kernelab.runners.probes import probes_enabled
from kernelab.runners.progress import ProgressCallback
from kernelab.service.contract.schemas import CellResult, JobResult, JobSpec, NodeInfo, ProbeReport
from kernelab.service.judge.verdicts import all_cells_failed

if TYPE_CHECKING:
    import torch

    from kernelab.kernels import Benchmark
    from kernelab.runners.timing import TimerKind

__all__ = ["job_result", "run_job"]


def _fork_server(children: int) -> contextlib.AbstractContextManager[object]:
    """The job's fork server when it starts two or more children (one interpreter and one
    ``import torch`` for all of them: ``kernelab.runners.forkserver``); for one child a plain
    process is as quick. ``KERNELAB_FORK_SERVER=0`` turns it off."""
    if children < 2 or os.environ.get("KERNELAB_FORK_SERVER", "1") == "0":
        return contextlib.nullcontext()
    return job_fork_server()


def job_result(
    spec: JobSpec,
    *,
    job_id: int | None,
    idempotency_key: str | None,
    node: NodeInfo,
    timer: str,
    started_at: datetime,
    cells: list[CellResult],
    probes: list[ProbeReport],
) -> JobResult:
    """The ``JobResult`` envelope of a job that ran, built the one way for every kind of job
    (``run_job`` and ``kernelab.runners.revision_job.run_revision_job``).

    ``idempotency_key``: a fresh ``uuid4().hex`` (32 hex digits) when None; ``timer``: the timer's
    label (``'cuda-event'`` or ``'perf_counter'``); ``started_at``: a UTC datetime;
    ``finished_at`` is now (UTC) and ``error`` is ``kernelab.service.judge.verdicts.all_cells_failed``
    of ``cells`` (None unless every cell failed); ``schema_version`` is the schema's default
    (``RESULT_SCHEMA_VERSION``). Raises ``pydantic.ValidationError`` for a field the schema
    refuses (an idempotency key under 8 characters, a naive ``started_at``)."""
    return JobResult(
        idempotency_key=idempotency_key or uuid.uuid4().hex,
        job_id=job_id,
        spec=spec,
        node=node,
        timer=timer,
        started_at=started_at,
        finished_at=datetime.now(UTC),
        cells=cells,
        probes=probes,
        error=all_cells_failed(cells),
    )


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
    kernelab.runners.measure``, forked from the job's fork server: ``kernelab.runners.forkserver``;
    this process never touches the GPU); the measuring child is killed once
    ``spec.timeout_s`` has passed. With ``isolate`` False the cells are measured in this process
    (tests of the engine). ``bench``, a ``Benchmark`` object in place of ``spec.benchmark`` (the
    Python API), is always measured in this process (an object cannot be handed to a child), so
    ``timeout_s`` is then not enforced.
    ``device`` overrides ``spec.device`` (``"auto"``: the GPU when there is one). ``progress(cell
    index, cell count, message)`` is called as each cell advances. ``timer_kind`` overrides
    ``spec.measurement.timer`` (``kernelab.runners.timing.make_timer``). ``idempotency_key`` defaults to a
    fresh ``uuid4().hex``; timestamps are UTC. Raises ``RuntimeError`` for a CUDA device without
    CUDA, ``kernelab.kernels.BenchmarkError`` for an unknown benchmark,
    ``kernelab.runners.children.MeasureError``
    when the child fails or overruns ``timeout_s``; failures inside a cell never raise.
    """
    started_at = datetime.now(UTC)
    dev = device_name(device, spec.device)
    dev_type = dev.partition(":")[0]
    if isolate and bench is None:  # inherited by the child, before anything imports triton
        configure_triton_env(dev_type)
    cells = spec.cell_count(dev_type)  # type: ignore[arg-type]
    report: ProgressCallback = progress if progress is not None else (lambda i, n, msg: None)
    in_child = isolate and bench is None
    children = 2 * probes_enabled(spec, dev_type) + in_child
    with _fork_server(children):
        report(0, cells, "probes before the cells")
        probes = phase_probes(spec, "before", dev_type)
        if in_child:
            results, node, timer_label = measure_in_child(
                spec,
                device=dev,
                progress=progress,
                timer_kind=timer_kind,
                timeout_s=spec.timeout_s,
            )
        else:
            # Heavy, so imported only here: torch and the engine (``cells`` imports them), which this
            # process loads only when it measures the cells itself (``isolate`` off, a ``bench``).
            import torch

            from kernelab.runners.cells import measure_cells

            results, node, timer_label = measure_cells(
                spec, device=torch.device(dev), progress=progress, timer_kind=timer_kind, bench=bench
            )
        report(max(0, cells - 1), cells, "probes after the cells")
        probes += phase_probes(spec, "after", dev_type)
    return job_result(
        spec,
        job_id=job_id,
        idempotency_key=idempotency_key,
        node=node,
        timer=timer_label,
        started_at=started_at,
        cells=results,
        probes=probes,
    )
