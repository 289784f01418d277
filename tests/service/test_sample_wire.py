"""The samples' wire forms: base64 columns (written since schema_version 2), JSON-list columns and
rows (older runners), each parsed straight into the same numpy arrays; ``schema_version`` checks;
an old-format result still ingests over HTTP and reads back bit for bit."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from factories import job_result, spec_dict
from pydantic import ValidationError

from kernelab.service.contract.schemas import (
    RESULT_SCHEMA_VERSION,
    SAMPLE_FIELDS,
    CellResult,
    JobResult,
    ResultHeader,
    SampleColumns,
)
from kernelab.service.judge import stats
from kernelab.service.server import crud

pytestmark = pytest.mark.timeout(120)


def awkward(n: int = 40, seed: int = 3) -> SampleColumns:
    """Samples whose floats need all 17 digits, with subnormal, zero and huge durations and
    partial nulls in every context column."""
    rng = np.random.default_rng(seed)
    duration = rng.random(n) * 10.0 ** rng.integers(-3, 12, n)
    duration[:3] = [0.0, 5e-324, 86_400e9]
    clocks = rng.random(n) * 2000
    clocks[::3] = np.nan
    reasons = rng.integers(-1, 2**62, n)
    return SampleColumns.from_arrays(
        variant=rng.integers(0, 2, n), round=np.arange(n) // 2, position=np.arange(n) % 2,
        duration_ns=duration, launches=rng.integers(1, 2**31 - 1, n), sm_clock_mhz=clocks,
        clock_event_reasons=reasons,
        temperature_c=np.where(rng.random(n) < 0.3, np.nan, rng.normal(40, 30, n)),
        power_w=np.where(rng.random(n) < 0.3, np.nan, rng.random(n) * 700), throttled=rng.random(n) < 0.2,
    )  # fmt: skip


def same_bits(a: SampleColumns, b: SampleColumns) -> bool:
    """Every column of ``a`` and ``b`` holds the same bytes in the same dtype."""
    return all(
        getattr(a, n).dtype == getattr(b, n).dtype and getattr(a, n).tobytes() == getattr(b, n).tobytes()
        for n in SAMPLE_FIELDS
    )


def _cell(samples: Any) -> str:
    return json.dumps({"index": 0, "params": {}, "samples": samples})


def test_the_three_wire_forms_parse_to_the_same_arrays_bit_for_bit() -> None:
    cols = awkward()
    base64_form = json.loads(cols.model_dump_json())
    assert base64_form["encoding"] == "base64" and base64_form["n"] == len(cols)
    lists, rows = cols.model_dump(), [r.model_dump() for r in cols.rows()]
    parsed = [CellResult.model_validate_json(_cell(form)).samples for form in (base64_form, lists, rows)]
    assert all(same_bits(p, cols) for p in parsed)
    assert cols.duration_ns.dtype == np.float64 and cols.variant.dtype == np.uint8


def test_base64_columns_are_the_little_endian_bytes_of_their_dtype() -> None:
    cols = SampleColumns(
        variant=["baseline", "candidate"], round=[0, 0], position=[0, 1], duration_ns=[1.5, 2.0]
    )
    form = json.loads(cols.model_dump_json())
    assert set(form) == {"encoding", "n", "variant", "round", "position", "duration_ns"}  # defaults left out
    assert form["duration_ns"]["dtype"] == "<f8"
    assert base64.b64decode(form["duration_ns"]["data"]) == np.array([1.5, 2.0], "<f8").tobytes()
    assert base64.b64decode(form["variant"]["data"]) == b"\x00\x01"


def _bad(form: dict[str, Any], **change: Any) -> list[dict[str, Any]]:
    with pytest.raises(ValidationError) as info:
        CellResult.model_validate_json(_cell({**form, **change}))
    return info.value.errors()


def _column(values: list[Any], dtype: str) -> dict[str, str]:
    return {"dtype": dtype, "data": base64.b64encode(np.array(values, dtype=dtype).tobytes()).decode()}


def test_a_base64_column_of_another_dtype_length_or_alphabet_names_the_column() -> None:
    form = json.loads(
        SampleColumns(variant=["baseline"], round=[0], position=[0], duration_ns=[1.0]).model_dump_json()
    )
    [e] = _bad(form, duration_ns=_column([1.0], "<f4"))
    assert e["loc"] == ("samples", "duration_ns", "dtype") and "'<f8'" in e["msg"]
    [e] = _bad(form, duration_ns=_column([1.0, 2.0], "<f8"))
    assert e["loc"] == ("samples", "duration_ns", "data") and "expected n = 1" in e["msg"]
    [e] = _bad(form, round={"dtype": "<i4", "data": "AAAA*AAA"})
    assert e["loc"] == ("samples", "round", "data") and "base64" in e["msg"]
    [e] = _bad(form, encoding="zlib")
    assert e["loc"] == ("samples", "encoding")
    [e] = _bad(form, duration="x")
    assert e["loc"] == ("samples", "duration")  # an unknown column, as in the list form
    assert {e["loc"] for e in _bad({**form, "n": 1}, round=None)} == {("samples", "round")}


def test_a_declared_n_the_columns_do_not_hold_allocates_nothing() -> None:
    """``n`` near 2**31 with one-value columns and the optional columns left out: a 422 naming the
    short column, found before any column of n values is made (the body bounds what is decoded)."""
    import tracemalloc

    form = json.loads(
        SampleColumns(variant=["baseline"], round=[0], position=[0], duration_ns=[1.0]).model_dump_json()
    )
    for optional in (
        "launches",
        "sm_clock_mhz",
        "clock_event_reasons",
        "temperature_c",
        "power_w",
        "throttled",
    ):
        form.pop(optional, None)
    tracemalloc.start()
    try:
        errors = _bad({**form, "n": 2**31 - 1})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert {e["loc"][1] for e in errors} == {"variant", "round", "position", "duration_ns"}
    assert peak < 16 * 2**20  # a column of 2**31 float64 values is 16 GiB


@pytest.mark.parametrize(
    ("column", "values", "dtype"),
    [
        ("variant", [0, 2], "u1"), ("round", [0, -1], "<i4"), ("position", [0, -5], "<i4"),
        ("duration_ns", [1.0, float("nan")], "<f8"), ("duration_ns", [1.0, -1.0], "<f8"),
        ("duration_ns", [1.0, 86_401e9], "<f8"), ("launches", [1, 0], "<i4"),
        ("sm_clock_mhz", [1.0, float("inf")], "<f8"), ("sm_clock_mhz", [1.0, -1.0], "<f8"),
        ("clock_event_reasons", [0, -2], "<i8"), ("temperature_c", [1.0, float("-inf")], "<f8"),
        ("power_w", [1.0, -3.0], "<f8"), ("throttled", [1, 2], "u1"),
    ],
)  # fmt: skip
def test_a_base64_value_sample_refuses_names_its_column_and_index(
    column: str, values: list[Any], dtype: str
) -> None:
    two = SampleColumns(
        variant=["baseline", "candidate"], round=[0, 0], position=[0, 1], duration_ns=[1.0, 2.0]
    )
    form = json.loads(two.model_dump_json())
    [e] = _bad(form, **{column: _column(values, dtype)})
    assert e["loc"] == ("samples", column, 1) and f"samples.{column}[1]" in e["msg"]


def test_from_arrays_validates_what_the_engine_measured() -> None:
    with pytest.raises(ValidationError) as info:
        SampleColumns.from_arrays(variant=[0, 1], round=[0, 0], position=[0, 1], duration_ns=[1.0, np.nan])
    assert info.value.errors()[0]["loc"] == ("duration_ns", 1)
    with pytest.raises(ValidationError, match="has 1 values, not 2"):
        SampleColumns.from_arrays(variant=[0, 1], round=[0], position=[0, 1], duration_ns=[1.0, 2.0])


def test_schema_version_is_written_and_a_newer_one_is_refused() -> None:
    result = job_result(1)
    doc = json.loads(result.model_dump_json())
    assert next(iter(doc)) == "schema_version" and doc["schema_version"] == RESULT_SCHEMA_VERSION
    del doc["schema_version"]  # a version-1 document (older runners) is read: upgraded
    assert JobResult.model_validate(doc).schema_version == RESULT_SCHEMA_VERSION
    assert ResultHeader.model_validate(doc).schema_version == 1
    for version, error in ((RESULT_SCHEMA_VERSION + 1, "schema_version_newer"), (0, "greater_than_equal"),
                           ("2", "int_type")):  # fmt: skip
        with pytest.raises(ValidationError) as info:
            JobResult.model_validate_json(json.dumps({**doc, "schema_version": version}))
        assert [(e["loc"], e["type"]) for e in info.value.errors()] == [(("schema_version",), error)]


def _v1_document(result: JobResult) -> bytes:
    """``result`` as a runner before schema_version 2 wrote it: no ``schema_version``, samples as
    JSON-list columns (the first cell in the row form)."""
    doc = json.loads(result.model_dump_json())
    del doc["schema_version"]
    for i, (cell, stored) in enumerate(zip(doc["cells"], result.cells, strict=True)):
        lists = stored.samples.model_dump()
        cell["samples"] = (
            [r.model_dump(exclude_defaults=True) for r in stored.samples.rows()] if i == 0 else lists
        )
    return json.dumps(doc).encode()


@pytest.mark.parametrize("form", ["old", "new"])
def test_a_result_of_either_format_ingests_and_reads_back_bit_for_bit(api, form: str) -> None:  # type: ignore[no-untyped-def]
    spec = spec_dict(sweep={"M": [4], "N": [64, 128]})
    job = api.submit(spec)
    runner = api.runner()
    api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner)
    result = job_result(job, spec=spec)
    for i, cell in enumerate(result.cells):
        cell.samples = awkward(seed=i)
    body = _v1_document(result) if form == "old" else result.model_dump_json().encode()
    assert (b'"encoding":"base64"' in body) == (form == "new")
    r = api.client.post(f"/api/v1/jobs/{job}/results", content=body,
                        headers={**runner, "content-type": "application/json"})  # fmt: skip
    assert r.status_code == 201, r.text
    with api.factory() as session:
        stored = crud.load_result(session=session, job_id=job)
    assert stored is not None
    assert all(same_bits(a.samples, b.samples) for a, b in zip(stored.cells, result.cells, strict=True))
    assert stats.compare(stored).model_dump_json() == stats.compare(result).model_dump_json()


def test_a_result_of_a_newer_schema_version_is_a_422_naming_it(api) -> None:  # type: ignore[no-untyped-def]
    job = api.submit()
    runner = api.runner()
    api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner)
    doc = json.loads(job_result(job).model_dump_json())
    doc["schema_version"] = RESULT_SCHEMA_VERSION + 1
    r = api.client.post(f"/api/v1/jobs/{job}/results", json=doc, headers=runner)
    assert r.status_code == 422
    assert [e["loc"] for e in r.json()["detail"]] == [["body", "schema_version"]]
    assert "newer than this reader" in r.json()["detail"][0]["msg"]


RAW = Path(__file__).resolve().parents[2] / "docs" / "results" / "raw"


@pytest.mark.parametrize("name", sorted(p.name for p in RAW.glob("*-result.json")))
def test_a_stored_version_1_result_file_reads_and_compares_as_its_version_2_form(name: str) -> None:
    """Real H200 results written before schema_version (rows of samples, no version key)."""
    text = (RAW / name).read_text(encoding="utf-8")
    assert "schema_version" not in json.loads(text)
    old = JobResult.model_validate_json(text)
    new = JobResult.model_validate_json(old.model_dump_json())
    assert all(same_bits(a.samples, b.samples) for a, b in zip(old.cells, new.cells, strict=True))
    assert sum(len(c.samples) for c in old.cells) > 0
    assert stats.compare(new).model_dump_json() == stats.compare(old).model_dump_json()
