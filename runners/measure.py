"""The processes of a job: ``python -m kernelab.runners.measure cells|probes SPEC_JSON OUT_JSON``.

``kernelab.runners.job.run_job`` orchestrates a job without touching the GPU (or importing torch)
itself: it probes the node in one fresh process (``probes``), measures the cells in another
(``cells``) and probes again in a third. Where a job starts two or more, they are forked from the
job's fork server (``kernelab.runners.forkserver``: one interpreter and one ``import torch`` per
job, no benchmark code, no CUDA context), else each is a new interpreter. A benchmark module that
patches a timing function, sets a cache policy in its CUDA context or leaves threads behind reaches
only the measuring process, which ends with its cells; the probes never share a process with
benchmark code, and only one of the job's processes holds the GPU at a time (NVML then sees no other
tenant of ours). Each child reads the ``JobSpec`` JSON file ``SPEC_JSON`` and writes its answer to
``OUT_JSON`` atomically (temp file + rename):

* ``cells --device D [--timer-kind K]``: ``kernelab.runners.cells.measure_cells``, one line ``progress:
  <cell index> <cell count> <message>`` per step on stdout; ``MeasuredCells`` JSON;
* ``probes --phase before|after|adhoc --device-type cpu|cuda``:
  ``kernelab.runners.cells.probe_reports``; a JSON list of ``ProbeReport``.

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
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from kernelab.runners.nodefault import (
    EXIT_NODE_FAULT,
    NODE_FAULT_LINE,
    NODE_FAULT_MARK,
    NodeFault,
    node_fault,
)
from kernelab.runners.reaper import (
    PARENT_PID_ENV,
    become_subreaper,
    die_with_parent,
    kill_descendants,
    kill_pipe_holders,
)
from kernelab.runners.spool import atomic_write_text
from kernelab.service.schemas import CellResult, JobSpec, NodeInfo, ProbeReport

if TYPE_CHECKING:
    import torch

    from kernelab.runners.forkserver import ForkedChild

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_BENCHMARK = 3
_KILL_WAIT_S = 5.0
_RELAY_WAIT_S = 2.0  # how long the end of a child's output may lag behind its exit
_STDERR_TAIL_CHARS = 4_000
SCHEMA_VERSION = 1
ProgressFn = Callable[[int, int, str], None]


class MeasuredCells(BaseModel):
    """What the measuring process hands back: the cells, the node's fingerprint as the measuring
    process saw it (e.g. Triton interpreted) and the timer label. ``schema_version`` names the
    layout (1)."""

    schema_version: int = Field(default=SCHEMA_VERSION)
    cells: list[CellResult]
    node: NodeInfo
    timer: str


class MeasureError(RuntimeError):
    """The measuring process failed, was killed, or outlasted the job's ``timeout_s``."""


def measure_in_child(
    spec: JobSpec,
    *,
    device: str | torch.device,
    progress: ProgressFn | None = None,
    timer_kind: str | None = None,
    timeout_s: float,
) -> tuple[list[CellResult], NodeInfo, str]:
    """Measure ``spec``'s cells in a fresh ``python -m kernelab.runners.measure cells`` process on ``device``
    and return ``(cells, node, timer label)`` as ``kernelab.runners.cells.measure_cells`` does.
    ``progress(index, count, message)`` gets the child's progress lines. The child (its whole
    process group) is killed after ``timeout_s`` seconds or when this call is interrupted. Raises
    ``kernelab.kernels.BenchmarkError`` when the benchmark cannot be loaded,
    ``kernelab.runners.nodefault.NodeFault`` when the child could not write for want of disk space
    or file descriptors (its exit status 4), ``OSError`` when this process cannot write the child's
    spec, ``MeasureError`` for any other failure of the child (the message holds its last stderr
    line)."""
    args = ["cells", "--device", str(device)] + (["--timer-kind", timer_kind] if timer_kind else [])
    text = _run_child(spec, args, progress=progress, timeout_s=timeout_s, what="measurement")
    measured = MeasuredCells.model_validate_json(text)
    return measured.cells, measured.node, measured.timer


def probes_in_child(spec: JobSpec, *, phase: str, device_type: str, timeout_s: float) -> list[ProbeReport]:
    """``kernelab.runners.cells.probe_reports`` of ``spec`` in a fresh
    ``python -m kernelab.runners.measure probes``
    process (a process that never imports benchmark code). A child that fails or overruns
    ``timeout_s`` gives one report holding the error (a probe failure is a finding about the
    node, never a lost job); a node fault (``NodeFault``, ``OSError``) is raised, as in
    ``measure_in_child``."""
    from datetime import UTC, datetime

    try:
        text = _run_child(
            spec,
            ["probes", "--phase", phase, "--device-type", device_type],
            progress=None,
            timeout_s=timeout_s,
            what="probe",
        )
    except MeasureError as exc:
        return [
            ProbeReport(
                phase=phase,  # type: ignore[arg-type]
                taken_at=datetime.now(UTC),
                errors={"run_probes": str(exc)[:500]},
            )
        ]
    return _PROBE_REPORTS.validate_json(text)


