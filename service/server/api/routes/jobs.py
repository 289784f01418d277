"""``/jobs``: submit, list, read, cancel, and the read views of a job's result
(comparison JSON, raw samples as JSON or CSV, Markdown report)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, HTTPException, Query, Request, Response, status
from fastapi.responses import PlainTextResponse, StreamingResponse
from sqlalchemy.orm import Session

from kernelab.service.contract.schemas import (
    AtDoor,
    AttemptsPage,
    Comparison,
    HealthJudgements,
    JobPublic,
    JobsPage,
    JobStatus,
    Text,
    WorkloadComparison,
    WorkloadSpec,
)
from kernelab.service.server import crud, gangs, queue, sample_export, workload_store
from kernelab.service.server.api.deps import (
    DEFAULT_LIMIT,
    AdminToken,
    JobId,
    Limit,
    Offset,
    ReadToken,
    SessionDep,
    SessionFactoryDep,
    SettingsDep,
    SubmitToken,
    page_headers,
)
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.api.spec_body import JobSpecBody, SpecBodyRoute
from kernelab.service.server.core.config import Settings
from kernelab.service.server.downloads import DownloadSlots, SlotStreamingResponse, fetched

router = APIRouter(prefix="/jobs", tags=["jobs"], route_class=DoorRoute)

MAX_SAMPLE_PAGE = 1_000_000  # largest ?limit= of /jobs/{id}/samples


def submit_job(
    spec: JobSpecBody, principal: SubmitToken, session: SessionDep, settings: SettingsDep
) -> JobPublic:
    """Validate ``spec`` against its benchmark's advertised schema and queue it (422 naming the
    field if invalid; a side's ``source.repo`` in a refused form too:
    ``kernelab.service.contract.repo_address``; 413 for a body over ``KERNELAB_MAX_SPEC_BYTES``, decoded in
    a worker thread: ``kernelab.service.server.api.spec_body``).

    Nothing is imported: the schema is the one runners advertise, or the one that ships with the
    server for a built-in (``kernelab.service.server.offers.check_spec``). A benchmark no runner
    advertised is queued and waits (``waiting_for`` says so), or is a 422 on ``benchmark`` with
    ``KERNELAB_REQUIRE_OFFERED_BENCHMARK=true``.

    A workload spec (``kind: workload``, ``kernelab.service.contract.schemas.WorkloadSpec``) is checked for
    form only (its program is never imported) and queued for runners that run workloads
    (``kernelab.service.server.gangs``: ``launch.nnodes`` of them claim it together)."""
    if isinstance(spec, WorkloadSpec):
        job = gangs.submit(session, spec, max_attempts=settings.max_attempts, submitted_by=principal.token_id)
        return crud.job_public(session=session, job=job, alive_s=settings.runner_alive_s)
    accepted = crud.accept_spec(
        session=session, spec=spec, require_offered=settings.require_offered_benchmark
    )
    job = queue.submit(
        session, spec, max_attempts=settings.max_attempts, submitted_by=principal.token_id,
        needs_benchmark=accepted.needs_benchmark, schema_sha256=accepted.schema_sha256,
    )  # fmt: skip
    return crud.job_public(session=session, job=job, alive_s=settings.runner_alive_s)


router.add_api_route("", submit_job, methods=["POST"], status_code=status.HTTP_201_CREATED,
                     route_class_override=SpecBodyRoute)  # fmt: skip


@router.get("")
def list_jobs(
    request: Request,
    response: Response,
    _: ReadToken,
    session: SessionDep,
    settings: SettingsDep,
    offset: Offset = 0,
    limit: Limit = DEFAULT_LIMIT,
    status: JobStatus | None = None,
    benchmark: Annotated[Annotated[Text, AtDoor(max_length=500)] | None, Query()] = None,
) -> JobsPage:
    """Jobs, newest first, optionally filtered by status and benchmark. Headers ``X-Total-Count``
    and, while jobs remain, ``Link: <...>; rel="next"``."""
    page = crud.list_jobs(session=session, offset=offset, limit=limit, status=status, benchmark=benchmark,
                          alive_s=settings.runner_alive_s)  # fmt: skip
    response.headers.update(page_headers(request, total=page.count, offset=offset, limit=limit))
    return page


@router.get("/{job_id}")
def get_job(job_id: JobId, _: ReadToken, session: SessionDep, settings: SettingsDep) -> JobPublic:
    """One job (404 if unknown); ``waiting_for`` says why a queued job no live runner can take waits."""
    return crud.job_public(
        session=session, job=queue.get_job(session, job_id), alive_s=settings.runner_alive_s
    )


@router.get("/{job_id}/attempts")
def get_attempts(
    request: Request,
    response: Response,
    job_id: JobId,
    _: ReadToken,
    session: SessionDep,
    offset: Offset = 0,
    limit: Limit = DEFAULT_LIMIT,
) -> AttemptsPage:
    """The job's attempts (claims by runners) in order: attempt number, runner name (null if the
    runner was deleted), claimed/ended times, outcome and error. 404 if the job is unknown."""
    queue.get_job(session, job_id)
    page = crud.attempts_page(session=session, job_id=job_id, offset=offset, limit=limit)
    response.headers.update(page_headers(request, total=page.count, offset=offset, limit=limit))
    return page


@router.post("/{job_id}/cancel")
def cancel_job(job_id: JobId, principal: SubmitToken, session: SessionDep) -> JobPublic:
    """Cancel a queued or running job (409 if it already finished); submit scope, any job (tokens
    are a team's or a CI's, not a person's: ``docs/operations.md``, "Managing jobs"). The runner of
    a running job stops it at its next heartbeat (every ``kernelab runner --heartbeat-s``)."""
    by = f"token {principal.name!r}"
    return crud.job_public(session=session, job=queue.cancel(session, job_id, by=by))


def rerun_job(job_id: JobId, principal: SubmitToken, session: SessionDep, settings: SettingsDep) -> JobPublic:
    """Queue job ``job_id``'s stored spec again as a new job (``rerun_of`` names the original), in
    whatever status the original is; submit scope. The spec is checked as a submission is, against
    today's advertised schema (422 naming the field when it no longer fits); 404 for an unknown job."""
    # crud.rerun_job: the dashboard's Re-run button (kernelab.web.manage) calls it too
    return crud.rerun_job(session=session, job_id=job_id, submitted_by=principal.token_id, settings=settings)


router.add_api_route("/{job_id}/rerun", rerun_job, methods=["POST"], status_code=status.HTTP_201_CREATED)


COMPARING_RETRY_AFTER_S = 2  # Retry-After of a 409 while a compare worker computes the comparison


def _comparison_or_409(session: Session, job_id: int, settings: Settings) -> Comparison:
    """The job's stored comparison with node-health flags; 409 while there is none: no result yet,
    ``comparing`` (queued for or being computed by a compare worker, with ``Retry-After``), or
    ``comparison failed``. Never computes it (``kernelab.service.server.compare_worker`` does)."""
    from kernelab.service.server.node_health import job_comparison

    job = queue.get_job(session, job_id)
    stored = job_comparison(session=session, job_id=job_id, settings=settings)
    return _stored_or_409(job_id, job.status, stored.status, stored.error, stored.comparison)


T = TypeVar("T")


def _stored_or_409(job_id: int, job_status: str, state: str, error: str | None, stored: T | None) -> T:
    """``stored`` (a job's stored comparison); 409 while it is ``comparing`` (with
    ``Retry-After``), when it ``failed``, or while there is no result yet."""
    if state == "comparing":
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            f"job {job_id}: comparing: its result is stored and its comparison is being computed",
            headers={"Retry-After": str(COMPARING_RETRY_AFTER_S)},
        )
    if state == "failed":
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id}: comparison failed: {error}")
    if stored is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no result yet (status {job_status})")
    return stored


