"""Alembic is the only way the schema is made: up/down/up works, and it matches the models."""

from __future__ import annotations

import json
import warnings
from datetime import UTC, datetime
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from factories import spec_dict
from sqlalchemy import MetaData, Table, insert, inspect, select, text

from kernelab.app import create_app
from kernelab.service.server import crud
from kernelab.service.server.core.config import Settings
from kernelab.service.server.core.db import (
    SchemaNotCurrentError,
    check_at_head,
    downgrade,
    head_revision,
    make_engine,
    make_session_factory,
    upgrade,
    upgrade_told,
)
from kernelab.service.server.models import Base

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette asks for the httpx2 fork (tests/service/conftest.py)
    from fastapi.testclient import TestClient

TABLES = {
    "tokens", "runners", "jobs", "job_attempts", "results", "cells", "sample_blocks", "probe_reports",
    "probe_readings", "health_judgements", "history_points", "compare_tasks", "runner_benchmarks",
    "bisects", "gang_members", "workload_results",
}  # fmt: skip


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    upgrade(db_url)
    assert _tables(db_url) == TABLES
    downgrade(db_url, "base")
    assert _tables(db_url) == set()
    upgrade(db_url)
    assert _tables(db_url) == TABLES
    engine = make_engine(db_url)
    try:
        check_at_head(engine)
    finally:
        engine.dispose()


def test_serve_says_what_the_upgrade_did_without_the_password(db_url: str) -> None:
    head = head_revision()
    if db_url.startswith("postgresql"):  # trust auth: a password is accepted and must not be shown
        db_url = db_url.replace("//postgres@", "//postgres:secret@")
        assert ":secret@" in db_url
    shown = db_url.replace(":secret@", ":***@")
    assert upgrade_told(db_url) == f"database {shown}: schema created at {head}"
    assert upgrade_told(db_url) == f"database {shown}: schema at {head} (current)"
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            before = MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()
    assert before == head
    from alembic.script import ScriptDirectory

    from kernelab.service.server.core.db import alembic_config

    previous = ScriptDirectory.from_config(alembic_config()).get_revision(head).down_revision
    downgrade(db_url, str(previous))
    assert upgrade_told(db_url) == f"database {shown}: schema upgraded from {previous} to {head}"


def test_models_match_migrations(db_url: str) -> None:
    """Autogenerate finds no difference: the migrations create exactly what the models declare."""
    upgrade(db_url)
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            opts = {"compare_type": True, "compare_server_default": True}
            context = MigrationContext.configure(conn, opts=opts)
            assert compare_metadata(context, Base.metadata) == []
    finally:
        engine.dispose()


def test_app_refuses_a_database_not_at_head(db_url: str) -> None:
    with pytest.raises(SchemaNotCurrentError, match=head_revision()):
        create_app(Settings(database_url=db_url))
    upgrade(db_url)
    downgrade(db_url, "base")
    with pytest.raises(SchemaNotCurrentError, match="kernelab serve"):
        create_app(Settings(database_url=db_url))


def test_sqlite_folder_is_created(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'k.db'}"
    upgrade(url)
    assert (tmp_path / "a" / "b" / "k.db").is_file()


def _old_sample_rows() -> list[dict[str, Any]]:
    """Rows of the pre-0010 ``samples`` table for two cells: nulls, partial context, throttling."""
    rows = []
    for i in range(7):
        rows.append({
            "cell": i % 2, "variant": ("baseline", "candidate")[i % 3 == 0], "round": i // 2,
            "position": i % 2,
            "duration_ns": 1000.0 + i / 3, "launches": 1 + i, "throttled": i == 4,
            "sm_clock_mhz": None if i % 2 else 1980.0 - i, "clock_event_reasons": None if i < 3 else 4 * i,
            "temperature_c": None if i == 5 else -1.5 + i, "power_w": None,
        })  # fmt: skip
    return rows


