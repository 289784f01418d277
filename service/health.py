"""Node-health verdicts: healthy bands learned from probe history, and the reasons a node is not healthy.

Pure functions over ``kernelab.service.schemas``: no database, no web framework, so the runner's CLI
(``kernelab probe``) evaluates a fresh report with the same code as the server.

Figures. A probe report yields *figures*, one number per thing a healthy node should reproduce
(``probe_figures``):

* ``copy GPU <i>`` — device-local copy bandwidth of GPU i, GB/s (read + written), higher is better;
* ``peer <i>-><j>`` — peer copy bandwidth, GB/s, higher is better;
* ``all-reduce <group> <size> time`` — time per all-reduce in us for sizes up to
  ``latency_max_bytes`` (latency-bound: nccl-tests' times are flat below ~1 MiB on NVLink),
  lower is better;
* ``all-reduce <group> <size> busbw`` — bus bandwidth, GB/s, for sizes from ``busbw_min_bytes``
  (bandwidth-bound), higher is better.

Bands. A node's band per figure is the median, min and max of that figure over its own last
``band_window`` *healthy* reports (``band_min_probes`` at least, else no band). The limit is
``copy_min_fraction`` x median for bandwidths (``busbw_min_fraction`` for all-reduce busbw) and
``latency_max_factor`` x median for times; defaults 0.90, 0.85 and 1.5 (``Thresholds``).
Medians, not means: a band stays put when a minority of its reports were bad. The fleet's band
per GPU model is the same over the healthy reports of every node of that model (``fleet_bands``).

Chain. A node's history is evaluated oldest first (``evaluate_history``): each report is judged
against the band learned from the healthy reports before it, and only healthy reports teach the
band. So a node that degrades for good stays degraded instead of teaching its band the new, lower
figures (a deliberate trade: after a legitimate slow-down, e.g. a new driver, the old reports must
age out of the database or the thresholds be loosened).

Series. Readings of one figure repeated in one report (several calls of one all-reduce size, as
an all-reduce series posts them) are one series: the leading calls slower than ``cold_factor`` x
the median of the calls after them are warm-up (the first call of a communicator sets up its
connections: 214 ms against ~4 us warm) and left out, the rest summarised by their median, as
nccl-tests times only after its warm-up iterations (``all_reduce_perf -w``). One reading alone is
judged as it is.

Reasons that need no band (``instant_reasons``): a probe that failed or computed a wrong sum; a
GPU's clock-event mask holding a throttle reason (``kernelab.service.clock_events``: the one rule that also
marks samples throttled; the server decodes the mask itself, names posted without a mask or
against it are not judged; informational reasons such as ``gpu_idle`` and DCGM's blank placeholder
never degrade; ``sw_power_cap`` alone is the power limiter under the probe's or a job's load and is
ignored by default, ``IGNORED_CLOCK_REASONS`` says why; in a probe taken right after a job it is
ignored whatever ``ignored_clock_reasons`` says); a GPU or GPU pair far below its peers in the same
report (``peer_min_fraction`` x the median of that report's copy or peer figures, with at least
``PEER_MIN_FIGURES`` of them: a half-speed link shows this way on a fresh node, with no history);
volatile uncorrected ECC errors that grew since the previous report; and another process on a GPU
(``contended``: another tenant; ``verdicts.foreign_processes`` decides what "another" is).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from kernelab.service import clock_events
from kernelab.service.schemas import (
    AllReduceReading,
    Flag,
    HealthBand,
    HealthReason,
    NodeHealth,
    ProbeReport,
)
from kernelab.service.verdicts import foreign_processes

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


@dataclass(frozen=True)
class Thresholds:
    """Where a figure leaves its band; see the module docstring. Fractions and factors are
    dimensionless; sizes in bytes. Raises ``ValueError`` for fractions outside (0, 1], a factor
    below 1 or counts below 1."""

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
    """One number a probe report yields: ``key`` names it across reports (and nodes of a model)."""

    key: str
    value: float
    unit: str
    better: Better
    kind: Literal["copy", "peer", "latency", "busbw"]
    device_index: int | None = None
    ranks: tuple[int, ...] = ()
    readings: int = 1  # readings of the report summarised (a series), warm-up left out
    warmup: int = 0  # leading cold readings of the series left out


def size_label(n: int) -> str:
    """``8`` -> ``"8 B"``, ``1048576`` -> ``"1 MiB"``: whole binary units only, else bytes."""
    for unit, scale in (("GiB", 1024**3), ("MiB", MIB), ("KiB", 1024)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _group_label(ranks: Sequence[int], world_size: int) -> str:
    return f"[{','.join(map(str, ranks))}]" if ranks else f"x{world_size}"


def probe_figures(report: ProbeReport, thresholds: Thresholds | None = None) -> list[Figure]:
    """The figures of ``report`` (module docstring), in report order.

    gloo all-reduce readings (CPU mode) yield none. All-reduce sizes between ``latency_max_bytes``
    and ``busbw_min_bytes`` (exclusive) yield no figure: neither their time nor their bandwidth is
    a stable health signal. CUDA-graph readings get their own keys (``... graph``), since their
    times differ from eager ones.
    """
    t = thresholds or Thresholds()
    out: list[Figure] = []
    for c in report.copy_bandwidth:
        out.append(
            Figure(
                f"copy GPU {c.device_index}",
                c.bandwidth_gbps,
                "GB/s",
                "higher",
                "copy",
                device_index=c.device_index,
            )
        )
    for p in report.peer_copy:
        if p.peer_access and p.bandwidth_gbps > 0:
            out.append(
                Figure(
                    f"peer {p.src_device}->{p.dst_device}",
                    p.bandwidth_gbps,
                    "GB/s",
                    "higher",
                    "peer",
                    ranks=(p.src_device, p.dst_device),
                )
            )
    series: dict[str, list[AllReduceReading]] = {}
    for a in report.all_reduce:
        if a.world_size < 2:
            continue  # one rank moves no data: its "all-reduce" says nothing about the links
        if a.backend == "gloo":
            # gloo between processes of one CPU-only host (kernelab's CPU mode) times the host's
            # scheduler, not a link: on a loaded 2-core machine it swings 2x between probes.
            continue
        stem = f"all-reduce {_group_label(a.ranks, a.world_size)} {size_label(a.size_bytes)}"
        stem += " graph" if a.cuda_graph else ""
        # A host-clock reading of NCCL (before 2026-11-30, or asked for) times torch's dispatch too
        # (kernelab.runners.probes.all_reduce): it gets its own band, never mixed with event-timed readings.
        stem += " host-clock" if a.timed_by == "host-clock" and not a.cuda_graph else ""
        series.setdefault(stem, []).append(a)
    for stem, calls in series.items():
        a = calls[0]
        warm = calls[warmup_calls([c.time_us for c in calls], t.cold_factor) :]
        time_us = statistics.median(c.time_us for c in warm)
        busbw = statistics.median(c.busbw_gbps for c in warm)
        n, cold = len(calls), len(calls) - len(warm)
        if a.size_bytes <= t.latency_max_bytes:
            out.append(
                Figure(
                    f"{stem} time",
                    time_us,
                    "us",
                    "lower",
                    "latency",
                    ranks=tuple(a.ranks),
                    readings=n,
                    warmup=cold,
                )
            )
        if a.size_bytes >= t.busbw_min_bytes:
            out.append(
                Figure(
                    f"{stem} busbw",
                    busbw,
                    "GB/s",
                    "higher",
                    "busbw",
                    ranks=tuple(a.ranks),
                    readings=n,
                    warmup=cold,
                )
            )
    return out


def warmup_calls(times_us: Sequence[float], cold_factor: float = COLD_FACTOR) -> int:
    """How many leading calls of a series (times in call order, us) are warm-up: each slower than
    ``cold_factor`` x the median of the calls after it. 0 for a single call; at least one call is
    always kept. E.g. ``[214477, 4.1, 4.0, 3.9]`` -> 1."""
    cold = 0
    while cold < len(times_us) - 1 and times_us[cold] > cold_factor * statistics.median(times_us[cold + 1 :]):
        cold += 1
    return cold


FiguresOf = Callable[[ProbeReport], list[Figure]]
"""``probe_figures`` of a report under fixed thresholds (``figures_once`` computes each once)."""


def figures_once(thresholds: Thresholds | None = None) -> FiguresOf:
    """``probe_figures`` under ``thresholds``, computed once per report object: a node's chain
    (``evaluate_history``) learns each report's band from the healthy reports before it, so without
    it a report's figures were derived again for every later report (window x reports times)."""
    t = thresholds or Thresholds()
    memo: dict[int, tuple[ProbeReport, list[Figure]]] = {}

    def figures_of(report: ProbeReport) -> list[Figure]:
        hit = memo.get(id(report))
        if hit is None or hit[0] is not report:  # the report is held, so its id is not reused
            hit = memo[id(report)] = (report, probe_figures(report, t))
        return hit[1]

    return figures_of


