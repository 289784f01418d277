"""A spec stored by an older version stays readable when the door's bounds grow stricter.

The door refuses a seed above 2**62, an integer parameter past int64, more than 64 parameter keys,
an empty list in ``sweep_by_device`` and a malformed benchmark reference
(``kernelab.service.contract.schemas``);
older versions stored such specs. Reading them back (the job, its claim, its result, its report)
must not fail: stored data is validated with ``schemas.STORED``, the door's bounds only at the door.
"""

from __future__ import annotations

from typing import Any

import pytest
from factories import job_result, spec_dict
from sqlalchemy import update

from kernelab.service.contract.schemas import STORED, JobSpec
from kernelab.service.server import models

OLDER = {  # each a spec an older version accepted and stored
    "seed 10**29": {"measurement": {"min_rounds": 4, "max_rounds": 8, "seed": 10**29}},
    "int past int64": {"params": {"unused": 10**30}},
    "70 parameter keys": {"params": {f"k{i}": i for i in range(70)}},
    "empty sweep_by_device list": {"sweep_by_device": {"cuda": {"M": []}}},
}


@pytest.mark.parametrize("case", sorted(OLDER))
def test_the_door_refuses_what_a_stored_read_takes(case: str) -> None:
    data = spec_dict(**OLDER[case])
    with pytest.raises(ValueError):
        JobSpec.model_validate(data)
    assert JobSpec.model_validate(data, context=STORED).cells("cpu")


def _store(api: Any, job_id: int, spec: dict[str, Any]) -> None:
    with api.factory.begin() as session:
        session.execute(update(models.Job).where(models.Job.id == job_id).values(spec=spec))


@pytest.mark.parametrize("case", sorted(OLDER))
def test_an_older_stored_spec_is_read_and_reported(api: Any, case: str) -> None:
    job_id = api.submit()
    runner = api.runner()
    claim = api.client.post("/api/v1/runners/claim", json={}, headers=runner)
    assert claim.status_code == 200, claim.text
    assert api.post_result(job_id, job_result(job_id), runner).status_code in (200, 201)
    older = spec_dict(**OLDER[case])
    _store(api, job_id, older)  # as an older version would have stored it
    read = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin)
    assert read.status_code == 200, read.text
    assert read.json()["spec"]["params"] == older.get("params", {})
    for path in (
        "/api/v1/jobs",
        f"/api/v1/jobs/{job_id}/comparison",
        f"/api/v1/jobs/{job_id}/report.md",
        f"/api/v1/jobs/{job_id}/samples",
        f"/api/v1/jobs/{job_id}/health",
        f"/jobs/{job_id}",
        "/",
    ):
        got = api.client.get(path, headers=api.admin)
        assert got.status_code == 200, (path, got.text[:500])


@pytest.mark.parametrize("case", sorted(OLDER))
def test_a_queued_older_spec_is_failed_with_its_reason_not_handed_out(api: Any, case: str) -> None:
    older_id = api.submit()
    _store(api, older_id, spec_dict(**OLDER[case]))
    good_id = api.submit()
    claim = api.client.post("/api/v1/runners/claim", json={}, headers=api.runner())
    assert claim.status_code == 200, claim.text
    assert claim.json()["job_id"] == good_id  # the next job, in the same claim
    job = api.client.get(f"/api/v1/jobs/{older_id}", headers=api.admin).json()
    assert job["status"] == "failed"
    assert "breaks a bound of this version" in job["error"] and "resubmit" in job["error"]