_PROBE_REPORTS = TypeAdapter(list[ProbeReport])


def _run_child(
    spec: JobSpec, args: list[str], *, progress: ProgressFn | None, timeout_s: float, what: str
) -> str:
    """Run ``python -m kernelab.runners.measure ARGS SPEC OUT``; the text of OUT
    (see ``measure_in_child``)."""
    from kernelab.kernels import BenchmarkError

    with tempfile.TemporaryDirectory(prefix="kernelab-measure-") as tmp:
        spec_path, out_path, err_path = Path(tmp, "spec.json"), Path(tmp, "out.json"), Path(tmp, "stderr")
        spec_path.write_text(spec.model_dump_json(), encoding="utf-8")
        cmd = [
            sys.executable,
            "-P",
            "-m",
            "kernelab.runners.measure",
            args[0],
            str(spec_path),
            str(out_path),
            *args[1:],
        ]
        with err_path.open("w", encoding="utf-8") as err:
            proc = _start(cmd, err)
            said: list[str] = []  # the child's node-fault line, on stdout: its stderr may be on a full disk
            relay = threading.Thread(target=_relay, args=(proc.stdout, progress, said), daemon=True)
            relay.start()
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                raise MeasureError(
                    f"timed out: the {what} ran longer than the spec's timeout_s = "
                    f"{timeout_s:g} s and was killed"
                ) from None
            except BaseException:
                _kill_group(proc)
                raise
            finally:
                _end_relay(proc, relay)
        tail = _tail(err_path)
        if code == EXIT_BENCHMARK:
            raise BenchmarkError(_last_line(tail, "measure: benchmark: "))
        if code == EXIT_NODE_FAULT:
            why = (said or [_last_line(tail, f"measure: {NODE_FAULT_MARK}") or "(it said no more)"])[-1]
            raise NodeFault(f"the {what} process could not write on this node: {why}")
        if code != EXIT_OK or not out_path.exists():
            why = _last_line(tail, "measure: failed: ") or f"the {what} process exited with status {code}"
            raise MeasureError(why)
        return out_path.read_text(encoding="utf-8")


def _start(cmd: list[str], err: IO[str]) -> subprocess.Popen[str] | ForkedChild:
    """The child: forked by the job's fork server where one runs (``kernelab.runners.forkserver``:
    torch already imported), else a new interpreter; both in a new session, stdout a pipe."""
    from kernelab.runners import forkserver

    server = forkserver.active()
    if server is not None:
        try:
            return server.spawn(cmd[cmd.index("kernelab.runners.measure") + 1 :], err)
        except forkserver.ForkServerError as exc:  # gone or too slow: measured cold; the job goes on
            _say(f"measure: the job's fork server failed, starting the child cold: {exc}")
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=err,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
        env=_child_env(),
    )


def job_fork_server() -> contextlib.AbstractContextManager[object]:
    """A fork server for the children of one job (``kernelab.runners.forkserver.ForkServer``, made
    active until the block ends), or a do-nothing block where one cannot be started."""
    from kernelab.runners.forkserver import ForkServer

    try:
        return ForkServer(_child_env())
    except OSError as exc:
        _say(f"measure: no fork server ({exc}); each child starts its own interpreter")
        return contextlib.nullcontext()


def _child_env() -> dict[str, str]:
    """The job environment (``kernelab.runners.jobenv.job_env``: allow-listed, no credentials) with
    ``PYTHONPATH`` set to this process's ``sys.path`` (the child imports the benchmark modules this
    process could import: a module next to the spec, a test module) and this process's pid added to
    ``KERNELAB_OWN_PIDS`` (NVML then counts it as ours, never as another tenant)."""
    from kernelab.runners.jobenv import job_env
    from kernelab.runners.probes.telemetry import OWN_PIDS_ENV

    paths = [p for p in sys.path if p and os.path.isdir(p)]
    # The child runs with ``python -P`` (no implicit current folder: in a runner's job that is a folder
    # job code writes, where a ``runners/`` of its own would shadow kernelab's). Outside a runner the
    # current folder is the user's own and stays importable, last.
    if os.environ.get("KERNELAB_JOBNS") != "1":
        paths.append(os.getcwd())
    own = ",".join(filter(None, (os.environ.get(OWN_PIDS_ENV, ""), str(os.getpid()))))
    return job_env(
        {
            "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
            OWN_PIDS_ENV: own,
            PARENT_PID_ENV: str(os.getpid()),
        }
    )


