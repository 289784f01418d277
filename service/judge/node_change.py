"""Did the job change the node? Its probe report after the job against the one before it.

A job's two probe reports (``phase`` ``before`` and ``after``, each taken in a process that never
imports benchmark code) should agree within the probes' own noise. A figure that moved beyond it,
in either direction, says the node is not the one the job started on: a candidate that left a
device-wide state behind, another tenant that arrived, a clock policy that changed. The job's
cells then read ``inconclusive`` (reason ``node-changed``, naming the figure and both values),
whatever their timing says; the runner probes the node again before its next job.

Tolerance per figure kind (relative change of after against before): copy and peer bandwidth
10%, all-reduce bus bandwidth 15%, all-reduce latency 50% and at least 2 us. On an H200 the
device copy probe reads within 0.1% from one report to the next (4,190-4,196 GB/s before and
after the same jobs, docs/results/2026-12-01-h200-adversarial.md) and the 8 B all-reduce 6.0-6.1 us
over five runs (docs/results/2026-11-30-h200x2-probe-accuracy.md); the tolerances leave room
for a job's own heat (an after probe taken at the power cap) while catching the 3x and 100x moves
the cheats produced. Where a node has a healthy band (``kernelab.service.judge.health``), the tolerance widens
to
three times the band's relative spread when that is larger. A CPU-only node is not judged: its
copy bandwidth is the host's memory, shared with every other process there (a loaded 2-core CI
machine swung it from 5.6 to 4.1 GB/s between the two probes of one job), and its gloo all-reduce
yields no figure (``kernelab.service.judge.health.probe_figures``); the CPU mode serves CI and laptops.

Pure functions over ``kernelab.service.contract.schemas``; figures from
``kernelab.service.judge.health.probe_figures``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kernelab.service.contract.schemas import HealthBand, HealthReason, ProbeReport, Reason
from kernelab.service.judge.health import Figure, probe_figures
from kernelab.service.judge.verdicts import reason

TOLERANCE: dict[str, float] = {"copy": 0.10, "peer": 0.10, "busbw": 0.15, "latency": 0.50}
DEFAULT_TOLERANCE = 0.50
"""A figure of a kind ``TOLERANCE`` does not name, without a ``Figure.change_tolerance`` of its own
(a probe added later): the loosest of the kinds above."""
LATENCY_FLOOR_US = 2.0
BAND_SPREAD_FACTOR = 3.0


def _phase(probes: Sequence[ProbeReport], phase: str) -> ProbeReport | None:
    reports = [p for p in probes if p.phase == phase]
    return max(reports, key=lambda p: p.taken_at) if reports else None


def _tolerance(f: Figure, band: HealthBand | None) -> float:
    tol = f.change_tolerance if f.change_tolerance is not None else TOLERANCE.get(f.kind, DEFAULT_TOLERANCE)
    if band is not None and band.median > 0:
        tol = max(tol, BAND_SPREAD_FACTOR * (band.high - band.low) / band.median)
    return tol


def node_change_reasons(
    probes: Sequence[ProbeReport], bands: Mapping[str, HealthBand] | None = None, *, device_type: str = "cuda"
) -> list[Reason]:
    """``node-changed`` reasons, one per figure of the latest ``after`` report that moved beyond
    its tolerance (module docstring) from the latest ``before`` report of ``probes``; empty when
    either report is missing or nothing moved. ``bands``: the node's healthy bands by figure key,
    if known; ``device_type``: the node's (a ``"cpu"`` node is not judged: module docstring)."""
    before, after = _phase(probes, "before"), _phase(probes, "after")
    if before is None or after is None or device_type == "cpu":
        return []
    old = {f.key: f for f in probe_figures(before)}
    out = []
    for f in probe_figures(after):
        prev = old.get(f.key)
        if prev is None or prev.value <= 0 or f.value < 0:
            continue
        change = f.value / prev.value - 1
        tol = _tolerance(f, (bands or {}).get(f.key))
        if abs(change) <= tol or (f.kind == "latency" and abs(f.value - prev.value) < LATENCY_FLOOR_US):
            continue
        out.append(
            reason(
                "node-changed",
                f"{f.key} read {f.value:,.4g} {f.unit} after the job against "
                f"{prev.value:,.4g} {f.unit} before "
                f"it ({100 * change:+.0f}%, beyond ±{100 * tol:.0f}%): the node changed while the job ran; "
                "its timings cannot decide",
            )
        )
    return out


def changed_since(
    reports: Sequence[ProbeReport],
    job_ids: Sequence[int | None],
    *,
    device_type: str = "cuda",
    bands: Mapping[str, HealthBand] | None = None,
) -> list[HealthReason]:
    """Is the node still as a job left it? ``reports`` and their ``job_ids`` (any order): find the
    latest job whose ``after`` report moved beyond tolerance from its ``before`` report (the job
    that changed the node), then compare the node's latest report with that job's ``before``
    report: while it still differs, ``degraded-node`` reasons (code ``node-changed``) naming the
    job; once a probe reads within tolerance of the state before that job, none. A job's changed
    cells are told by ``node_change_reasons``; this keeps the *node* degraded until a probe says
    otherwise. CPU-only nodes are not judged (module docstring)."""
    if device_type == "cpu" or not reports:
        return []
    by_job: dict[int, dict[str, ProbeReport]] = {}
    for report, job_id in zip(reports, job_ids, strict=True):
        if job_id is not None and report.phase in ("before", "after"):
            seen = by_job.setdefault(job_id, {})
            if report.phase not in seen or report.taken_at > seen[report.phase].taken_at:
                seen[report.phase] = report
    changing = [
        (pair["after"].taken_at, job_id, pair["before"])
        for job_id, pair in by_job.items()
        if {"before", "after"} <= set(pair) and node_change_reasons([pair["before"], pair["after"]], bands)
    ]
    if not changing:
        return []
    changed_at, job_id, before = max(changing, key=lambda c: c[0])
    latest = max(reports, key=lambda r: r.taken_at)
    still = node_change_reasons([before, latest.model_copy(update={"phase": "after"})], bands)
    return [
        HealthReason(
            code="node-changed",
            flag="degraded-node",
            message=f"left changed by job {job_id}: {r.message.split(': the node changed')[0]} "
            f"(latest probe, {latest.taken_at:%Y-%m-%d %H:%M:%S} UTC, against the probe before "
            "that job); degraded until a probe reads as before",
        )
        for r in still
    ]