def learn_bands(
    reports: Iterable[ProbeReport],
    thresholds: Thresholds | None = None,
    *,
    scope: str = "node",
    figures_of: FiguresOf | None = None,
) -> dict[str, HealthBand]:
    """Band per figure key over ``reports`` (taken to be healthy): median, min, max, count, limit.

    Figures seen in fewer than ``band_min_probes`` reports get no band. ``scope`` (``"node"`` or
    ``"fleet <model>"``) is copied into each band so a reason can say which band it left.
    ``figures_of``: a report's figures (``figures_once``; default ``probe_figures``).
    """
    t = thresholds or Thresholds()
    values: dict[str, list[float]] = {}
    meta: dict[str, Figure] = {}
    for report in reports:
        for f in figures_of(report) if figures_of else probe_figures(report, t):
            values.setdefault(f.key, []).append(f.value)
            meta.setdefault(f.key, f)
    bands: dict[str, HealthBand] = {}
    for key, vs in values.items():
        if len(vs) < t.band_min_probes:
            continue
        f = meta[key]
        median = statistics.median(vs)
        if f.kind == "latency":
            limit = median * t.latency_max_factor
        elif f.kind == "busbw":
            limit = median * t.busbw_min_fraction
        else:
            limit = median * t.copy_min_fraction
        bands[key] = HealthBand(
            figure=key,
            unit=f.unit,
            better=f.better,
            median=median,
            low=min(vs),
            high=max(vs),
            n=len(vs),
            limit=limit,
            scope=scope,
        )
    return bands


