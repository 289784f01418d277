"""The one ``JobResult`` envelope (``kernelab.runners.job.job_result``) of both kinds of job:
``run_job`` (in-process and child-process cells) and ``run_revision_job`` (worker per revision).

The envelope's fields are checked on the builder itself; that every job kind builds its result
through it is read from the source of ``kernelab.runners`` (a second ``JobResult(...)`` there is
a second envelope that can drift from the first). The slow revision-pipeline test
(``tests/runners/test_revision_pipeline.py``) runs both kinds and compares their envelopes."""

from __future__ import annotations

import ast
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

import kernelab.runners
from kernelab.runners.job import job_result
from kernelab.service.contract.schemas import RESULT_SCHEMA_VERSION, CellResult, JobResult
from tests.web.web_factory import T0, make_result

RUNNERS = Path(kernelab.runners.__file__).resolve().parent
BUILDER = ("job.py", "job_result")
JOB_KINDS = {("job.py", "run_job"), ("revision_job.py", "run_revision_job")}


def _built(**changes: object) -> JobResult:
    parts = make_result(job_id=7)
    fields: dict[str, object] = {
        "job_id": parts.job_id,
        "idempotency_key": None,
        "node": parts.node,
        "timer": parts.timer,
        "started_at": parts.started_at,
        "cells": parts.cells,
        "probes": parts.probes,
    }
    fields.update(changes)
    return job_result(parts.spec, **fields)  # type: ignore[arg-type]


def test_the_envelope_holds_what_the_job_measured_and_when() -> None:
    parts = make_result(job_id=7)
    before = datetime.now(UTC)
    result = _built()
    assert result.model_dump(exclude={"idempotency_key", "finished_at"}) == parts.model_dump(
        exclude={"idempotency_key", "finished_at"}
    )  # spec, node, timer, started_at, cells, probes as given; no error; the current schema
    assert result.schema_version == RESULT_SCHEMA_VERSION
    assert result.error is None
    assert before <= result.finished_at <= datetime.now(UTC) and result.finished_at.tzinfo is not None
    assert JobResult.model_validate_json(result.model_dump_json()) == result


def test_the_idempotency_key_is_fresh_unless_given() -> None:
    first, second = _built().idempotency_key, _built().idempotency_key
    assert re.fullmatch(r"[0-9a-f]{32}", first) and re.fullmatch(r"[0-9a-f]{32}", second)
    assert first != second  # a retried post of one result reuses its key; two results never share one
    assert _built(idempotency_key="runner-key-0001").idempotency_key == "runner-key-0001"
    with pytest.raises(ValidationError, match="idempotency_key"):
        _built(idempotency_key="short")


def test_every_cell_failing_is_the_jobs_error_and_one_success_is_not() -> None:
    cells = make_result().cells
    failed = [CellResult(index=c.index, params=c.params, error=f"boom {c.index}") for c in cells]
    assert _built(cells=failed).error == f"all {len(cells)} cells failed; first: boom 0"
    assert _built(cells=[*failed[:-1], cells[-1]]).error is None
    assert _built(cells=[]).error is None


def test_a_naive_start_time_is_refused() -> None:
    with pytest.raises(ValidationError, match="started_at"):
        _built(started_at=(T0 + timedelta(seconds=1)).replace(tzinfo=None))


def _functions_calling(name: str) -> set[tuple[str, str]]:
    """``(file, top-level function)`` of ``kernelab.runners`` whose body calls ``name(...)``."""
    found = set()
    for path in sorted(RUNNERS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for top in tree.body:
            for node in ast.walk(top):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                    where = top.name if isinstance(top, (ast.FunctionDef, ast.ClassDef)) else "<module>"
                    found.add((path.relative_to(RUNNERS).as_posix(), where))
    return found


def test_every_job_kind_builds_its_result_with_the_one_builder() -> None:
    assert _functions_calling("JobResult") == {BUILDER}, "a JobResult built outside job_result"
    assert _functions_calling("job_result") == JOB_KINDS
