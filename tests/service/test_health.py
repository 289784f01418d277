"""Node-health verdicts (kernelab.service.judge.health) on recorded H200 readings: figures, band learning, the
chain over a node's history, instant reasons, fleet bands, and the flags a comparison carries."""

from __future__ import annotations

import pytest
from factories import job_result
from health_fixtures import h200x2_report, nccl_tests_in_place, recorded_h200x1

from kernelab.service.contract.schemas import PeerCopyReading
from kernelab.service.judge import health, stats


def _history(*reports):  # type: ignore[no-untyped-def]
    return health.evaluate_history(list(reports))


def test_figures_of_recorded_reports() -> None:
    one = recorded_h200x1()
    figures = {f.key: f for f in health.probe_figures(one)}
    # One GPU: the world-size-1 "all-reduce" moves no data and yields no figure.
    assert list(figures) == ["copy GPU 0"]
    assert figures["copy GPU 0"].value == pytest.approx(4196.5, abs=0.1)
    two = {f.key: f.value for f in health.probe_figures(h200x2_report())}
    ref = nccl_tests_in_place()
    assert two["all-reduce [0,1] 8 B time"] == ref[8][0]
    assert two["all-reduce [0,1] 512 KiB time"] == ref[512 << 10][0]
    assert two["all-reduce [0,1] 512 MiB busbw"] == ref[512 << 20][1]
    assert "all-reduce [0,1] 8 B busbw" not in two  # small sizes are judged by time only


def test_band_learning_median_and_limits() -> None:
    reports = [h200x2_report(i, copy_scale=(s, 1.0)) for i, s in enumerate((0.98, 1.0, 1.02, 0.99, 1.01))]
    bands = health.learn_bands(reports)
    copy = bands["copy GPU 0"]
    base = recorded_h200x1().copy_bandwidth[0].bandwidth_gbps
    assert copy.n == 5 and copy.median == pytest.approx(base)
    assert (copy.low, copy.high) == (pytest.approx(0.98 * base), pytest.approx(1.02 * base))
    assert copy.limit == pytest.approx(0.90 * base)
    assert bands["all-reduce [0,1] 8 B time"].limit == pytest.approx(1.5 * nccl_tests_in_place()[8][0])
    assert bands["all-reduce [0,1] 512 MiB busbw"].limit == pytest.approx(
        0.85 * nccl_tests_in_place()[512 << 20][1]
    )
    assert health.learn_bands(reports[:2]) == {}  # fewer than band_min_probes (3)


def test_degraded_copy_named_and_not_learned() -> None:
    healthy = [h200x2_report(i) for i in range(4)]
    slow = [h200x2_report(10 + i, copy_scale=(1.0, 0.8)) for i in range(30)]
    history = _history(*healthy, *slow)
    assert history.reasons[:4] == [[], [], [], []]
    for reasons in history.reasons[4:]:  # a node that stays slow stays degraded: slow probes never teach
        assert [(r.code, r.flag, r.device_index, r.figure) for r in reasons] == [
            ("copy-outside-band", "degraded-node", 1, "copy GPU 1")
        ]
    assert "80% of the node band's median" in history.reasons[4][0].message
    assert len(history.healthy) == 4


def test_recovery_and_just_inside_the_band() -> None:
    reports = [h200x2_report(i) for i in range(3)] + [
        h200x2_report(3, copy_scale=(0.91, 1.0)),  # 91% >= 90%: healthy
        h200x2_report(4, copy_scale=(0.89, 1.0)),  # 89%: degraded
        h200x2_report(5),  # recovered
    ]
    assert [health.status_of(r) for r in _history(*reports).reasons] == [
        "healthy",
        "healthy",
        "healthy",
        "healthy",
        "degraded",
        "healthy",
    ]


@pytest.mark.parametrize(
    ("kwargs", "figure"),
    [
        ({"latency_scale": 1.6}, "all-reduce [0,1] 8 B time"),
        ({"busbw_scale": 0.8}, "all-reduce [0,1] 512 MiB busbw"),
    ],
)
def test_all_reduce_latency_and_busbw(kwargs, figure) -> None:  # type: ignore[no-untyped-def]
    reasons = _history(*(h200x2_report(i) for i in range(3)), h200x2_report(9, **kwargs)).reasons[-1]
    assert figure in {r.figure for r in reasons}
    assert all(r.flag == "degraded-node" for r in reasons)
    fine = {"latency_scale": 1.4} if "latency_scale" in kwargs else {"busbw_scale": 0.9}
    assert _history(*(h200x2_report(i) for i in range(3)), h200x2_report(9, **fine)).reasons[-1] == []


