"""Node health through the real app and database: GET /nodes/{name} reports status, reasons and
bands; a job measured on a degraded node carries the flag and the note (REST, Markdown, page)."""

from __future__ import annotations

from datetime import timedelta

from factories import job_result, spec_dict
from health_fixtures import h200x2_report

from kernelab.service.contract.schemas import ProbeReport

NODE = "h200-node-1"


def _post_probe(api, runner, report: ProbeReport) -> None:  # type: ignore[no-untyped-def]
    headers = {**runner, "content-type": "application/json"}
    r = api.client.post(f"/api/v1/nodes/{NODE}/probes", content=report.model_dump_json(), headers=headers)
    assert r.status_code == 201, r.text


def _job_on_node(api, runner, before: ProbeReport, after: ProbeReport) -> int:  # type: ignore[no-untyped-def]
    job_id = api.submit(spec_dict())
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    result = job_result(job_id, hostname=NODE, key=f"health-key-{job_id:04d}")
    result = result.model_copy(
        update={
            "probes": [
                before.model_copy(update={"phase": "before"}),
                after.model_copy(update={"phase": "after"}),
            ]
        }
    )
    assert api.post_result(job_id, result, runner).status_code == 201
    return job_id


def test_node_health_status_bands_and_job_flags(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(NODE)
    read = api.token("read")
    for minute in range(4):
        _post_probe(api, runner, h200x2_report(minute))
    detail = api.client.get(f"/api/v1/nodes/{NODE}", headers=read).json()
    state = detail["health"]
    assert state["status"] == "healthy" and state["reasons"] == [] and state["healthy_probes"] == 4
    bands = {b["figure"]: b for b in state["bands"]}
    assert bands["copy GPU 1"]["n"] == 4 and bands["copy GPU 1"]["scope"] == "node"
    assert bands["copy GPU 1"]["limit"] == 0.9 * bands["copy GPU 1"]["median"]

    healthy_job = _job_on_node(api, runner, h200x2_report(5), h200x2_report(6))
    comparison = api.client.get(f"/api/v1/jobs/{healthy_job}/comparison", headers=read).json()
    assert "degraded-node" not in comparison["flags"] and comparison["notes"] == []

    # GPU 1 copies at 70% of its band during the next job: the node is degraded, the job flagged.
    sick_job = _job_on_node(
        api, runner, h200x2_report(10, copy_scale=(1.0, 0.7)), h200x2_report(11, copy_scale=(1.0, 0.7))
    )
    state = api.client.get(f"/api/v1/nodes/{NODE}", headers=read).json()["health"]
    assert state["status"] == "degraded" and state["flags"] == ["degraded-node"]
    assert [(r["code"], r["device_index"]) for r in state["reasons"]] == [("copy-outside-band", 1)]
    comparison = api.client.get(f"/api/v1/jobs/{sick_job}/comparison", headers=read).json()
    assert "degraded-node" in comparison["flags"]
    assert all("degraded-node" in c["flags"] for c in comparison["cells"])
    assert "copy GPU 1" in comparison["notes"][0] and "exclude" in comparison["notes"][0]
    markdown = api.client.get(f"/api/v1/jobs/{sick_job}/report.md", headers=read).text
    assert "degraded node" in markdown and "copy GPU 1" in markdown
    # The earlier job is judged by the band of its day: it stays clean.
    comparison = api.client.get(f"/api/v1/jobs/{healthy_job}/comparison", headers=read).json()
    assert "degraded-node" not in comparison["flags"]

    page = api.client.get(f"/nodes/{NODE}", headers=api.admin)
    assert page.status_code == 200
    assert "health-degraded" in page.text and "copy GPU 1" in page.text and 'id="node-bands"' in page.text
    job_page = api.client.get(f"/jobs/{sick_job}", headers=api.admin)
    assert "node-health-note" in job_page.text


def test_contended_node(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(NODE)
    report = h200x2_report(0)
    gpu0, gpu1 = report.telemetry
    busy = gpu1.model_copy(update={"other_processes": [{"pid": 7, "own": True}, {"pid": 8, "own": False}]})
    _post_probe(
        api,
        runner,
        report.model_copy(
            update={"telemetry": [gpu0, busy], "taken_at": report.taken_at + timedelta(hours=1)}
        ),
    )
    state = api.client.get(f"/api/v1/nodes/{NODE}", headers=api.token("read")).json()["health"]
    assert state["status"] == "contended"
    assert [(r["code"], r["device_index"], r["flag"]) for r in state["reasons"]] == [
        ("other-tenant", 1, "contended")
    ]


def test_unknown_node_is_404(api) -> None:  # type: ignore[no-untyped-def]
    r = api.client.get("/api/v1/nodes/nowhere", headers=api.token("read"))
    assert r.status_code == 404 and "nowhere" in r.json()["detail"]