def _end_relay(proc: subprocess.Popen[str] | ForkedChild, relay: threading.Thread) -> None:
    """Wait for the end of the child's output and close it. Processes the child left behind that
    still hold its output open are killed first (``kernelab.runners.reaper.kill_pipe_holders``): a
    pipe a thread still reads cannot be closed (the close would wait for that thread)."""
    relay.join(timeout=_RELAY_WAIT_S)
    if relay.is_alive() and proc.stdout is not None:
        kill_pipe_holders(proc.stdout.fileno())
        relay.join(timeout=_RELAY_WAIT_S)
    if not relay.is_alive() and proc.stdout is not None:
        proc.stdout.close()


def _tail(path: Path) -> str:
    """The last ``_STDERR_TAIL_CHARS`` characters of the child's stderr file (``""`` unreadable)."""
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-_STDERR_TAIL_CHARS:]
    except OSError:
        return ""


def _relay(stream: IO[str] | None, progress: ProgressFn | None, said: list[str]) -> None:
    if stream is None:
        return
    for line in stream:
        if line.startswith(NODE_FAULT_LINE):
            said.append(line[len(NODE_FAULT_LINE) :].strip())
            continue
        head, _, message = line.rstrip("\n").partition(" ")
        if head != "progress:" or progress is None:
            continue
        index, _, rest = message.partition(" ")
        count, _, text = rest.partition(" ")
        with contextlib.suppress(ValueError):
            progress(int(index), int(count), text)


def _last_line(text: str, mark: str) -> str:
    lines = [line[len(mark) :].strip() for line in text.splitlines() if line.startswith(mark)]
    return lines[-1] if lines else ""


def _kill_group(proc: subprocess.Popen[str] | ForkedChild) -> None:
    """SIGTERM the child's process group, SIGKILL it after ``_KILL_WAIT_S`` seconds. A forked child
    whose server does not report its end (benchmark code stopped the server) is abandoned with the
    server (``ForkedChild.abandon``), so a timeout always ends the job's wait."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=_KILL_WAIT_S)
            return
        except subprocess.TimeoutExpired:
            continue
    abandon = getattr(proc, "abandon", None)
    if abandon is not None:
        abandon()
        return
    proc.wait()


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


def _say(text: str) -> None:
    """``text`` on stderr, unless stderr (a file beside the job's, on a disk that may be full)
    cannot take it: the exit status still says what happened."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr, flush=True)


def _node_fault_exit(fault: str) -> int:
    """Say ``fault`` on stdout (the parent's pipe) and stderr (where it can); ``EXIT_NODE_FAULT``."""
    text = " ".join(fault.split())
    with contextlib.suppress(OSError):
        print(NODE_FAULT_LINE + text, flush=True)
    _say(f"measure: {NODE_FAULT_MARK}{text}")
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
        _say(f"measure: failed: cannot read spec {args.spec_json}: {exc}")
        return EXIT_BAD_INPUT
    t0 = time.perf_counter()
    try:
        import torch

        from kernelab.kernels import BenchmarkError
        from kernelab.runners.cells import measure_cells, probe_reports

        try:
            if args.what == "probes":
                from kernelab.runners.probes.all_reduce import allow_forked_ranks

                allow_forked_ranks()  # this process only probes: its CPU ranks may be forked from it
                reports = probe_reports(spec, args.phase, args.device_type)
                atomic_write_text(args.out_json, _PROBE_REPORTS.dump_json(reports).decode())
                return EXIT_OK
            cells, node, timer = measure_cells(
                spec, device=torch.device(args.device), progress=_print_progress, timer_kind=args.timer_kind
            )
        except BenchmarkError as exc:
            if node_fault(exc):  # the import failed for want of disk space or descriptors
                raise
            _say(f"measure: benchmark: {exc}")
            return EXIT_BENCHMARK
        text = MeasuredCells(cells=cells, node=node, timer=timer).model_dump_json()
        atomic_write_text(args.out_json, text)
    except Exception as exc:  # the job's own failure (reported, never hidden), or the node's
        fault = node_fault(exc)
        if fault:
            return _node_fault_exit(fault)
        with contextlib.suppress(OSError):
            traceback.print_exc(file=sys.stderr)
        _say(f"measure: failed: {type(exc).__name__}: {' '.join(str(exc).split())}")
        return EXIT_FAILED
    _say(f"measure: {len(cells)} cells in {time.perf_counter() - t0:.1f} s")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