def test_instant_reasons() -> None:
    base = h200x2_report()
    gpu0, gpu1 = base.telemetry
    throttled = base.model_copy(
        update={
            "telemetry": [
                gpu0,
                gpu1.model_copy(
                    update={"clock_event_reason_names": ["sw_thermal"], "clock_event_reasons": 0x20}
                ),
            ]
        }
    )
    [reason] = health.instant_reasons(throttled)
    assert (reason.code, reason.flag, reason.device_index) == ("clock-event", "degraded-node", 1)
    assert "sw_thermal" in reason.message
    assert health.instant_reasons(base) == []  # gpu_idle is ignored
    assert (
        health.instant_reasons(
            throttled, thresholds=health.Thresholds(ignored_clock_reasons=("gpu_idle", "sw_thermal"))
        )
        == []
    )

    # The power limiter at work (sw_power_cap, 0x4) is the load's, the probe's or a job's: no
    # degradation by default in any phase; an operator who judges it (ignored_clock_reasons=())
    # still never sees it in the probe right after a job.
    capped = base.model_copy(
        update={
            "telemetry": [
                gpu0.model_copy(
                    update={"clock_event_reason_names": ["sw_power_cap"], "clock_event_reasons": 0x4}
                ),
                gpu1,
            ]
        }
    )
    judged = health.Thresholds(ignored_clock_reasons=())
    for phase in ("before", "after", "adhoc"):
        assert health.instant_reasons(capped.model_copy(update={"phase": phase})) == []
    assert health.instant_reasons(capped.model_copy(update={"phase": "after"}), thresholds=judged) == []
    [capped_reason] = health.instant_reasons(capped.model_copy(update={"phase": "before"}), thresholds=judged)
    assert capped_reason.device_index == 0 and "sw_power_cap" in capped_reason.message
    assert health.instant_reasons(throttled.model_copy(update={"phase": "after"})) != []  # thermal stays

    tenant = base.model_copy(
        update={
            "telemetry": [
                gpu0.model_copy(
                    update={
                        "other_processes": [
                            {"pid": 1, "own": True, "used_memory_bytes": 1},
                            {"pid": 2, "own": False, "used_memory_bytes": 1},
                        ]
                    }
                ),
                gpu1,
            ]
        }
    )
    [reason] = health.instant_reasons(tenant)
    assert (reason.code, reason.flag, reason.device_index) == ("other-tenant", "contended", 0)
    assert health.status_of([reason]) == "contended"

    ecc = base.model_copy(
        update={"telemetry": [gpu0.model_copy(update={"ecc_volatile_uncorrected": 3}), gpu1]}
    )
    assert [r.code for r in health.instant_reasons(ecc, previous=base)] == ["ecc-growth"]
    assert health.instant_reasons(ecc, previous=ecc) == []

    failed = base.model_copy(update={"errors": {"all_reduce": "TimeoutError: ranks hung"}})
    wrong = base.model_copy(update={"all_reduce": [base.all_reduce[0].model_copy(update={"correct": False})]})
    assert [r.code for r in health.instant_reasons(failed)] == ["probe-failed"]
    assert [r.code for r in health.instant_reasons(wrong)] == ["all-reduce-wrong"]


def test_thresholds_are_configurable_and_validated() -> None:
    reports = [h200x2_report(i) for i in range(3)] + [h200x2_report(3, copy_scale=(0.8, 1.0))]
    loose = health.Thresholds(copy_min_fraction=0.75)
    assert health.evaluate_history(reports, thresholds=loose).reasons[-1] == []
    with pytest.raises(ValueError, match="copy_min_fraction"):
        health.Thresholds(copy_min_fraction=1.5)
    with pytest.raises(ValueError, match="latency_max_factor"):
        health.Thresholds(latency_max_factor=0.5)


def test_fleet_band_judges_a_new_node() -> None:
    fleet = health.fleet_bands([h200x2_report(i) for i in range(6)], "NVIDIA H200")
    assert fleet["copy GPU 0"].scope == "fleet NVIDIA H200"
    new_node = health.node_health(
        [h200x2_report(30, copy_scale=(0.5, 1.0))], fleet=fleet, model="NVIDIA H200"
    )
    assert new_node.status == "degraded"
    assert [r.figure for r in new_node.reasons] == ["copy GPU 0"]
    assert "fleet NVIDIA H200 band" in new_node.message
    assert {b.scope for b in new_node.bands} == {"fleet NVIDIA H200"}  # no node band yet
    assert health.node_health([]).status == "unknown"


def test_peer_copy_figures() -> None:
    report = h200x2_report().model_copy(
        update={
            "peer_copy": [
                PeerCopyReading(
                    src_device=0,
                    dst_device=1,
                    peer_access=True,
                    size_bytes=1 << 28,
                    time_us=700.0,
                    bandwidth_gbps=383.0,
                ),
                PeerCopyReading(
                    src_device=1,
                    dst_device=0,
                    peer_access=False,
                    size_bytes=1 << 28,
                    time_us=9000.0,
                    bandwidth_gbps=29.8,
                ),
            ]
        }
    )
    keys = [f.key for f in health.probe_figures(report)]
    assert "peer 0->1" in keys and "peer 1->0" not in keys


def test_comparison_carries_node_flags_and_note() -> None:
    slow = h200x2_report(9, copy_scale=(1.0, 0.5))
    reasons = health.evaluate(slow, node_bands=health.learn_bands([h200x2_report(i) for i in range(3)]))
    flags = health.flags_of(reasons)
    assert flags == ["degraded-node"]
    result = job_result(7)
    c = stats.compare(result, health_flags=flags, notes=health.report_notes(flags, reasons))
    assert "degraded-node" in c.flags and all("degraded-node" in cell.flags for cell in c.cells)
    assert c.notes and "degraded node" in c.notes[0] and "copy GPU 1" in c.notes[0]
    assert c.summary == stats.compare(result).summary  # the verdicts stand; the flag and note qualify them
    assert health.report_notes([], []) == []


def test_gloo_all_reduce_is_not_a_health_figure() -> None:
    # kernelab's CPU mode: gloo between processes of one host times the scheduler, not a link.
    report = job_result(1).probes[0]
    assert report.all_reduce and all(a.backend == "gloo" for a in report.all_reduce)
    keys = [f.key for f in health.probe_figures(report)]
    assert keys and not any(k.startswith("all-reduce") for k in keys)
