"""``/jobs``: submit, list, read, cancel, and the read views of a job's result
(comparison JSON, raw samples as JSON or CSV, Markdown report)."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, status
from fastapi.responses import PlainTextResponse, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker

from kernels import validate_spec
from service import crud, queue
from service.api.deps import ReadToken, SessionDep, SessionFactoryDep, SettingsDep, SubmitToken
from service.api.errors import SpecInvalidError
from service.schemas import Comparison, JobPublic, JobResult, JobsPage, JobSpec, JobStatus

router = APIRouter(prefix="/jobs", tags=["jobs"])

MAX_PAGE = 500  # largest ?limit= of a list
_STREAM_ROWS = 2000  # sample rows per streamed chunk


@router.post("", status_code=status.HTTP_201_CREATED)
def submit_job(
    spec: JobSpec, principal: SubmitToken, session: SessionDep, settings: SettingsDep
) -> JobPublic:
    """Validate ``spec`` against its benchmark and queue it (422 naming the field if invalid)."""
    errors = validate_spec(spec)
    if errors:
        raise SpecInvalidError(errors)
    job = queue.submit(session, spec, max_attempts=settings.max_attempts, submitted_by=principal.token_id)
    return crud.job_public(session=session, job=job)


@router.get("")
def list_jobs(
    _: ReadToken,
    session: SessionDep,
    offset: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    status: JobStatus | None = None,
    benchmark: str | None = None,
) -> JobsPage:
    """Jobs, newest first, optionally filtered by status and benchmark."""
    return crud.list_jobs(session=session, offset=offset, limit=limit, status=status, benchmark=benchmark)


@router.get("/{job_id}")
def get_job(job_id: int, _: ReadToken, session: SessionDep) -> JobPublic:
    """One job (404 if unknown)."""
    return crud.job_public(session=session, job=queue.get_job(session, job_id))


@router.post("/{job_id}/cancel")
def cancel_job(job_id: int, _: SubmitToken, session: SessionDep) -> JobPublic:
    """Cancel a queued or running job (409 if it already finished)."""
    return crud.job_public(session=session, job=queue.cancel(session, job_id))


def _result_or_409(session: Session, job_id: int) -> JobResult:
    job = queue.get_job(session, job_id)
    result = crud.load_result(session=session, job_id=job_id)
    if result is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no result yet (status {job.status})")
    return result


@router.get("/{job_id}/comparison")
def get_comparison(job_id: int, _: ReadToken, session: SessionDep) -> Comparison:
    """Per-cell statistics and verdicts of the job's result (409 while there is none)."""
    from service.stats import compare

    return compare(_result_or_409(session, job_id), job_id=job_id)


@router.get("/{job_id}/report.md", response_class=PlainTextResponse)
def get_report(job_id: int, _: ReadToken, session: SessionDep) -> PlainTextResponse:
    """The comparison as Markdown, ready to paste into a pull request (409 while no result)."""
    from service.report import to_markdown
    from service.stats import compare

    markdown = to_markdown(compare(_result_or_409(session, job_id), job_id=job_id))
    return PlainTextResponse(markdown, media_type="text/markdown; charset=utf-8")


def _csv_chunks(factory: sessionmaker[Session], job_id: int) -> Iterator[str]:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=crud.SAMPLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    with factory() as session:
        for i, row in enumerate(crud.iter_sample_rows(session=session, job_id=job_id), 1):
            writer.writerow({**row, "params": json.dumps(row["params"], sort_keys=True)})
            if i % _STREAM_ROWS == 0:
                yield buf.getvalue()
                buf.seek(0)
                buf.truncate()
    yield buf.getvalue()


def _json_chunks(factory: sessionmaker[Session], job_id: int) -> Iterator[str]:
    yield "["
    parts: list[str] = []
    first = True
    with factory() as session:
        for row in crud.iter_sample_rows(session=session, job_id=job_id):
            parts.append(("" if first else ",") + json.dumps(row, allow_nan=False))
            first = False
            if len(parts) >= _STREAM_ROWS:
                yield "".join(parts)
                parts.clear()
    yield "".join(parts) + "]"


@router.get("/{job_id}/samples", responses={200: {"content": {"text/csv": {}, "application/json": {}}}})
def get_samples(
    job_id: int,
    _: ReadToken,
    session: SessionDep,
    factory: SessionFactoryDep,
    format: Literal["json", "csv"] = "json",
) -> StreamingResponse:
    """Every raw sample of the job's result, streamed: a JSON array of objects or CSV with the
    columns ``crud.SAMPLE_COLUMNS`` (``params`` JSON-encoded; ``duration_ns`` per launch).
    409 while there is no result."""
    job = queue.get_job(session, job_id)
    if not crud.has_result(session=session, job_id=job_id):
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no result yet (status {job.status})")
    headers: dict[str, Any] = {}
    if format == "csv":
        headers["Content-Disposition"] = f'attachment; filename="job-{job_id}-samples.csv"'
        return StreamingResponse(_csv_chunks(factory, job_id), media_type="text/csv", headers=headers)
    return StreamingResponse(_json_chunks(factory, job_id), media_type="application/json")
