"""The probe protocol: what one node-health probe declares, and the registry of probes.

A probe is one module of ``kernelab.service.contract.probes`` (found there by
``kernelab.service.contract.schemas.probes``,
which builds ``ProbeReport`` from the registry) that calls ``register(Probe(...))`` once with:

* its readings: ``name`` (the ``ProbeReport`` field that holds them: the stored form), ``reading``
  (the pydantic model of one reading: field names and dtypes), ``units`` (reading field -> unit),
  ``max_readings`` (the list's bound at the door), ``position`` (the field's place in the report's
  JSON, so a report dumps key for key as before);
* how the runner measures it: ``runner``, ``"module:function"`` of the measuring function on the
  runner side (never imported by the server); with ``generic_runner`` it is called as
  ``function(spec: ProbeSpec, device_type: str) -> Sequence[reading]`` by
  ``kernelab.runners.probes.run_probes``, else ``run_probes`` runs it in its own order (the
  built-in probes: copy and all-reduce share a time budget, ``kernelab.runners.probes.links``);
* its health rule (pure): ``figures`` (numbers a healthy node reproduces, judged against bands
  learned from the node's healthy history: ``kernelab.service.judge.health``), ``instant`` (reasons
  visible in one report, or against the previous one), ``peak`` (a key of the node's probed peaks
  for the plausibility guard: ``kernelab.service.judge.verdicts.probe_peaks``), ``contended`` (another
  tenant seen: ``verdicts.probe_flags``);
* how it is shown: ``label``, ``text`` (the section of ``kernelab probe``'s plain-text report),
  ``summary`` (its parts of the report's one-line summary: ``kernelab.service.judge.report.probe_summary``,
  called with the report and its readings, empty ones included),
  ``pivot`` (the dashboard's table, one column per phase), ``panel`` (the node page's history
  figure), ``flat`` (a row of the flat ``probe_readings`` table, for probes whose ``name`` is one of
  ``kernelab.service.server.models.READING_KINDS``).

Everything here imports only the wire contract, so the server, the dashboard and the runner all
import it; no probe module may import the runner (``tests/test_house.py``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import BaseModel

from kernelab.service.contract.schemas.health import HealthBand, HealthReason

if TYPE_CHECKING:
    from kernelab.service.contract.schemas.probes import ProbeReport
    from kernelab.service.contract.schemas.spec import ProbeSpec

MIB = 1024**2
# Defaults: the node-health issue (#4) of this project.
COPY_MIN_FRACTION = 0.90
BUSBW_MIN_FRACTION = 0.85
LATENCY_MAX_FACTOR = 1.5
BAND_WINDOW = 20
BAND_MIN_PROBES = 3
FLEET_WINDOW = 500
LATENCY_MAX_BYTES = 1 * MIB
BUSBW_MIN_BYTES = 64 * MIB
IGNORED_CLOCK_REASONS: tuple[str, ...] = ("sw_power_cap",)
"""Throttle reasons (``clock_events.THROTTLE_NAMES``) that still do not degrade a node, in any probe;
informational reasons never do, whatever this says. By default ``sw_power_cap`` (NVML 0x4): the
power limiter holding the board at its limit under load, the probe's own (its copy and matmul-peak
kernels load the GPU) or a job's (an H200 running 8192^3 bf16 matmuls: 557 W, 1635 MHz,
``sw_power_cap``, every other figure of the probe within its band;
docs/results/2026-11-30-h200x2-probe-accuracy.md). Public health checks read it the same way:
azurehpc-health-checks (``customTests/azure_gpu_clock_throttling.nhc`` in Azure/azurehpc-health-checks)
warns on every active reason but none, ``gpu_idle`` and ``sw_power_cap`` alone. A node whose power
delivery is at fault shows ``hw_slowdown``/``hw_power_brake`` (judged), and one capped too low
shows in its copy and all-reduce bands. ``KERNELAB_HEALTH_IGNORED_CLOCK_REASONS=[]`` judges it
again (except in ``after`` probes: ``LOAD_CLOCK_REASONS``)."""
PEER_MIN_FRACTION = 0.75
"""A GPU's copy or a pair's peer bandwidth below this x the median of its peers in the same report is
degraded. GPUs of one node are one model and, on NVLink/NVSwitch nodes, every pair has the same
links: a healthy report's peers lie within a few percent of each other (the 2xH200 node of
docs/results/2026-11-30-h200x2-probe-accuracy.md: 387.5 and 387.0 GB/s), while a link that trained
at half width or fell back to PCIe reads ~50%. On a PCIe tree mixing switch-local and
cross-socket pairs, lower it (``KERNELAB_HEALTH_PEER_MIN_FRACTION``)."""
PEER_MIN_FIGURES = 3  # with two figures there is no majority to say which one is off
COLD_FACTOR = 10.0
"""A leading call of a series slower than this x the median of the calls after it is warm-up: a
cold first call (connection set-up) is orders of magnitude slower, noise of a warm link is not."""
# Reasons a job's own load raises: an H200 running dense bf16 matmuls reaches its 700 W board limit
# and NVML reports sw_power_cap (seen 2026-11-30: 557 W, 1635 MHz in the probe right after an
# 8192^3 matmul job; docs/results/2026-11-30-h200x2-probe-accuracy.md). In an "after" probe they
# describe the job, not the node; the job's samples carry their own clocks and throttle marks.
LOAD_CLOCK_REASONS: tuple[str, ...] = ("sw_power_cap",)

Better = Literal["higher", "lower"]
R = TypeVar("R", bound=BaseModel)


@dataclass(frozen=True)
class Thresholds:
    """Where a figure leaves its band (``kernelab.service.judge.health``'s module docstring). Fractions
    and factors are dimensionless; sizes in bytes. Raises ``ValueError`` for fractions outside
    (0, 1], a factor below 1 or counts below 1."""

    copy_min_fraction: float = COPY_MIN_FRACTION
    busbw_min_fraction: float = BUSBW_MIN_FRACTION
    latency_max_factor: float = LATENCY_MAX_FACTOR
    band_window: int = BAND_WINDOW
    band_min_probes: int = BAND_MIN_PROBES
    latency_max_bytes: int = LATENCY_MAX_BYTES
    busbw_min_bytes: int = BUSBW_MIN_BYTES
    ignored_clock_reasons: tuple[str, ...] = IGNORED_CLOCK_REASONS
    after_job_clock_reasons: tuple[str, ...] = LOAD_CLOCK_REASONS
    peer_min_fraction: float = PEER_MIN_FRACTION
    cold_factor: float = COLD_FACTOR

    def __post_init__(self) -> None:
        for name in ("copy_min_fraction", "busbw_min_fraction", "peer_min_fraction"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must lie in (0, 1], got {getattr(self, name)}")
        if self.latency_max_factor < 1:
            raise ValueError(f"latency_max_factor must be >= 1, got {self.latency_max_factor}")
        if self.cold_factor < 1:
            raise ValueError(f"cold_factor must be >= 1, got {self.cold_factor}")
        if self.band_window < 1 or self.band_min_probes < 1:
            raise ValueError("band_window and band_min_probes must be >= 1")


@dataclass(frozen=True)
class Figure:
    """One number a probe report yields: ``key`` names it across reports (and nodes of a model).

    ``kind`` names the rule in reason codes (``<kind>-outside-band``, ``<kind>-below-peers``) and
    in ``kernelab.service.judge.node_change``; ``limit_factor`` x the band's median is the band's limit
    (a fraction below 1 when ``better`` is "higher", a factor above 1 when "lower"); ``peers``, when
    set, is the plural noun of the figures of this kind in one report ("GPUs") that the figure is
    also compared with (``health.peer_reasons``)."""

    key: str
    value: float
    unit: str
    better: Better
    kind: str
    device_index: int | None = None
    ranks: tuple[int, ...] = ()
    readings: int = 1  # readings of the report summarised (a series), warm-up left out
    warmup: int = 0  # leading cold readings of the series left out
    limit_factor: float = field(default=COPY_MIN_FRACTION, compare=False)
    peers: str | None = field(default=None, compare=False)
    change_tolerance: float | None = field(default=None, compare=False)
    """Relative change of an after-probe against the before-probe beyond which the node changed
    (``kernelab.service.judge.node_change``); None: that module's tolerance of the figure's ``kind``."""


def size_label(n: int) -> str:
    """``8`` -> ``"8 B"``, ``1048576`` -> ``"1 MiB"``: whole binary units only, else bytes."""
    for unit, scale in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def warmup_calls(times_us: Sequence[float], cold_factor: float = COLD_FACTOR) -> int:
    """How many leading calls of a series (times in call order, us) are warm-up: each slower than
    ``cold_factor`` x the median of the calls after it. 0 for a single call; at least one call is
    always kept. E.g. ``[214477, 4.1, 4.0, 3.9]`` -> 1."""
    cold = 0
    while cold < len(times_us) - 1 and times_us[cold] > cold_factor * statistics.median(times_us[cold + 1 :]):
        cold += 1
    return cold


# Display
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Column(Generic[R]):
    """One column of a plain-text table: its header and a reading's cell text."""

    header: str
    cell: Callable[[R], str]


@dataclass(frozen=True)
class TextSection(Generic[R]):
    """A probe's section of the plain-text report (``kernelab probe``): a title line, then a table
    with one row per reading. ``title(report, readings)``; ``show_empty``: the title is printed even
    without readings (NVML's status line), the table never is."""

    title: Callable[[ProbeReport, Sequence[R]], str]
    columns: tuple[Column[R], ...]
    show_empty: bool = False


@dataclass(frozen=True)
class Cell:
    """One cell of a dashboard table: ``text``, a right-aligned number (``num``) or not, ``nowrap``,
    and an optional badge after the text (``badge`` its text, ``badge_kind`` its CSS class:
    ``fail``, ``flag``, ``pass``, ``neutral``)."""

    text: str
    num: bool = True
    nowrap: bool = False
    badge: str | None = None
    badge_kind: str = "fail"


@dataclass(frozen=True)
class Pivot(Generic[R]):
    """A probe's table on the job and node pages: one row per ``key(reading)`` (sorted by it), the
    ``labels`` of the row's first reading under ``label_headers`` (``{device}`` is replaced by
    "GPU", "CPU" or "device"), then per phase the ``values`` of the reading that phase took under
    ``f"{phase}{suffix}"`` for each of ``value_suffixes`` (a missing reading shows a dash).
    ``table_id`` is the table's HTML id."""

    table_id: str
    caption: str
    key: Callable[[R], tuple[Any, ...]]
    label_headers: tuple[str, ...]
    labels: Callable[[R], tuple[Cell, ...]]
    value_suffixes: tuple[str, ...]
    values: Callable[[R], tuple[Cell, ...]]


@dataclass(frozen=True)
class Panel(Generic[R]):
    """A probe's panel of the node page's history figure (``kernelab.web.figures``): one trace per
    ``trace(reading)`` key, one point per report at the median of its readings of that key.

    ``trace(reading) -> (key, name)`` (``{device}`` in the name is replaced as in ``Pivot``);
    ``value`` in ``unit``; ``log``: a log y axis; ``shown(keys)``: the keys whose traces start
    visible (None: all); ``band(b) -> "area" | "line" | None``: how the health band ``b`` is drawn
    on this panel (an area from its low to high and its limit line, the limit line alone, or not)."""

    title: str
    trace: Callable[[R], tuple[tuple[Any, ...], str]]
    value: Callable[[R], float]
    hover: str
    log: bool = False
    shown: Callable[[Sequence[tuple[Any, ...]]], set[tuple[Any, ...]]] | None = None
    band: Callable[[HealthBand], Literal["area", "line"] | None] = lambda band: None


@dataclass(frozen=True)
class Flat:
    """A reading as a row of the flat ``probe_readings`` table
    (``kernelab.service.server.models.ProbeReading``):
    ``device_index``, ``world_size``, ``size_bytes``, ``time_us``, ``value_gbps``, ``busbw_gbps``."""

    size_bytes: int
    time_us: float
    value_gbps: float
    device_index: int | None = None
    world_size: int | None = None
    busbw_gbps: float | None = None


# The protocol
# --------------------------------------------------------------------------------------------------

FiguresRule = Callable[[Sequence[R], Thresholds], list[Figure]]
InstantRule = Callable[[Sequence[R], Sequence[R] | None, str, Thresholds], list[HealthReason]]
"""``instant(readings, previous_readings, phase, thresholds)``: ``previous_readings`` are the
probe's readings in the node's previous report (None without one)."""


@dataclass(frozen=True)
class Probe(Generic[R]):
    """One node-health probe (the module docstring). Raises nothing itself; ``register`` checks it."""

    name: str
    label: str
    reading: type[R]
    units: Mapping[str, str]
    max_readings: int
    position: int
    runner: str
    generic_runner: bool = True
    error_key: str = ""
    figures: FiguresRule[R] | None = None
    instant: InstantRule[R] | None = None
    peak: tuple[str, Callable[[R], float]] | None = None
    contended: Callable[[Sequence[R]], bool] | None = None
    text: TextSection[R] | None = None
    summary: Callable[[ProbeReport, Sequence[R]], list[str]] | None = None
    pivot: Pivot[R] | None = None
    panel: Panel[R] | None = None
    flat: Callable[[R], Flat] | None = None

    @property
    def errors_key(self) -> str:
        """The key of ``ProbeReport.errors`` this probe's failure is recorded under."""
        return self.error_key or self.name

    def readings(self, report: ProbeReport) -> list[R]:
        """The readings of this probe in ``report`` (empty when it did not run)."""
        value: list[R] = getattr(report, self.name)
        return value


_REGISTRY: dict[str, Probe[Any]] = {}
COMMON_FIELDS = ("phase", "taken_at", "wall_s", "mode", "notes", "nvml_status", "errors")
"""Fields of ``ProbeReport`` that belong to no probe; a probe's ``name`` is none of them."""


def register(probe: Probe[R]) -> Probe[R]:
    """Add ``probe`` to the registry and return it. Raises ``ValueError`` for a name or position
    already taken, a name that is a common report field or not an identifier, a unit for a field
    the reading does not have, or a bound below 1; ``RuntimeError`` once ``ProbeReport`` is built
    (``kernelab.service.contract.schemas.probes``: a probe registered after it would not be in it)."""
    if _BUILT:
        raise RuntimeError(f"probe {probe.name!r} registered after ProbeReport was built")
    if not probe.name.isidentifier() or probe.name in COMMON_FIELDS:
        raise ValueError(f"a probe's name must be an identifier and no common field, got {probe.name!r}")
    if probe.name in _REGISTRY:
        raise ValueError(f"probe {probe.name!r} is registered twice")
    taken = {p.position: p.name for p in _REGISTRY.values()}
    if probe.position in taken or probe.position in _COMMON_POSITIONS.values():
        raise ValueError(f"probe {probe.name!r}: position {probe.position} is taken")
    unknown = set(probe.units) - set(probe.reading.model_fields)
    if unknown:
        raise ValueError(f"probe {probe.name!r}: units for fields its reading lacks: {sorted(unknown)}")
    if probe.max_readings < 1:
        raise ValueError(f"probe {probe.name!r}: max_readings must be >= 1")
    _REGISTRY[probe.name] = probe
    return probe


_COMMON_POSITIONS = {
    "phase": 0,
    "taken_at": 1,
    "wall_s": 2,
    "mode": 50,
    "notes": 51,
    "nvml_status": 70,
    "errors": 80,
}
"""Where the common fields sit among the probes' in a report's JSON (as they did before probes
were registered: ``copy_bandwidth`` 10, ``all_reduce`` 20, ``telemetry`` 30, ``peer_copy`` 40,
``matmul_peak`` 60)."""
_BUILT = False


def mark_built() -> None:
    """Called once ``ProbeReport`` is built: no probe may register after it."""
    global _BUILT
    _BUILT = True


def registered() -> tuple[Probe[Any], ...]:
    """Every registered probe, by ``position`` (the report's order)."""
    return tuple(sorted(_REGISTRY.values(), key=lambda p: p.position))


def probe(name: str) -> Probe[Any]:
    """The probe named ``name``; ``KeyError`` naming the registered ones when there is none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no probe {name!r}; registered: {sorted(_REGISTRY)}") from None


def field_order() -> list[str]:
    """``ProbeReport``'s fields in their JSON order: common and probe fields by position."""
    positions = {**_COMMON_POSITIONS, **{p.name: p.position for p in _REGISTRY.values()}}
    return sorted(positions, key=positions.__getitem__)


def probes_with(attr: str) -> Iterable[Probe[Any]]:
    """The registered probes whose ``attr`` (``figures``, ``pivot``, ...) is set, in report order."""
    return (p for p in registered() if getattr(p, attr) is not None)


def runs_generically(spec: ProbeSpec) -> bool:
    """Whether ``run_probes`` runs the probes with ``generic_runner``: whenever ``spec`` enables any
    probe (``ProbeSpec.off()`` runs none)."""
    return spec.copy_bandwidth or spec.all_reduce or spec.nvml or spec.matmul_peak
