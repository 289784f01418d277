"""Decoding a big JSON body does not block the event loop: a posted result, the
one body that is tens of MiB in normal use, is validated in a worker thread, not on the event
loop that every other request of the process waits on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from factories import job_result

from kernelab.service.contract.schemas import JobResult

pytestmark = pytest.mark.timeout(60)


def _on_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def test_a_result_body_is_validated_off_the_event_loop(api, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[bool] = []
    original = JobResult.model_validate_json

    def recording(data: Any, *args: Any, **kwargs: Any) -> JobResult:
        seen.append(_on_event_loop())
        return original(data, *args, **kwargs)

    monkeypatch.setattr(JobResult, "model_validate_json", recording)
    job = api.submit()
    runner = api.runner()
    assert api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner).status_code == 200
    assert api.post_result(job, job_result(job), runner).status_code == 201
    assert seen and not any(seen), seen  # validated, and never on the event loop's thread
    bad = api.client.post(
        f"/api/v1/jobs/{job}/results",
        content=b"{not json",
        headers={**runner, "content-type": "application/json"},
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["type"] == "json_invalid"
    assert not any(seen)
