"""A runner token speaks for its own node only: probes and results for another node
are 403 naming the field, nothing is stored; the binding survives rotation; migration 0013 binds
existing runners to the hostname they registered with."""

from __future__ import annotations

from factories import job_result, probe_report
from sqlalchemy import func, insert, select

from kernelab.service.server.core.db import downgrade, make_engine, upgrade
from kernelab.service.server.models import ProbeReport, Result, Runner


def _count(api, table) -> int:  # type: ignore[no-untyped-def]
    with api.factory() as session:
        return session.scalar(select(func.count()).select_from(table)) or 0


def _post_probe(api, node: str, headers: dict[str, str], **kwargs):  # type: ignore[no-untyped-def]
    report = probe_report("adhoc", **kwargs)
    return api.client.post(f"/api/v1/nodes/{node}/probes", content=report.model_dump_json(),
                           headers={**headers, "content-type": "application/json"})  # fmt: skip


def _forbidden_at(r, loc: list) -> str:  # type: ignore[no-untyped-def, type-arg]
    assert r.status_code == 403, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == loc and error["type"] == "node_mismatch"
    return str(error["msg"])


def test_probe_for_another_node_is_403_and_stores_nothing(api) -> None:  # type: ignore[no-untyped-def]
    mine, theirs = api.runner("node-a"), api.runner("node-b")
    assert _post_probe(api, "node-b", theirs).status_code == 201
    msg = _forbidden_at(_post_probe(api, "node-b", mine, gbps=1_000.0), ["path", "name"])
    assert "'node-a'" in msg and "'node-b'" in msg
    assert _count(api, ProbeReport) == 1
    node = api.client.get("/api/v1/nodes/node-b", headers=api.admin).json()
    assert node["probe_reports"] == 1
    assert node["probes"][0]["report"]["copy_bandwidth"][0]["bandwidth_gbps"] == 20.0
    assert _post_probe(api, "node-a", mine).status_code == 201


def test_result_for_another_node_is_403_and_the_job_stays_leased(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner("node-a")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    r = api.post_result(job_id, job_result(job_id, hostname="node-b"), runner)
    _forbidden_at(r, ["body", "node", "hostname"])
    assert _count(api, Result) == 0 and _count(api, ProbeReport) == 0
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["status"] == "running"
    assert api.post_result(job_id, job_result(job_id, hostname="node-a"), runner).status_code == 201


def test_unbound_runner_is_bound_by_first_use(api) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/runners/register", json={"name": "bare"}, headers=api.admin)
    headers = {"Authorization": f"Bearer {r.json()['token']}"}
    assert api.client.get("/api/v1/runners/me", headers=headers).json()["node_name"] is None
    assert _post_probe(api, "gpu-7", headers).status_code == 201
    assert api.client.get("/api/v1/runners/me", headers=headers).json()["node_name"] == "gpu-7"
    _forbidden_at(_post_probe(api, "gpu-8", headers), ["path", "name"])


def test_rotated_token_keeps_the_binding_and_registration_moves_it(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner("node-a")
    token_id = max(t["id"] for t in api.client.get("/api/v1/tokens", headers=api.admin).json()["data"]
                   if t["name"] == "runner:node-a")  # fmt: skip
    rotated = api.client.post(f"/api/v1/tokens/{token_id}/rotate", headers=api.admin).json()["token"]
    new = {"Authorization": f"Bearer {rotated}"}
    _forbidden_at(_post_probe(api, "node-z", new), ["path", "name"])
    assert _post_probe(api, "node-a", new).status_code == 201
    assert _post_probe(api, "node-a", runner).status_code == 401  # rotated away
    body = {"name": "node-a", "node": {"hostname": "node-z", "device_type": "cpu"}}
    moved = api.client.post("/api/v1/runners/register", json=body, headers=api.admin).json()["token"]
    assert _post_probe(api, "node-z", {"Authorization": f"Bearer {moved}"}).status_code == 201


def test_migration_0013_binds_existing_runners_to_their_hostname(db_url: str) -> None:
    upgrade(db_url, "0012_history_health")
    engine = make_engine(db_url)
    runners = Runner.__table__  # inserts name/node (and created_at's default) only: columns 0012 has
    try:
        with engine.begin() as conn:
            conn.execute(insert(runners).values(name="a", node={"hostname": "node-a", "device_type": "cpu"}))
            conn.execute(insert(runners).values(name="b"))
            conn.execute(insert(runners).values(name="c", node={"device_type": "cpu"}))
        upgrade(db_url)
        with engine.connect() as conn:
            rows = {name: node for name, node in conn.execute(select(runners.c.name, runners.c.node_name))}
        assert rows == {"a": "node-a", "b": None, "c": None}
        downgrade(db_url, "0012_history_health")
        upgrade(db_url)
    finally:
        engine.dispose()