@router.get("/{job_id}/comparison")
def get_comparison(job_id: JobId, _: ReadToken, session: SessionDep, settings: SettingsDep) -> Comparison:
    """Per-cell statistics and verdicts of the job's result (409 while there is none, or while it
    is ``comparing``: ``JobPublic.comparison_status`` says which); flags
    ``degraded-node``/``contended`` and a note when the node's probes left its healthy band."""
    return _comparison_or_409(session, job_id, settings)


def _judgements_or_409(session: Session, job_id: int, settings: Settings) -> HealthJudgements:
    from kernelab.service.server import node_health

    job = queue.get_job(session, job_id)
    current = node_health.job_judgement(session=session, job_id=job_id, settings=settings)
    result_id = crud.result_id(session=session, job_id=job_id)
    if current is None or result_id is None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no result yet (status {job.status})")
    data = node_health.judgements(session=session, result_id=result_id)
    return HealthJudgements(current=current, data=data)


@router.get("/{job_id}/health")
def get_health(job_id: JobId, _: ReadToken, session: SessionDep, settings: SettingsDep) -> HealthJudgements:
    """The node-health judgements of the job's result, oldest first (409 while there is none):
    judged once against the node's and the fleet's bands as of the measurement (on the first read
    if the compare worker has not yet), then only by an explicit ``POST``."""
    return _judgements_or_409(session, job_id, settings)