def test_samples_move_to_blocks_and_back(db_url: str) -> None:
    """0010 moves each cell's ``samples`` rows into one block and back on downgrade: the same values
    in the same order (nulls included), read through ``crud`` in between."""
    upgrade(db_url, "0009_comparison")
    old = _old_sample_rows()
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            meta = MetaData()
            jobs, results, cells, samples = (
                Table(name, meta, autoload_with=conn) for name in ("jobs", "results", "cells", "samples")
            )
            now = datetime(2026, 11, 30, tzinfo=UTC)
            job_id = conn.execute(insert(jobs).values(
                name="m", benchmark="softmax", spec=spec_dict(), device="cpu", status="succeeded", attempts=1,
                max_attempts=1, created_at=now).returning(jobs.c.id)).scalar_one()  # fmt: skip
            result_id = conn.execute(insert(results).values(
                job_id=job_id, idempotency_key="migrate-0010", node_name="n", timer="perf_counter",
                node={"hostname": "n", "device_type": "cpu"}, spec=spec_dict(), started_at=now,
                finished_at=now, received_at=now).returning(results.c.id)).scalar_one()  # fmt: skip
            cell_ids = [conn.execute(insert(cells).values(
                result_id=result_id, cell_index=i, params={"N": i}, baseline_params={}, candidate_params={},
                work={}, correctness={}).returning(cells.c.id)).scalar_one() for i in range(3)]  # fmt: skip
            for row in old:
                values = {k: v for k, v in row.items() if k != "cell"}
                conn.execute(insert(samples).values(cell_id=cell_ids[row["cell"]], **values))
        expected = {
            c: [{k: v for k, v in r.items() if k != "cell"} for r in old if r["cell"] == c] for c in range(3)
        }

        upgrade(db_url)
        with make_session_factory(engine)() as session:
            result = crud.load_result(session=session, job_id=job_id)
            assert result is not None
            assert [[s.model_dump() for s in c.samples.rows()] for c in result.cells] == [
                expected[0],
                expected[1],
                [],
            ]
            assert crud.count_samples(session=session, job_id=job_id) == len(old)
            assert [r["cell_index"] for r in crud.iter_sample_rows(session=session, job_id=job_id)] == (
                [0] * len(expected[0]) + [1] * len(expected[1])
            )
        with engine.connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM sample_blocks")) == 2  # the empty cell has none

        downgrade(db_url, "0009_comparison")
        with engine.connect() as conn:
            samples = Table("samples", MetaData(), autoload_with=conn)
            back = [dict(r._mapping) for r in conn.execute(select(samples).order_by(samples.c.id))]
        assert [{k: v for k, v in r.items() if k not in ("id", "cell_id")} for r in back] == (
            expected[0] + expected[1]
        )
        owners = [cell_ids[0]] * len(expected[0]) + [cell_ids[1]] * len(expected[1])
        assert [r["cell_id"] for r in back] == owners
    finally:
        engine.dispose()


