"""A job that leaves the node changed makes the node degraded until a probe reads as before it:
through the real app and database (SQLite file and PostgreSQL)."""

from __future__ import annotations

from factories import job_result, probe_report, spec_dict

from kernelab.service.contract.schemas import NodeInfo, ProbeReport

NODE = "gpu-node-changed"
GPU = NodeInfo(
    hostname=NODE, device_type="cuda", device_name="NVIDIA H200", device_count=1, python_version="3.12"
)


def _post_probe(api, runner, report: ProbeReport) -> None:  # type: ignore[no-untyped-def]
    headers = {**runner, "content-type": "application/json"}
    r = api.client.post(f"/api/v1/nodes/{NODE}/probes", content=report.model_dump_json(), headers=headers)
    assert r.status_code == 201, r.text


def _health(api, read) -> dict:  # type: ignore[no-untyped-def,type-arg]
    return api.client.get(f"/api/v1/nodes/{NODE}", headers=read).json()["health"]


def test_a_node_left_slow_by_a_job_is_degraded_until_a_probe_reads_as_before(api) -> None:  # type: ignore[no-untyped-def]
    runner, read = api.runner(NODE, device_type="cuda"), api.token("read")
    job_id = api.submit(spec_dict(device="cuda"))
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    before = probe_report("before", gbps=4190.0)
    after = probe_report("after", taken_at=before.taken_at.replace(minute=5), gbps=1391.0)
    result = job_result(job_id, hostname=NODE, key="node-changed-0001", spec=spec_dict(device="cuda"))
    result = result.model_copy(update={"node": GPU, "probes": [before, after]})
    assert api.post_result(job_id, result, runner).status_code == 201

    state = _health(api, read)
    assert state["status"] == "degraded"
    changed = [r for r in state["reasons"] if r["code"] == "node-changed"]
    assert changed and f"job {job_id}" in changed[0]["message"] and "1,391" in changed[0]["message"]
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=read).json()
    assert {c["verdict"] for c in comparison["cells"]} == {"inconclusive"}
    assert [r["code"] for r in comparison["reasons"]] == ["node-changed"]

    _post_probe(api, runner, probe_report("adhoc", taken_at=before.taken_at.replace(minute=7), gbps=1400.0))
    assert _health(api, read)["status"] == "degraded"  # a probe that still reads slow: still degraded
    _post_probe(api, runner, probe_report("adhoc", taken_at=before.taken_at.replace(minute=9), gbps=4185.0))
    back = _health(api, read)
    assert back["status"] == "healthy" and not [r for r in back["reasons"] if r["code"] == "node-changed"]
