"""The job's child processes seen from the process that starts them: ``measure_in_child`` and
``probes_in_child`` run ``python -m kernelab.runners.measure cells|probes`` (forked from the job's
fork server where one runs, ``kernelab.runners.forkserver``; else a new interpreter), relay its
progress lines, kill its process group past the timeout and read its answer.

The orchestrating process of a job (``kernelab.runners.job``, the runner daemon's re-probe) calls
these; importing this module imports neither torch nor benchmark code. What the child writes and
its exit statuses are ``kernelab.runners.measure``'s (the child's side).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal

from kernelab.kernels import BenchmarkError
from kernelab.runners import forkserver
from kernelab.runners.jobenv import job_env
from kernelab.runners.measure import EXIT_BENCHMARK, EXIT_OK, PROBE_REPORTS, MeasuredCells, say
from kernelab.runners.nodefault import EXIT_NODE_FAULT, NODE_FAULT_LINE, NODE_FAULT_MARK, NodeFault
from kernelab.runners.probes import probes_enabled
from kernelab.runners.probes.telemetry import OWN_PIDS_ENV
from kernelab.runners.progress import ProgressCallback
from kernelab.runners.reaper import PARENT_PID_ENV, kill_pipe_holders
from kernelab.service.contract.schemas import CellResult, JobSpec, NodeInfo, ProbeReport

if TYPE_CHECKING:
    import torch

__all__ = ["MeasureError", "job_fork_server", "measure_in_child", "phase_probes", "probes_in_child"]

_KILL_WAIT_S = 5.0
_RELAY_WAIT_S = 2.0  # how long the end of a child's output may lag behind its exit
_STDERR_TAIL_CHARS = 4_000
PROBE_TIMEOUT_S = 600.0  # a job's probe process that takes longer is killed; its report says so


class MeasureError(RuntimeError):
    """The measuring process failed, was killed, or outlasted the job's ``timeout_s``."""


def measure_in_child(
    spec: JobSpec,
    *,
    device: str | torch.device,
    progress: ProgressCallback | None = None,
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
    return PROBE_REPORTS.validate_json(text)


def phase_probes(spec: JobSpec, phase: Literal["before", "after"], device_type: str) -> list[ProbeReport]:
    """The ``phase`` probe reports of a job's ``spec`` on a ``device_type`` node, taken in a fresh
    process that never imports benchmark code and then exits (``probes_in_child``, killed after
    ``PROBE_TIMEOUT_S`` seconds); none when no probe is enabled (``probes_enabled``). Raises as
    ``probes_in_child``."""
    if not probes_enabled(spec, device_type):
        return []
    return probes_in_child(spec, phase=phase, device_type=device_type, timeout_s=PROBE_TIMEOUT_S)


def _run_child(
    spec: JobSpec, args: list[str], *, progress: ProgressCallback | None, timeout_s: float, what: str
) -> str:
    """Run ``python -m kernelab.runners.measure ARGS SPEC OUT``; the text of OUT
    (see ``measure_in_child``)."""
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


def _start(cmd: list[str], err: IO[str]) -> subprocess.Popen[str] | forkserver.ForkedChild:
    """The child: forked by the job's fork server where one runs (``kernelab.runners.forkserver``:
    torch already imported), else a new interpreter; both in a new session, stdout a pipe."""
    server = forkserver.active()
    if server is not None:
        try:
            return server.spawn(cmd[cmd.index("kernelab.runners.measure") + 1 :], err)
        except forkserver.ForkServerError as exc:  # gone or too slow: measured cold; the job goes on
            say(f"measure: the job's fork server failed, starting the child cold: {exc}")
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
    try:
        return forkserver.ForkServer(_child_env())
    except OSError as exc:
        say(f"measure: no fork server ({exc}); each child starts its own interpreter")
        return contextlib.nullcontext()


def _child_env() -> dict[str, str]:
    """The job environment (``kernelab.runners.jobenv.job_env``: allow-listed, no credentials) with
    ``PYTHONPATH`` set to this process's ``sys.path`` (the child imports the benchmark modules this
    process could import: a module next to the spec, a test module) and this process's pid added to
    ``KERNELAB_OWN_PIDS`` (NVML then counts it as ours, never as another tenant)."""
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


def _end_relay(proc: subprocess.Popen[str] | forkserver.ForkedChild, relay: threading.Thread) -> None:
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


def _relay(stream: IO[str] | None, progress: ProgressCallback | None, said: list[str]) -> None:
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


def _kill_group(proc: subprocess.Popen[str] | forkserver.ForkedChild) -> None:
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
