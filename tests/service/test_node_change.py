"""A job whose probe after it differs from the one before it beyond the probes' noise: every cell
reads ``inconclusive`` (``node-changed``, naming the figure and both values), the job says so."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from test_stats import make_cell, make_result, make_samples

from kernelab.service.contract.schemas import AllReduceReading, CopyBandwidthReading, HealthBand, ProbeReport
from kernelab.service.judge import stats
from kernelab.service.judge.node_change import node_change_reasons

T0 = datetime(2026, 12, 1, 7, tzinfo=UTC)


def report(phase: str, gbps: float, *, latency_us: float | None = None, minutes: int = 0) -> ProbeReport:
    copy = [CopyBandwidthReading(device_index=0, size_bytes=1 << 29, time_us=1.0, bandwidth_gbps=gbps)]
    ar = []
    if latency_us is not None:
        ar = [
            AllReduceReading(
                backend="nccl",
                world_size=2,
                ranks=[0, 1],
                size_bytes=8,
                time_us=latency_us,
                algbw_gbps=0.0,
                busbw_gbps=0.0,
                timed_by="cuda-events",
            )
        ]
    return ProbeReport(
        phase=phase,
        taken_at=T0 + timedelta(minutes=minutes),
        copy_bandwidth=copy,  # type: ignore[arg-type]
        all_reduce=ar,
        nvml_status="ok",
    )


@pytest.mark.parametrize(
    ("before", "after", "changed"),
    [
        (4190.0, 4180.0, False),  # the H200 probe's own noise
        (4190.0, 3900.0, False),  # -7%: a hot node after a heavy job, within 10%
        (4190.0, 1391.0, True),  # the cache-policy cheat: both sides 3x slower
        (4187.0, 421_072.0, True),  # a patched timer reaching the probe: 100x faster is a change too
    ],
)
def test_copy_bandwidth_moves_beyond_ten_percent_either_way(before: float, after: float, changed: bool):
    found = node_change_reasons([report("before", before), report("after", after, minutes=5)])
    assert bool(found) == changed
    if changed:
        (r,) = found
        assert r.code == "node-changed" and "copy GPU 0" in r.message
        assert f"{after:,.4g}" in r.message and f"{before:,.4g}" in r.message


def test_latency_needs_fifty_percent_and_two_microseconds() -> None:
    def moved(b: float, a: float) -> bool:
        pair = [report("before", 4190, latency_us=b), report("after", 4190, latency_us=a)]
        return bool(node_change_reasons(pair))

    assert not moved(6.0, 8.5)  # +42%
    assert not moved(1.0, 2.5)  # +150% but 1.5 us: below the floor
    assert moved(6.0, 30.0)


def test_no_pair_of_reports_no_judgement_and_the_latest_of_each_phase_counts() -> None:
    assert node_change_reasons([report("after", 100.0)]) == []
    assert node_change_reasons([report("before", 4190.0), report("adhoc", 100.0)]) == []
    probes = [
        report("before", 1000.0),
        report("before", 4190.0, minutes=1),
        report("after", 4185.0, minutes=9),
    ]
    assert node_change_reasons(probes) == []


def test_a_wide_band_widens_the_tolerance() -> None:
    probes = [report("before", 4000.0), report("after", 3400.0, minutes=5)]  # -15%
    assert node_change_reasons(probes)
    band = HealthBand(
        figure="copy GPU 0",
        unit="GB/s",
        better="higher",
        median=4000.0,
        low=3200.0,
        high=4400.0,
        n=10,
        limit=3600.0,
    )
    assert node_change_reasons(probes, {"copy GPU 0": band}) == []  # spread 30%: tolerance 90%


def test_every_cell_of_a_changed_job_is_inconclusive_with_the_figures() -> None:
    cells = [make_cell(i, make_samples(rounds=40, ratio=0.9, seed=20 + i)) for i in range(2)]
    steady = stats.compare(
        make_result(cells, probes=[report("before", 4190), report("after", 4188)], device_type="cuda")
    )
    assert [c.verdict for c in steady.cells] == ["faster", "faster"] and not steady.reasons
    changed = stats.compare(
        make_result(cells, probes=[report("before", 4190), report("after", 1391)], device_type="cuda")
    )
    assert [c.verdict for c in changed.cells] == ["inconclusive", "inconclusive"]
    assert all(c.timing_verdict == "faster" and c.reasons[0].code == "node-changed" for c in changed.cells)
    assert all("node-changed" in c.flags for c in changed.cells)
    assert [r.code for r in changed.reasons] == ["node-changed"] and "node-changed" in changed.flags
    assert changed.summary == {"inconclusive": 2}


def test_a_cpu_node_is_not_judged() -> None:
    noisy = [report("before", 5.6), report("after", 4.1)]  # -27%: a loaded 2-core host
    assert node_change_reasons(noisy) and not node_change_reasons(noisy, device_type="cpu")
    assert not node_change_reasons([report("before", 5.6), report("after", 0.5)], device_type="cpu")
