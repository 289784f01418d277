"""A job whose baseline and candidate come from source revisions: one worker process per side.

``run_revision_job`` is ``kernelab.runners.job.run_job`` for a spec where a side has a ``source``
(``kernelab.runners.worker`` picks it). It

1. materialises each side's revision (``kernelab.runners.revisions.RevisionCache``: allow-list, cached bare
   clone, one worktree per commit, install steps once); a side without a source uses the
   installed code;
2. starts one ``python -m kernelab.runners.revision_worker`` per side, with the side's revision first on
   ``sys.path`` and its own ``TRITON_CACHE_DIR`` (``<cache>/triton/<sha>``: compiled kernels of
   two revisions never mix);
3. probes the node before, then per sweep cell asks both workers to prepare the cell (inputs,
   correctness against that revision's reference, declared work) and measures the pair with
   ``kernelab.runners.engine.measure_interleaved``: the round order, launch counts, per-sample GPU context
   and stop rule are decided here; each "time one sample of side X" is one request to X's
   worker, which times it with its own ``kernelab.runners.timing`` timer on the same device, while the
   other worker waits;
4. probes after, and returns the ``JobResult`` whose ``node.revisions`` records both commits, the
   diff stat between them and each side's torch/triton/CUDA/driver versions.

A revision that cannot be used (not allowed, not found, failed install, benchmark that does not
import, unknown variant or parameter, worker that died) raises ``RevisionError`` with a message
that names the side; the runner daemon reports it as the job's error. A failure inside one cell
is recorded on that cell and the job goes on, as in ``run_job``.
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
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import torch

import kernelab
from kernelab.kernels._device import configure_triton_env
from kernelab.runners import jobns
from kernelab.runners.engine import measure_interleaved
from kernelab.runners.job import ProgressCallback, _probes, _short_error, check_seed, resolve_device
from kernelab.runners.jobenv import job_env
from kernelab.runners.probes import node_info
from kernelab.runners.probes.telemetry import ContextSampler
from kernelab.runners.revisions import AllowList, Checkout, RevisionCache, RevisionError
from kernelab.runners.timing import TimerKind, choose_launches
from kernelab.service.schemas import (
    CellResult,
    CorrectnessResult,
    JobResult,
    JobSpec,
    Reason,
    RevisionInfo,
    RevisionsInfo,
    TimedCheck,
    Variant,
    Work,
)
from kernelab.service.verdicts import all_cells_failed

log = logging.getLogger(__name__)

SIDES: tuple[Variant, Variant] = ("baseline", "candidate")
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


class RemotePairTimer:
    """``kernelab.runners.engine.PairTimer`` whose samples are timed by the two sides' workers."""

    def __init__(self, channels: dict[Variant, WorkerChannel], setup: dict[Variant, dict[str, Any]]):
        self.channels = channels
        self.setup = setup

    def time_ns(self, variant: Variant, launches: int) -> float:
        """One sample of ``variant`` timed in its worker; raises ``RuntimeError`` with the worker's
        error (the engine's caller records it against the cell)."""
        answer = self.channels[variant].request({"op": "time", "launches": launches})
        if not answer.get("ok"):
            raise RuntimeError(f"{variant}: {answer.get('error')}")
        return float(answer["ns"])

    def launches_for(self, variant: Variant, per_launch_ns: float) -> int:
        """``kernelab.runners.timing.choose_launches`` with the limits of ``variant``'s worker timer."""
        info = self.setup[variant]
        return choose_launches(
            per_launch_ns, min_window_ns=float(info["min_window_ns"]), max_launches=int(info["max_launches"])
        )

    def _ask(self, variant: Variant, payload: dict[str, Any]) -> dict[str, Any]:
        answer = self.channels[variant].request(payload)
        if not answer.get("ok"):
            raise RuntimeError(f"{variant}: {answer.get('error')}")
        return answer

    def timer_kind(self, variant: Variant) -> str:
        """The timer kind that times ``variant`` in its worker now."""
        return str(self._ask(variant, {"op": "kind"})["kind"])

    def use_fallback(self, variant: Variant) -> bool:
        """Move ``variant``'s worker to its timer's fallback."""
        return bool(self._ask(variant, {"op": "fallback"})["moved"])

    def verify(
        self, variant: Variant, *, seed: int, rounds: int, launches: int
    ) -> tuple[TimedCheck, list[Reason]]:
        """A checked sample of ``variant`` in its worker
        (``kernelab.runners.sides.LocalSide.checked_sample``)."""
        answer = self._ask(variant, {"op": "verify", "seed": seed, "rounds": rounds, "launches": launches})
        found = [Reason.model_validate(f) for f in answer["findings"]]
        return TimedCheck.model_validate(answer["check"]), found

    def finish(self, variant: Variant) -> list[Reason]:
        """Findings of ``variant``'s worker after the rounds (no device work, a replaced timer)."""
        return [Reason.model_validate(f) for f in self._ask(variant, {"op": "finish"})["findings"]]