def test_stored_timestamps_become_aware_utc(db_url: str) -> None:
    """0012 rewrites the ``taken_at`` of stored probe reports as aware UTC: reports of one node that
    mixed zone-less and offset times (accepted before the door refused the former) made every
    read of the node answer 500; after the upgrade the node reads 200, in UTC. Stored comparisons
    are dropped (readers recompute them under the current rules)."""
    from factories import probe_report

    upgrade(db_url, "0011_verdict_rules")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            meta = MetaData()
            reports, jobs, results = (Table(n, meta, autoload_with=conn)
                                      for n in ("probe_reports", "jobs", "results"))  # fmt: skip
            for i, taken in enumerate(("2026-01-02T07:00:00+05:00", "2026-01-02T08:00:00")):
                report = probe_report().model_dump(mode="json") | {"taken_at": taken}
                moment = datetime.fromisoformat(taken)
                conn.execute(insert(reports).values(
                    node_name="node-a", phase="adhoc", taken_at=moment, wall_s=1.0, nvml_status="absent",
                    report=report, received_at=datetime(2026, 1, 2, 9, i, tzinfo=UTC)))  # fmt: skip
            now = datetime(2026, 1, 2, tzinfo=UTC)
            job_id = conn.execute(insert(jobs).values(
                name="m", benchmark="softmax", spec=spec_dict(), device="cpu", status="succeeded", attempts=1,
                max_attempts=1, created_at=now, summary={"faster": 2},
            ).returning(jobs.c.id)).scalar_one()  # fmt: skip
            conn.execute(insert(results).values(
                job_id=job_id, idempotency_key="migrate-0012", node_name="node-a", timer="perf_counter",
                node={"hostname": "node-a", "device_type": "cpu"}, spec=spec_dict(), started_at=now,
                finished_at=now, received_at=now, comparison={"stale": True}))  # fmt: skip
        upgrade(db_url)
        with engine.connect() as conn:
            stored = [r for (r,) in conn.execute(text("SELECT report FROM probe_reports ORDER BY id"))]
            summary = conn.execute(text("SELECT summary FROM jobs")).scalar_one()
            comparison = conn.execute(text("SELECT comparison FROM results")).scalar_one()
        stored = [json.loads(r) if isinstance(r, str) else r for r in stored]
        assert [r["taken_at"] for r in stored] == ["2026-01-02T02:00:00Z", "2026-01-02T08:00:00Z"]
        assert summary is None and comparison is None
        settings = Settings(database_url=db_url, admin_token="migration-admin-token-0123456789")
        with TestClient(create_app(settings)) as client:
            headers = {"Authorization": "Bearer migration-admin-token-0123456789"}
            node = client.get("/api/v1/nodes/node-a", headers=headers)
            assert node.status_code == 200, node.text
            assert node.json()["health"]["taken_at"] == "2026-01-02T08:00:00Z"
            page = client.get("/nodes/node-a", headers=headers)
            assert page.status_code == 200 and "2026-01-02 02:00:00 UTC" in page.text
        downgrade(db_url, "0011_verdict_rules")
        assert _tables(db_url) == TABLES - {
            "health_judgements",
            "history_points",
            "compare_tasks",
            "runner_benchmarks",
            "bisects",
            "gang_members",
            "workload_results",
        }
    finally:
        engine.dispose()


def test_stored_results_get_compare_tasks(db_url: str) -> None:
    """0015 queues a compare task for every stored result without a comparison (readers no longer
    compute one) and a done one for a result with it; the job reads "comparing" until a compare
    worker stored it. Downgrade drops the table."""
    from kernelab.service.server.compare_worker import drain

    upgrade(db_url, "0013_runner_node")
    engine = make_engine(db_url)
    try:
        with engine.begin() as conn:
            meta = MetaData()
            jobs, results = (Table(n, meta, autoload_with=conn) for n in ("jobs", "results"))
            now = datetime(2026, 1, 2, tzinfo=UTC)
            ids = []
            for i, comparison in enumerate((None, {"method_version": 1})):
                job_id = conn.execute(insert(jobs).values(
                    name="m", benchmark="softmax", spec=spec_dict(), device="cpu", status="succeeded",
                    attempts=1, max_attempts=1, created_at=now).returning(jobs.c.id)
                ).scalar_one()  # fmt: skip
                conn.execute(insert(results).values(
                    job_id=job_id, idempotency_key=f"migrate-0015-{i}", node_name="node-a",
                    timer="perf_counter",
                    node={"hostname": "node-a", "device_type": "cpu"}, spec=spec_dict(), started_at=now,
                    finished_at=now, received_at=now, comparison=comparison))  # fmt: skip
                ids.append(job_id)
        upgrade(db_url)
        with engine.connect() as conn:
            tasks = conn.execute(
                text("SELECT job_id, status, attempts FROM compare_tasks ORDER BY job_id")
            ).all()
        assert [tuple(t) for t in tasks] == [(ids[0], "queued", 0), (ids[1], "done", 0)]
        settings = Settings(database_url=db_url, admin_token="migration-admin-token-0123456789")
        headers = {"Authorization": "Bearer migration-admin-token-0123456789"}
        with TestClient(create_app(settings)) as client:
            assert (
                client.get(f"/api/v1/jobs/{ids[0]}", headers=headers).json()["comparison_status"]
                == "comparing"
            )
            r = client.get(f"/api/v1/jobs/{ids[0]}/comparison", headers=headers)
            assert r.status_code == 409 and "comparing" in r.json()["detail"], r.text
            assert r.headers["Retry-After"]
            assert drain(client.app.state.session_factory, settings).done == 1  # type: ignore[attr-defined]
            assert (
                client.get(f"/api/v1/jobs/{ids[0]}", headers=headers).json()["comparison_status"] == "ready"
            )
            assert client.get(f"/api/v1/jobs/{ids[0]}/comparison", headers=headers).status_code == 200
        downgrade(db_url, "0013_runner_node")
        assert "compare_tasks" not in _tables(db_url)
    finally:
        engine.dispose()


