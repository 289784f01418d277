"""On-disk spool of measured results that have not reached the server yet.

Nothing measured is lost: the daemon moves every finished ``JobResult`` into the spool *before*
posting it and deletes the file only once the server has acknowledged it (201, or 200 with
``duplicate: true`` for a repeated idempotency key). A result the server refuses for good
(``REFUSED_FOR_GOOD``: 400, 404, 409, 413, 422) is moved to ``rejected/`` with the reason
beside it, so it is kept but not re-sent forever. Every other answer leaves it pending, to be
re-sent: 401/403 refuse the daemon's token, not the result; 5xx, 429 and the like, timeouts and
unreachable servers say "later".

A daemon that runs workload jobs keeps their ``WorkloadResult`` documents in a second spool of
the same kind (``<root>/workload/``, ``put_document``), flushed by the same loop and posted to
``POST /runners/jobs/{id}/workload-result`` (``kernelab.runners.daemon.workload``).

Layout under ``root``::

    <job_id>-<idempotency_key>.json       pending JobResult JSON
    rejected/<same name>                  refused by the server
    rejected/<same name>.reason.txt       the server's answer

A file is named from the claim it answers (``path_for(job_id, key)``: the job id and the
idempotency key the daemon made for that attempt, which holds the attempt number), never by
reading the result, and its bytes are posted as they are (``read``): the runner parses a result
once, at most (the ``held`` results the full disk could not take). Every file carries
``schema_version`` (``kernelab.service.contract.schemas.RESULT_SCHEMA_VERSION``): ``read`` checks it, and a
file of a newer version (written by a newer kernelab, then downgraded) is kept where it is, with
a log line, never posted or deleted (``NewerResultFile``); an older one is posted as it is (the
server reads every older version).

Files are written atomically (temp file in the same directory, fsync, ``os.replace``), so a crash
leaves either the old file or the new one, never half of one.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from pydantic import ValidationError

from kernelab.service.contract.schemas import RESULT_SCHEMA_VERSION, JobResult, ResultHeader

_SAFE = re.compile(r"[^A-Za-z0-9._-]")
_NAME = re.compile(r"^(\d+)-[A-Za-z0-9._-]+\.json$")
REFUSED_FOR_GOOD = frozenset({400, 404, 409, 413, 422})
"""HTTP statuses that refuse a posted result itself (malformed, unknown job, lease taken over or
key of another result, too large, does not fit its job): no retry changes the answer."""


class NewerResultFile(Exception):
    """A spooled file's ``schema_version`` is newer than this kernelab's ``RESULT_SCHEMA_VERSION``."""


class UnreadableResultFile(Exception):
    """A spooled file is not a ``JobResult`` document of a job this spool can name (not JSON, no
    ``schema_version`` of an integer, a name that is not ``<job_id>-<key>.json``)."""


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


def _header(data: bytes, path: Path) -> ResultHeader:
    try:
        return ResultHeader.model_validate_json(data)
    except ValidationError as exc:
        if any(e["type"] == "schema_version_newer" for e in exc.errors()):
            raise NewerResultFile(
                f"{Path(path).name}: schema_version is newer than this kernelab's "
                f"{RESULT_SCHEMA_VERSION}; kept (a newer kernelab posts it)"
            ) from None
        raise UnreadableResultFile(f"{Path(path).name}: {exc.errors()[0]['msg']}") from None


class Spool:
    """A directory of pending ``JobResult`` files (see the module docstring for the layout)."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.rejected_dir = self.root / "rejected"
        self.root.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"<Spool {self.root} pending={len(self.pending())}>"

    def path_for(self, job_id: int, key: str) -> Path:
        """Where the result of the claim ``(job_id, key)`` is spooled: one file per job and
        idempotency key (the daemon's key holds the attempt number)."""
        return self.root / f"{job_id}-{_SAFE.sub('_', key)}.json"

    def put(self, result: JobResult) -> Path:
        """Write ``result`` (a ``JobResult`` with a ``job_id``) into the spool atomically; return
        its path. The document carries ``schema_version``. Raises ``OSError`` (a full disk)."""
        assert result.job_id is not None, "a spooled result answers a claim"
        path = self.path_for(result.job_id, result.idempotency_key)
        atomic_write_text(path, result.model_dump_json())
        return path

    def put_document(self, job_id: int, key: str, text: str) -> Path:
        """Write a serialised result document of the claim ``(job_id, key)`` (JSON with
        ``schema_version`` and ``job_id``: a ``WorkloadResult`` in the workload spool) atomically;
        return its path. Raises ``OSError``."""
        path = self.path_for(job_id, key)
        atomic_write_text(path, text)
        return path

    def adopt(self, result_file: Path, *, job_id: int, key: str) -> Path:
        """Move a result file the worker wrote for the claim ``(job_id, key)`` into the spool: a
        rename, the file is not read. Raises ``OSError``."""
        path = self.path_for(job_id, key)
        os.replace(result_file, path)
        return path

    def pending(self) -> list[Path]:
        """Pending result files, oldest first."""
        files = [p for p in self.root.glob("*.json") if p.is_file()]
        return sorted(files, key=lambda p: (p.stat().st_mtime_ns, p.name))

    @staticmethod
    def job_id_of(path: Path) -> int:
        """The job id in a spooled file's name. Raises ``UnreadableResultFile`` for another name."""
        match = _NAME.match(Path(path).name)
        if match is None:
            raise UnreadableResultFile(f"{Path(path).name} is not named <job_id>-<key>.json")
        return int(match.group(1))

    @staticmethod
    def read(path: Path) -> tuple[int, bytes]:
        """``(job_id, document bytes)`` of a spooled file, to post unchanged. Reads only its
        ``schema_version`` (``ResultHeader``: other keys are not validated; the server does that).
        Raises ``NewerResultFile`` for a version newer than ``RESULT_SCHEMA_VERSION``,
        ``UnreadableResultFile`` for a file that is no such document, ``OSError``."""
        job_id = Spool.job_id_of(path)
        data = Path(path).read_bytes()
        header = _header(data, path)
        if header.job_id is not None and header.job_id != job_id:
            raise UnreadableResultFile(f"{Path(path).name} holds the result of job {header.job_id}")
        return job_id, data

    @staticmethod
    def load(path: Path) -> JobResult:
        """Read and validate a spooled result (every version up to ``RESULT_SCHEMA_VERSION``).
        Raises ``NewerResultFile`` for a newer version, ``pydantic.ValidationError`` for a
        corrupt file, ``OSError``."""
        data = Path(path).read_bytes()
        _header(data, path)
        return JobResult.model_validate_json(data)

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
