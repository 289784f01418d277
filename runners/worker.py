"""Child-process entry point that runs one job: ``python -m kernelab.runners.worker SPEC_JSON OUT_JSON``.

The daemon runs every job in a fresh child so that a crash, a hung kernel or a leaked CUDA
context cannot take the daemon down, and so that a hard timeout can kill it. The child:

1. reads the ``JobSpec`` JSON file ``SPEC_JSON``;
2. runs ``kernelab.runners.job.run_job(spec, job_id=..., idempotency_key=..., progress=...)`` (or, when a
   side names a source revision, ``kernelab.runners.revision_job.run_revision_job`` with the
   ``--allow-repo`` list and ``--cache-dir``), printing one progress line per sweep cell on stdout;
3. writes the ``JobResult`` JSON to ``OUT_JSON`` atomically (temp file + rename), so the daemon
   never reads half a result. When that file cannot be written (``OSError``: the disk is full,
   ...), the result goes to stdout instead, as one line ``RESULT_MARK + JSON`` that the daemon
   keeps (in its spool, or in memory while its disk stays full): a finished measurement is
   never dropped for want of disk space.

SIGTERM (the daemon stopping a cancelled, lost or timed-out job) raises ``SystemExit`` here, so
the measuring and probe children, which run in sessions of their own, are killed with this
process (``kernelab.runners.measure``) instead of measuring on, orphaned. The worker is the
reaper of every process of its job (``kernelab.runners.reaper``): whatever job code started and
detached (``setsid``, a double fork) is killed when the worker ends, and the worker gets SIGTERM
when the daemon dies.

Exit status: 0 on success; 2 for unusable arguments or an invalid spec file; 1 when the job raised;
4 (``kernelab.runners.nodefault.EXIT_NODE_FAULT``) when the node, not the job, made it fail (the
disk or the file table full while a process of the job wrote: a line ``worker: node fault: <why>``
on stderr where it can be written, and ``NODE_FAULT_LINE`` + why on stdout; no result is handed
over, the job is measured again). The
error goes to stderr (the daemon posts its tail as the job's failure message).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import traceback
from pathlib import Path

from pydantic import ValidationError

from kernelab.runners.nodefault import (
    EXIT_NODE_FAULT,
    NODE_FAULT_LINE,
    NODE_FAULT_MARK,
    node_fault,
    node_fault_text,
)
from kernelab.runners.reaper import become_subreaper, die_with_parent, kill_descendants
from kernelab.runners.spool import atomic_write_text
from kernelab.service.contract.schemas import JobResult, JobSpec

EXIT_OK = 0
EXIT_JOB_FAILED = 1
EXIT_BAD_INPUT = 2
RESULT_MARK = "kernelab-result-json: "  # a stdout line carrying the result the file could not hold
NODE_CHANGED_MARK = "kernelab-node-changed: "  # a stdout line: the job changed the node (reason follows)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kernelab.runners.worker", description=__doc__.splitlines()[0])
    p.add_argument("spec_json", type=Path, help="JobSpec JSON file")
    p.add_argument("out_json", type=Path, help="where the JobResult JSON is written")
    p.add_argument("--job-id", type=int, default=None)
    p.add_argument("--idempotency-key", default=None)
    p.add_argument(
        "--allow-repo",
        action="append",
        default=[],
        metavar="REPO",
        help="repository a source revision may come from (repeatable; also KERNELAB_ALLOWED_REPOS)",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".kernelab" / "revisions",
        help="clones, worktrees and Triton caches of source revisions",
    )
    return p


def _print_progress(index: int, total: int, message: str) -> None:
    print(f"progress: [{index + 1}/{total}] {message}", flush=True)


def _node_changed(result: JobResult) -> str:
    """The first ``node-changed`` reason of ``result`` (its probes after against before, or a cell's
    in-process canary), or ``""``."""
    from kernelab.service.judge.node_change import node_change_reasons

    found = node_change_reasons(result.probes, device_type=result.node.device_type) + [
        f for c in result.cells for f in c.findings if f.code == "node-changed"
    ]
    return found[0].message if found else ""


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through measure's cleanup, which kills its child


def _say(text: str) -> None:
    """``text`` on stderr, unless stderr (a file in the job's folder, on a disk that may be full)
    cannot take it: the exit status still says what happened."""
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr, flush=True)


def _node_fault_exit(fault: str) -> int:
    """Say ``fault`` on stdout (the daemon's pipe: ``NODE_FAULT_LINE``) and on stderr (where it
    can); ``EXIT_NODE_FAULT``."""
    text = " ".join(fault.split())
    with contextlib.suppress(OSError):
        print(NODE_FAULT_LINE + text, flush=True)
    _say(f"worker: {NODE_FAULT_MARK}{text}")
    return EXIT_NODE_FAULT


def cells_node_fault(result: JobResult) -> str:
    """The first error of ``result``'s cells (or of their static metrics) that names a fault of the
    node (``kernelab.runners.nodefault.node_fault_text``: a cell whose Triton cache or scratch write
    found the disk full), or ``""``."""
    for cell in result.cells:
        for text in (cell.error, cell.static.error if cell.static is not None else None):
            found = node_fault_text(text or "")
            if found:
                return f"cell {cell.index}: {found}"
    return ""


def main(argv: list[str] | None = None) -> int:
    """Run the worker with ``argv`` (default ``sys.argv[1:]``); return the exit status. Every
    process the job left behind is killed before it returns (``kernelab.runners.reaper``)."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    become_subreaper()
    die_with_parent(signal.SIGTERM)
    try:
        return _run(args)
    finally:
        left = kill_descendants()
        if left:
            _say(f"worker: killed {len(left)} process(es) the job left behind: {left}")


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = JobSpec.model_validate_json(args.spec_json.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        if node_fault(exc):
            return _node_fault_exit(node_fault(exc))
        _say(f"worker: cannot read spec {args.spec_json}: {exc}")
        return EXIT_BAD_INPUT

    from kernelab.runners.job import run_job  # torch is imported by the measuring child, not here
    from kernelab.runners.revisions import AllowList, RevisionError

    try:
        if spec.baseline.source is not None or spec.candidate.source is not None:
            from kernelab.runners.revision_job import run_revision_job  # imports torch

            result = run_revision_job(
                spec,
                allow=AllowList.from_env(args.allow_repo),
                cache_dir=args.cache_dir,
                job_id=args.job_id,
                idempotency_key=args.idempotency_key,
                progress=_print_progress,
            )
        else:
            result = run_job(
                spec, job_id=args.job_id, idempotency_key=args.idempotency_key, progress=_print_progress
            )
    except Exception as exc:  # the node's fault, or the job's own failure: report it, never hide it
        fault = node_fault(exc)
        if fault:
            return _node_fault_exit(fault)
        if isinstance(exc, RevisionError):  # a known, user-facing failure: the message says it all
            _say(f"worker: job failed: {exc}")
            return EXIT_JOB_FAILED
        with contextlib.suppress(OSError):
            traceback.print_exc(file=sys.stderr)
        _say(f"worker: job failed: {type(exc).__name__}: {exc}")
        return EXIT_JOB_FAILED
    fault = cells_node_fault(result)
    if fault:  # measured on a node that could not write: not this job's result
        return _node_fault_exit(fault)
    changed = _node_changed(result)
    if changed:  # the daemon probes the node again before its next job
        print(NODE_CHANGED_MARK + " ".join(changed.split()), flush=True)
    text = result.model_dump_json()
    try:
        atomic_write_text(args.out_json, text)
    except OSError as exc:  # the daemon reads it from stdout (module docstring)
        with contextlib.suppress(OSError):  # stderr is a file on the same, maybe full, disk
            print(f"worker: result not written to {args.out_json} ({exc}); handed over on stdout",
                  file=sys.stderr, flush=True)  # fmt: skip
        sys.stdout.write(RESULT_MARK + text + "\n")
        sys.stdout.flush()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