@router.post("/{job_id}/health")
def rejudge_health(
    job_id: JobId, _: AdminToken, session: SessionDep, settings: SettingsDep
) -> HealthJudgements:
    """Judge the result's node health again (after a change of ``KERNELAB_HEALTH_*`` thresholds or
    rules), against the bands as of the measurement: a new judgement dated now, whose note names
    the one it replaces; the comparison, the report and the history follow it (409 without a
    result; admin scope)."""
    from kernelab.service.server import history, node_health

    _judgements_or_409(session, job_id, settings)
    node_health.judge(session=session, job_id=job_id, settings=settings, trigger="rejudge")
    history.build_points(session=session, job_id=job_id, settings=settings)
    return _judgements_or_409(session, job_id, settings)


def _workload_or_409(session: Session, job_id: int) -> WorkloadComparison:
    """The workload job's stored comparison; 404 for an unknown job, 409 for a benchmark job, while
    there is no result, while it is ``comparing`` (with ``Retry-After``), or when it failed."""
    job = queue.get_job(session, job_id)
    if job.kind != "workload":
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job {job_id} is a benchmark job: GET /jobs/{job_id}/comparison"
        )
    state = workload_store.comparison_state(session, job_id)
    return _stored_or_409(job_id, job.status, state.status, state.error, state.comparison)


@router.get("/{job_id}/workload")
def get_workload(job_id: JobId, _: ReadToken, session: SessionDep) -> WorkloadComparison:
    """A workload job's stored comparison (``kernelab.service.judge.workload_stats``, computed by a compare
    worker from every node's raw result): phase and metric verdicts with per-rank times, the
    consistency table, the timeline of runs with the probes between them. 409 while there is
    none (``JobPublic.comparison_status`` says why), or for a benchmark job; 404 for an unknown job."""
    return _workload_or_409(session, job_id)


@router.get("/{job_id}/report.md", response_class=PlainTextResponse)
def get_report(job_id: JobId, _: ReadToken, session: SessionDep, settings: SettingsDep) -> PlainTextResponse:
    """The comparison as Markdown, ready to paste into a pull request (409 while no result); a
    workload job's is ``kernelab.service.judge.workload_report.workload_markdown``."""
    from kernelab.service.judge.report import to_markdown

    if workload_store.is_workload_job(session, job_id):
        from kernelab.service.judge.workload_report import workload_markdown

        text = workload_markdown(_workload_or_409(session, job_id))
        return PlainTextResponse(text, media_type="text/markdown; charset=utf-8")
    markdown = to_markdown(_comparison_or_409(session, job_id, settings))
    return PlainTextResponse(markdown, media_type="text/markdown; charset=utf-8")