def _outside(f: Figure, band: HealthBand) -> bool:
    return f.value > band.limit if f.better == "lower" else f.value < band.limit


def band_reasons(
    report: ProbeReport,
    bands: Mapping[str, HealthBand],
    thresholds: Thresholds | None = None,
    *,
    figures_of: FiguresOf | None = None,
) -> list[HealthReason]:
    """A ``degraded-node`` reason for every figure of ``report`` beyond its band's limit."""
    out = []
    for f in figures_of(report) if figures_of else probe_figures(report, thresholds):
        band = bands.get(f.key)
        if band is None or not _outside(f, band):
            continue
        relation = f"{f.value / band.median:.0%} of" if band.median else "vs"
        summary = ""
        if f.readings > 1:
            summary = f" (median of {f.readings - f.warmup} calls after {f.warmup} warm-up)"
        out.append(
            HealthReason(
                code=f"{f.kind}-outside-band",
                flag="degraded-node",
                figure=f.key,
                device_index=f.device_index,
                value=f.value,
                limit=band.limit,
                message=(
                    f"{f.key}: {f.value:.4g} {f.unit}{summary} is {relation} the {band.scope} band's median "
                    f"{band.median:.4g} {f.unit} (limit {band.limit:.4g} {f.unit}, "
                    f"{band.n} healthy probes)"
                ),
            )
        )
    return out


def peer_reasons(
    report: ProbeReport, thresholds: Thresholds | None = None, *, figures_of: FiguresOf | None = None
) -> list[HealthReason]:
    """``degraded-node`` for each copy figure (a GPU) or peer figure (a GPU pair) of ``report`` below
    ``peer_min_fraction`` x the median of the report's figures of that kind, when the report has at
    least ``PEER_MIN_FIGURES`` of them. Needs no history: one report with six pairs at 78-82 GB/s and
    one at 40 GB/s names the slow pair on a node's first probe."""
    t = thresholds or Thresholds()
    by_kind: dict[str, list[Figure]] = {}
    for f in figures_of(report) if figures_of else probe_figures(report, t):
        if f.kind in ("copy", "peer"):
            by_kind.setdefault(f.kind, []).append(f)
    out = []
    for kind, figures in by_kind.items():
        if len(figures) < PEER_MIN_FIGURES:
            continue
        median = statistics.median(f.value for f in figures)
        limit = t.peer_min_fraction * median
        what = "GPUs" if kind == "copy" else "GPU pairs"
        for f in figures:
            if f.value < limit:
                out.append(
                    HealthReason(
                        code=f"{kind}-below-peers",
                        flag="degraded-node",
                        figure=f.key,
                        device_index=f.device_index,
                        value=f.value,
                        limit=limit,
                        message=(
                            f"{f.key}: {f.value:.4g} {f.unit} is {f.value / median:.0%} of the median "
                            f"{median:.4g} {f.unit} of the {len(figures)} {what} in the same report "
                            f"(limit {t.peer_min_fraction:g}x): far below its peers"
                        ),
                    )
                )
    return out


