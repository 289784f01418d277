"""A job whose source repository is written in a refused form (``..``, encoded dots, a password,
a remote helper) is a 422 naming ``<side>.source.repo`` at submit time; nothing is queued."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from kernelab.service.server.models import Job


def _sourced(repo: str) -> dict:  # type: ignore[type-arg]
    good = {"repo": "https://github.com/myorg/x", "ref": "main"}
    return {
        "benchmark": "mypkg.bench:B",
        "baseline": {"variant": "a", "source": {**good, "repo": repo}},
        "candidate": {"variant": "b", "source": good},
    }


@pytest.mark.parametrize("repo", [
    "https://github.com/myorg/../attacker/x", "https://github.com/myorg/%2e%2e/attacker/x",
    "https://u:secret@github.com/myorg/x", "ext::sh -c id", "/srv/allowed/../evil",
])  # fmt: skip
def test_refused_repository_form_is_a_422_naming_the_field(api, repo: str) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=_sourced(repo), headers=api.admin)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["body", "baseline", "source", "repo"] and error["msg"]
    assert "secret" not in r.text  # the refusal never echoes the address (a password in it)
    with api.factory() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_canonical_repository_forms_are_queued(api) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=_sourced("git@github.com:myorg/x.git"), headers=api.admin)
    assert r.status_code == 201, r.text
