"""On-disk spool of measured results that have not reached the server yet.

Nothing measured is lost: the daemon moves every finished ``JobResult`` into the spool *before*
posting it and deletes the file only once the server has acknowledged it (201, or 200 with
``duplicate: true`` for a repeated idempotency key). A result the server refuses for good
(``REFUSED_FOR_GOOD``: 400, 404, 409, 413, 422) is moved to ``rejected/`` with the reason
beside it, so it is kept but not re-sent forever. Every other answer leaves it pending, to be
re-sent: 401/403 refuse the daemon's token, not the result; 5xx, 429 and the like, timeouts and
unreachable servers say "later".

Layout under ``root``::

    <job_id>-<idempotency_key>.json       pending JobResult JSON
    rejected/<same name>                  refused by the server
    rejected/<same name>.reason.txt       the server's answer

Files are written atomically (temp file in the same directory, fsync, ``os.replace``), so a crash
leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from kernelab.service.schemas import JobResult

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
REFUSED_FOR_GOOD = frozenset({400, 404, 409, 413, 422})
"""HTTP statuses that refuse a posted result itself (malformed, unknown job, lease taken over or
key of another result, too large, does not fit its job): no retry changes the answer."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically: temp file + fsync + ``os.replace``.

    Creates the parent directory. Raises ``OSError`` when the directory is not writable.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class Spool:
    """A directory of pending ``JobResult`` files (see the module docstring for the layout)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.rejected_dir = self.root / "rejected"
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"<Spool {self.root} pending={len(self.pending())}>"

    def path_for(self, result: JobResult) -> Path:
        """Where ``result`` is spooled: one file per (job, idempotency key)."""
        return self.root / f"{result.job_id}-{_SAFE.sub('_', result.idempotency_key)}.json"

    def put(self, result: JobResult) -> Path:
        """Write ``result`` into the spool atomically; return its path."""
        path = self.path_for(result)
        atomic_write_text(path, result.model_dump_json())
        return path

    def adopt(self, result_file: Path) -> Path:
        """Move a result file the worker wrote into the spool (a rename; validates it first).

        Raises ``pydantic.ValidationError`` when the file is not a ``JobResult``.
        """
        result = JobResult.model_validate_json(Path(result_file).read_text(encoding="utf-8"))
        path = self.path_for(result)
        os.replace(result_file, path)
        return path

    def pending(self) -> list[Path]:
        """Pending result files, oldest first."""
        files = [p for p in self.root.glob("*.json") if p.is_file()]
        return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))

    @staticmethod
    def load(path: Path) -> JobResult:
        """Read a spooled result. Raises ``pydantic.ValidationError`` for a corrupt file."""
        return JobResult.model_validate_json(Path(path).read_text(encoding="utf-8"))

    @staticmethod
    def done(path: Path) -> None:
        """The server acknowledged ``path``: remove it."""
        Path(path).unlink(missing_ok=True)

    def reject(self, path: Path, reason: str) -> Path:
        """The server refused ``path`` for good: keep it under ``rejected/`` with ``reason``."""
        self.rejected_dir.mkdir(parents=True, exist_ok=True)
        target = self.rejected_dir / Path(path).name
        atomic_write_text(target.with_name(target.name + ".reason.txt"), reason + "\n")
        os.replace(path, target)
        return target
