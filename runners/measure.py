"""The processes of a job: ``python -m kernelab.runners.measure cells|probes SPEC_JSON OUT_JSON``.

``kernelab.runners.job.run_job`` orchestrates a job without touching the GPU (or importing torch)
itself: it probes the node in one fresh process (``probes``), measures the cells in another
(``cells``) and probes again in a third, each started and read by ``kernelab.runners.children``.
Where a job starts two or more, they are forked from the job's fork server
(``kernelab.runners.forkserver``: one interpreter and one ``import torch`` per job, no benchmark
code, no CUDA context), else each is a new interpreter. A benchmark module that patches a timing
function, sets a cache policy in its CUDA context or leaves threads behind reaches only the
measuring process, which ends with its cells; the probes never share a process with benchmark
code, and only one of the job's processes holds the GPU at a time (NVML then sees no other tenant
of ours). Each child reads the ``JobSpec`` JSON file ``SPEC_JSON`` and writes its answer to
``OUT_JSON`` atomically (temp file + rename):

* ``cells --device D [--timer-kind K]``: ``kernelab.runners.cells.measure_cells``, one line ``progress:
  <cell index> <cell count> <message>`` per step on stdout; ``MeasuredCells`` JSON;
* ``probes --phase before|after|adhoc --device-type cpu|cuda``:
  ``kernelab.runners.cells.probe_reports``; a JSON list of ``ProbeReport`` (``PROBE_REPORTS``).

This module is the child's side; its exit statuses, ``MeasuredCells`` and ``PROBE_REPORTS`` are
also what the parent's side (``kernelab.runners.children``) reads, so importing it imports no torch
and no benchmark code (``main`` imports them).

Exit status: 0 done; 2 unusable arguments or spec file; 3 the benchmark cannot be loaded
(``kernelab.kernels.BenchmarkError``, message on stderr after ``measure: benchmark: ``); 4 a fault of
the node, not of the job (``kernelab.runners.nodefault``: the disk full, the file table full, while
measuring or writing ``OUT_JSON``; ``measure: node fault: <error>`` on stderr, where stderr can still
be written); 1 anything else raised (``measure: failed: <error>`` on stderr).

Each child dies with the process that started it (``kernelab.runners.reaper.die_with_parent``:
``SIGKILL`` when its parent dies), so a worker killed in the middle of a job leaves no measuring
process behind, and kills what the benchmark started and left running before it exits (it is
their child subreaper).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
import traceback
from pathlib import Path

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from kernelab.kernels import BenchmarkError
from kernelab.runners.nodefault import EXIT_NODE_FAULT, NODE_FAULT_LINE, NODE_FAULT_MARK, node_fault
from kernelab.runners.reaper import become_subreaper, die_with_parent, kill_descendants
from kernelab.runners.spool import atomic_write_text
from kernelab.service.contract.schemas import CellResult, JobSpec, NodeInfo, ProbeReport

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_BENCHMARK = 3
SCHEMA_VERSION = 1


class MeasuredCells(BaseModel):
    """What the measuring process hands back: the cells, the node's fingerprint as the measuring
    process saw it (e.g. Triton interpreted) and the timer label. ``schema_version`` names the
    layout (1)."""

    schema_version: int = Field(default=SCHEMA_VERSION)
    cells: list[CellResult]
    node: NodeInfo
    timer: str


PROBE_REPORTS = TypeAdapter(list[ProbeReport])
"""The ``probes`` child's answer: a JSON list of ``ProbeReport``."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kernelab.runners.measure", description=__doc__.splitlines()[0]
    )
    p.add_argument("what", choices=["cells", "probes"])
    p.add_argument("spec_json", type=Path)
    p.add_argument("out_json", type=Path)
    p.add_argument("--device", default="cpu", help="cells: e.g. cpu or cuda:0")
    p.add_argument("--timer-kind", default=None)
    p.add_argument("--phase", choices=["before", "after", "adhoc"], default="before")
    p.add_argument("--device-type", choices=["cpu", "cuda"], default="cpu")
    return p


def _print_progress(index: int, total: int, message: str) -> None:
    print(f"progress: {index} {total} {' '.join(message.split())}", flush=True)


def say(text: str) -> None:
    """``text`` on stderr, unless stderr (a file beside the job's, on a disk that may be full)
    cannot take it: the exit status still says what happened."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr, flush=True)


def _node_fault_exit(fault: str) -> int:
    """Say ``fault`` on stdout (the parent's pipe) and stderr (where it can); ``EXIT_NODE_FAULT``."""
    text = " ".join(fault.split())
    with contextlib.suppress(OSError):
        print(NODE_FAULT_LINE + text, flush=True)
    say(f"measure: {NODE_FAULT_MARK}{text}")
    return EXIT_NODE_FAULT


def main(argv: list[str] | None = None) -> int:
    """Measure the cells or take the probes of ``SPEC_JSON`` (module docstring); the exit status.
    What the benchmark started and left running is killed before it returns
    (``kernelab.runners.reaper``)."""
    die_with_parent(signal.SIGKILL)
    become_subreaper()
    try:
        return _main(argv)
    finally:
        kill_descendants()


def _main(argv: list[str] | None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = JobSpec.model_validate_json(args.spec_json.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        if node_fault(exc):
            return _node_fault_exit(node_fault(exc))
        say(f"measure: failed: cannot read spec {args.spec_json}: {exc}")
        return EXIT_BAD_INPUT
    t0 = time.perf_counter()
    try:
        # Heavy, so imported here and not at the top: torch (``cells`` and ``all_reduce`` import
        # it), which the orchestrating process that imports this module must not load; a failure
        # of these imports (a disk full, no file descriptor) is this child's reported failure.
        import torch

        from kernelab.runners.cells import measure_cells, probe_reports

        try:
            if args.what == "probes":
                from kernelab.runners.probes.all_reduce import allow_forked_ranks  # heavy: torch

                allow_forked_ranks()  # this process only probes: its CPU ranks may be forked from it
                reports = probe_reports(spec, args.phase, args.device_type)
                atomic_write_text(args.out_json, PROBE_REPORTS.dump_json(reports).decode())
                return EXIT_OK
            cells, node, timer = measure_cells(
                spec, device=torch.device(args.device), progress=_print_progress, timer_kind=args.timer_kind
            )
        except BenchmarkError as exc:
            if node_fault(exc):  # the import failed for want of disk space or descriptors
                raise
            say(f"measure: benchmark: {exc}")
            return EXIT_BENCHMARK
        text = MeasuredCells(cells=cells, node=node, timer=timer).model_dump_json()
        atomic_write_text(args.out_json, text)
    except Exception as exc:  # the job's own failure (reported, never hidden), or the node's
        fault = node_fault(exc)
        if fault:
            return _node_fault_exit(fault)
        with contextlib.suppress(OSError):
            traceback.print_exc(file=sys.stderr)
        say(f"measure: failed: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return EXIT_FAILED
    say(f"measure: {len(cells)} cells in {time.perf_counter() - t0:.1f} s")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
