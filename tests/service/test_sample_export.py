"""``GET /jobs/{id}/samples`` written column-wise per block (``kernelab.service.server.sample_export``) is the
same
text as one ``json.dumps``/``csv.DictWriter`` call per row, for whole downloads and for pages that
start and end inside blocks; on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import numpy as np
from factories import job_result, spec_dict

from kernelab.service.contract.schemas import SAMPLE_FIELDS, SampleColumns
from kernelab.service.server import crud, sample_export

SWEEP = {"M": [4], "N": [64, 128, 256, 512, 1024, 2048]}  # 6 cells
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def _with_nulls(rng: np.random.Generator, values: np.ndarray, p: float) -> list[Any]:
    """``values`` as a list, each replaced by None with probability ``p``."""
    return [None if null else v for v, null in zip(values.tolist(), rng.random(len(values)) < p, strict=True)]


def _cells(rng: np.random.Generator) -> list[SampleColumns]:
    """Samples of the 6 cells (37, 50, 1, 0, 23, 40 samples): every column full of values of
    many digits and extremes; every nullable column partly null; a CPU runner's block (the context
    columns all null, stored as SQL NULL; one variant, launches and throttled constant); a single
    sample; no samples; the context columns all null but for one sample."""

    def full(n: int, p_null: float) -> SampleColumns:
        return SampleColumns(
            variant=rng.choice(["baseline", "candidate"], n).tolist(),
            round=rng.integers(0, INT32_MAX, n, endpoint=True).tolist(),  # past the lookup table's range
            position=np.arange(n).tolist(),
            duration_ns=(rng.random(n) * 10.0 ** rng.integers(-6, 13, n)).tolist(),  # 1e-6 .. 1e13 ns
            launches=rng.integers(1, 1000, n).tolist(),
            sm_clock_mhz=_with_nulls(rng, rng.random(n) * 2000, p_null),
            clock_event_reasons=_with_nulls(rng, rng.integers(0, INT64_MAX, n, endpoint=True), p_null),
            temperature_c=_with_nulls(rng, np.r_[-0.0, rng.normal(40, 30, n - 1)], p_null),
            power_w=_with_nulls(rng, np.r_[0.0, rng.random(n - 1) * 700], p_null),
            throttled=(rng.random(n) < 0.3).tolist(),
        )

    cpu = SampleColumns(variant=["candidate"] * 23, round=[0] * 23, position=list(range(23)),
                        duration_ns=(1 / 3 + rng.random(23)).tolist())  # fmt: skip
    one_set = full(40, 1.0)
    for name, value in (("sm_clock_mhz", 1410.0), ("clock_event_reasons", 4), ("temperature_c", -7.25),
                        ("power_w", 0.1 + 0.2)):  # fmt: skip
        getattr(one_set, name)[17] = value  # the others null: stored as NaN / -1, not as SQL NULL
    return [full(37, 0.0), full(50, 0.4), full(1, 0.0), SampleColumns(), cpu, one_set]


def _expected_rows(result: Any) -> list[dict[str, Any]]:
    """The rows of the download straight from the posted result (no database, no block codec)."""
    return [
        {"cell_index": cell.index, "params": cell.params, **{n: getattr(row, n) for n in SAMPLE_FIELDS}}
        for cell in result.cells for row in cell.samples.rows()
    ]  # fmt: skip


def _json_text(rows: list[dict[str, Any]]) -> str:
    """The download as it was written before: one ``json.dumps`` per row."""
    return "[" + ",".join(json.dumps(row, allow_nan=False) for row in rows) + "]"


def _csv_text(rows: list[dict[str, Any]]) -> str:
    """The download as it was written before: ``csv.DictWriter``, ``params`` JSON with sorted keys."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=crud.SAMPLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "params": json.dumps(row["params"], sort_keys=True)})
    return buf.getvalue()


def test_downloads_are_the_row_by_row_text_for_every_page(api) -> None:  # type: ignore[no-untyped-def]
    spec = spec_dict(sweep=SWEEP)
    job = api.submit(spec)
    runner = api.runner()
    api.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=runner)
    result = job_result(job, spec=spec)
    for cell, samples in zip(result.cells, _cells(np.random.default_rng(7)), strict=True):
        cell.samples = samples
    assert api.post_result(job, result, runner).status_code == 201
    rows = _expected_rows(result)
    total = len(rows)
    assert total == 151 and any(r["throttled"] for r in rows) and any(r["power_w"] is None for r in rows)
    with api.factory() as session:
        assert list(crud.iter_sample_rows(session=session, job_id=job)) == rows  # the reference itself
    read = api.token("read")
    # blocks of 37, 50, 1, 23, 40 rows start at rows 0, 37, 87, 88, 111
    pages = [(0, None), (5, 3), (30, 10), (36, 52), (87, 1), (86, 3), (100, 30), (150, 10), (151, 5),
             (0, 151)]  # fmt: skip
    for offset, limit in pages:
        page = rows[offset : None if limit is None else offset + limit]
        query = f"offset={offset}" + ("" if limit is None else f"&limit={limit}")
        got = api.client.get(f"/api/v1/jobs/{job}/samples?format=json&{query}", headers=read)
        assert got.status_code == 200 and got.headers["x-total-count"] == str(total)
        assert ("link" in got.headers) == (limit is not None and offset + limit < total)
        assert got.json() == page, (offset, limit)
        assert got.text == _json_text(page), (offset, limit)
        got = api.client.get(f"/api/v1/jobs/{job}/samples?format=csv&{query}", headers=read)
        assert got.status_code == 200 and got.headers["x-total-count"] == str(total)
        parsed = list(csv.DictReader(io.StringIO(got.text)))
        assert parsed == list(csv.DictReader(io.StringIO(_csv_text(page)))), (offset, limit)
        assert got.text == _csv_text(page), (offset, limit)
    with api.factory() as session:  # chunks of one block: the "," between rows at every chunk start
        blocks = crud.iter_sample_blocks(session=session, job_id=job, offset=30, limit=100)
        assert "".join(sample_export.json_chunks(blocks, chunk_chars=1)) == _json_text(rows[30:130])
        blocks = crud.iter_sample_blocks(session=session, job_id=job, batch=1)
        assert "".join(sample_export.csv_chunks(blocks, chunk_chars=1)) == _csv_text(rows)