def _label(spec: JobSpec, side: Variant, checkout: Checkout | None) -> str:
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
    spec: JobSpec, checkouts: dict[Variant, Checkout | None], cache: RevisionCache, deadline: float
) -> Iterator[dict[Variant, WorkerChannel]]:
    (cache.root / "scratch").mkdir(parents=True, exist_ok=True)
    # The job's own working folder (``python -m`` puts it first on sys.path: never one shared by jobs)
    scratch = Path(tempfile.mkdtemp(prefix="job-", dir=cache.root / "scratch"))
    channels: dict[Variant, WorkerChannel] = {}
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
        yield channels
    finally:
        for channel in channels.values():
            channel.close()
        shutil.rmtree(scratch, ignore_errors=True)


def _run_cell(
    spec: JobSpec,
    index: int,
    cell: dict[str, Any],
    channels: dict[Variant, WorkerChannel],
    pair: RemotePairTimer,
    sampler: ContextSampler | None,
    progress: Callable[[str], None],
) -> CellResult:
    """One cell across the two workers; a failure is recorded in ``CellResult.error``."""
    result = CellResult(
        index=index,
        params=cell,
        baseline_params={**cell, **spec.baseline.params},
        candidate_params={**cell, **spec.candidate.params},
    )
    try:
        progress("preparing and checking correctness")
        answers = {side: channels[side].request({"op": "cell", "index": index}) for side in SIDES}
        failed = [f"{side}: {a.get('error')}" for side, a in answers.items() if not a.get("ok")]
        if failed:
            result.error = "; ".join(failed)
            return result
        for side, answer in answers.items():
            if answer.get("correctness") is not None:
                result.correctness[side] = CorrectnessResult.model_validate(answer["correctness"])
            result.findings += [Reason.model_validate(f) for f in answer.get("findings", [])]
        progress("measuring")
        taken = [0]

        def checkpoint(rounds: int, launches: Mapping[Variant, int]) -> None:
            seed = check_seed(spec.measurement.seed, taken[0])
            taken[0] += 1
            for side in SIDES:
                check, found = pair.verify(side, seed=seed, rounds=rounds, launches=launches[side])
                result.timed_checks.setdefault(side, []).append(check)
                result.findings += [f for f in found if f not in result.findings]

        checks = spec.correctness.enabled and spec.correctness.timed_checks
        try:
            result.samples = measure_interleaved(
                pair,
                spec.measurement,
                sampler=sampler,
                progress=progress,
                checkpoint=checkpoint if checks else None,
            )
        finally:
            result.timers = {side: pair.timer_kind(side) for side in SIDES}
        for side in SIDES:
            result.findings += [f for f in pair.finish(side) if f not in result.findings]
        result.work = {side: Work.model_validate(answers[side]["work"]) for side in SIDES}
    except RevisionError:
        raise  # a dead or hung worker ends the job
    except Exception as exc:  # one cell's failure must not lose the job's other cells
        log.exception("cell %d %s failed", index, cell)
        result.error = _short_error(exc)
    finally:
        for channel in channels.values():
            if channel.proc.poll() is None:
                channel.request({"op": "release"})
    return result


def _revision_info(
    spec: JobSpec, side: Variant, checkout: Checkout | None, versions: dict[str, Any]
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
) -> JobResult:
    """Run ``spec`` (a side has a ``source``) on this node; see the module docstring.

    ``allow``: repositories this runner may fetch; ``cache_dir``: clones, worktrees, Triton caches.
    ``device``, ``progress``, ``timer_kind`` and ``idempotency_key`` as in ``kernelab.runners.job.run_job``.
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
    checkouts: dict[Variant, Checkout | None] = {}
    for side in SIDES:
        source = getattr(spec, side).source
        if source is not None:
            report(0, 1, f"{side}: fetching {source.repo} @ {source.ref}")
        checkouts[side] = cache.materialise(source, side, allow=allow) if source is not None else None
    base, cand = checkouts["baseline"], checkouts["candidate"]
    diff_stat, shortstat = cache.diff_stat(base, cand) if base is not None and cand is not None else ("", "")
    sampler = ContextSampler(dev.index) if dev.type == "cuda" else None
    cells = spec.cells(dev.type)  # type: ignore[arg-type]
    probes = _probes(spec, "before", dev)
    results: list[CellResult] = []
    with _workers(spec, checkouts, cache, deadline) as channels:
        setup: dict[Variant, dict[str, Any]] = {}
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
        pair = RemotePairTimer(channels, setup)
        for index, cell in enumerate(cells):
            report(index, len(cells), f"cell {index + 1}/{len(cells)} {cell}")
            result = _run_cell(spec, index, cell, channels, pair, sampler, partial(report, index, len(cells)))
            report(index, len(cells), f"done: {result.error or f'{len(result.samples)} samples'}")
            results.append(result)
    node = node_info(dev)
    probes += _probes(spec, "after", dev)
    node.revisions = RevisionsInfo(
        baseline=_revision_info(spec, "baseline", base, setup["baseline"]["versions"]),
        candidate=_revision_info(spec, "candidate", cand, setup["candidate"]["versions"]),
        diff_stat=diff_stat,
        diff_shortstat=shortstat,
    )
    return JobResult(
        idempotency_key=idempotency_key or uuid.uuid4().hex,
        job_id=job_id,
        spec=spec,
        node=node,
        timer=setup["baseline"]["timer"],
        started_at=started_at,
        finished_at=datetime.now(UTC),
        cells=results,
        probes=probes,
        error=all_cells_failed(results),
    )
