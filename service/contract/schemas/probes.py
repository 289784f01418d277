"""Node-health probe readings a runner posts (``ProbeReport``), built from the registered probes.

``ProbeReport`` has the common fields (``phase``, ``taken_at``, ``wall_s``, ``mode``, ``notes``,
``nvml_status``, ``errors``) and one list field per probe of ``kernelab.service.contract.probes`` (each
module there registers one ``Probe``: ``kernelab.service.contract.schemas.probe_protocol``), in the order of
their ``position``: today ``copy_bandwidth``, ``all_reduce``, ``telemetry``, ``peer_copy`` and
``matmul_peak``, so a report dumps key for key as it did when they were written out here
(``tests/service/fixtures/probe_report_2026-12-01.json``). Every module of that package whose name
does not start with ``_`` is imported when this module is, before ``ProbeReport`` is built.

Every list of a report is bounded by what kernelab's full probe takes on one node of at most
``MAX_DEVICES`` GPUs (``kernelab.runners.probes``): at most 540 readings, about twice an 8-GPU
node's full report, so every page that reads a node's history costs at most about twice what an
honest 8-GPU fleet costs, however a runner filled its reports."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field, create_model

from kernelab.service.contract.schemas import probe_protocol
from kernelab.service.contract.schemas.types import (
    MAX_LIST_ITEMS,
    AtDoor,
    ErrorText,
    ShortText,
    UtcDatetime,
    _Posted,
)

MAX_DEVICES = 16
"""Most GPUs of one node (8 on an HGX board or an MI300X platform, 4 on a GB200 tray, 16 on the
largest single systems): device indices are ``0 .. MAX_DEVICES - 1``, and a report holds at most
one copy, telemetry and matmul reading per GPU."""
MAX_RANKS = 4096
"""Most ranks of one all-reduce group (``world_size``), and largest rank index + 1."""
MAX_ALL_REDUCE_READINGS = 256
"""Most all-reduce readings of one report: the full probe's 14 sizes (8 B x 4^k to 128 MiB, then
256 MiB: ``kernelab.runners.probes.all_reduce.full_sizes_bytes``), eager and as a CUDA graph, over
the whole node and its sub-groups (``sub_groups``: 8 pairs on 16 GPUs; 4 pairs and 2 halves on 8):
14 x 2 x 9 = 252 at ``MAX_DEVICES``."""
MAX_PEER_READINGS = MAX_DEVICES * (MAX_DEVICES - 1)
"""Most peer-copy readings of one report: every ordered pair of GPUs (240 at ``MAX_DEVICES``)."""
DeviceIndex = Annotated[int, Field(ge=0), AtDoor(le=MAX_DEVICES - 1)]
"""A GPU's index on its node: 0 .. ``MAX_DEVICES`` - 1 (``probe_readings.device_index``)."""
Rank = Annotated[int, Field(ge=0), AtDoor(le=MAX_RANKS - 1)]
MAX_GPU_PROCESSES = 256
"""Most processes of one telemetry reading (NVML's compute processes of one GPU)."""
PROBES_PACKAGE = "kernelab.service.contract.probes"


class _CommonFields(_Posted):
    """Node-health readings taken at one moment (before or after a job, or on demand)."""

    phase: Literal["before", "after", "adhoc"] = "adhoc"
    taken_at: UtcDatetime
    wall_s: float = Field(default=0.0, ge=0, description="how long the probe took")
    mode: Literal["quick", "full"] = "quick"
    notes: Annotated[list[ErrorText], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=list, description="probes skipped and why"
    )
    nvml_status: ErrorText = Field(default="absent", description="'ok', 'absent' or the error")
    errors: Annotated[dict[ShortText, ErrorText], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=dict, description="probe name -> error text"
    )


def discover() -> list[str]:
    """Import every probe module of ``kernelab.service.contract.probes`` (names not starting with ``_``),
    each registering its probe; returns the module names imported, sorted."""
    package = importlib.import_module(PROBES_PACKAGE)
    names = sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))
    for name in names:
        importlib.import_module(f"{PROBES_PACKAGE}.{name}")
    return names


def _build() -> type[_CommonFields]:
    """``ProbeReport``: the common fields and one ``list[reading]`` per registered probe (bounded at
    the door by its ``max_readings``, empty by default), in ``probe_protocol.field_order()``."""
    common = _CommonFields.model_fields
    probes = {p.name: p for p in probe_protocol.registered()}
    fields: dict[str, Any] = {}
    for name in probe_protocol.field_order():
        if name in common:
            info = common[name]
            fields[name] = (info.annotation, info)
        else:
            p = probes[name]
            fields[name] = (
                Annotated[list[p.reading], AtDoor(max_length=p.max_readings)],  # type: ignore[name-defined]
                Field(default_factory=list),
            )
    # The built model is no subclass of _CommonFields (fields keep their positions): the type checker
    # sees it as one (TYPE_CHECKING below), with a probe's readings reached through Probe.readings.
    model: type[_CommonFields] = create_model(
        "ProbeReport",
        __base__=_Posted,  # type: ignore[arg-type]
        __module__=__name__,
        __doc__=_CommonFields.__doc__,
        **fields,
    )
    probe_protocol.mark_built()
    return model


discover()
if TYPE_CHECKING:
    ProbeReport = _CommonFields
else:
    ProbeReport = _build()

# The built-in probes' readings, where they were before probes were modules of their own (imported
# after ProbeReport is built: importing them first would build it while one of them is half-imported).
from kernelab.service.contract.probes.all_reduce import AllReduceReading  # noqa: E402
from kernelab.service.contract.probes.copy_bandwidth import CopyBandwidthReading  # noqa: E402
from kernelab.service.contract.probes.matmul_peak import MatmulPeakReading  # noqa: E402
from kernelab.service.contract.probes.peer_copy import PeerCopyReading  # noqa: E402
from kernelab.service.contract.probes.telemetry import GpuTelemetry  # noqa: E402

__all__ = [
    "MAX_ALL_REDUCE_READINGS", "MAX_DEVICES", "MAX_GPU_PROCESSES", "MAX_PEER_READINGS", "MAX_RANKS",
    "AllReduceReading", "CopyBandwidthReading", "DeviceIndex", "GpuTelemetry", "MatmulPeakReading",
    "PeerCopyReading", "ProbeReport", "Rank", "discover",
]  # fmt: skip