@router.get(
    "/{job_id}/cells",
    responses={200: {"content": {"text/csv": {}, "application/json": {}}},
               409: {"description": "no stored comparison yet (no result, comparing, or it failed)"}},
)  # fmt: skip
def get_cells(
    job_id: JobId, _: ReadToken, session: SessionDep, settings: SettingsDep,
    format: Literal["json", "csv"] = "json",
) -> Response:  # fmt: skip
    """The per-cell comparison as a table (``kernelab.service.judge.cell_table``): per cell its parameters,
    verdict and deciding reason, flags, medians, ratio with its CI, Δ % with its CI, the speedup in
    words, p-values, and each side's achieved GB/s and TFLOP/s with their share of the node's
    probed peaks. ``format=json``: an object with the job's peaks, fixed parameters, varying axes
    and ``cells``; ``format=csv``: one row per cell, ``param.NAME`` columns first
    (``cell_table.EXPORT_COLUMNS``). Read from the stored comparison with node-health flags; 409
    while there is none, as ``/comparison``."""
    from kernelab.service.judge import cell_table

    comparison = _comparison_or_409(session, job_id, settings)
    attachment = {"Content-Disposition": f'attachment; filename="job-{job_id}-cells.{format}"'}
    if format == "csv":
        return Response(cell_table.export_csv(comparison), media_type="text/csv; charset=utf-8",
                        headers=attachment)  # fmt: skip
    return Response(cell_table.export_json(comparison), media_type="application/json", headers=attachment)


DOWNLOAD_RETRY_AFTER_S = 5  # Retry-After of a 429 for a client already running its downloads


@router.get(
    "/{job_id}/samples",
    responses={200: {"content": {"text/csv": {}, "application/json": {}}},
               429: {"description": "this token already runs KERNELAB_DOWNLOADS_PER_CLIENT downloads"}},
)  # fmt: skip
def get_samples(
    request: Request,
    job_id: JobId,
    principal: ReadToken,
    session: SessionDep,
    factory: SessionFactoryDep,
    format: Literal["json", "csv"] = "json",
    offset: Offset = 0,
    limit: Annotated[int | None, Query(ge=1, le=MAX_SAMPLE_PAGE)] = None,
) -> StreamingResponse:
    """The raw samples of the job's result, streamed: a JSON array of objects or CSV with the
    columns ``crud.SAMPLE_COLUMNS`` (``params`` JSON-encoded; ``duration_ns`` per launch), in
    cell order then posting order. 409 while there is no result.

    Paginated: ``offset`` rows skipped, at most ``limit`` rows (all when omitted). Headers:
    ``X-Total-Count`` (samples of the job) and, while rows remain, an RFC 8288
    ``Link: <...>; rel="next"`` to the next page.

    The stream holds no database connection while the client reads (``kernelab.service.server.downloads``); a
    token runs at most ``KERNELAB_DOWNLOADS_PER_CLIENT`` downloads at once per server process,
    429 with ``Retry-After`` beyond."""
    job = queue.get_job(session, job_id)
    if not crud.has_result(session=session, job_id=job_id):
        raise HTTPException(status.HTTP_409_CONFLICT, f"job {job_id} has no result yet (status {job.status})")
    total = crud.count_samples(session=session, job_id=job_id)
    batches = crud.sample_batches(session=session, job_id=job_id, offset=offset, limit=limit)
    headers: dict[str, Any] = page_headers(request, total=total, offset=offset, limit=limit)
    parts = fetched(factory, batches, lambda s, batch: crud.read_sample_batch(session=s, batch=batch))
    if format == "csv":
        headers["Content-Disposition"] = f'attachment; filename="job-{job_id}-samples.csv"'
        chunks, media_type = sample_export.csv_chunks(parts), "text/csv"
    else:
        chunks, media_type = sample_export.json_chunks(parts), "application/json"
    slots: DownloadSlots = request.app.state.download_slots
    return SlotStreamingResponse(chunks, media_type=media_type, headers=headers, slots=slots,
                                 client=principal.token_id, retry_after_s=DOWNLOAD_RETRY_AFTER_S)  # fmt: skip
