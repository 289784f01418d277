"""The probe protocol (``kernelab.service.contract.schemas.probe_protocol``): ``ProbeReport`` built from the
registered probes keeps its stored form, and the registry refuses a probe it could not place."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import Field

from kernelab.service.contract.schemas import ProbeReport
from kernelab.service.contract.schemas import probe_protocol as pp
from kernelab.service.contract.schemas.types import _Posted, read_stored
from kernelab.service.server import models

STORED = Path(__file__).parent / "fixtures" / "probe_report_2026-12-01.json"
"""A report dumped by ``ProbeReport.model_dump(mode="json")`` before probes were registered (every
probe field, CUDA graphs, a wrong sum, a foreign process, an error)."""
BUILT_IN = ("copy_bandwidth", "all_reduce", "telemetry", "peer_copy", "matmul_peak")


def _added() -> set[str]:
    """Probes registered since the built-in ones: their (empty) fields are the only new keys."""
    return {p.name for p in pp.registered()} - set(BUILT_IN)


def test_a_report_stored_before_the_registry_loads_and_dumps_as_it_was() -> None:
    text = STORED.read_text(encoding="utf-8")
    stored = json.loads(text)
    for report in (ProbeReport.model_validate(stored), read_stored(ProbeReport, stored)):
        dumped = report.model_dump(mode="json", exclude=_added())
        assert json.dumps(dumped, indent=1) + "\n" == text  # key for key
        assert all(pp.probe(name).readings(report) == [] for name in _added())
    report = ProbeReport.model_validate_json(text)
    assert pp.probe("copy_bandwidth").readings(report)[1].bandwidth_gbps == 4193.2
    assert pp.probe("all_reduce").readings(report)[1].correct is False
    assert pp.probe("telemetry").readings(report)[0].clock_event_reason_names == ["gpu_idle", "sw_power_cap"]


def test_a_report_written_now_is_read_by_the_fields_of_before() -> None:
    """The other way: what a server of now stores has exactly the keys of before, in their order."""
    report = ProbeReport.model_validate(json.loads(STORED.read_text(encoding="utf-8")))
    assert list(report.model_dump(mode="json", exclude=_added())) == [
        "phase", "taken_at", "wall_s", "copy_bandwidth", "all_reduce", "telemetry", "peer_copy", "mode",
        "notes", "matmul_peak", "nvml_status", "errors",
    ]  # fmt: skip
    assert list(ProbeReport.model_fields) == list(report.model_dump())  # every field, in its position
    minimal = ProbeReport.model_validate({"taken_at": "2026-12-01T10:00:00Z"})
    assert all(pp.probe(name).readings(minimal) == [] for name in BUILT_IN)


def test_the_registry_holds_the_built_in_probes_in_report_order() -> None:
    names = [p.name for p in pp.registered()]
    assert [n for n in names if n in BUILT_IN] == list(BUILT_IN)
    assert [p.position for p in pp.registered()] == sorted(p.position for p in pp.registered())
    assert [p.name for p in pp.probes_with("pivot")][:2] == ["copy_bandwidth", "all_reduce"]
    assert pp.probe("telemetry").errors_key == "nvml"
    with pytest.raises(KeyError, match="registered: "):
        pp.probe("nope")


def test_a_probe_bound_holds_at_the_door() -> None:
    limit = pp.probe("copy_bandwidth").max_readings
    reading = {"device_index": 0, "size_bytes": 1, "time_us": 1.0, "bandwidth_gbps": 1.0}
    body = {"taken_at": "2026-12-01T10:00:00Z", "copy_bandwidth": [reading] * (limit + 1)}
    with pytest.raises(ValueError, match="copy_bandwidth"):
        ProbeReport.model_validate(body)
    with pytest.raises(ValueError, match="extra_forbidden|Extra inputs"):
        ProbeReport.model_validate({"taken_at": "2026-12-01T10:00:00Z", "not_a_probe": []})


def test_every_probe_declares_units_of_its_own_fields_and_flat_rows_only_of_stored_kinds() -> None:
    for p in pp.registered():
        assert set(p.units) <= set(p.reading.model_fields), p.name
        assert ":" in p.runner and p.runner.startswith("kernelab."), p.name
        if p.flat is not None:
            assert p.name in models.READING_KINDS, p.name  # a CHECK constraint of probe_readings


class _Reading(_Posted):
    value: float = Field(ge=0)


def _probe(**changes: object) -> pp.Probe[_Reading]:
    fields: dict[str, object] = dict(
        name="x_probe", label="x", reading=_Reading, units={"value": "s"}, max_readings=4, position=97,
        runner="kernelab.runners.probes.x:measure",
    )  # fmt: skip
    fields.update(changes)
    return pp.Probe(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes, error",
    [
        ({"name": "errors"}, "no common field"),
        ({"name": "not an identifier"}, "identifier"),
        ({"name": "copy_bandwidth"}, "registered twice"),
        ({"position": 10}, "position 10 is taken"),
        ({"position": 50}, "position 50 is taken"),
        ({"units": {"missing": "s"}}, "units for fields its reading lacks"),
        ({"max_readings": 0}, "max_readings"),
    ],
)
def test_register_refuses_a_probe_it_cannot_place(
    changes: dict[str, object], error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pp, "_BUILT", False)
    with pytest.raises(ValueError, match=error):
        pp.register(_probe(**changes))
    assert "x_probe" not in {p.name for p in pp.registered()}


def test_no_probe_registers_after_the_report_is_built() -> None:
    with pytest.raises(RuntimeError, match="after ProbeReport was built"):
        pp.register(_probe())
