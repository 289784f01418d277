"""A stopping daemon never drops a measurement it holds only in memory.

A result is held in memory when the work dir's disk could not take it (``RunnerDaemon.held``)
and the server has not acknowledged it yet. When the daemon stops (SIGTERM, ``--once`` at its
end, a refused token), ``keep_at_shutdown``:

1. **waits and says why**: for up to ``grace_s`` seconds (none after a second signal, nor when
   the token was refused) it tries every ``WAIT_POLL_S`` to post the results or to spool them
   (``RunnerDaemon.flush_spool``), logging what it waits for (the disk, the server) and how long;
2. then writes each one still held into the first of ``fallback_dirs`` (``--spool-fallback``)
   that takes it, as a spool file ``DIR/<name>/<job>-<key>.json``, which the daemon posts at its
   next start like its own spool;
3. and, as a last resort, to stderr: one line ``RESULT_MARK`` + the ``JobResult`` JSON (a result
   the server refused for good: ``REFUSED_MARK``), which an operator saves as a file of the spool
   (the JSON after the mark, named ``<job_id>-<anything>.json``) to have it posted.

Each step is logged with the result's job, so what happened to every measurement is on record;
``RunnerDaemon.on_stderr`` counts the results of step 3 (``kernelab runner`` then exits 1).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from kernelab.runners.client import KernelabAPIError
from kernelab.runners.spool import Spool
from kernelab.runners.worker import RESULT_MARK
from kernelab.service.contract.schemas import JobResult

if TYPE_CHECKING:
    from kernelab.runners.daemon.loop import RunnerDaemon

log = logging.getLogger(__name__)

WAIT_POLL_S = 2.0  # how often a stopping daemon tries again to post or spool what it holds
REFUSED_MARK = "kernelab-refused-result-json: "  # a stderr line: a result the server refused for good


def keep_at_shutdown(daemon: RunnerDaemon) -> None:
    """Keep every result ``daemon`` holds only in memory (module docstring); never raises."""
    if not daemon.held and not daemon.refused_in_memory:
        return
    _wait(daemon)
    for key, result in list(daemon.held.items()):
        where = _to_fallback(daemon, result, refused=None)
        if where is None:
            _to_stderr(daemon, result, RESULT_MARK)
        del daemon.held[key]
    for result, reason in list(daemon.refused_in_memory):
        if _to_fallback(daemon, result, refused=reason) is None:
            _to_stderr(daemon, result, REFUSED_MARK)
    daemon.refused_in_memory.clear()


def _wait(daemon: RunnerDaemon) -> None:
    """Try to post or spool the held results for up to ``daemon.grace_s`` seconds, saying why (each
    post tried once: the wait is the retry)."""
    error = daemon._post_error
    if daemon._now.is_set() or (isinstance(error, KernelabAPIError) and error.status_code in (401, 403)):
        return  # a second signal, or a refused token: no wait will post them
    deadline = time.monotonic() + daemon.grace_s
    said_at = float("-inf")
    retries, daemon.client.retries = daemon.client.retries, 0
    try:
        while daemon.held and not daemon._now.is_set() and time.monotonic() < deadline:
            if time.monotonic() - said_at >= 10 * WAIT_POLL_S:
                said_at = time.monotonic()
                log.warning(
                    "runner %s: shutdown waits: %d measured result(s) are held in memory only (the work "
                    "dir %s cannot take them: %s; the server: %s); trying every %.0f s for up to %.0f s "
                    "more, then they are written to %s (a second signal: now)",
                    daemon.name, len(daemon.held), daemon.work_dir, daemon.write_problem or "full",
                    daemon._post_error or "not tried yet", WAIT_POLL_S, deadline - time.monotonic(),
                    ", ".join(map(str, daemon.fallback_dirs)) or "stderr",
                )  # fmt: skip
            try:
                daemon.flush_spool()
            except Exception as exc:  # a shutdown must reach the writing-out below
                log.error("runner %s: posting at shutdown failed: %s", daemon.name, exc)
            error = daemon._post_error
            if isinstance(error, KernelabAPIError) and error.status_code in (401, 403):
                return
            if daemon.held:
                daemon._now.wait(WAIT_POLL_S)
    finally:
        daemon.client.retries = retries


def _to_fallback(daemon: RunnerDaemon, result: JobResult, *, refused: str | None) -> Path | None:
    """``result`` written into the first fallback spool that takes it (under ``rejected/`` with
    ``refused`` as the reason, when the server refused it for good); None when none did."""
    for folder in daemon.fallback_dirs:
        try:
            spool = Spool(folder / daemon.name)
            path = spool.put(result)
            if refused is not None:
                path = spool.reject(path, refused)
        except OSError as exc:
            log.error("runner %s: result of job %s cannot be written to %s: %s",
                      daemon.name, result.job_id, folder, exc)  # fmt: skip
            continue
        then = "" if refused else f": a runner started with --spool-fallback {folder} posts it"
        log.error("runner %s: result of job %s was held in memory (the work dir is full); written to %s "
                  "at shutdown%s", daemon.name, result.job_id, path, then)  # fmt: skip
        return path
    return None


def _to_stderr(daemon: RunnerDaemon, result: JobResult, mark: str) -> None:
    """The last resort: ``result`` as one ``mark`` line on stderr, with an error saying how to post it."""
    log.error(
        "runner %s: result of job %s could not be written anywhere (the work dir is full, no "
        "--spool-fallback took it); it is on stderr as one line starting with %r: save the JSON "
        "after that mark as %s/%s-saved.json and start the runner again to post it",
        daemon.name, result.job_id, mark, daemon.spool.root, result.job_id,
    )  # fmt: skip
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(mark + result.model_dump_json() + "\n")
        sys.stderr.flush()
    daemon.on_stderr += 1
