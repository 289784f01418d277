"""Timing findings in the statistics: contention during a cell, the probes' matmul peak as the default
plausibility bound, dropped-throttled counts and raw/adjusted p in the reports."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from kernelab.service.contract.schemas import ContentionReading, MatmulPeakReading, Work
from kernelab.service.judge import report
from kernelab.service.judge.stats import compare
from kernelab.service.judge.verdicts import node_peaks
from tests.service.factories import T0, job_result, probe_report

pytestmark = pytest.mark.timeout(60)

OWN = {"pid": os.getpid(), "own": True, "used_memory_bytes": 1 << 30, "sm_util_pct": 99.0}


def _with_peak(result, tflops: float):  # type: ignore[no-untyped-def]
    peak = MatmulPeakReading(device_index=0, dtype="bfloat16", m=8192, n=8192, k=8192, launches=8,
                             time_us=2 * 8192**3 / (tflops * 1e6), tflops=tflops)  # fmt: skip
    before = probe_report("before").model_copy(update={"matmul_peak": [peak]})
    after = probe_report("after", taken_at=T0 + timedelta(seconds=13))
    return result.model_copy(update={"probes": [before, after]})


def _cell_flags(result) -> list[list[str]]:  # type: ignore[no-untyped-def]
    return [c.flags for c in compare(result, n_resamples=200).cells]


def test_a_foreign_process_during_a_cell_flags_that_cell_and_the_job():
    result = job_result(1)
    result.cells[1].contention = [
        ContentionReading(round=0, processes=[OWN]),
        ContentionReading(round=4, processes=[OWN, {"pid": 4242, "own": False, "sm_util_pct": 35.0}]),
    ]
    result.cells[0].contention = [ContentionReading(round=0, processes=[OWN])]
    c = compare(result, n_resamples=200)
    assert "contended" not in c.cells[0].flags and "contended" in c.cells[1].flags
    assert "contended" in c.flags


def test_in_a_container_one_unmatched_process_is_ours_two_are_contention():
    # NVML may report host PIDs: then no entry is ``own`` and one process is presumed ours.
    result = job_result(1)
    host = {"pid": 91_000, "own": False, "used_memory_bytes": 1 << 30, "sm_util_pct": 98.0}
    result.cells[0].contention = [ContentionReading(round=3, processes=[host])]
    result.cells[1].contention = [ContentionReading(round=3, processes=[host, {**host, "pid": 91_001}])]
    flags = _cell_flags(result)
    assert "contended" not in flags[0] and "contended" in flags[1]


def test_compare_uses_the_probes_matmul_peak_by_default():
    result = job_result(1)
    # factories: cell 0 declares 5*M*N = 1280 FLOP in ~800 ns at the candidate: 1.6e-3 TFLOP/s.
    rate = 5.0 * 4 * 64 / 800.0 / 1e3
    assert node_peaks(_with_peak(result, 123.0))["matmul_tflops"] == 123.0
    assert "implausible" not in _cell_flags(_with_peak(result, 10 * rate))[0]
    flagged = compare(_with_peak(result, rate / 10), n_resamples=200).cells[0]
    assert "implausible" in flagged.flags and flagged.verdict != "faster"  # 20% faster, but impossible
    assert "implausible" not in _cell_flags(result)[0]  # no peak measured: no bound
    # An explicit bound still overrides the probe's.
    assert "implausible" not in compare(_with_peak(result, rate / 10), peaks={"matmul_tflops": 1e9},
                                        n_resamples=200).cells[0].flags  # fmt: skip


def test_work_without_flops_is_not_bounded_by_the_matmul_peak():
    result = _with_peak(job_result(1), 1e-9)
    for cell in result.cells:
        cell.work = {v: Work(bytes_read=8.0, bytes_written=8.0) for v in ("baseline", "candidate")}
    assert all("implausible" not in f for f in _cell_flags(result))


def test_reports_show_dropped_throttled_samples_and_both_p_values():
    c = compare(job_result(1), n_resamples=200)
    cell = c.cells[0]
    assert "throttled" in cell.flags and cell.baseline.dropped_throttled == 1  # factories: 1 per cell
    assert cell.p_value is not None and cell.p_adjusted is not None
    flags_text = report.format_flags(cell)
    assert "throttled (1+0 dropped)" in flags_text
    p_text = report.format_p(cell)
    assert p_text == f"{cell.p_value:.2g} [{cell.p_adjusted:.2g}]"
    table = report.format_table(c)
    assert "p [BH]" in table and p_text in table and "throttled (1+0 dropped)" in table
    md = report.to_markdown(c)
    assert "| p [BH] |" in md and "throttled (1+0 dropped)" in md and "Benjamini-Hochberg" in md
