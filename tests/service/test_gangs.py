"""Workload jobs in the queue through the REST API on SQLite and PostgreSQL
(``kernelab.service.server.gangs``,
``kernelab.service.server.workload_store``): submission and its 422s, routing to runners that run
workloads only, gang seats gathering, the rendezvous timeout, a member whose lease runs out, the
nodes' results merged and compared by the compare worker. Time is moved by writing the seats'
times in the database (the server judges by the database's clock), never by sleeping."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from kernelab.service.contract.schemas import WorkloadResult
from kernelab.service.server.models import GangMember, Job

NOW = datetime(2026, 12, 2, tzinfo=UTC)


def _spec(nnodes: int = 1, **kw: Any) -> dict[str, Any]:
    return {
        "kind": "workload",
        "name": "w",
        "baseline": {"command": ["a.py"]},
        "candidate": {"command": ["b.py"]},
        "launch": {"nproc_per_node": 1, "nnodes": nnodes, "rdzv_timeout_s": 30},
        "runs": 2,
        **kw,
    }


def _result(spec: dict[str, Any], *, node: str, node_rank: int, rank: int, key: str) -> str:
    """A node's result: 4 runs (ABBA), phase ``step`` per rank, 1 s baseline, 2 s candidate."""
    runs = []
    for index, side in enumerate(["baseline", "candidate", "candidate", "baseline"]):
        seconds = 1.0 if side == "baseline" else 2.0
        record = {"type": "phase", "name": "step", "rank": rank, "seconds": seconds}
        runs.append({"index": index, "side": side, "started_at": NOW.isoformat(), "wall_s": seconds + 1,
                     "outcome": "ok", "records": [record]})  # fmt: skip
    result = WorkloadResult.model_validate(
        {"spec": spec, "node": {"hostname": node, "device_type": "cpu"}, "runs": runs, "idempotency_key": key,
         "node_rank": node_rank}
    )  # fmt: skip
    return result.model_dump_json()


def _claim(api: Any, runner: dict[str, str], **body: Any) -> Any:
    return api.client.post("/api/v1/runners/claim", json={"lease_s": 60, **body}, headers=runner)


def _post(api: Any, job_id: int, runner: dict[str, str], body: str) -> Any:
    return api.client.post(
        f"/api/v1/runners/jobs/{job_id}/workload-result",
        content=body,
        headers={**runner, "content-type": "application/json"},
    )


def _job(api: Any, job_id: int) -> dict[str, Any]:
    r = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_workload_spec_is_queued_and_its_problems_are_422s_naming_the_field(api) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=_spec(), headers=api.admin)
    assert r.status_code == 201, r.text
    assert r.json()["kind"] == "workload" and r.json()["spec"]["kind"] == "workload"
    assert "waiting for 1 runner(s) that run workloads" in r.json()["waiting_for"]
    bad = _spec(baseline={"command": ["a.py"], "env": {"RANK": "3"}})
    r = api.client.post("/api/v1/jobs", json=bad, headers=api.admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:3] == ["body", "baseline", "env"], r.text
    r = api.client.post("/api/v1/jobs", json=_spec(launch={"nnodes": 0}), headers=api.admin)
    assert r.status_code == 422 and ["body", "launch", "nnodes"] in [e["loc"] for e in r.json()["detail"]]
    r = api.client.post("/api/v1/jobs", json={**_spec(), "kind": "other"}, headers=api.admin)
    assert r.status_code == 422 and [e["loc"] for e in r.json()["detail"]] == [["body", "kind"]]


def test_only_a_runner_that_runs_workloads_gets_one_and_a_gang_of_one_runs_at_once(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit(_spec())
    plain = api.runner("node-b")
    assert _claim(api, plain).status_code == 204
    runner = api.runner("node-a")
    r = _claim(api, runner, workloads=True)
    assert r.status_code == 200, r.text
    gang = r.json()["gang"]
    assert r.json()["job_id"] == job_id and gang["ready"] and gang["node_rank"] == 0 and gang["nnodes"] == 1
    job = _job(api, job_id)
    assert job["status"] == "running" and job["attempts"] == 1 and job["gang"]["members"] == {"0": "node-a"}
    beat = api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={"lease_s": 60}, headers=runner)
    assert beat.status_code == 200, beat.text
    assert (
        api.client.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={}, headers=plain).status_code == 409
    )
    spec = job["spec"]
    wrong = _post(api, job_id, runner, _result(spec, node="node-a", node_rank=1, rank=0, key="key-0000a"))
    assert wrong.status_code == 422 and wrong.json()["detail"][0]["loc"] == ["body", "node_rank"]
    assert api.client.get(f"/api/v1/jobs/{job_id}/workload", headers=api.admin).status_code == 409
    body = _result(spec, node="node-a", node_rank=0, rank=0, key="key-0000b")
    r = _post(api, job_id, runner, body)
    assert r.status_code == 201 and r.json()["complete"], r.text
    again = _post(api, job_id, runner, body)
    assert again.status_code == 201 and again.json()["duplicate"]
    assert _job(api, job_id)["comparison_status"] == "comparing"
    api.compare()
    job = _job(api, job_id)
    assert job["status"] == "succeeded" and job["comparison_status"] == "ready"
    c = api.client.get(f"/api/v1/jobs/{job_id}/workload", headers=api.admin).json()
    step = next(q for q in c["quantities"] if q["name"] == "step")
    assert step["baseline"]["median"] == 1.0 and step["candidate"]["median"] == 2.0
    md = api.client.get(f"/api/v1/jobs/{job_id}/report.md", headers=api.admin)
    assert md.status_code == 200 and "| step | 1 s | 2 s |" in md.text
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin)
    assert page.status_code == 200
    for text in ("Phases and metrics", "Per-rank times", "Slowest rank: step (baseline): rank 0", "step s"):
        assert text in page.text, text


