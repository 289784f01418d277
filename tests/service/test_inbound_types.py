"""The inbound types every schema shares, on SQLite and PostgreSQL: text without U+0000, aware UTC
timestamps, finite strict numbers, samples that refuse unknown fields. Each refusal is a 422 whose
``loc`` names the field and stores nothing; each accepted value reads back the same on both."""

from __future__ import annotations

import json
from typing import Any

import pytest
from factories import job_result, list_form, probe_report
from sqlalchemy import func, select

from kernelab.service.server.models import Cell, ProbeReport, Result, Token


def _claimed(api):  # type: ignore[no-untyped-def]
    job_id = api.submit()
    runner = api.runner("node-a")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    return job_id, runner


def _stored(api) -> tuple[int, int, int]:  # type: ignore[no-untyped-def]
    with api.factory() as session:
        return tuple(session.scalar(select(func.count()).select_from(t)) for t in (Result, Cell, ProbeReport))


def _set(body: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        body = body[key]
    body[path[-1]] = value


def _locs(response) -> list[tuple[Any, ...]]:  # type: ignore[no-untyped-def]
    return [tuple(e["loc"]) for e in response.json()["detail"]]


def _post(api, job_id: int, runner: dict[str, str], body: dict[str, Any]):  # type: ignore[no-untyped-def]
    return api.client.post(f"/api/v1/jobs/{job_id}/results", content=json.dumps(body),
                           headers={**runner, "content-type": "application/json"})  # fmt: skip


# Every kind of inbound text of a result; the value at each path gets a NUL in it.
NUL_PATHS: list[tuple[Any, ...]] = [
    ("error",),
    ("node", "hostname"),
    ("node", "device_name"),
    ("timer",),
    ("cells", 0, "error"),
    ("cells", 0, "correctness", "baseline", "message"),
    ("cells", 0, "correctness", "candidate", "dtype"),
    ("probes", 0, "notes"),
    ("probes", 0, "errors"),
]


@pytest.mark.parametrize("path", NUL_PATHS, ids=lambda p: ".".join(map(str, p)))
def test_nul_in_any_result_text_is_a_422_naming_the_field(api, path: tuple[Any, ...]) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    body = json.loads(job_result(job_id).model_dump_json())
    if path[-1] == "notes":
        value: Any = ["skipped\x00"]
        field = (*path, 0)
    elif path[-1] == "errors":
        value = {"copy": "bad\x00text"}
        field = (*path, "copy")
    else:
        value = "bad\x00text"
        field = path
    _set(body, path, value)
    r = _post(api, job_id, runner, body)
    assert r.status_code == 422, r.text
    assert ("body", *field) in _locs(r), r.text
    assert "U+0000" in r.text
    assert _stored(api) == (0, 0, 0)


def test_nul_in_nested_json_of_telemetry_is_refused_by_name(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    body = json.loads(job_result(job_id).model_dump_json())
    body["probes"][0]["telemetry"] = [{"device_index": 0, "other_processes": [{"pid": 7, "name": "x\x00y"}]}]
    r = _post(api, job_id, runner, body)
    assert r.status_code == 422, r.text
    assert ("body", "probes", 0, "telemetry", 0, "other_processes", 0) in _locs(r)
    assert _stored(api) == (0, 0, 0)


def test_nul_in_token_names_runner_nodes_and_probes_is_refused_by_name(api) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/tokens", json={"name": "ci\x00bot", "scopes": ["read"]}, headers=api.admin)
    assert r.status_code == 422, r.text
    assert ("body", "name") in _locs(r)
    body = {"name": "runner-b", "node": {"hostname": "h\x00st", "device_type": "cpu"}}
    r = api.client.post("/api/v1/runners/register", json=body, headers=api.admin)
    assert r.status_code == 422, r.text
    assert ("body", "node", "hostname") in _locs(r)
    runner = api.runner("node-a")
    report = probe_report().model_dump(mode="json")
    report["nvml_status"] = "NVML\x00error"
    r = api.client.post("/api/v1/nodes/node-a/probes", json=report, headers=runner)
    assert r.status_code == 422, r.text
    assert ("body", "nvml_status") in _locs(r)
    with api.factory() as session:
        assert session.scalar(select(func.count()).select_from(Token).where(Token.name.like("ci%"))) == 0
    assert _stored(api) == (0, 0, 0)


def test_zone_less_timestamps_are_refused_by_name(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    body = json.loads(job_result(job_id).model_dump_json())
    body["started_at"] = "2026-01-02T03:04:05"
    body["probes"][1]["taken_at"] = "2026-01-02T03:04:18.5"
    r = _post(api, job_id, runner, body)
    assert r.status_code == 422, r.text
    errors = {tuple(e["loc"]): e["type"] for e in r.json()["detail"]}
    assert errors[("body", "started_at")] == "timezone_aware"
    assert errors[("body", "probes", 1, "taken_at")] == "timezone_aware"
    report = probe_report().model_dump(mode="json")
    report["taken_at"] = "2026-01-02T08:00:00"
    r = api.client.post("/api/v1/nodes/node-a/probes", json=report, headers=runner)
    assert r.status_code == 422 and ("body", "taken_at") in _locs(r), r.text
    assert _stored(api) == (0, 0, 0)


def test_timestamps_with_a_zone_are_stored_and_answered_in_utc(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner("node-a")
    for taken in ("2026-01-02T07:00:00+05:00", "2026-01-02T01:30:00Z", "2026-01-01T22:00:00-05:00"):
        report = probe_report().model_dump(mode="json")
        report["taken_at"] = taken
        assert api.client.post("/api/v1/nodes/node-a/probes", json=report, headers=runner).status_code == 201
    node = api.client.get("/api/v1/nodes/node-a", headers=api.admin)
    assert node.status_code == 200, node.text
    taken_at = [p["report"]["taken_at"] for p in node.json()["probes"]]
    assert taken_at == ["2026-01-02T03:00:00Z", "2026-01-02T02:00:00Z", "2026-01-02T01:30:00Z"]
    assert node.json()["health"]["taken_at"] == "2026-01-02T03:00:00Z"
    page = api.client.get("/nodes/node-a", headers=api.admin)
    assert page.status_code == 200
    assert "2026-01-02 02:00:00 UTC" in page.text and "07:00:00" not in page.text


def test_huge_samples_are_refused_by_name(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    body = list_form(job_result(job_id))
    body["cells"][0]["samples"]["duration_ns"][5] = 9e307
    r = _post(api, job_id, runner, body)
    assert r.status_code == 422, r.text
    assert ("body", "cells", 0, "samples", "duration_ns", 5) in _locs(r)
    assert _stored(api) == (0, 0, 0)


@pytest.mark.parametrize("value", [True, "1e3", 2.0], ids=["true", "string", "float-for-int"])
def test_numbers_of_samples_and_work_are_strict(api, value: Any) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    body = list_form(job_result(job_id))
    column = "launches" if value == 2.0 else "duration_ns"
    body["cells"][0]["samples"][column][2] = value
    body["cells"][1]["work"]["baseline"]["flops"] = value if value != 2.0 else "2"
    r = _post(api, job_id, runner, body)
    assert r.status_code == 422, r.text
    locs = _locs(r)
    assert ("body", "cells", 0, "samples", column, 2) in locs
    assert ("body", "cells", 1, "work", "baseline", "flops") in locs
    assert _stored(api) == (0, 0, 0)


def test_row_form_samples_refuse_unknown_fields_by_name(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    result = job_result(job_id)
    body = json.loads(result.model_dump_json())
    rows = [s.model_dump(mode="json") for s in result.cells[0].samples.rows()]
    rows[3]["unit"] = "ms"
    rows[4]["duration_ns"] = "1e3"
    body["cells"][0]["samples"] = rows
    r = _post(api, job_id, runner, body)
    assert r.status_code == 422, r.text
    locs = _locs(r)
    assert ("body", "cells", 0, "samples", 3, "unit") in locs
    assert ("body", "cells", 0, "samples", 4, "duration_ns") in locs
    assert _stored(api) == (0, 0, 0)


def test_nonfinite_correctness_metrics_read_the_same_on_both_databases(api) -> None:  # type: ignore[no-untyped-def]
    """NaN/Infinity metrics of a check (a norm over a NaN output) are stored as null, named in
    ``nonfinite_metrics`` and told as ``metric-not-finite``: no "nan" on SQLite, no 422 on
    PostgreSQL."""
    job_id, runner = _claimed(api)
    body = json.loads(job_result(job_id).model_dump_json())
    check = body["cells"][0]["correctness"]["candidate"]
    check.update(passed=False, rel_error=float("nan"), max_abs_error=float("inf"), message="FAIL: rows 0-3")
    text = json.dumps(body)
    assert "NaN" in text and "Infinity" in text
    r = api.client.post(f"/api/v1/jobs/{job_id}/results", content=text,
                        headers={**runner, "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 201, r.text
    api.compare()
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin)
    assert comparison.status_code == 200, comparison.text
    cell = comparison.json()["cells"][0]
    stored = cell["correctness"]["candidate"]
    assert (stored["rel_error"], stored["max_abs_error"]) == (None, None)
    assert stored["nonfinite_metrics"] == ["rel_error", "max_abs_error"]
    codes = {(x["code"], x["side"]) for x in cell["reasons"]}
    assert ("metric-not-finite", "candidate") in codes and ("wrong-output", "candidate") in codes
    assert cell["verdict"] == "incorrect"
    report = api.client.get(f"/api/v1/jobs/{job_id}/report.md", headers=api.admin)
    assert report.status_code == 200 and "nan" not in report.text.lower()


@pytest.mark.parametrize("url", [
    "/api/v1/jobs?benchmark=a%00b", "/history?benchmark=a%00b", "/api/v1/nodes/a%00b", "/nodes/a%00b",
])  # fmt: skip
def test_nul_in_query_and_path_text_is_a_422_naming_it(api, url: str) -> None:  # type: ignore[no-untyped-def]
    r = api.client.get(url, headers=api.admin)
    assert r.status_code == 422, r.text
    where = "query" if "?" in url else "path"
    assert (where, "benchmark" if where == "query" else "name") in _locs(r)


@pytest.mark.parametrize("where", [("cells", 0), ("cells", 0, "correctness", "baseline"), ("node",), ()],
                         ids=["cell", "check", "node", "result"])  # fmt: skip
def test_a_unit_the_server_does_not_know_is_a_422_naming_it(api, where: tuple[Any, ...]) -> None:  # type: ignore[no-untyped-def]
    """``"unit": "ms"`` anywhere in a posted result would leave its numbers 1000x wrong if ignored:
    refused by name, nothing stored (posted models refuse unknown fields)."""
    job_id, runner = _claimed(api)
    body = json.loads(job_result(job_id).model_dump_json())
    _set(body, (*where, "unit"), "ms")
    r = _post(api, job_id, runner, body)
    assert r.status_code == 422, r.text
    assert [e["type"] for e in r.json()["detail"]] == ["extra_forbidden"]
    assert ("body", *where, "unit") in _locs(r)
    assert _stored(api) == (0, 0, 0)


def test_an_unknown_field_of_a_probe_report_is_a_422_naming_it(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner("node-a")
    body = probe_report().model_dump(mode="json")
    body["copy_bandwidth"][0]["bandwidth_unit"] = "GiB/s"
    r = api.client.post("/api/v1/nodes/node-a/probes", json=body, headers=runner)
    assert r.status_code == 422, r.text
    assert ("body", "copy_bandwidth", 0, "bandwidth_unit") in _locs(r)
    assert _stored(api) == (0, 0, 0)


def test_stored_documents_read_whatever_an_older_version_wrote() -> None:
    """``read_stored``: a field a version no longer has is dropped, and a list longer than today's
    door admits is read up to the bound (a page costs what the door admits), where the door
    refuses both by name."""
    from pydantic import ValidationError

    from kernelab.service.contract.schemas import ProbeReport, read_stored
    from kernelab.service.contract.schemas.types import MAX_LIST_ITEMS

    old = probe_report().model_dump(mode="json")
    old |= {"retired_field": 1, "notes": ["skipped"] * (MAX_LIST_ITEMS + 5)}
    with pytest.raises(ValidationError) as refused:
        ProbeReport.model_validate(old)
    assert {e["loc"] for e in refused.value.errors()} == {("retired_field",), ("notes",)}
    read = read_stored(ProbeReport, old)
    assert len(read.notes) == MAX_LIST_ITEMS and read.copy_bandwidth == probe_report().copy_bandwidth


@pytest.mark.parametrize(
    "value", ["\ud800", "a\udfffb", "\udc80"], ids=["high", "low-inside", "escaped-byte"]
)
def test_a_lone_surrogate_is_a_422_naming_the_field_that_can_be_sent(api, value: str) -> None:  # type: ignore[no-untyped-def]
    """A ``\\ud800`` escape (half a surrogate pair) answered 500: the 422 echoed the input, which UTF-8
    cannot encode. Now refused by name; the echo writes the code point as an escape."""
    body = json.dumps({"name": value, "scopes": ["read"]})  # ensure_ascii: the escape itself
    r = api.client.post(
        "/api/v1/tokens", content=body, headers={**api.admin, "content-type": "application/json"}
    )
    assert r.status_code == 422, r.text
    assert ("body", "name") in _locs(r)
    assert "\\ud" in r.text.lower() or "\\\\ud" in r.text.lower()
    with api.factory() as session:
        assert session.scalar(select(func.count()).select_from(Token)) == 1  # the bootstrap admin's


def test_bytes_that_are_not_utf8_name_their_field_in_every_door(api) -> None:  # type: ignore[no-untyped-def]
    """Raw bytes that are not UTF-8 inside a JSON string: FastAPI's door answered 400 naming
    nothing, pydantic's own parser a 422 at a line and column; both doors now name the field."""
    job_id, runner = _claimed(api)
    token = b'{"name": "\xff\xfe", "scopes": ["read"]}'
    r = api.client.post(
        "/api/v1/tokens", content=token, headers={**api.admin, "content-type": "application/json"}
    )
    assert r.status_code == 422 and ("body", "name") in _locs(r), r.text
    result = job_result(job_id).model_dump_json().replace('"timer":"perf_counter"', '"timer":"\x01"').encode()
    r = _post_bytes(api, job_id, runner, result.replace(b"\x01", b"\xed\xa0\x80"))
    assert r.status_code == 422 and ("body", "timer") in _locs(r), r.text
    assert _stored(api) == (0, 0, 0)


def _post_bytes(api, job_id: int, runner: dict[str, str], body: bytes):  # type: ignore[no-untyped-def]
    return api.client.post(f"/api/v1/jobs/{job_id}/results", content=body,
                           headers={**runner, "content-type": "application/json"})  # fmt: skip


@pytest.mark.parametrize(("url", "loc"), [
    ("/api/v1/jobs?benchmark=%FF%FE", ("query", "benchmark")),
    ("/api/v1/history?benchmark=soft%ED%A0%80max", ("query", "benchmark")),
    ("/api/v1/nodes/node%FF", ("path", "name")),
    ("/nodes/node%C3", ("path", "name")),
])  # fmt: skip
def test_path_and_query_bytes_not_utf8_are_refused_by_name(api, url: str, loc: tuple[str, str]) -> None:  # type: ignore[no-untyped-def]
    """Starlette reads them with ``errors="replace"`` (U+FFFD): refused by name before routing."""
    r = api.client.get(url, headers=api.admin)
    assert r.status_code == 422, r.text
    assert loc in _locs(r)
