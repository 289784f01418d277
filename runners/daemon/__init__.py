"""The runner daemon: one per GPU node, it claims jobs from the server and runs them.

Loop (``RunnerDaemon.run``)::

    re-send spooled results -> long-poll claim -> run the job in a worker process
      (python -m kernelab.runners.worker, hard timeout = spec.timeout_s, lease heartbeat from a thread)
    -> move the result into the spool -> post it (idempotent) -> delete it once acknowledged

One module per part: ``tokens`` (the runner's own token: given, saved or registered),
``probe_pool`` (the all-reduce ranks kept alive between jobs), ``supervisor`` (one job's worker:
scratch folder, isolation, environment, heartbeat, timeout, grace), ``loop`` (the daemon: claims,
the spool, failures, signals). The daemon says at start-up which isolation job code has and
warns when job code could still read the token file.
"""

from kernelab.runners.daemon.loop import DEFAULT_WORK_DIR, MIN_FREE_BYTES, AdvertError, RunnerDaemon
from kernelab.runners.daemon.tokens import RunnerTokenMismatchError

__all__ = ["DEFAULT_WORK_DIR", "MIN_FREE_BYTES", "AdvertError", "RunnerDaemon", "RunnerTokenMismatchError"]
