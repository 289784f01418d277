"""Degenerate data gets a reason, not a verdict, and reads the same on SQLite and PostgreSQL.

Each case is posted (or, where the door now refuses it, stored as an older server stored it) the way
a runner would, then read back through the API: the comparison answers 200, every null ratio / CI /
verdict carries a reason code from ``kernelab.service.judge.verdicts.REASONS`` and a sentence, and the JSON
equals
what ``kernelab.service.judge.stats.compare`` gives in this process (the same answer on both databases)."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
import pytest
from factories import T0, job_result, spec_dict
from sqlalchemy import select

from kernelab.service.contract.schemas import CellComparison, JobResult, Sample, SampleColumns, Work
from kernelab.service.judge import stats, verdicts
from kernelab.service.server import crud
from kernelab.service.server.models import Runner


def _every_null_has_a_reason(cell: dict[str, Any]) -> None:
    """Every null ratio, CI bound or timing verdict, and every verdict that is not a timing
    verdict, is explained by a catalogued reason with a sentence."""
    codes = [r["code"] for r in cell["reasons"]]
    assert all(code in verdicts.REASONS for code in codes), codes
    assert all(r["message"].strip() for r in cell["reasons"])
    nulls = [k for k in ("ratio", "ci_low", "ci_high", "hl_ci_low_ns", "hl_ci_high_ns") if cell[k] is None]
    if nulls or cell["verdict"] in ("inconclusive", *verdicts.PROBLEM_VERDICTS):
        deciding = [c for c in codes if verdicts.REASONS[c].verdict is not None]
        assert deciding, f"{nulls} null / verdict {cell['verdict']} without a deciding reason: {codes}"


def _runner_id(api, name: str = "node-a") -> int:  # type: ignore[no-untyped-def]
    with api.factory() as session:
        return session.scalar(select(Runner.id).where(Runner.name == name))


def _claimed(api, spec: dict[str, Any] | None = None):  # type: ignore[no-untyped-def]
    job_id = api.submit(spec)
    runner = api.runner("node-a")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    return job_id, runner


_SAMPLE_DEFAULTS = {"launches": 1, "sm_clock_mhz": None, "clock_event_reasons": None, "temperature_c": None,
                    "power_w": None, "throttled": False}  # fmt: skip


def _abba(rounds: int, base_ns: Callable[[int], float], cand_ns: Callable[[int], float],
          **context: Any) -> SampleColumns:  # fmt: skip
    rows = []
    for r in range(rounds):
        order = ("baseline", "candidate", "candidate", "baseline")
        for pos, variant in enumerate(order):
            ns = base_ns(r * 4 + pos) if variant == "baseline" else cand_ns(r * 4 + pos)
            # model_construct: samples the door now refuses (9e307 ns) are built as an older server took them
            rows.append(Sample.model_construct(variant=variant, round=r, position=pos, duration_ns=ns,
                                               **{**_SAMPLE_DEFAULTS, **context}))  # fmt: skip
    return SampleColumns.from_rows(rows)


def _with_samples(job_id: int, samples: SampleColumns, work: Work | None = None,
                  spec: dict[str, Any] | None = None) -> JobResult:  # fmt: skip
    result = job_result(job_id, spec=spec)
    works = {"work": {"baseline": work, "candidate": work}} if work else {}
    cells = [c.model_copy(update={"samples": samples, **works}) for c in result.cells]
    return result.model_copy(update={"cells": cells})


def _post_and_read(api, job_id: int, runner: dict[str, str], result: JobResult) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    r = api.post_result(job_id, result, runner)
    assert r.status_code == 201, r.text
    return _read(api, job_id, result)


def _read(api, job_id: int, result: JobResult) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    got = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin)
    assert got.status_code == 200, got.text
    expected = stats.compare(result, job_id=job_id).model_dump(mode="json")
    cells = got.json()["cells"]
    assert cells == expected["cells"]  # the same answer as in this process, on either database
    for cell in cells:
        _every_null_has_a_reason(cell)
    assert api.client.get(f"/api/v1/jobs/{job_id}/report.md", headers=api.admin).status_code == 200
    assert api.client.get(f"/jobs/{job_id}", headers=api.admin).status_code == 200
    return cells


def _codes(cell: dict[str, Any]) -> set[str]:
    return {r["code"] for r in cell["reasons"]}


def test_two_rounds_are_too_few_for_a_verdict(api) -> None:  # type: ignore[no-untyped-def]
    """2 rounds (4 samples per side) of a clear 2x speed-up: p and the CI look decisive, the
    verdict is inconclusive with too-few-rounds; 5 rounds of the same data decide."""
    spec = spec_dict(measurement={"min_rounds": 2, "max_rounds": 8})
    job_id, runner = _claimed(api, spec)
    few = _with_samples(job_id, _abba(2, lambda i: 2000.0 + i, lambda i: 1000.0 + i), spec=spec)
    for cell in _post_and_read(api, job_id, runner, few):
        assert cell["verdict"] == "inconclusive" and cell["timing_verdict"] == "faster"
        assert "too-few-rounds" in _codes(cell)
    cell = stats.compare(_with_samples(job_id, _abba(5, lambda i: 2000.0 + i, lambda i: 1000.0 + i))).cells[0]
    assert cell.verdict == "faster" and "too-few-rounds" not in {r.code for r in cell.reasons}


def test_all_zero_baseline_has_no_ratio_and_says_why(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    result = _with_samples(job_id, _abba(6, lambda i: 0.0, lambda i: 1000.0 + i))
    for cell in _post_and_read(api, job_id, runner, result):
        assert cell["ratio"] is None and cell["ci_low"] is None
        assert {"zero-baseline", "below-resolution"} <= _codes(cell)
        assert cell["verdict"] == "implausible"


def test_zero_ns_candidate_with_work_is_implausible_never_faster(api) -> None:  # type: ignore[no-untyped-def]
    job_id, runner = _claimed(api)
    work = Work(flops=1e9, bytes_read=4e6, bytes_written=4e6)
    result = _with_samples(job_id, _abba(6, lambda i: 50_000.0 + i, lambda i: 0.0), work)
    for cell in _post_and_read(api, job_id, runner, result):
        assert cell["verdict"] == "implausible", cell["reasons"]
        assert "below-resolution" in _codes(cell) and cell["timing_verdict"] == "faster"
        assert cell["ratio"] == 0.0  # the number is kept, greyed, never the verdict


def test_a_sample_throttled_by_its_clock_event_reasons_is_throttled_whatever_its_clock(api) -> None:  # type: ignore[no-untyped-def]
    """hw_thermal (0x40) at the full clock: throttled and dropped. A DCGM blank mask and the
    informational gpu_idle (0x1) are not throttling."""
    job_id, runner = _claimed(api)
    masks = {0: 0x40, 1: 0x7FFFFFFFFFFFFFF0, 2: 0x1}
    samples = _abba(6, lambda i: 2000.0 + i, lambda i: 1000.0 + i, sm_clock_mhz=1980.0)
    samples.clock_event_reasons = np.array([masks.get(i, 0) for i in range(len(samples))], dtype=np.int64)
    assert not any(samples.throttled)
    for cell in _post_and_read(api, job_id, runner, _with_samples(job_id, samples)):
        assert "throttled" in cell["flags"]
        assert (cell["baseline"]["dropped_throttled"], cell["candidate"]["dropped_throttled"]) == (1, 0)
        assert cell["baseline"]["n"] == 11


def test_huge_samples_stored_by_an_older_server_read_finite_and_implausible(api) -> None:  # type: ignore[no-untyped-def]
    """Samples of 9e307 ns (now refused at the door) stored as an older server stored them: the
    mean and a median of two of them overflowed float64 to Infinity, which PostgreSQL's JSON
    refused on every read. Now the statistics are computed without overflow, the verdict is
    ``implausible`` (``beyond-job-time``), and every read answers 200 on both databases."""
    job_id, _ = _claimed(api)
    huge = _with_samples(job_id, _abba(6, lambda i: 9e307, lambda i: 9e307 * (1 - 1e-3 * (i % 2))))
    with api.factory.begin() as session:
        crud.store_result(session=session, job_id=job_id, result=huge, runner_id=_runner_id(api))
    api.compare()
    cells = _read(api, job_id, huge)
    for cell in cells:
        assert cell["baseline"]["median_ns"] == cell["baseline"]["mean_ns"] == 9e307
        assert cell["ratio"] is not None and 0.999 <= cell["ratio"] <= 1.0
        assert cell["verdict"] == "implausible" and "beyond-job-time" in _codes(cell)
    text = json.dumps(cells)
    assert "Infinity" not in text and "NaN" not in text
    assert api.client.get(f"/api/v1/jobs/{job_id}", headers=api.admin).status_code == 200


def test_overflowing_numbers_are_null_with_a_reason() -> None:
    """What still cannot be a finite number (1.7e308 bytes read plus as many written) is left out
    or null with the ``non-finite`` reason, never Infinity in JSON."""
    work = Work(bytes_read=1.7e308, bytes_written=1.7e308, flops=1e9)
    result = _with_samples(1, _abba(6, lambda i: 1000.0 + i % 3, lambda i: 900.0 + i % 2), work)
    cell = stats.compare(result).cells[0]
    assert "baseline_gbps" not in cell.throughput and "baseline_tflops" in cell.throughput
    assert "non-finite" in {r.code for r in cell.reasons}
    assert "Infinity" not in cell.model_dump_json()


@pytest.mark.parametrize("kind", ["ok", "few", "zero-base", "zero-cand", "huge", "failed", "one-side"])
def test_every_null_in_a_comparison_has_a_reason(kind: str) -> None:
    spec = spec_dict()
    result = job_result(1, spec=spec)
    samples = {
        "ok": _abba(6, lambda i: 2000.0 + i, lambda i: 1000.0 + i),
        "few": _abba(1, lambda i: 2000.0 + i, lambda i: 1000.0 + i),
        "zero-base": _abba(6, lambda i: 0.0, lambda i: 1000.0),
        "zero-cand": _abba(6, lambda i: 1000.0, lambda i: 0.0),
        "huge": _abba(6, lambda i: 1.7e308, lambda i: 1.7e308),
        "failed": SampleColumns(),
        "one-side": SampleColumns.from_rows(
            [Sample(variant="baseline", round=r, position=0, duration_ns=1000.0) for r in range(6)]),
    }[kind]  # fmt: skip
    cells = [c.model_copy(update={"samples": samples, "error": "boom" if kind == "failed" else None})
             for c in result.cells]  # fmt: skip
    comparison = stats.compare(result.model_copy(update={"cells": cells, "finished_at": T0 + timedelta(1)}))
    for cell in comparison.cells:
        _every_null_has_a_reason(cell.model_dump(mode="json"))
        assert isinstance(cell, CellComparison)
    json.loads(comparison.model_dump_json())  # finite: strict JSON
    assert "Infinity" not in comparison.model_dump_json()
