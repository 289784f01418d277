"""A job whose baseline and candidate come from source revisions: one worker process per side.

``run_revision_job`` is ``kernelab.runners.job.run_job`` for a spec where a side has a ``source``
(``kernelab.runners.worker`` picks it). It

1. materialises each side's revision (``kernelab.runners.revisions.RevisionCache``: allow-list, cached bare
   clone, one worktree per commit, install steps once); a side without a source uses the
   installed code;
2. starts one ``python -m kernelab.runners.revision_worker`` per side, with the side's revision first on
   ``sys.path`` and its own ``TRITON_CACHE_DIR`` (``<cache>/triton/<sha>``: compiled kernels of
   two revisions never mix);
3. probes the node before, then measures every sweep cell with the cell pipeline
   (``kernelab.runners.pipeline.run_cells``), the same code as an in-process job, over
   ``WorkerSides``: each of its ``WorkerSide`` methods (prepare, reference, correctness checks
   with every ``correctness`` option, bitwise comparison, one timed sample, a checked sample,
   device work, integrity, declared work, static metrics) is one request to that side's worker,
   served there by a ``kernelab.runners.sides.LocalSide`` of that revision's benchmark on the same
   device, while the other worker waits. The round order, launch counts, per-sample GPU context,
   contention readings (the workers count as this runner's processes) and stop rule are decided
   here;
4. probes after, and returns the ``JobResult`` whose ``node.revisions`` records both commits, the
   diff stat between them and each side's torch/triton/CUDA/driver versions. The result has the
   shape of an in-process job's: the same fields are filled for every option.

A revision that cannot be used (not allowed, not found, failed install, benchmark that does not
import, unknown variant or parameter, worker that died) raises ``RevisionError`` with a message
that names the side; the runner daemon reports it as the job's error. A failure inside one cell
(a worker's error answer: ``kernelab.runners.pipeline.SideError``) is recorded on that cell and the
job goes on, as in ``run_job``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

import kernelab
from kernelab.kernels._device import configure_triton_env
from kernelab.runners import jobns
from kernelab.runners.cells import resolve_device
from kernelab.runners.children import phase_probes
from kernelab.runners.job import job_result
from kernelab.runners.jobenv import job_env
from kernelab.runners.pipeline import CellMonitor, Compiled, OutputRef, SideError, run_cells
from kernelab.runners.probes import node_info
from kernelab.runners.probes.contention import GpuContentionMonitor
from kernelab.runners.probes.telemetry import ContextSampler, register_own_pids, unregister_own_pids
from kernelab.runners.progress import ProgressCallback
from kernelab.runners.revisions import AllowList, Checkout, RevisionCache, RevisionError
from kernelab.runners.static_metrics import kernel_code_from_json
from kernelab.runners.timing import TimerKind
from kernelab.service.contract.schemas import (
    BitwiseComparison,
    CorrectnessResult,
    CorrectnessSpec,
    JobResult,
    JobSpec,
    Reason,
    RevisionInfo,
    RevisionsInfo,
    Side,
    TimedCheck,
    Work,
)

log = logging.getLogger(__name__)

SIDES: tuple[Side, Side] = ("baseline", "candidate")
# the folder holding the installed kernelab package (a checkout, or site-packages)
_KERNELAB_ROOT = str(Path(kernelab.__file__).resolve().parent.parent)
_EXIT_WAIT_S = 10.0  # how long a worker gets to exit after the "exit" request


class WorkerChannel:
    """One side's worker process and its JSON-lines channel (see ``kernelab.runners.revision_worker``).

    ``request`` waits for the answer until ``deadline`` (``time.monotonic()`` seconds); a worker
    that dies or overruns raises ``RevisionError`` naming ``label``.
    """

    def __init__(
        self, label: str, env: dict[str, str], cwd: Path, deadline: float, argv: list[str] | None = None
    ):
        self.label = label
        self.deadline = deadline
        self._buf = b""
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-P", "-m", "kernelab.runners.revision_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd=cwd,
        )
        assert self.proc.stdout is not None
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.proc.stdout, selectors.EVENT_READ)

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Send ``payload``, return the answer; an ``ok: false`` answer raises ``RevisionError``
        only for ``setup`` (else it is returned for the caller to record)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise self._died() from None
        return json.loads(self._readline())

    def _readline(self) -> bytes:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise RevisionError(f"{self.label}: the worker did not answer before the job's timeout")
            if not self._selector.select(timeout=remaining):
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise self._died()
            self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line

    def _died(self) -> RevisionError:
        code = self.proc.wait(timeout=_EXIT_WAIT_S)
        return RevisionError(
            f"{self.label}: the worker process exited with status {code} (its stderr is in the job's log)"
        )

    def close(self) -> None:
        """Ask the worker to exit; kill it if it does not within ``_EXIT_WAIT_S``."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, RevisionError, ValueError):
                self.request({"op": "exit"})
            try:
                self.proc.wait(timeout=_EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._selector.close()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


class WorkerSide:
    """The cell pipeline's ``CellSide`` of one side in its worker process: each method is one request
    on the side's channel, served there by a ``kernelab.runners.sides.LocalSide``
    (``kernelab.runners.revision_worker``). A worker's error answer raises ``SideError`` naming
    the side; a worker that died or overran raises ``RevisionError`` (both from
    ``WorkerChannel.request``). ``scratch``: the job's working folder, where outputs handed from
    one side to the other are written."""

    def __init__(self, side: Side, channel: WorkerChannel, scratch: Path, input_sets: int = 1) -> None:
        self.side, self.channel, self.scratch = side, channel, scratch
        self.input_sets = input_sets  # the input sets the worker prepared (the engine's placement)
        self.interpreted = False  # the worker's eager check ran Triton kernels in the interpreter

    def __repr__(self) -> str:
        return f"<WorkerSide {self.side} {self.channel.label!r} pid={self.channel.proc.pid}>"

    def _ask(self, op: str, **fields: Any) -> dict[str, Any]:
        answer = self.channel.request({"op": op, **fields})
        if not answer.get("ok"):
            raise SideError(f"{self.side}: {answer.get('error')}")
        return answer

    def _findings(self, op: str) -> list[Reason]:
        return [Reason.model_validate(f) for f in self._ask(op)["findings"]]

    @property
    def timer_kind(self) -> str:
        return str(self._ask("kind")["kind"])

    def time_ns(self, launches: int) -> float:
        return float(self._ask("time", launches=launches)["ns"])

    def use_inputs(self, index: int) -> None:
        """Time input set ``index`` from now on (the engine's rotating placement)."""
        self._ask("use", index=index)

    def launches_for(self, per_launch_ns: float) -> int:
        return int(self._ask("launches", per_launch_ns=per_launch_ns)["launches"])

    def use_fallback(self) -> bool:
        return bool(self._ask("fallback")["moved"])

    def take_reference(self) -> None:
        self._ask("reference")

    def eager_check(self, spec: CorrectnessSpec, *, seed: int) -> tuple[CorrectnessResult, list[Reason]]:
        answer = self._ask("check", correctness=spec.model_dump(mode="json"), seed=seed)
        found = [Reason.model_validate(f) for f in answer["findings"]]
        self.interpreted = bool(answer.get("interpreted"))  # its Triton kernels ran in the interpreter
        return CorrectnessResult.model_validate(answer["correctness"]), found

    def first_output(self) -> Path:
        """The kept output, written by the worker to a file of the job's working folder."""
        path = self.scratch / f"{self.side}-output.pt"
        self._ask("output", path=str(path))
        return path

    def compare_bitwise(self, baseline: OutputRef) -> BitwiseComparison:
        if isinstance(baseline, torch.Tensor):  # another process's output reaches a worker as a file
            path = self.scratch / f"{self.side}-other-output.pt"
            torch.save(baseline, path)
        else:
            path = baseline
        try:
            answer = self._ask("bitwise", path=str(path))
        finally:
            path.unlink(missing_ok=True)
        return BitwiseComparison.model_validate(answer["comparison"])

    def checked_sample(
        self, *, seed: int, rounds: int, launches: int, references: dict[Any, Any] | None = None
    ) -> TimedCheck:
        """``references`` is for sides in one process; a worker computes its own."""
        answer = self._ask("verify", seed=seed, rounds=rounds, launches=launches)
        return TimedCheck.model_validate(answer["check"])

    def device_work_findings(self) -> list[Reason]:
        return self._findings("device_work")

    def tamper_findings(self) -> list[Reason]:
        return self._findings("integrity")

    def work(self) -> Work:
        return Work.model_validate(self._ask("work")["work"])


class WorkerSides:
    """The cell pipeline's ``SidePair`` of a revision job: the two sides' workers (``channels``,
    set up with the answers ``setup``) on ``device``."""

    def __init__(
        self,
        channels: dict[Side, WorkerChannel],
        setup: dict[Side, dict[str, Any]],
        device: torch.device,
        scratch: Path,
    ) -> None:
        self.channels, self.setup, self.device, self.scratch = channels, setup, device, scratch
        self.static_target: str | None = setup["baseline"].get("static_target")

    def __repr__(self) -> str:
        return f"<WorkerSides {', '.join(c.label for c in self.channels.values())}>"

    def prepare(self, index: int, cell: Mapping[str, Any]) -> dict[Side, WorkerSide]:
        """Both workers prepare cell ``index``; raises ``SideError`` naming every side that could not."""
        answers = {side: self.channels[side].request({"op": "cell", "index": index}) for side in SIDES}
        failed = [f"{side}: {a.get('error')}" for side, a in answers.items() if not a.get("ok")]
        if failed:
            raise SideError("; ".join(failed))
        return {
            side: WorkerSide(side, self.channels[side], self.scratch, int(answers[side].get("sets", 1)))
            for side in SIDES
        }

    def release(self) -> None:
        for channel in self.channels.values():
            if channel.proc.poll() is None:
                with contextlib.suppress(RevisionError):
                    channel.request({"op": "release"})

    def static_kernels(self, indices: Sequence[int], target: str) -> dict[Side, list[Compiled]]:
        """Each worker compiles its own revision's kernels (the ``static`` request)."""
        out: dict[Side, list[Compiled]] = {}
        for side in SIDES:
            answer = self.channels[side].request({"op": "static", "target": target, "cells": list(indices)})
            if not answer.get("ok"):
                raise SideError(f"{side}: {answer.get('error')}")
            out[side] = [
                ([kernel_code_from_json(k) for k in c["kernels"]], c["error"]) for c in answer["cells"]
            ]
        return out

    def timer_label(self) -> str:
        """``JobResult.timer``: the baseline worker's timer label after the cells."""
        answer = self.channels["baseline"].request({"op": "label"})
        return str(answer.get("label") or self.setup["baseline"]["timer"])


def _label(spec: JobSpec, side: Side, checkout: Checkout | None) -> str:
    source = getattr(spec, side).source
    if source is None or checkout is None:
        return f"{side} (installed code)"
    return f"{side} ({source.branch or source.ref} @ {checkout.sha[:12]})"


def _triton_cache(checkout: Checkout | None, scratch: Path) -> Path:
    """A side's Triton cache: in its worktree (made afresh with it: never shared with a revision
    installed by other steps), or in the job's own scratch folder for installed code."""
    path = (checkout.root if checkout is not None else scratch) / ".kernelab-triton"
    if path.is_symlink() or (path.exists() and not path.is_dir()):  # left by an install step: never followed
        path.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


def _worker_env(triton_cache: Path) -> dict[str, str]:
    """A side worker's environment: the job environment (``kernelab.runners.jobenv``: allow-listed, no
    credentials), kernelab first on ``PYTHONPATH``, the side's own Triton cache."""
    env = job_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_KERNELAB_ROOT, env.get("PYTHONPATH", "")) if p)
    env["TRITON_CACHE_DIR"] = str(triton_cache)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextlib.contextmanager
