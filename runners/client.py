"""HTTP client of kernelab's REST API (``/api/v1``), used by the runner daemon and the CLI.

Every call sends ``Authorization: Bearer <token>``. Failures are split in two:

* *definite* refusals, ``FINAL_STATUS`` (400, 401, 403, 404, 409, 413, 422: the request itself
  is wrong, or its job/lease/credential is), raise ``KernelabAPIError`` at once, carrying the
  status code and the server's ``detail`` message;
* everything else is *transient* and retried with bounded exponential backoff and full jitter
  (delay = uniform(0, min(max_backoff_s, backoff_s * 2**attempt)), the "full jitter" scheme of
  the AWS Architecture Blog, "Exponential Backoff and Jitter", 2015), at least the server's
  ``Retry-After`` seconds (capped at ``max_backoff_s``): any 5xx (a 503 while the database is
  down), any other 4xx (429, 408, a proxy's own answer), connect errors and pool timeouts, and a
  2xx whose body is not the expected JSON. When the retries are spent ``KernelabUnavailable``
  is raised (with ``status_code`` of the last answer, if any); the daemon spools results on it
  and tries again later.

A read timeout, a dropped connection after the request was sent, or a garbled success answer is
retried only for calls that are safe to repeat (GETs, heartbeats, result posts carrying an
idempotency key, probe posts); for ``submit`` and ``claim`` it raises ``KernelabUnavailable`` at
once, since a second submit would queue a second job and a lost claim answer holds a job under a
lease nobody works on (it expires; the job is re-queued).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from kernelab.service.contract.schemas import (
    STORED,
    BisectCreate,
    BisectFinish,
    BisectPublic,
    BisectStep,
    ClaimRequest,
    Comparison,
    GangSeat,
    Heartbeat,
    HistoryPage,
    JobClaim,
    JobFailure,
    JobProgress,
    JobPublic,
    JobResult,
    JobsPage,
    JobSpec,
    JobVsJob,
    NodeInfo,
    ProbeReport,
    RegressionsPage,
    ResultAccepted,
    RunnerAdverts,
    RunnerIdentity,
    RunnerRegister,
    RunnerRegistered,
    WorkloadAccepted,
    WorkloadComparison,
    WorkloadSpec,
)

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
FINAL_STATUS = frozenset({400, 401, 403, 404, 409, 413, 422})  # refusals no retry changes
TERMINAL_JOB_STATUS = frozenset({"succeeded", "failed", "cancelled"})  # a job in these never changes


def is_settled(job: JobPublic) -> bool:
    """True when ``job`` is finished (``TERMINAL_JOB_STATUS``) and its comparison is no longer being
    computed (``comparison_status`` is not ``comparing``): what it says will not change."""
    return job.status in TERMINAL_JOB_STATUS and job.comparison_status != "comparing"


class KernelabError(Exception):
    """Base of the client's errors."""


class KernelabAPIError(KernelabError):
    """The server answered with an error status.

    ``status_code`` is the HTTP status; ``detail`` the server's ``{"detail": ...}`` rendered as
    text (FastAPI's validation list becomes ``"loc.path: message"`` lines).
    """

    def __init__(self, status_code: int, detail: str, *, method: str = "", path: str = ""):
        super().__init__(f"{method} {path} -> HTTP {status_code}: {detail}".strip())
        self.status_code = status_code
        self.detail = detail
        self.method = method
        self.path = path


class KernelabUnavailable(KernelabError):
    """The server could not be reached, or kept failing (any answer outside ``FINAL_STATUS`` and
    2xx, or a garbled success answer), after all retries. ``status_code``: the last answer's
    HTTP status, None when none came."""

    def __init__(self, message: str, *, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


T = TypeVar("T")


def format_detail(body: Any) -> str:
    """Render a FastAPI error body as text.

    ``body`` is the decoded JSON (``{"detail": str | list[{"loc", "msg", ...}]}``) or raw text.
    Validation errors become one ``"a.b.c: message"`` line each, so the field is named.
    """
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):
        lines = []
        for err in detail:
            if isinstance(err, dict):
                loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body")
                lines.append(f"{loc}: {err.get('msg', err)}" if loc else str(err.get("msg", err)))
            else:
                lines.append(str(err))
        return "\n".join(lines)
    return str(detail)


