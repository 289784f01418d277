"""HTTP client of kernelab's REST API (``/api/v1``), used by the runner daemon and the CLI.

Every call sends ``Authorization: Bearer <token>``. Failures are split in two:

* *transient* (the request may not have reached the server, or a proxy/server said "try again":
  connect errors, 502/503/504) are retried with bounded exponential backoff and full jitter
  (delay = uniform(0, min(max_backoff_s, backoff_s * 2**attempt)), the "full jitter" scheme of
  the AWS Architecture Blog, "Exponential Backoff and Jitter", 2015). When the retries are spent
  ``KernelabUnavailable`` is raised; the daemon spools results on it.
* *definite* answers (4xx, other 5xx) raise ``KernelabAPIError`` carrying the status code and the
  server's ``detail`` message.

A read timeout or a dropped connection after the request was sent is retried only for calls that
are safe to repeat (GETs, heartbeats, result posts carrying an idempotency key, probe posts);
``submit`` and ``claim`` are not repeated then, since a second submit would queue a second job and
a lost claim answer would hold a job under a lease nobody works on.
"""

from __future__ import annotations

import logging
import random
import time
from types import TracebackType
from typing import Any

import httpx
from pydantic import BaseModel

from service.schemas import (
    ClaimRequest,
    Comparison,
    Heartbeat,
    JobClaim,
    JobFailure,
    JobPublic,
    JobResult,
    JobsPage,
    JobSpec,
    NodeInfo,
    ProbeReport,
    ResultAccepted,
    RunnerIdentity,
    RunnerRegister,
    RunnerRegistered,
)

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
TRANSIENT_STATUS = frozenset({502, 503, 504})
TERMINAL_JOB_STATUS = frozenset({"succeeded", "failed", "cancelled"})  # a job in these never changes


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
    """The server could not be reached (or kept answering 502/503/504) after all retries."""


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
        connections). Raises ``KernelabAPIError`` for 4xx and non-transient 5xx answers,
        ``KernelabUnavailable`` once transient failures outlast the retries.
        """
        url = f"{API_PREFIX}{path}" if api else path
        timeout = self.timeout_s if timeout_s is None else timeout_s
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self._delay_s(attempt - 1)
                log.info("%s %s: %s; retry %d/%d in %.2f s", method, url, last, attempt, self.retries, delay)
                time.sleep(delay)
            try:
                resp = self._http.request(method, url, json=json, params=params, timeout=timeout)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                last = f"{type(exc).__name__}: {exc}"
                continue
            except httpx.UnsupportedProtocol as exc:  # a server URL without http(s)://: no retry helps
                raise KernelabUnavailable(f"server URL {self.base_url!r}: {exc}") from exc
            except httpx.TransportError as exc:
                if not idempotent:
                    raise KernelabUnavailable(
                        f"{method} {url}: {type(exc).__name__}: {exc} (not retried: not idempotent)"
                    ) from exc
                last = f"{type(exc).__name__}: {exc}"
                continue
            if resp.status_code in TRANSIENT_STATUS:
                last = f"HTTP {resp.status_code}"
                continue
            if resp.status_code >= 400:
                raise KernelabAPIError(resp.status_code, _detail_of(resp), method=method, path=url)
            return resp
        raise KernelabUnavailable(f"{method} {self.base_url}{url}: {last} (after {self.retries} retries)")

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

    def submit(self, spec: JobSpec | dict[str, Any]) -> JobPublic:
        """``POST /jobs``: queue a job. Raises ``KernelabAPIError`` (422 names the bad field)."""
        body = spec.model_dump(mode="json") if isinstance(spec, JobSpec) else spec
        return JobPublic.model_validate(self.request("POST", "/jobs", json=body, idempotent=False).json())

    def get_job(self, job_id: int) -> JobPublic:
        """``GET /jobs/{id}``. Raises ``KernelabAPIError`` 404 for an unknown id."""
        return JobPublic.model_validate(self.request("GET", f"/jobs/{job_id}", idempotent=True).json())

    def list_jobs(self, *, offset: int = 0, limit: int = 50) -> JobsPage:
        """``GET /jobs?offset=&limit=``: newest first, as the server orders them."""
        resp = self.request("GET", "/jobs", params={"offset": offset, "limit": limit}, idempotent=True)
        return JobsPage.model_validate(resp.json())

    def cancel(self, job_id: int) -> JobPublic:
        """``POST /jobs/{id}/cancel``."""
        resp = self.request("POST", f"/jobs/{job_id}/cancel", idempotent=True)
        return JobPublic.model_validate(resp.json())

    def comparison(self, job_id: int) -> Comparison:
        """``GET /jobs/{id}/comparison``. Raises ``KernelabAPIError`` 409 while there is no result."""
        resp = self.request("GET", f"/jobs/{job_id}/comparison", idempotent=True)
        return Comparison.model_validate(resp.json())

    def samples(self, job_id: int, *, fmt: str = "json") -> Any:
        """``GET /jobs/{id}/samples?format=json|csv``: decoded JSON, or CSV text."""
        resp = self.request("GET", f"/jobs/{job_id}/samples", params={"format": fmt}, idempotent=True)
        return resp.json() if fmt == "json" else resp.text

    def report_md(self, job_id: int) -> str:
        """``GET /jobs/{id}/report.md``: the comparison as Markdown."""
        return self.request("GET", f"/jobs/{job_id}/report.md", idempotent=True).text

    # ---------------------------------------------------------------------------------------------
    # runners (admin to register, per-runner token afterwards)

    def register(self, name: str, node: NodeInfo | None = None) -> RunnerRegistered:
        """``POST /runners/register`` (admin scope): a per-runner token, shown once."""
        body = _dump(RunnerRegister(name=name, node=node))
        return RunnerRegistered.model_validate(
            self.request("POST", "/runners/register", json=body, idempotent=False).json()
        )

    def whoami(self) -> RunnerIdentity:
        """``GET /runners/me`` (runner scope): the runner this client's token belongs to.
        Raises ``KernelabAPIError`` 401 (refused token) or 403 (not a runner token)."""
        return RunnerIdentity.model_validate(self.request("GET", "/runners/me", idempotent=True).json())

    @property
    def token(self) -> str | None:
        """The bearer token this client sends (never log it)."""
        return self._token

    def claim(self, *, wait_s: float = 0.0, lease_s: float = 120.0) -> JobClaim | None:
        """``POST /runners/claim``: long-poll up to ``wait_s`` s; ``None`` when nothing is queued (204)."""
        body = _dump(ClaimRequest(wait_s=wait_s, lease_s=lease_s))
        resp = self.request(
            "POST", "/runners/claim", json=body, idempotent=False, timeout_s=self.timeout_s + wait_s
        )
        if resp.status_code == 204 or not resp.content:
            return None
        return JobClaim.model_validate(resp.json())

    def heartbeat(self, job_id: int, *, lease_s: float = 120.0) -> None:
        """``POST /runners/jobs/{id}/heartbeat``: extend the lease by ``lease_s`` seconds.

        Raises ``KernelabAPIError`` with status 409 when the lease is lost (expired and re-queued,
        or the job was cancelled).
        """
        body = _dump(Heartbeat(lease_s=lease_s))
        self.request("POST", f"/runners/jobs/{job_id}/heartbeat", json=body, idempotent=True)

    def fail(self, job_id: int, error: str, *, retry: bool = False) -> None:
        """``POST /runners/jobs/{id}/fail``; ``error`` is cut to the schema's 20 000 characters."""
        body = _dump(JobFailure(error=error[-20_000:] or "unknown error", retry=retry))
        self.request("POST", f"/runners/jobs/{job_id}/fail", json=body, idempotent=True)

    def post_result(self, job_id: int, result: JobResult) -> ResultAccepted:
        """``POST /jobs/{id}/results``: idempotent through ``result.idempotency_key``.

        A repeated post answers ``duplicate=True`` with the first result's id.
        """
        resp = self.request("POST", f"/jobs/{job_id}/results", json=_dump(result), idempotent=True)
        return ResultAccepted.model_validate(resp.json())

    def post_probe(self, node_name: str, report: ProbeReport) -> None:
        """``POST /nodes/{name}/probes``: store a node-health reading."""
        self.request("POST", f"/nodes/{node_name}/probes", json=_dump(report), idempotent=True)

    def get_node(self, node_name: str) -> Any:
        """``GET /nodes/{name}``: the node with its recent probes, as decoded JSON."""
        return self.request("GET", f"/nodes/{node_name}", idempotent=True).json()

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
        return dict(self.request("POST", "/tokens", json=body, idempotent=False).json())

    def list_tokens(self, *, live_only: bool = False, page: int = 500) -> list[dict[str, Any]]:
        """``GET /tokens``, every page: all tokens newest first (``TokenPublic`` dicts, no secrets);
        ``live_only`` leaves out revoked ones."""
        params: dict[str, Any] = {"limit": page}
        if live_only:
            params["revoked"] = "false"
        rows: list[dict[str, Any]] = []
        while True:
            resp = self.request("GET", "/tokens", params={**params, "offset": len(rows)}, idempotent=True)
            answer = resp.json()
            rows += answer["data"]
            if not answer["data"] or len(rows) >= answer["count"]:
                return rows

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        """``POST /tokens/{id}/revoke`` (idempotent): the token's ``TokenPublic`` dict afterwards.

        Raises ``KernelabAPIError`` 404 for an unknown id, 409 for the caller's own token.
        """
        return dict(self.request("POST", f"/tokens/{token_id}/revoke", idempotent=True).json())


def _dump(model: BaseModel) -> Any:
    return model.model_dump(mode="json")


def _detail_of(resp: httpx.Response) -> str:
    try:
        return format_detail(resp.json())
    except ValueError:
        return resp.text.strip() or resp.reason_phrase
