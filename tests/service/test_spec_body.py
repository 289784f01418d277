"""The attack: a 44 MB spec of 2,000,000 keys froze the server for ~10 s (FastAPI
decoded and validated it on the event loop). Specs are now at most ``KERNELAB_MAX_SPEC_BYTES``
(1 MiB; 413 before decoding) and validated from their bytes in a worker thread
(``kernelab.service.server.api.spec_body``)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from factories import spec_dict

from kernelab.service.contract.schemas import JobSpec
from kernelab.service.server.api.spec_body import DEFAULT_MAX_SPEC_BYTES

pytestmark = pytest.mark.timeout(60)


def _key_bomb(n_bytes: int) -> bytes:
    """``{"k0":[0],"k1":[0],...}`` of about ``n_bytes``: the attack's body."""
    n = n_bytes // len('"k1000000":[0],')
    return ("{" + ",".join(f'"k{i}":[0]' for i in range(n)) + "}").encode()


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_spec_body_is_validated_off_the_event_loop(api, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[bool] = []
    original = JobSpec.model_validate_json

    def recording(data: Any, *args: Any, **kwargs: Any) -> JobSpec:
        seen.append(_on_event_loop())
        return original(data, *args, **kwargs)

    monkeypatch.setattr(JobSpec, "model_validate_json", recording)
    assert api.client.post("/api/v1/jobs", json=spec_dict(), headers=api.admin).status_code == 201
    bad = api.client.post("/api/v1/jobs", json=spec_dict(benchmark=".x:y"), headers=api.admin)
    assert bad.status_code == 422 and [e["loc"] for e in bad.json()["detail"]] == [["body", "benchmark"]]
    junk = api.client.post("/api/v1/jobs", content=b"\xb9{not json",
                           headers={**api.admin, "content-type": "application/json"})  # fmt: skip
    assert junk.status_code == 422 and junk.json()["detail"][0]["type"] == "json_invalid"  # not UTF-8 either
    assert junk.json()["detail"][0]["input"] == ""
    assert len(seen) == 3 and not any(seen), seen


def test_a_spec_over_the_limit_is_a_413_before_it_is_decoded(api, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    decoded: list[int] = []
    monkeypatch.setattr(JobSpec, "model_validate_json", lambda data, *a, **k: decoded.append(len(data)))
    body = _key_bomb(2 * DEFAULT_MAX_SPEC_BYTES)  # ~2 MiB, ~140k keys; the attack's was 44 MB
    headers = {**api.admin, "content-type": "application/json"}
    declared = api.client.post("/api/v1/jobs", content=body, headers=headers)
    assert declared.status_code == 413, declared.text
    assert "KERNELAB_MAX_SPEC_BYTES" in declared.json()["detail"]
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    streamed = api.client.post("/api/v1/jobs", content=iter(chunks), headers=headers)
    assert streamed.status_code == 413, streamed.text
    assert decoded == []
    assert api.client.get("/api/v1/jobs", headers=api.admin).json()["count"] == 0


def test_a_key_bomb_within_the_limit_is_a_short_422(api) -> None:  # type: ignore[no-untyped-def]
    body = _key_bomb(DEFAULT_MAX_SPEC_BYTES - 1024)  # ~70k keys: one extra_forbidden error each
    headers = {**api.admin, "content-type": "application/json"}
    r = api.client.post("/api/v1/jobs", content=body, headers=headers)
    assert r.status_code == 422, r.text[:300]
    detail = r.json()["detail"]
    assert len(detail) <= 50 and len(r.content) < 64 * 1024
    assert ["body", "benchmark"] in [e["loc"] for e in detail]
    n_keys = body.count(b":")
    assert detail[-1]["type"] == "too_many_errors"
    more = n_keys + 3 - (len(detail) - 1)  # one per key, + 3 missing fields, less those shown
    assert detail[-1]["msg"] == f"{more} more errors not shown"


def test_a_workload_spec_is_validated_as_one(api) -> None:  # type: ignore[no-untyped-def]
    """A workload spec is checked as a ``WorkloadSpec`` (its own errors, never a benchmark spec's
    missing fields); another ``kind`` is one error on ``kind``."""
    body = {"kind": "workload", "baseline": {"command": ["a.py"]}, "candidate": {"command": ["b.py"]}}
    r = api.client.post("/api/v1/jobs", json=body, headers=api.admin)
    assert r.status_code == 201, r.text[:300]
    broken = api.client.post("/api/v1/jobs", json={**body, "runs": 0}, headers=api.admin)
    assert broken.status_code == 422 and [e["loc"] for e in broken.json()["detail"]] == [["body", "runs"]]
    other = api.client.post("/api/v1/jobs", json={**body, "kind": "other"}, headers=api.admin)
    assert other.status_code == 422 and [e["loc"] for e in other.json()["detail"]] == [["body", "kind"]]
