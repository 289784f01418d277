"""Operations: Prometheus ``/metrics``, token rotation and revocation, paginated raw samples,
JSON logs, no CORS; each on SQLite and PostgreSQL through the real app."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from factories import job_result, probe_report, spec_dict
from prometheus_client.parser import text_string_to_metric_families

from kernelab.runners.local import free_port, wait_healthy
from kernelab.service.server.core.db import upgrade
from kernelab.service.server.observability import JsonFormatter


def _metrics(api, headers) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # type: ignore[no-untyped-def]
    r = api.client.get("/metrics", headers=headers)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_need_a_token_and_count_the_queue(api) -> None:  # type: ignore[no-untyped-def]
    assert api.client.get("/metrics").status_code == 401
    read = api.token("read")
    before = _metrics(api, read)
    assert before[("kernelab_queue_depth", ())] == 0
    finished, queued = api.submit(), api.submit()
    runner = api.runner("metrics-node")
    claim = api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner).json()
    assert claim["job_id"] == finished
    assert api.post_result(finished, job_result(finished, hostname="metrics-node"), runner).status_code == 201
    m = _metrics(api, read)
    assert m[("kernelab_queue_depth", ())] == 1 and queued
    assert m[("kernelab_jobs", (("status", "succeeded"),))] == 1
    assert m[("kernelab_jobs", (("status", "running"),))] == 0
    assert m[("kernelab_runners_alive", ())] == 1 == m[("kernelab_runners", ())]
    assert m[("kernelab_job_attempts", (("outcome", "succeeded"),))] == 1
    assert m[("kernelab_job_duration_seconds_count", ())] == 1
    assert m[("kernelab_job_duration_seconds_bucket", (("le", "+Inf"),))] == 1
    assert m[("kernelab_job_duration_seconds_sum", ())] >= 0


def test_tokens_rotate_and_revoke(api) -> None:  # type: ignore[no-untyped-def]
    assert api.client.post("/api/v1/tokens", json={"name": "ci", "scopes": ["read"]},
                           headers=api.token("submit")).status_code == 403  # fmt: skip
    issued = api.client.post("/api/v1/tokens", json={"name": "ci", "scopes": ["submit"]}, headers=api.admin)
    assert issued.status_code == 201, issued.text
    old = issued.json()
    old_auth = {"Authorization": f"Bearer {old['token']}"}
    assert api.client.get("/api/v1/jobs", headers=old_auth).status_code == 200

    rotated = api.client.post(f"/api/v1/tokens/{old['id']}/rotate", headers=api.admin)
    assert rotated.status_code == 201, rotated.text
    new = rotated.json()
    assert (new["name"], new["scopes"]) == ("ci", ["submit"]) and new["token"] != old["token"]
    assert api.client.get("/api/v1/jobs", headers=old_auth).status_code == 401
    new_auth = {"Authorization": f"Bearer {new['token']}"}
    assert api.client.post("/api/v1/jobs", json=spec_dict(), headers=new_auth).status_code == 201
    assert api.client.post(f"/api/v1/tokens/{old['id']}/rotate", headers=api.admin).status_code == 409

    revoked = api.client.post(f"/api/v1/tokens/{new['id']}/revoke", headers=api.admin)
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    assert api.client.get("/api/v1/jobs", headers=new_auth).status_code == 401
    listed = api.client.get("/api/v1/tokens?revoked=false", headers=api.admin).json()
    assert all(t["revoked_at"] is None for t in listed["data"]) and "token" not in listed["data"][0]
    assert new["id"] not in {t["id"] for t in listed["data"]}
    assert api.client.post("/api/v1/tokens/999999/revoke", headers=api.admin).status_code == 404
    bad = api.client.post("/api/v1/tokens", json={"name": "x", "scopes": ["root"]}, headers=api.admin)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"][:2] == ["body", "scopes"]


def test_samples_are_paginated_in_json_and_csv(api) -> None:  # type: ignore[no-untyped-def]
    job = api.submit()
    runner = api.runner()
    api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner)
    result = job_result(job)
    assert api.post_result(job, result, runner).status_code == 201
    read = api.token("read")
    everything = api.client.get(f"/api/v1/jobs/{job}/samples", headers=read)
    total = sum(len(c.samples) for c in result.cells)
    assert int(everything.headers["x-total-count"]) == total == len(everything.json())
    assert "link" not in everything.headers

    pages, url = [], f"/api/v1/jobs/{job}/samples?limit=7"
    while url:
        r = api.client.get(url, headers=read)
        pages.append(r.json())
        link = r.headers.get("link")
        url = link[1 : link.index(">")] if link else ""
    assert [len(p) for p in pages[:-1]] == [7] * (len(pages) - 1) and 0 < len(pages[-1]) <= 7
    assert [row for page in pages for row in page] == everything.json()

    r = api.client.get(f"/api/v1/jobs/{job}/samples?format=csv&offset=5&limit=3", headers=read)
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert [float(x["duration_ns"]) for x in rows] == [s["duration_ns"] for s in everything.json()[5:8]]
    assert api.client.get(f"/api/v1/jobs/{job}/samples?limit=0", headers=read).status_code == 422


def test_no_cors_headers(api) -> None:  # type: ignore[no-untyped-def]
    preflight = api.client.options(
        "/api/v1/jobs", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert "access-control-allow-origin" not in preflight.headers
    r = api.client.get("/api/v1/jobs", headers={**api.token("read"), "Origin": "https://evil.example"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_json_log_lines_carry_the_extra_fields() -> None:
    record = logging.LogRecord("kernelab.service.http", logging.INFO, __file__, 1, "GET %s", ("/x",), None)
    record.event, record.status = "request", 200
    entry = json.loads(JsonFormatter().format(record))
    assert entry["message"] == "GET /x" and entry["level"] == "INFO"
    assert (entry["event"], entry["status"], entry["logger"]) == ("request", 200, "kernelab.service.http")
    assert entry["ts"].endswith("+00:00")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_server_log_holds_no_token(log_format: str, tmp_path: Path) -> None:
    """A real ``kernelab serve``: a token in ``/login?token=`` (the dashboard's sign-in link), in
    a bearer header and in a registration answer never reaches the log; each request is logged
    once (the app's request line, without its query; no second access line from uvicorn)."""
    db = f"sqlite:///{tmp_path / 'log.db'}"
    upgrade(db)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    admin = "log-test-admin-token-0123456789abcdef"
    env = {**os.environ, "KERNELAB_DATABASE_URL": db, "KERNELAB_ADMIN_TOKEN": admin,
           "KERNELAB_LOG_FORMAT": log_format, "KERNELAB_LOG_LEVEL": "INFO"}  # fmt: skip
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelab.runners.cli", "serve", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        wait_healthy(base, proc, timeout_s=60, log_path=log_path)
        with httpx.Client(base_url=base, timeout=30) as http:
            assert http.get(f"/login?token={admin}").status_code in (200, 303)
            auth = {"Authorization": f"Bearer {admin}"}
            body = {"name": "log-node", "node": {"hostname": "log-node", "device_type": "cpu"}}
            runner = http.post("/api/v1/runners/register", headers=auth, json=body)
            assert runner.status_code == 200, runner.text
            assert http.get(f"/api/v1/jobs?limit=5&token={admin}", headers=auth).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log_path.read_text()
    lines = text.splitlines()
    for request in ("GET /login 200", "POST /api/v1/runners/register 200", "GET /api/v1/jobs 200"):
        assert sum(request in line for line in lines) == 1, (request, text[-3000:])  # once, no query
    assert "HTTP/1.1" not in text  # no uvicorn access line
    for secret in (admin, runner.json()["token"]):
        assert secret not in text, f"a token reached the {log_format} log"
    if log_format == "json":
        assert "color_message" not in text and "\x1b[" not in text


def test_every_list_pages_with_total_and_next_link(api) -> None:  # type: ignore[no-untyped-def]
    """``/jobs``, ``/tokens``, ``/nodes`` and ``/jobs/{id}/attempts`` answer ``X-Total-Count`` and,
    while items remain, ``Link: <...offset=N...>; rel="next"`` (as the raw samples do)."""
    jobs = [api.submit() for _ in range(3)]
    runner = api.runner("pager-node")
    claim = api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner).json()
    api.client.post(f"/api/v1/runners/jobs/{claim['job_id']}/fail", json={"error": "x", "retry": True},
                    headers=runner)  # fmt: skip
    api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner)  # attempt 2
    api.client.post("/api/v1/nodes/pager-node/probes", json=probe_report().model_dump(mode="json"),
                    headers=runner)  # fmt: skip
    for path, total in (("/api/v1/jobs", len(jobs)), ("/api/v1/tokens", None), ("/api/v1/nodes", 1),
                        (f"/api/v1/jobs/{claim['job_id']}/attempts", 2)):  # fmt: skip
        whole = api.client.get(path, headers=api.admin)
        assert whole.status_code == 200, (path, whole.text)
        count = whole.json()["count"]
        assert whole.headers["x-total-count"] == str(count) and (total is None or count == total), path
        assert "link" not in whole.headers, path
        first = api.client.get(f"{path}?limit=1", headers=api.admin)
        assert first.headers["x-total-count"] == str(count) and len(first.json()["data"]) == 1
        if count > 1:
            assert 'rel="next"' in first.headers["link"] and "offset=1" in first.headers["link"], path
            assert "limit=1" in first.headers["link"]
        last = api.client.get(f"{path}?limit=1&offset={count - 1}", headers=api.admin)
        assert "link" not in last.headers, path
