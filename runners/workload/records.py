"""Reading what a run's ranks reported: the per-rank record files and the record lines of the run's
output (the line format: ``kernelab.workload``)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from kernelab.service.contract.schemas import WorkloadRecord
from kernelab.service.contract.schemas.workload import MAX_RUN_RECORDS

_RECORD = TypeAdapter(WorkloadRecord)
MAX_RECORDS_PER_RUN = MAX_RUN_RECORDS  # a run reporting more (a phase per micro-step of a long loop) is cut


def parse_line(line: str) -> dict[str, object] | None:
    """The record object of one line (the text from its first ``{``, so a ``[rank0]:`` prefix is
    allowed), or None when the line is no record (``"kernelab": 1`` missing, not JSON)."""
    start = line.find("{")
    if start < 0 or '"kernelab"' not in line:
        return None
    try:
        obj = json.loads(line[start:])
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("kernelab") != 1:
        return None
    return obj


def read_records(folder: Path | None, output: str) -> tuple[list[WorkloadRecord], int]:
    """The records of one run: every ``rank-*.jsonl`` file in ``folder`` (in rank order), then the
    record lines of ``output``; and how many record lines were malformed (a torn last line of a
    crashed rank, a field of the wrong type). At most ``MAX_RECORDS_PER_RUN`` records."""
    lines: list[str] = []
    if folder is not None:
        for path in sorted(folder.glob("rank-*.jsonl"), key=lambda p: p.stem):
            lines.extend(path.read_text(encoding="utf-8", errors="replace").splitlines())
    lines.extend(output.splitlines())
    out: list[WorkloadRecord] = []
    bad = 0
    for line in lines:
        obj = parse_line(line)
        if obj is None:
            bad += int(line.lstrip().startswith('{"kernelab"'))
            continue
        try:
            out.append(_RECORD.validate_python({k: v for k, v in obj.items() if k != "kernelab"}))
        except ValidationError:
            bad += 1
        if len(out) >= MAX_RECORDS_PER_RUN:
            break
    return out, bad


def bounded_log(text: str, max_bytes: int) -> str:
    """``text`` whole, or its first and last ``max_bytes / 2`` characters around a marker saying how
    much was left out (the start holds the command's set-up, the end its failure)."""
    if len(text) <= max_bytes:
        return text
    half = max_bytes // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters left out ...]\n{text[-half:]}"