def test_workloads_migration_keeps_benchmark_jobs_and_drops_workload_ones(db_url: str) -> None:
    """0019 adds ``jobs.kind``/``nnodes`` without rebuilding ``jobs`` (a rebuild on SQLite would
    cascade to the results that reference it): a stored benchmark job and its result keep their
    rows, read as kind ``benchmark`` of one node. Downgrade deletes the workload jobs (their seats,
    node results and compare tasks with them) and keeps the benchmark job and its result."""
    upgrade(db_url, "0018_pair_tasks")
    engine = make_engine(db_url)
    try:
        now = datetime(2026, 12, 2, tzinfo=UTC)
        with engine.begin() as conn:
            meta = MetaData()
            jobs, results = (Table(n, meta, autoload_with=conn) for n in ("jobs", "results"))
            bench = conn.execute(insert(jobs).values(
                name="m", benchmark="softmax", spec=spec_dict(), device="cpu", status="succeeded",
                attempts=1, max_attempts=1, created_at=now).returning(jobs.c.id)).scalar_one()  # fmt: skip
            conn.execute(insert(results).values(
                job_id=bench, idempotency_key="migrate-0019", node_name="node-a", timer="perf_counter",
                node={"hostname": "node-a", "device_type": "cpu"}, spec=spec_dict(), started_at=now,
                finished_at=now, received_at=now))  # fmt: skip
        upgrade(db_url)
        with engine.begin() as conn:
            meta = MetaData()
            jobs, runners, seats, rows, tasks = (
                Table(n, meta, autoload_with=conn)
                for n in ("jobs", "runners", "gang_members", "workload_results", "compare_tasks")
            )
            assert conn.execute(select(jobs.c.kind, jobs.c.nnodes).where(jobs.c.id == bench)).one() == (
                "benchmark", 1,
            )  # fmt: skip
            assert conn.execute(text("SELECT count(*) FROM results")).scalar_one() == 1
            runner = conn.execute(
                insert(runners).values(name="r", created_at=now).returning(runners.c.id)
            ).scalar_one()
            assert (
                conn.execute(select(runners.c.workloads).where(runners.c.id == runner)).scalar_one() is False
            )
            work = conn.execute(insert(jobs).values(
                name="w", benchmark="workload", spec={"kind": "workload"}, device="cpu", status="succeeded",
                attempts=1, max_attempts=1, created_at=now, kind="workload", nnodes=2).returning(jobs.c.id)
            ).scalar_one()  # fmt: skip
            conn.execute(insert(seats).values(job_id=work, attempt=1, node_rank=0, runner_id=runner,
                                              joined_at=now, lease_expires_at=now))  # fmt: skip
            conn.execute(insert(rows).values(job_id=work, attempt=1, node_rank=0, idempotency_key="wl-0019",
                                             node_name="n", result={}, received_at=now))  # fmt: skip
            conn.execute(insert(tasks).values(kind="workload", job_id=work, status="done", attempts=1,
                                              max_attempts=3, created_at=now))  # fmt: skip
        downgrade(db_url, "0018_pair_tasks")
        assert {"gang_members", "workload_results"} & _tables(db_url) == set()
        with engine.connect() as conn:
            assert [r[0] for r in conn.execute(text("SELECT id FROM jobs"))] == [bench]
            assert conn.execute(text("SELECT count(*) FROM results")).scalar_one() == 1
            assert conn.execute(text("SELECT count(*) FROM compare_tasks")).scalar_one() == 0
        upgrade(db_url)
    finally:
        engine.dispose()
