"""Node-health verdicts: healthy bands learned from probe history, and the reasons a node is not healthy.

Pure functions over ``kernelab.service.contract.schemas``: no database, no web framework, so the runner's CLI
(``kernelab probe``) evaluates a fresh report with the same code as the server. The rules of each
probe (its figures, its instant reasons) are declared by the probe's module in
``kernelab.service.contract.probes`` (``kernelab.service.contract.schemas.probe_protocol``); this module
applies them
all, probe by probe in report order, and owns what is common: bands, peers, the chain, errors.

Figures. A probe report yields *figures*, one number per thing a healthy node should reproduce
(``probe_figures``; each with the factor of its band's limit and, for copy and peer figures, the
noun of its peers in one report). Today's:

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
``latency_max_factor`` x median for times (the figure's ``limit_factor``); defaults 0.90, 0.85 and
1.5 (``Thresholds``).
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
GPU's clock-event mask holding a throttle reason (``kernelab.service.contract.clock_events``: the one rule
that also
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

from kernelab.service.contract.schemas import (
    Flag,
    HealthBand,
    HealthReason,
    NodeHealth,
    ProbeReport,
)
from kernelab.service.contract.schemas.probe_protocol import (
    BAND_MIN_PROBES,
    BAND_WINDOW,
    BUSBW_MIN_BYTES,
    BUSBW_MIN_FRACTION,
    COLD_FACTOR,
    COPY_MIN_FRACTION,
    FLEET_WINDOW,
    IGNORED_CLOCK_REASONS,
    LATENCY_MAX_BYTES,
    LATENCY_MAX_FACTOR,
    LOAD_CLOCK_REASONS,
    MIB,
    PEER_MIN_FIGURES,
    PEER_MIN_FRACTION,
    Better,
    Figure,
    Thresholds,
    probes_with,
    size_label,
    warmup_calls,
)

__all__ = [
    "BAND_MIN_PROBES", "BAND_WINDOW", "BUSBW_MIN_BYTES", "BUSBW_MIN_FRACTION", "COLD_FACTOR",
    "COPY_MIN_FRACTION", "FLEET_WINDOW", "IGNORED_CLOCK_REASONS", "LATENCY_MAX_BYTES",
    "LATENCY_MAX_FACTOR", "LOAD_CLOCK_REASONS", "MIB", "PEER_MIN_FIGURES", "PEER_MIN_FRACTION", "Better",
    "Figure", "History", "Thresholds", "band_reasons", "evaluate", "evaluate_history", "figures_once",
    "flags_of", "fleet_bands", "instant_reasons", "learn_bands", "node_health", "peer_reasons",
    "probe_figures", "report_notes", "size_label", "status_of", "warmup_calls",
]  # fmt: skip


def probe_figures(report: ProbeReport, thresholds: Thresholds | None = None) -> list[Figure]:
    """The figures of ``report``: each registered probe's ``figures`` rule over its readings
    (``kernelab.service.contract.probes``), probe by probe in report order, each probe's in reading order.

    Today: ``copy GPU <i>``, ``all-reduce ...`` (gloo readings and one-rank groups yield none; sizes
    between ``latency_max_bytes`` and ``busbw_min_bytes`` exclusive yield none; CUDA-graph readings
    get their own keys, ``... graph``), ``peer <i>-><j>``.
    """
    t = thresholds or Thresholds()
    out: list[Figure] = []
    for probe in probes_with("figures"):
        assert probe.figures is not None
        out += probe.figures(probe.readings(report), t)
    return out


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
        limit = median * f.limit_factor
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
        if f.peers is not None:
            by_kind.setdefault(f.kind, []).append(f)
    out = []
    for kind, figures in by_kind.items():
        if len(figures) < PEER_MIN_FIGURES:
            continue
        median = statistics.median(f.value for f in figures)
        limit = t.peer_min_fraction * median
        what = figures[0].peers
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
    for name, text in sorted(report.errors.items()):
        out.append(
            HealthReason(
                code="probe-failed",
                flag="degraded-node",
                figure=name,
                message=f"the {name} probe failed: {text}",
            )
        )
    out += peer_reasons(report, t, figures_of=figures_of)
    for probe in probes_with("instant"):
        assert probe.instant is not None
        before = probe.readings(previous) if previous is not None else None
        out += probe.instant(probe.readings(report), before, report.phase, t)
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
