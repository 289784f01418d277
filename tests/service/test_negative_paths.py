"""One shared helper checks every endpoint's negative paths: no token -> 401 with
``WWW-Authenticate: Bearer``; a bad token -> 401; unknown id -> 404 with a message; an extra
field in a strict body -> 422 naming it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from factories import job_result, probe_report, spec_dict
from fastapi.routing import APIRoute, iter_route_contexts

UNKNOWN_ID = 987654


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # "{id}" is replaced by a job id
    scope: str  # "read" | "submit" | "admin" | "runner"
    body: dict[str, Any] | None = None
    has_id: bool = True
    strict_body: bool = field(default=False)


def _bodies() -> dict[str, dict[str, Any]]:
    return {
        "spec": spec_dict(),
        "result": job_result(UNKNOWN_ID).model_dump(mode="json"),
        "probe": probe_report().model_dump(mode="json"),
        "bisect": {"repo": "/r", "good": "aaaa", "bad": "bbbb", "good_ref": "v1", "bad_ref": "main",
                   "commits": [{"sha": "bbbb"}], "spec": spec_dict()},
        "step": {"job_id": 1, "commit": "bbbb", "outcome": "good"},
        "workload": {"idempotency_key": "negative-paths", "runs": [],
                     "node": {"hostname": "node-a", "device_type": "cpu"},
                     "spec": {"kind": "workload", "baseline": {"command": ["a.py"]},
                              "candidate": {"command": ["b.py"]}}},
    }  # fmt: skip


ENDPOINTS = [
    Endpoint("POST", "/api/v1/jobs", "submit", _bodies()["spec"], has_id=False, strict_body=True),
    Endpoint("GET", "/api/v1/jobs", "read", has_id=False),
    Endpoint("GET", "/api/v1/jobs/{id}", "read"),
    Endpoint("GET", "/api/v1/jobs/{id}/comparison", "read"),
    Endpoint("GET", "/api/v1/jobs/{id}/samples", "read"),
    Endpoint("GET", "/api/v1/jobs/{id}/cells", "read"),
    Endpoint("GET", "/api/v1/jobs/{id}/report.md", "read"),
    Endpoint("POST", "/api/v1/jobs/{id}/cancel", "submit"),
    Endpoint("POST", "/api/v1/jobs/{id}/rerun", "submit"),
    Endpoint("POST", "/api/v1/bisects", "submit", _bodies()["bisect"], has_id=False, strict_body=True),
    Endpoint("GET", "/api/v1/bisects", "read", has_id=False),
    Endpoint("GET", "/api/v1/bisects/{id}", "read"),
    Endpoint("POST", "/api/v1/bisects/{id}/steps", "submit", _bodies()["step"], strict_body=True),
    Endpoint("POST", "/api/v1/bisects/{id}/finish", "submit", {"status": "stopped"}, strict_body=True),
    Endpoint("POST", "/api/v1/jobs/{id}/results", "runner", _bodies()["result"]),
    Endpoint("POST", "/api/v1/runners/register", "admin", {"name": "n"}, has_id=False, strict_body=True),
    Endpoint("POST", "/api/v1/runners/claim", "runner", {}, has_id=False, strict_body=True),
    Endpoint("POST", "/api/v1/runners/jobs/{id}/heartbeat", "runner", {}, strict_body=True),
    Endpoint("POST", "/api/v1/runners/jobs/{id}/fail", "runner", {"error": "x"}, strict_body=True),
    Endpoint("POST", "/api/v1/runners/jobs/{id}/gang", "runner", {}, strict_body=True),
    Endpoint("POST", "/api/v1/runners/jobs/{id}/workload-result", "runner", _bodies()["workload"]),
    Endpoint("GET", "/api/v1/jobs/{id}/workload", "read"),
    Endpoint("POST", "/api/v1/nodes/{id}/probes", "runner", _bodies()["probe"], has_id=False),
    Endpoint("GET", "/api/v1/nodes", "read", has_id=False),
    Endpoint("GET", "/api/v1/nodes/{id}", "read"),
    Endpoint("GET", "/api/v1/jobs/{id}/attempts", "read"),
    Endpoint("GET", "/api/v1/jobs/{id}/health", "read"),
    Endpoint("POST", "/api/v1/jobs/{id}/health", "admin"),
    Endpoint("GET", "/api/v1/runners/me", "runner", has_id=False),
    Endpoint("GET", "/api/v1/tokens", "admin", has_id=False),
    Endpoint(
        "POST", "/api/v1/tokens", "admin", {"name": "n", "scopes": ["read"]}, has_id=False, strict_body=True
    ),
    Endpoint("POST", "/api/v1/tokens/{id}/rotate", "admin"),
    Endpoint("POST", "/api/v1/tokens/{id}/revoke", "admin"),
    Endpoint("GET", "/api/v1/history", "read", has_id=False),
    Endpoint("GET", "/api/v1/history/regressions", "read", has_id=False),
    Endpoint("GET", "/api/v1/compare", "read", has_id=False),  # unknown ids: tests/service/test_job_vs_job.py
]


def check_negative_paths(api, endpoint: Endpoint) -> None:  # type: ignore[no-untyped-def]
    """Assert the negative paths of ``endpoint`` on a real app and database."""
    path = endpoint.path.replace("{id}", str(UNKNOWN_ID))

    def call(headers: dict[str, str], body: dict[str, Any] | None = endpoint.body):  # type: ignore[no-untyped-def]
        return api.client.request(endpoint.method, path, json=body, headers=headers)

    r = call({})
    assert r.status_code == 401, (endpoint, r.text)
    assert r.headers["www-authenticate"] == "Bearer" and isinstance(r.json()["detail"], str)
    assert call({"Authorization": "Bearer wrong"}).status_code == 401
    allowed = api.runner("node-a") if endpoint.scope == "runner" else api.token(endpoint.scope)
    if endpoint.has_id:
        r = call(allowed)
        assert r.status_code == 404, (endpoint, r.text)
        assert str(UNKNOWN_ID) in r.json()["detail"]
    if endpoint.strict_body:
        r = call(allowed, {**(endpoint.body or {}), "unexpected_field": 1})
        assert r.status_code == 422, (endpoint, r.text)
        assert ["body", "unexpected_field"] in [e["loc"] for e in r.json()["detail"]]


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_negative_paths(api, endpoint: Endpoint) -> None:  # type: ignore[no-untyped-def]
    check_negative_paths(api, endpoint)


def test_every_api_route_is_covered(api) -> None:  # type: ignore[no-untyped-def]
    """A new endpoint without an entry above fails here (routes of included routers too:
    ``iter_route_contexts`` walks them with their full paths)."""
    covered = {(e.method, e.path.replace("{id}", "")) for e in ENDPOINTS}
    seen = 0
    for context in iter_route_contexts(api.client.app.routes):
        route, path = context.original_route, context.path or ""
        if not isinstance(route, APIRoute) or not path.startswith("/api/v1"):
            continue
        bare = re.sub(r"\{[^}]+\}", "", path)
        for method in route.methods - {"HEAD", "OPTIONS"}:
            seen += 1
            assert (method, bare) in covered, f"{method} {path} has no negative-path entry"
    assert seen == len(ENDPOINTS)


def test_nul_characters_are_a_422_naming_the_field(api) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL stores no U+0000 in text or JSON: the API refuses it up front, naming the field,
    instead of a late database error that names none."""
    from factories import spec_dict

    r = api.client.post("/api/v1/jobs", json=spec_dict(name="bad\u0000name"), headers=api.admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "name"], r.text
    assert "NUL" in r.json()["detail"][0]["msg"]
    job = api.submit()
    runner = api.runner("nul-node")
    assert api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner).status_code == 200
    r = api.client.post(f"/api/v1/runners/jobs/{job}/fail", json={"error": "oom\u0000"}, headers=runner)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "error"], r.text
    r = api.client.get("/api/v1/nodes/bad%00node", headers=api.admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "name"], r.text
    assert api.client.get(f"/api/v1/jobs/{job}", headers=api.admin).json()["status"] == "running"
