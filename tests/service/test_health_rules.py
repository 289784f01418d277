"""Health rules read NVML the way NVML means it, and judge a report against its own peers and
warm-up; through the pure functions and through the real app on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from health_fixtures import h200x2_report

from kernelab.service.contract import clock_events
from kernelab.service.contract.schemas import AllReduceReading, PeerCopyReading, ProbeReport
from kernelab.service.judge import health

NODE = "h200-node-1"
BLANK = 0x7FFFFFFFFFFFFFF0  # DCGM_INT64_BLANK
INFORMATIONAL = 0x1 | 0x2 | 0x10 | 0x100  # gpu_idle, applications_clocks_setting, sync_boost, display


def _with_mask(report: ProbeReport, mask: int | None, names: list[str] | None = None) -> ProbeReport:
    gpus = [g.model_copy(update={"clock_event_reasons": mask, "clock_event_reason_names": names or []})
            for g in report.telemetry]  # fmt: skip
    # validated again, as the server validates a posted report (names decoded from the mask)
    return ProbeReport.model_validate(report.model_copy(update={"telemetry": gpus}).model_dump(mode="json"))


def _pairs(gbps: list[float]) -> list[PeerCopyReading]:
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j][: len(gbps)]
    return [PeerCopyReading(src_device=i, dst_device=j, peer_access=True, size_bytes=1 << 28,
                            time_us=(1 << 28) / (g * 1e3), bandwidth_gbps=g)
            for (i, j), g in zip(pairs, gbps, strict=True)]  # fmt: skip


def _series(times_us: list[float], size: int = 8) -> list[AllReduceReading]:
    return [AllReduceReading(backend="nccl", world_size=2, ranks=[0, 1], size_bytes=size, time_us=t,
                             algbw_gbps=size / t / 1e3, busbw_gbps=size / t / 1e3, timed_by="cuda-events")
            for t in times_us]  # fmt: skip


@pytest.mark.parametrize("mask", [None, 0, BLANK, BLANK + 1, BLANK + 3, 2**63 - 1, INFORMATIONAL, 0x200])
def test_placeholder_and_informational_masks_are_healthy(mask: int | None) -> None:
    report = _with_mask(h200x2_report(), mask)
    assert health.instant_reasons(report) == []
    assert not clock_events.is_throttled(mask)


JUDGE_ALL = health.Thresholds(ignored_clock_reasons=())  # sw_power_cap judged too


@pytest.mark.parametrize("bit", [0x4, 0x8, 0x20, 0x40, 0x80])
def test_every_throttle_bit_degrades_and_marks_samples_throttled(bit: int) -> None:
    report = _with_mask(h200x2_report(), bit | 0x1)
    reasons = health.instant_reasons(report, thresholds=JUDGE_ALL)
    assert [r.code for r in reasons] == ["clock-event", "clock-event"]
    assert clock_events.is_throttled(bit | 0x1)
    # by default sw_power_cap alone (the power limiter under load) degrades no node; with another
    # throttle reason the node is degraded, named by that reason
    default = health.instant_reasons(report)
    assert (default == []) is (bit == 0x4)
    assert "sw_power_cap" not in " ".join(
        r.message for r in health.instant_reasons(_with_mask(report, 0x4 | 0x40))
    )


@pytest.mark.parametrize("mask", [None, 0, 0x1, 0x4, 0x40, 0x41, BLANK, INFORMATIONAL, 0x7F, 0x1FF, 0x400])
def test_is_throttled_and_node_health_are_one_rule(mask: int | None) -> None:
    degraded = bool(health.instant_reasons(_with_mask(h200x2_report(), mask), thresholds=JUDGE_ALL))
    assert degraded is clock_events.is_throttled(mask)


def test_the_server_decodes_the_mask_and_does_not_trust_names() -> None:
    contradicting = _with_mask(h200x2_report(), 0x1, ["hw_thermal", "sw_power_cap"])
    assert contradicting.telemetry[0].clock_event_reason_names == ["gpu_idle"]
    assert health.instant_reasons(contradicting) == []
    blank = _with_mask(h200x2_report(), BLANK, ["hw_thermal"])
    assert blank.telemetry[0].clock_event_reason_names == []
    names_only = _with_mask(h200x2_report(), None, ["hw_thermal"])
    assert health.instant_reasons(names_only) == []  # names without a mask are not judged
    hidden = _with_mask(h200x2_report(), 0x40, ["gpu_idle"])
    assert hidden.telemetry[0].clock_event_reason_names == ["hw_thermal"]
    assert "hw_thermal" in health.instant_reasons(hidden)[0].message


def test_a_pair_far_below_its_peers_is_degraded_without_history() -> None:
    report = h200x2_report().model_copy(update={"peer_copy": _pairs([78, 80, 82, 79, 81, 80, 40])})
    reasons = health.evaluate_history([report]).reasons[0]
    assert [(r.code, r.figure) for r in reasons] == [("peer-below-peers", "peer 2->0")]
    assert "50% of the median 80 GB/s of the 7 GPU pairs" in reasons[0].message
    even = h200x2_report().model_copy(update={"peer_copy": _pairs([78, 80, 82, 79, 81, 80, 77])})
    assert health.evaluate_history([even]).reasons[0] == []
    two = h200x2_report().model_copy(update={"peer_copy": _pairs([80, 40])})
    assert health.peer_reasons(two) == []  # two figures: no majority


def test_a_gpu_far_below_its_peers_is_degraded_without_history() -> None:
    base = h200x2_report()
    copies = [base.copy_bandwidth[0].model_copy(update={"device_index": i, "bandwidth_gbps": g})
              for i, g in enumerate([4190.0, 4200.0, 4185.0, 2100.0])]  # fmt: skip
    reasons = health.instant_reasons(base.model_copy(update={"copy_bandwidth": copies}))
    assert [(r.code, r.device_index) for r in reasons] == [("copy-below-peers", 3)]


def test_cold_first_calls_of_a_series_are_warm_up() -> None:
    assert health.warmup_calls([214_477.0, 4.1, 4.0, 3.9, 4.2]) == 1
    assert health.warmup_calls([900.0, 300.0, 4.1, 4.0]) == 2
    assert health.warmup_calls([5.0, 4.1, 4.0]) == 0
    assert health.warmup_calls([214_477.0]) == 0
    history = [h200x2_report(i).model_copy(update={"all_reduce": _series([4.0 + 0.1 * (i % 2)])})
               for i in range(4)]  # fmt: skip
    cold = h200x2_report(10).model_copy(update={"all_reduce": _series([214_477.0, 4.1, 4.0, 3.9, 4.2])})
    judged = health.evaluate_history([*history, cold])
    assert judged.reasons[-1] == []
    (figure,) = [f for f in health.probe_figures(cold) if f.kind == "latency"]
    assert (figure.value, figure.readings, figure.warmup) == (4.05, 5, 1)
    slow = h200x2_report(11).model_copy(update={"all_reduce": _series([214_477.0, 40.1, 40.0, 39.9])})
    reasons = health.evaluate_history([*history, slow]).reasons[-1]
    assert [r.code for r in reasons] == ["latency-outside-band"]
    assert "median of 3 calls after 1 warm-up" in reasons[0].message


# --------------------------------------------------------------------------------------------------
# Through the app, on both databases
# --------------------------------------------------------------------------------------------------


def _post(api, runner, report: ProbeReport) -> None:  # type: ignore[no-untyped-def]
    headers = {**runner, "content-type": "application/json"}
    r = api.client.post(f"/api/v1/nodes/{NODE}/probes", content=report.model_dump_json(), headers=headers)
    assert r.status_code == 201, r.text


def _health(api) -> dict:  # type: ignore[no-untyped-def,type-arg]
    r = api.client.get(f"/api/v1/nodes/{NODE}", headers=api.admin)
    assert r.status_code == 200, r.text
    page = api.client.get(f"/nodes/{NODE}", headers=api.admin)
    assert page.status_code == 200
    return r.json()["health"] | {"page": page.text}


def test_blank_masks_and_names_read_healthy_through_the_api(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(NODE)
    report = h200x2_report().model_dump(mode="json")
    report["telemetry"][0].update(clock_event_reasons=BLANK, clock_event_reason_names=["hw_thermal"])
    report["telemetry"][1].update(clock_event_reasons=INFORMATIONAL, clock_event_reason_names=["hw_slowdown"])
    r = api.client.post(f"/api/v1/nodes/{NODE}/probes", json=report, headers=runner)
    assert r.status_code == 201, r.text
    state = _health(api)
    assert state["status"] == "healthy", state["reasons"]
    stored = api.client.get(f"/api/v1/nodes/{NODE}", headers=api.admin).json()["probes"][0]["report"]
    assert [g["clock_event_reason_names"] for g in stored["telemetry"]] == [
        [],
        ["gpu_idle", "applications_clocks_setting", "sync_boost", "display_clock_setting"],
    ]
    _post(api, runner, _with_mask(h200x2_report(1), 0x40))
    state = _health(api)
    assert state["status"] == "degraded" and "hw_thermal" in state["message"]


def test_a_slow_pair_on_a_fresh_node_is_degraded_through_the_api(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(NODE)
    _post(api, runner, h200x2_report().model_copy(update={"peer_copy": _pairs([78, 80, 82, 79, 81, 80, 40])}))
    state = _health(api)
    assert state["status"] == "degraded" and state["healthy_probes"] == 0
    assert [(r["code"], r["figure"]) for r in state["reasons"]] == [("peer-below-peers", "peer 2->0")]
    assert "far below its peers" in state["page"]


def test_a_cold_first_all_reduce_call_is_warm_up_through_the_api(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(NODE)
    for i in range(4):
        _post(api, runner, h200x2_report(i).model_copy(update={"all_reduce": _series([4.0 + 0.1 * (i % 2)])}))
    cold = h200x2_report(10).model_copy(update={"all_reduce": _series([214_477.0, 4.1, 4.0, 3.9, 4.2])})
    _post(api, runner, cold.model_copy(update={"taken_at": cold.taken_at + timedelta(seconds=1)}))
    state = _health(api)
    assert state["status"] == "healthy", state["reasons"]
    assert state["healthy_probes"] == 5
    # three cold calls of five: the median of the whole series (600 us) would leave the band
    series = _series([214_477.0, 9_000.0, 600.0, 4.1, 4.0])
    colder = h200x2_report(11).model_copy(update={"all_reduce": series})
    _post(api, runner, colder)
    state = _health(api)
    assert state["status"] == "healthy", state["reasons"]
    assert state["healthy_probes"] == 6