def _workers(
    spec: JobSpec, checkouts: dict[Side, Checkout | None], cache: RevisionCache, deadline: float
) -> Iterator[tuple[dict[Side, WorkerChannel], Path]]:
    """The two sides' workers and the job's working folder; the workers count as this runner's own
    GPU processes while they run (``kernelab.runners.probes.telemetry.register_own_pids``)."""
    (cache.root / "scratch").mkdir(parents=True, exist_ok=True)
    # The job's own working folder (``python -m`` puts it first on sys.path: never one shared by jobs)
    scratch = Path(tempfile.mkdtemp(prefix="job-", dir=cache.root / "scratch"))
    channels: dict[Side, WorkerChannel] = {}
    try:
        for side in SIDES:
            triton = _triton_cache(checkouts[side], scratch)
            # isolated: the revision cache read-only for benchmark code but this job's folder and Triton cache
            argv = jobns.nested(
                [sys.executable, "-P", "-m", "kernelab.runners.revision_worker"],
                readonly=cache.root,
                writable=[scratch, triton],
            )
            channels[side] = WorkerChannel(
                _label(spec, side, checkouts[side]), _worker_env(triton), scratch, deadline, argv=argv
            )
            register_own_pids([channels[side].proc.pid])
        yield channels, scratch
    finally:
        for channel in channels.values():
            channel.close()
        unregister_own_pids(c.proc.pid for c in channels.values())
        shutil.rmtree(scratch, ignore_errors=True)