def test_a_gang_of_two_gathers_runs_and_merges_both_nodes(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit(_spec(nnodes=2))
    a, b = api.runner("node-a"), api.runner("node-b")
    assert _claim(api, a, workloads=True).status_code == 204  # rank 0 needs a rendezvous endpoint
    first = _claim(api, a, workloads=True, rdzv_endpoint="127.0.0.1:29400").json()["gang"]
    assert first["node_rank"] == 0 and not first["ready"] and first["joined"] == 1
    job = _job(api, job_id)
    assert (
        job["status"] == "queued"
        and job["gang"]["gathering"]
        and "gathering: 1 of 2 runners" in job["waiting_for"]
    )
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin).text
    assert "gathering: 1 of 2 runners" in page and "rank 0: node-a" in page
    again = _claim(api, a, workloads=True, rdzv_endpoint="127.0.0.1:29999").json()["gang"]
    assert again["node_rank"] == 0 and again["attempt"] == 1  # its own seat back, not a second one
    second = _claim(api, b, workloads=True, rdzv_endpoint="127.0.0.1:29500").json()["gang"]
    assert second["node_rank"] == 1 and second["ready"] and second["endpoint"] == "127.0.0.1:29400"
    seat = api.client.post(f"/api/v1/runners/jobs/{job_id}/gang", json={"lease_s": 60}, headers=a)
    assert seat.status_code == 200 and seat.json()["ready"] and seat.json()["endpoint"] == "127.0.0.1:29400"
    spec = _job(api, job_id)["spec"]
    r = _post(api, job_id, b, _result(spec, node="node-b", node_rank=1, rank=1, key="key-b-0001"))
    assert r.status_code == 201 and not r.json()["complete"] and _job(api, job_id)["status"] == "running"
    r = _post(api, job_id, a, _result(spec, node="node-a", node_rank=0, rank=0, key="key-a-0001"))
    assert r.status_code == 201 and r.json()["complete"]
    api.compare()
    c = api.client.get(f"/api/v1/jobs/{job_id}/workload", headers=api.admin).json()
    step = next(q for q in c["quantities"] if q["name"] == "step")
    assert {r["side"]: set(r["medians_s"]) for r in step["ranks"]} == {
        "baseline": {"0", "1"},
        "candidate": {"0", "1"},
    }


def test_a_gathering_past_its_rdzv_timeout_frees_its_seats(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit(_spec(nnodes=2))
    a = api.runner("node-a")
    assert not _claim(api, a, workloads=True, rdzv_endpoint="127.0.0.1:29400").json()["gang"]["ready"]
    with api.factory.begin() as session:  # the first seat is now 31 s old (rdzv_timeout_s = 30)
        for seat in session.scalars(select(GangMember)):
            seat.joined_at -= timedelta(seconds=31)
    r = api.client.post(f"/api/v1/runners/jobs/{job_id}/gang", json={"lease_s": 60}, headers=a)
    assert r.status_code == 409, r.text
    job = _job(api, job_id)
    assert job["status"] == "queued" and job["gang"] is None and job["attempts"] == 0


def test_a_member_whose_lease_runs_out_fails_the_attempt_for_the_whole_gang(api) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit(_spec(nnodes=2))
    a, b = api.runner("node-a"), api.runner("node-b")
    _claim(api, a, workloads=True, rdzv_endpoint="127.0.0.1:29400")
    assert _claim(api, b, workloads=True, rdzv_endpoint="127.0.0.1:29500").json()["gang"]["ready"]
    beat = f"/api/v1/runners/jobs/{job_id}/heartbeat"
    assert api.client.post(beat, json={"lease_s": 60}, headers=a).status_code == 200
    with api.factory.begin() as session:  # node-b died: its seat's lease ran out before it joined
        dead = session.scalars(select(GangMember).where(GangMember.node_rank == 1)).one()
        dead.lease_expires_at = dead.joined_at - timedelta(seconds=1)
        session.get_one(Job, job_id).lease_expires_at = dead.lease_expires_at
    lost = api.client.post(beat, json={"lease_s": 60}, headers=a)
    assert lost.status_code == 409, lost.text
    job = _job(api, job_id)
    assert job["status"] == "queued" and job["attempts"] == 1
    attempts = api.client.get(f"/api/v1/jobs/{job_id}/attempts", headers=api.admin).json()["data"]
    assert [x["outcome"] for x in attempts] == ["expired"]
    retry = _claim(api, b, workloads=True, rdzv_endpoint="127.0.0.1:29501").json()["gang"]
    assert retry["attempt"] == 2 and retry["node_rank"] == 0 and not retry["ready"]
