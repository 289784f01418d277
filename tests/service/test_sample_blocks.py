"""Columnar samples: ``SampleColumns`` validation and dumps, and the ``sample_blocks`` byte codec."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from kernelab.service.contract import sample_blocks
from kernelab.service.contract.schemas import SAMPLE_FIELDS, CellResult, Sample, SampleColumns

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
BASE = {"variant": ["baseline", "candidate"], "round": [0, 0], "position": [0, 1], "duration_ns": [1.0, 2.0]}


def mixed() -> SampleColumns:
    """Five samples: both variants, partial nulls in every context column, extremes of each dtype."""
    return SampleColumns(
        variant=["baseline", "candidate", "candidate", "baseline", "baseline"],
        round=[0, 0, 1, 1, INT32_MAX],
        position=[0, 1, 0, 1, 7],
        duration_ns=[0.0, 1e-3, 12_345.678, 5e12, 1.5],
        launches=[1, 2, INT32_MAX, 4, 5],
        sm_clock_mhz=[1980.0, None, 0.0, 1485.5, None],
        clock_event_reasons=[0, None, 4, INT64_MAX, None],
        temperature_c=[-12.5, 41.0, None, 60.25, 0.0],
        power_w=[None, 300.5, 0.0, None, 1.0],
        throttled=[False, True, False, False, True],
    )


def test_a_block_round_trips_every_value_and_null() -> None:
    cols = mixed()
    block = sample_blocks.encode(cols)
    assert block["n"] == 5
    assert np.frombuffer(block["duration_ns"], "<f8").tolist() == cols.duration_ns.tolist()
    assert np.frombuffer(block["variant"], "u1").tolist() == [0, 1, 1, 0, 0]
    assert np.isnan(np.frombuffer(block["sm_clock_mhz"], "<f8")).tolist() == [False, True, False, False, True]
    assert np.frombuffer(block["clock_event_reasons"], "<i8").tolist() == [0, -1, 4, INT64_MAX, -1]
    back = sample_blocks.decode(block)
    assert back == cols and back.rows() == cols.rows()
    assert {n: getattr(back, n).dtype.str for n in SAMPLE_FIELDS} == {
        n: getattr(cols, n).dtype.str for n in SAMPLE_FIELDS
    }  # the arrays read back are the arrays posted, dtype for dtype


def test_an_all_null_column_is_stored_as_null_and_an_empty_block_decodes() -> None:
    cols = SampleColumns(variant=["candidate"], round=[3], position=[0], duration_ns=[7.0])
    block = sample_blocks.encode(cols)
    assert {name for name, value in block.items() if value is None} == {
        "clock_event_reasons", "sm_clock_mhz", "temperature_c", "power_w",
    }  # fmt: skip
    assert sample_blocks.decode(block) == cols
    assert sample_blocks.decode(sample_blocks.encode(SampleColumns())) == SampleColumns()


def test_a_block_whose_bytes_do_not_hold_n_values_is_refused() -> None:
    block = sample_blocks.encode(mixed())
    block["round"] = block["round"][:-4]
    with pytest.raises(sample_blocks.CorruptBlockError, match="round: 16 bytes, expected 5 x int32"):
        sample_blocks.decode(block)


def test_columns_fill_left_out_defaults_and_dumps_leave_them_out() -> None:
    cols = SampleColumns.model_validate(BASE)
    assert cols.launches.tolist() == [1, 1] and cols.throttled.tolist() == [False, False]
    assert np.isnan(cols.power_w).all() and [r.power_w for r in cols.rows()] == [None, None]
    assert set(cols.model_dump()) == {"variant", "round", "position", "duration_ns"}
    assert set(json.loads(cols.model_dump_json())) == {"encoding", "n", "variant", "round", "position",
                                                       "duration_ns"}  # fmt: skip
    assert set(mixed().model_dump()) == set(SampleColumns.model_fields)  # nothing there is all-default
    assert SampleColumns.model_validate_json(cols.model_dump_json()) == cols
    assert len(cols) == 2 and not SampleColumns()


def test_columns_name_the_column_that_is_wrong() -> None:
    base = BASE
    with pytest.raises(ValidationError, match="samples.position has 1 values but samples.variant has 2"):
        SampleColumns.model_validate({**base, "position": [0]})
    with pytest.raises(ValidationError, match="samples.duration_ns is missing"):
        SampleColumns.model_validate({k: v for k, v in base.items() if k != "duration_ns"})
    wrong = [("round", -1), ("round", INT32_MAX + 1), ("launches", 0), ("duration_ns", -1.0),
             ("sm_clock_mhz", -5.0), ("clock_event_reasons", -1), ("variant", "other")]  # fmt: skip
    for column, bad in wrong:
        values = {**base, column: [bad, bad]}
        with pytest.raises(ValidationError) as info:
            SampleColumns.model_validate(values)
        assert {e["loc"] for e in info.value.errors()} == {(column, 0), (column, 1)}, column
    with pytest.raises(ValidationError, match="finite"):
        SampleColumns.model_validate_json(json.dumps({**base, "temperature_c": [1.0, float("nan")]}))
    with pytest.raises(ValidationError) as info:
        SampleColumns.model_validate({**base, "duration": [1.0, 2.0]})
    assert info.value.errors()[0]["loc"] == ("duration",)


def test_the_row_form_becomes_columns() -> None:
    rows = [Sample(variant="baseline", round=0, position=0, duration_ns=3.0, sm_clock_mhz=1.0),
            Sample(variant="candidate", round=0, position=1, duration_ns=4.0, throttled=True)]  # fmt: skip
    cell = CellResult.model_validate({"index": 0, "params": {}, "samples": [r.model_dump() for r in rows]})
    assert cell.samples == SampleColumns.from_rows(rows) and cell.samples.rows() == rows
    assert CellResult(index=0, params={}, samples=rows).samples == cell.samples  # type: ignore[arg-type]
    with pytest.raises(ValidationError) as info:
        CellResult.model_validate({"index": 0, "params": {}, "samples": [{"variant": "baseline"}]})
    assert {e["loc"][-1] for e in info.value.errors()} == {"round", "position", "duration_ns"}
    assert {e["loc"][:2] for e in info.value.errors()} == {("samples", 0)}


def test_from_rows_and_rows_are_inverse() -> None:
    assert SampleColumns.from_rows(mixed().rows()) == mixed()
    assert SampleColumns.from_rows([]) == SampleColumns()