class KernelabClient:
    """Synchronous client of one kernelab server.

    ``base_url`` is the server root (``http://host:8000``; ``/api/v1`` is added). ``token`` is a
    bearer token (admin, submit/read, or a per-runner token). ``timeout_s`` bounds each request
    (long-poll claims add their ``wait_s``). ``retries`` is the number of retries after the first
    attempt for transient failures, with delays capped at ``max_backoff_s`` seconds. ``transport``
    is passed to ``httpx.Client`` (e.g. ``httpx.ASGITransport`` to talk to an app in-process).

    The client holds a connection pool; close it with ``close()`` or use it as a context manager.
    It is safe to use from the daemon's heartbeat thread and main thread at once (httpx's
    ``Client`` is thread-safe).
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self._token = token
        self._transport = transport
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=self.timeout_s, transport=transport
        )

    # ---------------------------------------------------------------------------------------------
    # plumbing

    def __repr__(self) -> str:  # never show the token
        return f"<KernelabClient {self.base_url} token={'set' if self._token else 'none'}>"

    def __enter__(self) -> KernelabClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def with_token(self, token: str) -> KernelabClient:
        """A new client to the same server with another bearer token (same retry settings)."""
        return KernelabClient(
            self.base_url,
            token,
            timeout_s=self.timeout_s,
            retries=self.retries,
            backoff_s=self.backoff_s,
            max_backoff_s=self.max_backoff_s,
            transport=self._transport,
        )

    def _delay_s(self, attempt: int) -> float:
        return random.uniform(0.0, min(self.max_backoff_s, self.backoff_s * (2**attempt)))

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotent: bool,
        timeout_s: float | None = None,
        api: bool = True,
    ) -> httpx.Response:
        """Send one request with retries; return the (2xx/3xx) response.

        ``path`` is relative to ``/api/v1`` (or to the root with ``api=False``). ``idempotent``
        allows retrying after the request may have reached the server (read timeouts, dropped
        connections). Raises ``KernelabAPIError`` for a ``FINAL_STATUS`` answer,
        ``KernelabUnavailable`` once transient failures outlast the retries.
        """
        return self.call(method, path, lambda resp: resp, json=json, params=params, idempotent=idempotent,
                         timeout_s=timeout_s, api=api)  # fmt: skip

    def call(
        self,
        method: str,
        path: str,
        parse: Callable[[httpx.Response], T],
        *,
        json: Any = None,
        content: bytes | None = None,
        params: dict[str, Any] | None = None,
        idempotent: bool,
        timeout_s: float | None = None,
        api: bool = True,
    ) -> T:
        """``request`` that also turns the success answer into its value with ``parse``; a
        ``ValueError`` from it (not JSON, not the schema: pydantic's ``ValidationError`` is one)
        is a garbled answer, retried like a 503 when ``idempotent``. ``content``: a body already
        serialised as JSON, sent as it is (instead of ``json``)."""
        url = f"{API_PREFIX}{path}" if api else path
        timeout = self.timeout_s if timeout_s is None else timeout_s
        last: str = ""
        status: int | None = None
        wait_s = 0.0  # the last answer's Retry-After
        for attempt in range(self.retries + 1):
            if attempt:
                delay = max(self._delay_s(attempt - 1), min(wait_s, self.max_backoff_s))
                log.info("%s %s: %s; retry %d/%d in %.2f s", method, url, last, attempt, self.retries, delay)
                time.sleep(delay)
            try:
                resp = self._http.request(
                    method, url, json=json, content=content, params=params, timeout=timeout,
                    headers=None if content is None else _JSON_BODY,
                )  # fmt: skip
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                last, status, wait_s = f"{type(exc).__name__}: {exc}", None, 0.0
                continue
            except httpx.UnsupportedProtocol as exc:  # a server URL without http(s)://: no retry helps
                raise KernelabUnavailable(f"server URL {self.base_url!r}: {exc}") from exc
            except httpx.TransportError as exc:
                if not idempotent:
                    raise KernelabUnavailable(
                        f"{method} {url}: {type(exc).__name__}: {exc} (not retried: not idempotent)"
                    ) from exc
                last, status, wait_s = f"{type(exc).__name__}: {exc}", None, 0.0
                continue
            if resp.status_code in FINAL_STATUS:
                raise KernelabAPIError(resp.status_code, _detail_of(resp), method=method, path=url)
            status = resp.status_code
            if resp.status_code >= 400:
                last, wait_s = f"HTTP {resp.status_code}: {_detail_of(resp)[:200]}", _retry_after_s(resp)
                continue
            try:
                return parse(resp)
            except ValueError as exc:
                last, wait_s = f"HTTP {resp.status_code}, a body that is not the expected answer: {exc}", 0.0
                if not idempotent:
                    raise KernelabUnavailable(f"{method} {url}: {last} (not retried: not idempotent)",
                                              status_code=status) from exc  # fmt: skip
        raise KernelabUnavailable(
            f"{method} {self.base_url}{url}: {last} (after {self.retries} retries)", status_code=status
        )

    # ---------------------------------------------------------------------------------------------
    # server

    def healthz(self) -> bool:
        """True when ``GET /healthz`` answers 2xx right now (no retries)."""
        try:
            return self._http.get("/healthz", timeout=min(self.timeout_s, 5.0)).is_success
        except httpx.TransportError:
            return False

    # ---------------------------------------------------------------------------------------------
    # jobs (submit/read scopes)

    def submit(self, spec: JobSpec | WorkloadSpec | dict[str, Any]) -> JobPublic:
        """``POST /jobs``: queue a job (a benchmark's or a workload's). Raises ``KernelabAPIError``
        (422 names the bad field)."""
        body = spec.model_dump(mode="json") if isinstance(spec, JobSpec | WorkloadSpec) else spec
        return self.call("POST", "/jobs", _model(JobPublic), json=body, idempotent=False)

    def get_job(self, job_id: int) -> JobPublic:
        """``GET /jobs/{id}``. Raises ``KernelabAPIError`` 404 for an unknown id."""
        return self.call("GET", f"/jobs/{job_id}", _model(JobPublic), idempotent=True)

    def list_jobs(
        self, *, offset: int = 0, limit: int = 50, status: str | None = None, benchmark: str | None = None
    ) -> JobsPage:
        """``GET /jobs?offset=&limit=&status=&benchmark=``: newest first, as the server orders them."""
        params: dict[str, Any] = {"offset": offset, "limit": limit}
        params.update({k: v for k, v in (("status", status), ("benchmark", benchmark)) if v is not None})
        return self.call("GET", "/jobs", _model(JobsPage), params=params, idempotent=True)

    def cancel(self, job_id: int) -> JobPublic:
        """``POST /jobs/{id}/cancel``. Raises ``KernelabAPIError`` 409 for a finished job."""
        return self.call("POST", f"/jobs/{job_id}/cancel", _model(JobPublic), idempotent=True)

    def rerun(self, job_id: int) -> JobPublic:
        """``POST /jobs/{id}/rerun``: the job's spec queued again as a new job (``rerun_of``)."""
        return self.call("POST", f"/jobs/{job_id}/rerun", _model(JobPublic), idempotent=False)

    # ---------------------------------------------------------------------------------------------
    # bisects (submit scope to write, read to read)

    def create_bisect(self, body: BisectCreate) -> BisectPublic:
        """``POST /bisects``: record a new bisect."""
        return self.call("POST", "/bisects", _model(BisectPublic), json=_dump(body), idempotent=False)

    def add_bisect_step(self, bisect_id: int, step: BisectStep) -> BisectPublic:
        """``POST /bisects/{id}/steps``: append a judged step."""
        path = f"/bisects/{bisect_id}/steps"
        return self.call("POST", path, _model(BisectPublic), json=_dump(step), idempotent=False)

    def finish_bisect(self, bisect_id: int, body: BisectFinish) -> BisectPublic:
        """``POST /bisects/{id}/finish``: found, or stopped with the reason."""
        path = f"/bisects/{bisect_id}/finish"
        return self.call("POST", path, _model(BisectPublic), json=_dump(body), idempotent=False)

    def get_bisect(self, bisect_id: int) -> BisectPublic:
        """``GET /bisects/{id}``."""
        return self.call("GET", f"/bisects/{bisect_id}", _model(BisectPublic), idempotent=True)

    def wait(self, job_id: int, *, timeout_s: float = 3600.0, poll_s: float = 0.5) -> JobPublic:
        """Poll ``GET /jobs/{id}`` every ``poll_s`` seconds until the job ``is_settled`` (finished, its
        comparison computed: ``comparison`` then answers without 409 for a succeeded job) and return
        it. Raises ``TimeoutError`` naming the job's state after ``timeout_s`` seconds, and what
        ``get_job`` raises (``KernelabAPIError`` 404 for an unknown job)."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get_job(job_id)
            if is_settled(job):
                return job
            if time.monotonic() > deadline:
                state = "comparing" if job.comparison_status == "comparing" else job.status
                raise TimeoutError(f"job {job_id} still {state} after {timeout_s:g} s")
            time.sleep(poll_s)

    def comparison(self, job_id: int) -> Comparison:
        """``GET /jobs/{id}/comparison``. Raises ``KernelabAPIError`` 409 while there is no result."""
        return self.call("GET", f"/jobs/{job_id}/comparison", _model(Comparison), idempotent=True)

    def samples(self, job_id: int, *, fmt: str = "json") -> Any:
        """``GET /jobs/{id}/samples?format=json|csv``: decoded JSON, or CSV text."""
        parse: Callable[[httpx.Response], Any] = _json if fmt == "json" else _text
        return self.call("GET", f"/jobs/{job_id}/samples", parse, params={"format": fmt}, idempotent=True)

    def report_md(self, job_id: int) -> str:
        """``GET /jobs/{id}/report.md``: the comparison as Markdown."""
        return self.request("GET", f"/jobs/{job_id}/report.md", idempotent=True).text

    def history(
        self, benchmark: str, *, cell: list[str] | None = None, gpu_model: str | None = None,
        include_excluded: bool = False, limit: int = 50,
    ) -> HistoryPage:  # fmt: skip
        """``GET /history``: ``benchmark``'s lines with CIs and change points; ``cell`` (``k=v``
        items) and ``gpu_model`` keep matching lines. Raises ``KernelabAPIError`` (422 names the field)."""
        params: dict[str, Any] = {
            "benchmark": benchmark,
            "include_excluded": include_excluded,
            "limit": limit,
        }
        if cell:
            params["cell"] = cell
        if gpu_model is not None:
            params["gpu_model"] = gpu_model
        return self.call("GET", "/history", _model(HistoryPage), params=params, idempotent=True)

    def regressions(self, *, limit: int = 100) -> RegressionsPage:
        """``GET /history/regressions``: the fleet's lines whose latest change made them slower."""
        return self.call("GET", "/history/regressions", _model(RegressionsPage), params={"limit": limit},
                         idempotent=True)  # fmt: skip

    def compare_jobs(self, a: int, b: int, *, side: str = "candidate", wait_s: float = 600.0) -> JobVsJob:
        """``GET /compare?a=&b=``: job ``b`` against job ``a`` cell by cell. A pair the server
        queued for a compare worker (202) is asked again after its ``Retry-After`` until the answer
        comes, for up to ``wait_s`` seconds; then ``TimeoutError``. Raises ``KernelabAPIError``
        (404 unknown job, 409 no comparison yet or the worker failed on the pair, 422)."""
        deadline = time.monotonic() + wait_s
        while True:
            answer, retry_s = self.call("GET", "/compare", _pair_answer,
                                        params={"a": a, "b": b, "side": side}, idempotent=True)  # fmt: skip
            if answer is not None:
                return answer
            if time.monotonic() + retry_s > deadline:
                raise TimeoutError(f"job #{b} against job #{a}: still being compared after {wait_s:g} s")
            time.sleep(retry_s)

    # ---------------------------------------------------------------------------------------------
    # runners (admin to register, per-runner token afterwards)

    def register(self, name: str, node: NodeInfo | None = None) -> RunnerRegistered:
        """``POST /runners/register`` (admin scope): a per-runner token, shown once."""
        body = _dump(RunnerRegister(name=name, node=node))
        return self.call("POST", "/runners/register", _model(RunnerRegistered), json=body, idempotent=False)

    def whoami(self) -> RunnerIdentity:
        """``GET /runners/me`` (runner scope): the runner this client's token belongs to.
        Raises ``KernelabAPIError`` 401 (refused token) or 403 (not a runner token)."""
        return self.call("GET", "/runners/me", _model(RunnerIdentity), idempotent=True)

    @property
    def token(self) -> str | None:
        """The bearer token this client sends (never log it)."""
        return self._token

    def claim(
        self, *, wait_s: float = 0.0, lease_s: float = 120.0, benchmarks: RunnerAdverts | None = None,
        benchmarks_sha256: str | None = None, workloads: bool = False, rdzv_endpoint: str | None = None,
    ) -> JobClaim | None:  # fmt: skip
        """``POST /runners/claim``: long-poll up to ``wait_s`` s; ``None`` when nothing is queued (204).

        ``benchmarks``: the runner's advertisement, sent whole; ``benchmarks_sha256``: only its
        digest (a server that does not hold it answers 409 ``advert_required``:
        ``KernelabAPIError``). Neither: the server routes any job here. ``workloads``: this runner
        runs workload jobs (a claim may answer a gang seat, ``JobClaim.gang``); ``rdzv_endpoint``:
        the ``host:port`` it would host a rendezvous on as node rank 0."""
        digest = None if benchmarks is not None else benchmarks_sha256
        request = ClaimRequest(
            wait_s=wait_s, lease_s=lease_s, benchmarks=benchmarks, benchmarks_sha256=digest,
            workloads=workloads, rdzv_endpoint=rdzv_endpoint,
        )  # fmt: skip
        body = request.model_dump(mode="json", exclude_none=True)
        return self.call("POST", "/runners/claim", _claim_answer, json=body, idempotent=False,
                         timeout_s=self.timeout_s + wait_s)  # fmt: skip

    def heartbeat(
        self, job_id: int, *, lease_s: float = 120.0, timeout_s: float | None = None,
        progress: JobProgress | None = None,
    ) -> None:  # fmt: skip
        """``POST /runners/jobs/{id}/heartbeat``: extend the lease by ``lease_s`` seconds (from the
        server's database clock) and store ``progress`` (None: keep the last). ``timeout_s``
        bounds each try (default: the client's).

        Raises ``KernelabAPIError`` with status 409 when the lease is lost (re-queued after it
        expired, or the job was cancelled).
        """
        path = f"/runners/jobs/{job_id}/heartbeat"
        body = Heartbeat(lease_s=lease_s, progress=progress).model_dump(mode="json", exclude_none=True)
        self.request("POST", path, json=body, idempotent=True, timeout_s=timeout_s)

    def fail(self, job_id: int, error: str, *, retry: bool = False) -> None:
        """``POST /runners/jobs/{id}/fail``; ``error`` is cut to the schema's 20 000 characters."""
        body = _dump(JobFailure(error=error[-20_000:] or "unknown error", retry=retry))
        self.request("POST", f"/runners/jobs/{job_id}/fail", json=body, idempotent=True)

    def post_result(self, job_id: int, result: JobResult) -> ResultAccepted:
        """``POST /jobs/{id}/results``: idempotent through ``result.idempotency_key``.

        A repeated post answers ``duplicate=True`` with the first result's id.
        """
        return self.post_result_json(job_id, result.model_dump_json().encode())

    def post_result_json(self, job_id: int, body: bytes) -> ResultAccepted:
        """``post_result`` of a ``JobResult`` document already serialised (a spooled file's bytes,
        sent unchanged: the runner neither parses nor re-serialises it; the server validates it)."""
        path = f"/jobs/{job_id}/results"
        return self.call("POST", path, _model(ResultAccepted), content=body, idempotent=True)

    def keep_seat(self, job_id: int, *, lease_s: float = 120.0) -> GangSeat:
        """``POST /runners/jobs/{id}/gang``: keep this runner's seat in a workload job and read the
        gang (``ready``, the rendezvous ``endpoint``). Raises ``KernelabAPIError`` 409 when the seat
        is gone (the gathering timed out, the attempt ended)."""
        body = Heartbeat(lease_s=lease_s).model_dump(mode="json", exclude_none=True)
        return self.call("POST", f"/runners/jobs/{job_id}/gang", _model(GangSeat), json=body, idempotent=True)

    def post_workload_json(self, job_id: int, body: bytes) -> WorkloadAccepted:
        """``POST /runners/jobs/{id}/workload-result`` of a serialised ``WorkloadResult`` (a spooled
        file's bytes, sent unchanged); idempotent through its ``idempotency_key``."""
        path = f"/runners/jobs/{job_id}/workload-result"
        return self.call("POST", path, _model(WorkloadAccepted), content=body, idempotent=True)

    def workload(self, job_id: int) -> WorkloadComparison:
        """``GET /jobs/{id}/workload``: a workload job's stored comparison (409 while there is none)."""
        return self.call("GET", f"/jobs/{job_id}/workload", _model(WorkloadComparison), idempotent=True)

    def post_probe(self, node_name: str, report: ProbeReport) -> None:
        """``POST /nodes/{name}/probes``: store a node-health reading."""
        self.request("POST", f"/nodes/{node_name}/probes", json=_dump(report), idempotent=True)

    def get_node(self, node_name: str) -> Any:
        """``GET /nodes/{name}``: the node with its recent probes, as decoded JSON."""
        return self.call("GET", f"/nodes/{node_name}", _json, idempotent=True)

    # ---------------------------------------------------------------------------------------------
    # tokens (admin scope)

    def create_token(self, name: str, scopes: list[str]) -> dict[str, Any]:
        """``POST /tokens``: issue a token with ``scopes`` ("read", "submit", "admin").

        Returns the decoded ``TokenIssued``: ``id``, ``name``, ``scopes``, ``runner_id``,
        ``created_at``, ``revoked_at`` and ``token``, the plain secret, which the server never
        shows again. Raises ``KernelabAPIError`` (401/403 without an admin token, 422 for a bad
        name or scope).
        """
        body = {"name": name, "scopes": scopes}
        return self.call("POST", "/tokens", _json_object, json=body, idempotent=False)

    def list_tokens(self, *, live_only: bool = False, page: int = 500) -> list[dict[str, Any]]:
        """``GET /tokens``, every page: all tokens newest first (``TokenPublic`` dicts, no secrets);
        ``live_only`` leaves out revoked ones."""
        params: dict[str, Any] = {"limit": page}
        if live_only:
            params["revoked"] = "false"
        rows: list[dict[str, Any]] = []
        while True:
            query = {**params, "offset": len(rows)}
            answer = self.call("GET", "/tokens", _json_object, params=query, idempotent=True)
            rows += answer["data"]
            if not answer["data"] or len(rows) >= answer["count"]:
                return rows

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        """``POST /tokens/{id}/revoke`` (idempotent): the token's ``TokenPublic`` dict afterwards.

        Raises ``KernelabAPIError`` 404 for an unknown id, 409 for the caller's own token.
        """
        return self.call("POST", f"/tokens/{token_id}/revoke", _json_object, idempotent=True)