def _revision_info(
    spec: JobSpec, side: Side, checkout: Checkout | None, versions: dict[str, Any]
) -> RevisionInfo:
    source = getattr(spec, side).source
    if source is None or checkout is None:
        return RevisionInfo(versions=versions)
    return RevisionInfo(
        repo=source.repo,
        ref=source.ref,
        branch=source.branch,
        subdir=source.subdir,
        sha=checkout.sha,
        versions=versions,
    )


def run_revision_job(
    spec: JobSpec,
    *,
    allow: AllowList,
    cache_dir: Path,
    job_id: int | None = None,
    idempotency_key: str | None = None,
    device: str | torch.device | None = None,
    progress: ProgressCallback | None = None,
    timer_kind: TimerKind = "auto",
    monitor: CellMonitor | None = None,
) -> JobResult:
    """Run ``spec`` (a side has a ``source``) on this node; see the module docstring.

    ``allow``: repositories this runner may fetch; ``cache_dir``: clones, worktrees, Triton caches.
    ``device``, ``progress``, ``timer_kind`` and ``idempotency_key`` as in ``kernelab.runners.job.run_job``.
    ``monitor``: who else uses the GPU, read at each CI check (default: NVML's
    ``GpuContentionMonitor`` of the device on CUDA, none on a CPU; the workers count as ours).
    The job's ``timeout_s`` bounds every wait on a worker. Raises ``RevisionError`` when a side's
    revision or benchmark cannot be used (the message names the side), ``RuntimeError`` for a CUDA
    device without CUDA; failures inside a cell never raise.
    """
    started_at = datetime.now(UTC)
    deadline = time.monotonic() + spec.timeout_s
    dev = resolve_device(device, spec.device)
    configure_triton_env(dev)  # inherited by the workers, before they import triton
    report: ProgressCallback = progress if progress is not None else (lambda i, n, msg: None)
    cache = RevisionCache(cache_dir)
    checkouts: dict[Side, Checkout | None] = {}
    for side in SIDES:
        source = getattr(spec, side).source
        if source is not None:
            report(0, 1, f"fetching the {side}: {source.repo} @ {source.ref}")
        checkouts[side] = cache.materialise(source, side, allow=allow) if source is not None else None
    base, cand = checkouts["baseline"], checkouts["candidate"]
    diff_stat, shortstat = cache.diff_stat(base, cand) if base is not None and cand is not None else ("", "")
    sampler = ContextSampler(dev.index) if dev.type == "cuda" else None
    if monitor is None and dev.type == "cuda":
        monitor = GpuContentionMonitor(dev.index)
    cells = len(spec.cells(dev.type))  # type: ignore[arg-type]
    report(0, cells, "probes before the cells")
    probes = phase_probes(spec, "before", dev.type)
    with _workers(spec, checkouts, cache, deadline) as (channels, scratch):
        setup: dict[Side, dict[str, Any]] = {}
        for side in SIDES:
            co = checkouts[side]
            answer = channels[side].request(
                {
                    "op": "setup",
                    "spec": spec.model_dump(mode="json"),
                    "side": side,
                    "device": str(dev),
                    "path": str(co.path) if co else None,
                    "site": str(co.site) if co else None,
                    "timer_kind": timer_kind,
                }
            )
            if not answer.get("ok"):
                raise RevisionError(f"{channels[side].label}: {answer.get('error')}")
            setup[side] = answer
        pair = WorkerSides(channels, setup, dev, scratch)
        results = run_cells(
            pair, spec, sampler=sampler, monitor=monitor, progress=report, fatal=(RevisionError,)
        )
        timer_label = pair.timer_label()
    node = node_info(dev)
    report(max(0, cells - 1), cells, "probes after the cells")
    probes += phase_probes(spec, "after", dev.type)
    node.revisions = RevisionsInfo(
        baseline=_revision_info(spec, "baseline", base, setup["baseline"]["versions"]),
        candidate=_revision_info(spec, "candidate", cand, setup["candidate"]["versions"]),
        diff_stat=diff_stat,
        diff_shortstat=shortstat,
    )
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
