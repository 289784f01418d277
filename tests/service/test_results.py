"""Result ingestion: stored whole, idempotent, rebuilt exactly; raw samples as JSON and CSV;
probe reports and nodes."""

from __future__ import annotations

import csv
import gc
import io
import json

from factories import job_result, list_form, probe_report
from sqlalchemy import func, select

from kernelab.service.server import crud
from kernelab.service.server.models import Cell, ProbeReading, ProbeReport, Result, SampleBlock


def _counts(api) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    """Rows of results, cells, probe reports and readings; raw samples (summed over the blocks)."""
    with api.factory() as session:
        tables = (Result, Cell, ProbeReport, ProbeReading)
        count = select(func.count())
        results, cells, reports, readings = (session.scalar(count.select_from(t)) for t in tables)
        samples = session.scalar(select(func.coalesce(func.sum(SampleBlock.n), 0)))
        return (results, cells, samples, reports, readings)


def _claimed(api, name: str = "node-a"):  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner(name)
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    return job_id, runner


def test_ingest_is_idempotent_and_round_trips(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    result = job_result(job_id)
    first = api.post_result(job_id, result, runner)
    assert first.status_code == 201 and first.json()["duplicate"] is False
    counts = _counts(api)
    assert counts == (1, 2, 2 * 6 * 4, 2, 2 * 3)
    again = api.post_result(job_id, result, runner)
    assert again.status_code == 200
    assert again.json() == {"job_id": job_id, "result_id": first.json()["result_id"], "duplicate": True}
    assert _counts(api) == counts
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert job["status"] == "succeeded" and job["finished_at"]
    with api.factory() as session:
        assert crud.load_result(session=session, job_id=job_id) == result
        assert crud.load_result(session=session, job_id=job_id + 1) is None


def test_invalid_sample_stores_nothing(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    body = list_form(job_result(job_id))
    body["cells"][1]["samples"]["duration_ns"][3] = -5.0
    r = api.client.post(f"/api/v1/jobs/{job_id}/results", json=body, headers=runner)
    assert r.status_code == 422
    assert ["body", "cells", 1, "samples", "duration_ns", 3] in [e["loc"] for e in r.json()["detail"]]
    assert _counts(api) == (0, 0, 0, 0, 0)
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["status"] == "running"


def test_sample_columns_of_unequal_length_are_refused_by_name(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    body = list_form(job_result(job_id))
    body["cells"][0]["samples"]["round"].pop()
    body["cells"][1]["samples"]["power_w"][0] = float("inf")
    r = api.client.post(f"/api/v1/jobs/{job_id}/results", content=json.dumps(body), headers={
        **runner, "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 422
    errors = {tuple(e["loc"]): e["msg"] for e in r.json()["detail"]}
    assert "samples.round has 23 values but samples.variant has 24" in errors["body", "cells", 0, "samples"]
    assert ("body", "cells", 1, "samples", "power_w", 0) in errors
    body = list_form(job_result(job_id))
    body["cells"][0]["samples"]["duration"] = body["cells"][0]["samples"].pop("duration_ns")
    r = api.client.post(f"/api/v1/jobs/{job_id}/results", json=body, headers=runner)
    assert r.status_code == 422
    assert ["body", "cells", 0, "samples", "duration"] in [e["loc"] for e in r.json()["detail"]]
    assert _counts(api) == (0, 0, 0, 0, 0)


def test_row_form_of_older_runners_is_stored_the_same(api) -> None:  # type: ignore[no-untyped-def]
    """A body whose cells carry one JSON object per sample (the form before columns) is accepted,
    validated per row (``loc`` names the row) and stored exactly as the columnar form."""
    job_id, runner = _claimed(api)
    result = job_result(job_id)
    body = json.loads(result.model_dump_json())
    for cell, posted in zip(body["cells"], result.cells, strict=True):
        cell["samples"] = [s.model_dump(exclude_defaults=True) for s in posted.samples.rows()]
    bad = json.loads(json.dumps(body))
    bad["cells"][1]["samples"][3]["round"] = -1
    r = api.client.post(f"/api/v1/jobs/{job_id}/results", json=bad, headers=runner)
    assert r.status_code == 422
    assert ["body", "cells", 1, "samples", 3, "round"] in [e["loc"] for e in r.json()["detail"]]
    assert api.client.post(f"/api/v1/jobs/{job_id}/results", json=body, headers=runner).status_code == 201
    with api.factory() as session:
        assert crud.load_result(session=session, job_id=job_id) == result


def test_failure_inside_the_transaction_rolls_everything_back(api, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A database error after the result row, the cells and the sample blocks were inserted (here:
    a unique key broken while storing the probes): 409 and nothing stored, the job still running."""
    from sqlalchemy.exc import IntegrityError

    from kernelab.service.server.crud import ingest

    def broken(**_: object) -> None:
        raise IntegrityError("INSERT INTO probe_reports ...", {}, Exception("duplicate key value"))

    job_id, runner = _claimed(api)
    monkeypatch.setattr(ingest, "store_probe_report", broken)  # what store_result calls
    r = api.post_result(job_id, job_result(job_id), runner)
    assert r.status_code == 409 and "conflicts with stored data" in r.json()["detail"]
    assert _counts(api) == (0, 0, 0, 0, 0)
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["status"] == "running"


def test_result_must_fit_the_job(api) -> None:  # type: ignore[no-untyped-def]
    """Cells outside the sweep, repeated, with other params or missing, and another spec: 422
    naming the field, nothing stored, the job still running; the complete result then lands."""
    job_id, runner = _claimed(api)
    good = job_result(job_id)  # the 2 cells of spec_dict()'s sweep
    cases = [  # (result, the fields the 422 names)
        (good.model_copy(update={"cells": [good.cells[0], good.cells[0]]}), ["cells.1.index", "cells"]),
        (good.model_copy(update={"cells": [good.cells[0].model_copy(update={"index": 99})]}),
         ["cells.0.index", "cells"]),
        (good.model_copy(update={"cells": [good.cells[0], good.cells[1].model_copy(
            update={"params": {**good.cells[1].params, "N": 12345}})]}), ["cells.1.params"]),
        (good.model_copy(update={"cells": good.cells[:1]}), ["cells"]),
        (good.model_copy(update={"node": good.node.model_copy(update={"device_type": "cuda"})}),
         ["node.device_type"]),  # spec_dict() asks for device: cpu
        (good.model_copy(update={"spec": good.spec.model_copy(update={"name": "forged"})}), ["spec"]),
    ]  # fmt: skip
    for result, locs in cases:
        r = api.post_result(job_id, result, runner)
        assert r.status_code == 422, (locs, r.text)
        assert [".".join(map(str, e["loc"][1:])) for e in r.json()["detail"]] == locs, r.text
        assert all(e["msg"] for e in r.json()["detail"])
        assert _counts(api) == (0, 0, 0, 0, 0)
    assert "differs in: name" in api.post_result(job_id, cases[-1][0], runner).json()["detail"][0]["msg"]
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()["status"] == "running"
    # A result with a job-level error may hold part of the sweep (what was measured before it failed).
    partial = good.model_copy(update={"cells": good.cells[:1], "error": "OOM in cell 1"})
    assert api.post_result(job_id, partial, runner).status_code == 201


def test_a_repeated_key_must_repeat_the_result(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    first = job_result(job_id, key="retry-key-1")
    assert api.post_result(job_id, first, runner).status_code == 201
    again = api.post_result(job_id, first, runner)
    assert again.status_code == 200 and again.json()["duplicate"] is True
    other = first.model_copy(update={"cells": first.cells[:1], "error": "different"})
    r = api.post_result(job_id, other, runner)
    assert r.status_code == 409, r.text
    assert "different result" in r.json()["detail"] and "error" in r.json()["detail"]
    assert "cells" in r.json()["detail"]
    cell_error = first.model_copy(update={"cells": [first.cells[0].model_copy(update={"error": "OOM"}),
                                                    *first.cells[1:]]})  # fmt: skip
    r = api.post_result(job_id, cell_error, runner)
    assert r.status_code == 409 and "differs in: cells" in r.json()["detail"], r.text


def test_result_needs_the_lease(api) -> None:  # type: ignore[no-untyped-def]
    job_id, _ = _claimed(api)
    r = api.post_result(job_id, job_result(job_id, hostname="intruder"), api.runner("intruder"))
    assert r.status_code == 409 and "lease" in r.json()["detail"]
    r = api.post_result(job_id, job_result(job_id + 1, hostname="intruder"), api.runner("intruder"))
    assert r.status_code == 409 and "names job" in r.json()["detail"]
    assert _counts(api) == (0, 0, 0, 0, 0)


def test_result_with_error_fails_the_job(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    assert api.post_result(job_id, job_result(job_id, error="OOM in cell 1"), runner).status_code == 201
    job = api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).json()
    assert (job["status"], job["error"]) == ("failed", "OOM in cell 1")


def test_samples_json_and_csv(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    read = api.token("read")
    assert api.client.get(f"/api/v1/jobs/{job_id}/samples", headers=read).status_code == 409
    result = job_result(job_id)
    api.post_result(job_id, result, runner)
    expected = [
        (c.index, s.variant, s.round, s.position, s.duration_ns)
        for c in result.cells
        for s in c.samples.rows()
    ]
    rows = api.client.get(f"/api/v1/jobs/{job_id}/samples?format=json", headers=read).json()
    assert [
        (r["cell_index"], r["variant"], r["round"], r["position"], r["duration_ns"]) for r in rows
    ] == expected
    assert rows[0]["params"] == {"M": 4, "N": 64} and rows[0]["throttled"] is True
    r = api.client.get(f"/api/v1/jobs/{job_id}/samples?format=csv", headers=read)
    assert r.headers["content-type"].startswith("text/csv")
    table = list(csv.DictReader(io.StringIO(r.text)))
    assert list(table[0]) == list(crud.SAMPLE_COLUMNS)
    assert [(int(t["cell_index"]), t["variant"], int(t["round"]), int(t["position"]), float(t["duration_ns"]))
            for t in table] == expected  # fmt: skip
    assert json.loads(table[-1]["params"]) == {"M": 4, "N": 128}
    assert api.client.get(f"/api/v1/jobs/{job_id}/samples?format=xml", headers=read).status_code == 422


def test_probe_reports_and_nodes(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api, "node-a")
    api.post_result(job_id, job_result(job_id, hostname="node-a"), runner)
    body = probe_report("adhoc", gbps=7.5).model_dump_json()
    headers = {**api.runner("node-b"), "content-type": "application/json"}  # node-b's own runner
    r = api.client.post("/api/v1/nodes/node-b/probes", content=body, headers=headers)
    assert r.status_code == 201 and r.json()["node"] == "node-b"
    read = api.token("read")
    nodes = api.client.get("/api/v1/nodes", headers=read).json()
    assert nodes["count"] == 2
    assert [(n["name"], n["probe_reports"], n["results"]) for n in nodes["data"]] == [
        ("node-a", 2, 1),
        ("node-b", 1, 0),
    ]
    detail = api.client.get("/api/v1/nodes/node-a", headers=read).json()
    assert [p["report"]["phase"] for p in detail["probes"]] == ["after", "before"]
    assert {p["job_id"] for p in detail["probes"]} == {job_id}
    assert detail["node"]["hostname"] == "node-a"
    with api.factory() as session:
        readings = crud.probe_readings(session=session, node_name="node-b", kind="copy_bandwidth")
        assert [(r["value_gbps"], r["phase"]) for r in readings] == [(7.5, "adhoc")]
        busbw = crud.probe_readings(session=session, node_name="node-a", kind="all_reduce")
        assert [r["busbw_gbps"] for r in busbw] == [0.00027, 1.165, 0.00027, 1.165]
    assert api.client.get("/api/v1/nodes/node-z", headers=read).status_code == 404
    assert api.client.post("/api/v1/nodes/node-b/probes", json={}, headers=api.admin).status_code == 403


def test_garbage_collection_pauses_during_an_ingest_and_resumes(api) -> None:  # type: ignore[no-untyped-def]
    """The results route pauses the cyclic collector while it runs (nestable) and restores it."""
    from kernelab.service.server.api.raw_body import gc_paused as _gc_paused

    assert gc.isenabled()
    with _gc_paused():
        with _gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    job_id, runner = _claimed(api)
    assert api.post_result(job_id, job_result(job_id), runner).status_code == 201
    assert api.client.post(f"/api/v1/jobs/{job_id}/results", content=b"{", headers=runner).status_code == 422
    assert gc.isenabled()