def instant_reasons(
    report: ProbeReport,
    previous: ProbeReport | None = None,
    thresholds: Thresholds | None = None,
    *,
    figures_of: FiguresOf | None = None,
) -> list[HealthReason]:
    """Reasons visible in ``report`` alone (or against the ``previous`` report for ECC growth).

    ``degraded-node``: a failed probe (``report.errors``), a wrong all-reduce sum, a throttle reason
    in a GPU's clock-event mask (``clock_events.throttle_reasons``, decoded here from the mask, never
    from posted names) not in ``ignored_clock_reasons`` (nor, in an ``after`` probe, in
    ``after_job_clock_reasons``: the job's own power capping), a GPU or pair far below its peers
    (``peer_reasons``), ECC (volatile, uncorrected) above the previous report's count for the same
    GPU (matched by UUID, else index). ``contended``: another compute process on a GPU.
    """
    t = thresholds or Thresholds()
    out: list[HealthReason] = []
    for probe, text in sorted(report.errors.items()):
        out.append(
            HealthReason(
                code="probe-failed",
                flag="degraded-node",
                figure=probe,
                message=f"the {probe} probe failed: {text}",
            )
        )
    for a in report.all_reduce:
        if not a.correct:
            group = _group_label(a.ranks, a.world_size)
            out.append(
                HealthReason(
                    code="all-reduce-wrong",
                    flag="degraded-node",
                    figure=f"all-reduce {group} {size_label(a.size_bytes)}",
                    message=f"all-reduce over {group} of {size_label(a.size_bytes)} returned a wrong sum",
                )
            )
    out += peer_reasons(report, t, figures_of=figures_of)
    before = {(g.uuid or str(g.device_index)): g for g in (previous.telemetry if previous else [])}
    ignored = set(t.ignored_clock_reasons)
    if report.phase == "after":
        ignored |= set(t.after_job_clock_reasons)
    for g in report.telemetry:
        reasons = [r for r in clock_events.throttle_reasons(g.clock_event_reasons) if r not in ignored]
        if reasons:
            out.append(
                HealthReason(
                    code="clock-event",
                    flag="degraded-node",
                    device_index=g.device_index,
                    message=f"GPU {g.device_index}: clock-event reasons {', '.join(reasons)}",
                )
            )
        old = before.get(g.uuid or str(g.device_index))
        old_ecc = old.ecc_volatile_uncorrected if old is not None else None
        new_ecc = g.ecc_volatile_uncorrected
        if old_ecc is not None and new_ecc is not None and new_ecc > old_ecc:
            out.append(
                HealthReason(
                    code="ecc-growth",
                    flag="degraded-node",
                    device_index=g.device_index,
                    value=float(new_ecc),
                    limit=float(old_ecc),
                    message=(
                        f"GPU {g.device_index}: volatile uncorrected ECC errors grew from "
                        f"{old_ecc} to {new_ecc}"
                    ),
                )
            )
        foreign = foreign_processes(g.other_processes)
        if foreign:
            out.append(
                HealthReason(
                    code="other-tenant",
                    flag="contended",
                    device_index=g.device_index,
                    value=float(foreign),
                    message=f"GPU {g.device_index}: {foreign} other compute process(es)",
                )
            )
    return out


def status_of(reasons: Sequence[HealthReason]) -> Literal["healthy", "degraded", "contended"]:
    """``degraded`` if any reason flags ``degraded-node``, else ``contended`` if any, else ``healthy``."""
    if any(r.flag == "degraded-node" for r in reasons):
        return "degraded"
    return "contended" if reasons else "healthy"


def flags_of(reasons: Iterable[HealthReason]) -> list[Flag]:
    """The result flags the reasons imply, without duplicates, ``contended`` before ``degraded-node``."""
    present = {r.flag for r in reasons}
    return [f for f in ("contended", "degraded-node") if f in present]  # type: ignore[misc]


def evaluate(
    report: ProbeReport,
    *,
    node_bands: Mapping[str, HealthBand] | None = None,
    fleet_bands: Mapping[str, HealthBand] | None = None,
    previous: ProbeReport | None = None,
    thresholds: Thresholds | None = None,
    figures_of: FiguresOf | None = None,
) -> list[HealthReason]:
    """Every reason ``report`` is not healthy: instant reasons, then the node band's, then the
    fleet band's for figures the node band does not flag. Empty: healthy."""
    reasons = instant_reasons(report, previous, thresholds, figures_of=figures_of)
    node_out = band_reasons(report, node_bands or {}, thresholds, figures_of=figures_of)
    flagged = {r.figure for r in node_out}
    fleet_out = [
        r
        for r in band_reasons(report, fleet_bands or {}, thresholds, figures_of=figures_of)
        if r.figure not in flagged
    ]
    return reasons + node_out + fleet_out


