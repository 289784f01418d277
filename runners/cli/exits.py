"""The exit statuses of the ``kernelab`` command line (no imports: ``kernelab --version`` and
every command's start read them before anything heavy loads)."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1  # a cell's verdict is in --fail-on, or the job failed
EXIT_BAD_INPUT = 2
EXIT_NO_VERDICT = 3  # run/submit/report: server unreachable or refusing, wait timed out, job cancelled
