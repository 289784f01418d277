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
process (``kernelab.runners.measure``) instead of measuring on, orphaned.

Exit status: 0 on success; 2 for unusable arguments or an invalid spec file; 1 when the job raised.
The error goes to stderr (the daemon posts its tail as the job's failure message).
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

from kernelab.runners.spool import atomic_write_text
from kernelab.service.schemas import JobResult, JobSpec

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
    from kernelab.service.node_change import node_change_reasons

    found = node_change_reasons(result.probes, device_type=result.node.device_type) + [
        f for c in result.cells for f in c.findings if f.code == "node-changed"
    ]
    return found[0].message if found else ""


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through measure's cleanup, which kills its child


def main(argv: list[str] | None = None) -> int:
    """Run the worker with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        spec = JobSpec.model_validate_json(args.spec_json.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as exc:
        print(f"worker: cannot read spec {args.spec_json}: {exc}", file=sys.stderr)
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
    except RevisionError as exc:  # a known, user-facing failure: the message says it all
        print(f"worker: job failed: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
    except Exception as exc:  # the job's own failure: report it, never hide it
        traceback.print_exc(file=sys.stderr)
        print(f"worker: job failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_JOB_FAILED
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