@dataclass
class History:
    """Result of ``evaluate_history``: per report its reasons, and the node's current bands."""

    reasons: list[list[HealthReason]] = field(default_factory=list)
    healthy: list[ProbeReport] = field(default_factory=list)
    bands: dict[str, HealthBand] = field(default_factory=dict)


def evaluate_history(
    reports: Sequence[ProbeReport],
    *,
    fleet_bands: Mapping[str, HealthBand] | None = None,
    thresholds: Thresholds | None = None,
) -> History:
    """Judge a node's ``reports`` oldest first (by ``taken_at``), each against the band of the
    healthy reports before it (see "Chain" in the module docstring).

    Returns ``History`` whose ``reasons[i]`` belong to ``reports[i]`` (the caller's order), whose
    ``healthy`` are the reports that taught the band, and whose ``bands`` are the band learned from
    the last ``band_window`` of them (the band the next report will be judged against).
    """
    t = thresholds or Thresholds()
    figures_of = figures_once(t)
    order = sorted(range(len(reports)), key=lambda i: reports[i].taken_at)
    out = History(reasons=[[] for _ in reports])
    previous: ProbeReport | None = None
    for i in order:
        report = reports[i]
        bands = learn_bands(out.healthy[-t.band_window :], t, figures_of=figures_of)
        reasons = evaluate(
            report, node_bands=bands, fleet_bands=fleet_bands, previous=previous, thresholds=t,
            figures_of=figures_of,
        )  # fmt: skip
        out.reasons[i] = reasons
        if not reasons:
            out.healthy.append(report)
        previous = report
    out.bands = learn_bands(out.healthy[-t.band_window :], t, figures_of=figures_of)
    return out


def fleet_bands(
    reports: Iterable[ProbeReport], model: str, thresholds: Thresholds | None = None
) -> dict[str, HealthBand]:
    """The fleet band of one GPU ``model`` from its nodes' recent reports, those with no instant
    reason (a median over the fleet needs no chain: a minority of slow nodes cannot move it)."""
    t = thresholds or Thresholds()
    figures_of = figures_once(t)
    clean = [r for r in reports if not instant_reasons(r, None, t, figures_of=figures_of)]
    return learn_bands(clean, t, scope=f"fleet {model}", figures_of=figures_of)


def node_health(
    reports: Sequence[ProbeReport],
    *,
    fleet: Mapping[str, HealthBand] | None = None,
    thresholds: Thresholds | None = None,
    model: str | None = None,
    history: History | None = None,
) -> NodeHealth:
    """A node's health now: the verdict of its latest report (``status`` ``unknown`` without one),
    with the node's bands and the fleet's bands (fleet bands only for figures the node has no band for,
    so the answer shows which band each figure is judged by). ``history``: ``evaluate_history`` of
    these ``reports`` and ``fleet`` when the caller has it (a cached one), else computed here."""
    if not reports:
        return NodeHealth(status="unknown", model=model, message="no probe report yet")
    if history is None:
        history = evaluate_history(reports, fleet_bands=fleet, thresholds=thresholds)
    latest = max(range(len(reports)), key=lambda i: reports[i].taken_at)
    reasons = history.reasons[latest]
    bands = list(history.bands.values()) + [b for k, b in (fleet or {}).items() if k not in history.bands]
    status = status_of(reasons)
    message = (
        "; ".join(r.message for r in reasons)
        if reasons
        else (f"every figure within its band ({len(history.healthy)} healthy probes)")
    )
    return NodeHealth(
        status=status,
        model=model,
        taken_at=reports[latest].taken_at,
        reasons=reasons,
        bands=sorted(bands, key=lambda b: b.figure),
        flags=flags_of(reasons),
        healthy_probes=len(history.healthy),
        message=message,
    )


def report_notes(flags: Sequence[Flag], reasons: Sequence[HealthReason]) -> list[str]:
    """The sentence a comparison carries when its node was not healthy (empty when it was)."""
    if not flags:
        return []
    what = " and ".join("degraded" if f == "degraded-node" else f for f in flags)
    detail = "; ".join(dict.fromkeys(r.message for r in reasons))
    return [
        f"Measured on a {what} node ({detail}). History views and the changes they compute "
        "exclude this result by default (include it with include_excluded=true); its numbers are "
        "shown for inspection only."
    ]