_JSON_BODY = {"Content-Type": "application/json"}


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


M = TypeVar("M", bound=BaseModel)


def _model(model: type[M]) -> Callable[[httpx.Response], M]:
    """A ``parse`` for ``KernelabClient.call``: the body as ``model`` (``ValidationError``, a
    ``ValueError``, when it is not), read as stored data is (``read_stored``): an answer holds
    what the server stored, which the server's door bounded, not this client's, and a field a newer
    server adds is ignored. (A claim is read with ``STORED`` alone: a spec field this runner does
    not know refuses the claim, for the runner would not measure what was asked.)"""
    return lambda resp: model.model_validate_json(resp.content, context=STORED, extra="ignore")


def _pair_answer(resp: httpx.Response) -> tuple[JobVsJob | None, float]:
    """``GET /compare``'s answer: (the job-vs-job answer, 0) on 200; (None, Retry-After s) on 202."""
    if resp.status_code == 202:
        return None, max(0.1, _retry_after_s(resp))
    return _model(JobVsJob)(resp), 0.0


def _json(resp: httpx.Response) -> Any:
    return resp.json()  # json.JSONDecodeError is a ValueError


def _json_object(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    if not isinstance(body, dict):
        raise ValueError(f"expected a JSON object, got {type(body).__name__}")
    return body


def _claim_answer(resp: httpx.Response) -> JobClaim | None:
    if resp.status_code == 204 or not resp.content:
        return None
    return JobClaim.model_validate_json(resp.content, context=STORED)


def _text(resp: httpx.Response) -> str:
    return resp.text


def _retry_after_s(resp: httpx.Response) -> float:
    """The answer's ``Retry-After`` in seconds (RFC 9110 delay-seconds form; 0 when absent or
    an HTTP date)."""
    value = resp.headers.get("Retry-After", "").strip()
    return float(value) if value.isdigit() else 0.0


def _detail_of(resp: httpx.Response) -> str:
    try:
        return format_detail(resp.json())
    except ValueError:
        return resp.text.strip() or resp.reason_phrase
