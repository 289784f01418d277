"""Property-based API tests generated from the OpenAPI schema by schemathesis, on SQLite and on
PostgreSQL: no request, however malformed, gets a 5xx, and every 4xx says why (``detail``).

Bounded for CI: ``MAX_EXAMPLES`` examples per operation (positive and negative data), no
shrinking deadline. A database with one job, one result and one runner is prepared first so
that generated ids sometimes hit real rows.
"""

from __future__ import annotations

import sqlite3
import warnings
from contextlib import closing
from typing import Any

import pytest

# schemathesis (and hypothesis, which it brings) is in the dev extra only: without it this module
# is skipped at collection, so `pytest -m gpu` collects on a node with `.[server,runner]` + pytest.
pytest.importorskip("hypothesis", reason="hypothesis is not installed (the dev extra)")
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pytest.importorskip("schemathesis", reason="schemathesis is not installed (the dev extra)")
    import schemathesis
    from schemathesis import GenerationMode
    from schemathesis.checks import not_a_server_error
from factories import job_result, spec_dict  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from kernelab.app import create_app
from kernelab.service.server.core.config import Settings

MAX_EXAMPLES = 12  # per operation and database
RUNNER_PATHS = ("/api/v1/runners/claim", "/api/v1/runners/jobs/", "/results", "/probes")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

ADMIN_TOKEN = "fuzz-admin-token-0123456789abcdef0123456789"


def _seeded_app(url: str, client_class: Any) -> tuple[Any, dict[str, dict[str, str]]]:
    """The app on the migrated database ``url`` holding one finished job, one queued job and one
    runner; and the ``admin`` and ``runner`` headers that reach it."""
    app = create_app(
        Settings(database_url=url, admin_token=ADMIN_TOKEN, claim_poll_s=0.02, claim_wait_max_s=0.0)
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with client_class(app) as client:
        node = {"hostname": "fuzz-node", "device_type": "cpu"}
        registered = client.post(
            "/api/v1/runners/register", json={"name": "fuzz", "node": node}, headers=admin
        )
        runner = {"Authorization": f"Bearer {registered.json()['token']}"}
        job_id = client.post("/api/v1/jobs", json=spec_dict(), headers=admin).json()["id"]
        claimed = client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner)
        assert claimed.status_code == 200, claimed.text
        posted = client.post(
            f"/api/v1/jobs/{job_id}/results",
            content=job_result(job_id=job_id, hostname="fuzz-node").model_dump_json(),
            headers={**runner, "content-type": "application/json"},
        )  # fmt: skip
        assert posted.status_code == 201, posted.text
        client.post("/api/v1/jobs", json=spec_dict(), headers=admin)
    return app, {"admin": admin, "runner": runner}


@pytest.fixture
def targets(
    request: pytest.FixtureRequest, tmp_path: Any, _sqlite_template: Any, client_class: Any
) -> dict[str, Any]:
    """The databases' apps, seeded alike: ``{"sqlite": (app, headers), "postgres": (app, headers)}``;
    PostgreSQL is left out (and said so) only where its server cannot be reached."""
    sqlite_path = tmp_path / "fuzz.db"
    with closing(sqlite3.connect(_sqlite_template)) as src, closing(sqlite3.connect(sqlite_path)) as dst:
        src.backup(dst)  # the migrated template, page by page
    out = {"sqlite": _seeded_app(f"sqlite:///{sqlite_path}", client_class)}
    try:
        pg_url = request.getfixturevalue("pg_migrated_url")
    except pytest.skip.Exception as exc:  # no PostgreSQL here: SQLite alone, not nothing
        warnings.warn(f"fuzzing SQLite only: {exc}", stacklevel=1)
    else:
        out["postgres"] = _seeded_app(pg_url, client_class)
    return out


def four_xx_has_a_message(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 4xx answer carries a JSON body whose ``detail`` is a non-empty string or error list."""
    if not 400 <= response.status_code < 500:
        return None
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        raise AssertionError(f"{response.status_code} without a JSON body: {response.text[:200]!r}") from None
    if not detail:
        raise AssertionError(f"{response.status_code} without a message: {response.text[:200]!r}")
    return True


def _fuzz(operation: Any, mode: Any, targets: dict[str, Any], role: str) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=MAX_EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck), database=None,
    )  # fmt: skip
    def one(case: Any) -> None:
        failed: list[BaseException] = []
        for database, (app, headers) in targets.items():  # every database, even after a failure
            try:
                case.call_and_validate(
                    headers=headers[role], app=app, checks=[not_a_server_error, four_xx_has_a_message]
                )
            except (
                Exception,
                BaseExceptionGroup,
            ) as exc:  # schemathesis' FailureGroup is a BaseExceptionGroup
                exc.add_note(f"database: {database}")
                failed.append(exc)
        for other in failed[1:]:
            failed[0].add_note(f"and on the next database: {other!r}")
        if failed:
            raise failed[0]

    one()


def test_no_5xx_and_every_4xx_explains(targets: dict[str, Any]) -> None:
    """Every operation, positive and negative examples, on both databases: the checks raise on a
    5xx or a silent 4xx."""
    app, _ = targets["sqlite"]
    fuzz_schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in fuzz_schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    no_negative: list[str] = []
    for operation in operations:
        role = "runner" if any(p in operation.path for p in RUNNER_PATHS) else "admin"
        _fuzz(operation, GenerationMode.POSITIVE, targets, role)
        try:
            _fuzz(operation, GenerationMode.NEGATIVE, targets, role)
        except Unsatisfiable:  # nothing to make invalid (no parameters, no body): e.g. /healthz
            no_negative.append(operation.label)
    assert len(no_negative) < len(operations) / 2, no_negative
