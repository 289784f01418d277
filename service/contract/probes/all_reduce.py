"""All-reduce latency and bus bandwidth over the node's GPUs, timed the way nccl-tests times it.

Figures (``kernelab.service.judge.health``'s module docstring): ``all-reduce <group> <size> time`` (us,
lower is better, limit ``Thresholds.latency_max_factor`` x the median) for sizes up to
``latency_max_bytes`` and ``all-reduce <group> <size> busbw`` (GB/s, higher is better, limit
``busbw_min_fraction`` x the median) from ``busbw_min_bytes``; readings of one figure repeated in
a report are one series (warm-up calls left out: ``warmup_calls``). CUDA-graph readings and NCCL
readings timed by the host clock get keys of their own; gloo readings (CPU mode) and one-rank
groups yield none. Instant reason: a wrong sum. Measured by
``kernelab.runners.probes.links.measure_links`` (ranks of ``kernelab.runners.probes.all_reduce``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import Field

from kernelab.service.contract.schemas.health import HealthReason
from kernelab.service.contract.schemas.probe_protocol import (
    Cell,
    Column,
    Figure,
    Flat,
    Panel,
    Pivot,
    Probe,
    TextSection,
    Thresholds,
    register,
    size_label,
    warmup_calls,
)
from kernelab.service.contract.schemas.probes import MAX_ALL_REDUCE_READINGS, MAX_RANKS, Rank
from kernelab.service.contract.schemas.types import AtDoor, ShortText, Size64, _Posted
from kernelab.service.contract.units import format_bytes


class AllReduceReading(_Posted):
    """One all-reduce size, timed as nccl-tests times it. busbw = algbw * 2(n-1)/n."""

    backend: ShortText
    world_size: Annotated[int, Field(ge=1), AtDoor(le=MAX_RANKS)]
    ranks: Annotated[list[Rank], AtDoor(max_length=MAX_RANKS)] = Field(
        default_factory=list, description="device indices in the group"
    )
    size_bytes: Size64
    time_us: float = Field(ge=0)
    algbw_gbps: float = Field(ge=0)
    busbw_gbps: float = Field(ge=0)
    correct: bool = True
    cuda_graph: bool = Field(default=False, description="timed as one CUDA-graph replay of the ops")
    timed_by: Literal["host-clock", "cuda-events"] = Field(
        default="host-clock",
        description="host clock around the ops + one sync (nccl-tests), or CUDA events behind a spin "
        "kernel (kernelab.runners.probes.all_reduce)",
    )


def group_label(ranks: Sequence[int], world_size: int) -> str:
    """``[0,1]`` for listed ranks, else ``x<world_size>``."""
    return f"[{','.join(map(str, ranks))}]" if ranks else f"x{world_size}"


def figures(readings: Sequence[AllReduceReading], t: Thresholds) -> list[Figure]:
    """The latency and busbw figures of the readings (module docstring), series by series in the
    order their first reading came."""
    series: dict[str, list[AllReduceReading]] = {}
    for a in readings:
        if a.world_size < 2:
            continue  # one rank moves no data: its "all-reduce" says nothing about the links
        if a.backend == "gloo":
            # gloo between processes of one CPU-only host (kernelab's CPU mode) times the host's
            # scheduler, not a link: on a loaded 2-core machine it swings 2x between probes.
            continue
        stem = f"all-reduce {group_label(a.ranks, a.world_size)} {size_label(a.size_bytes)}"
        stem += " graph" if a.cuda_graph else ""
        # A host-clock reading of NCCL (before 2026-11-30, or asked for) times torch's dispatch too
        # (kernelab.runners.probes.all_reduce): it gets its own band, never mixed with event-timed readings.
        stem += " host-clock" if a.timed_by == "host-clock" and not a.cuda_graph else ""
        series.setdefault(stem, []).append(a)
    out: list[Figure] = []
    for stem, calls in series.items():
        a = calls[0]
        warm = calls[warmup_calls([c.time_us for c in calls], t.cold_factor) :]
        time_us = statistics.median(c.time_us for c in warm)
        busbw = statistics.median(c.busbw_gbps for c in warm)
        n, cold = len(calls), len(calls) - len(warm)
        if a.size_bytes <= t.latency_max_bytes:
            out.append(
                Figure(f"{stem} time", time_us, "us", "lower", "latency", ranks=tuple(a.ranks), readings=n,
                       warmup=cold, limit_factor=t.latency_max_factor)
            )  # fmt: skip
        if a.size_bytes >= t.busbw_min_bytes:
            out.append(
                Figure(f"{stem} busbw", busbw, "GB/s", "higher", "busbw", ranks=tuple(a.ranks), readings=n,
                       warmup=cold, limit_factor=t.busbw_min_fraction)
            )  # fmt: skip
    return out


def instant(
    readings: Sequence[AllReduceReading],
    previous: Sequence[AllReduceReading] | None,
    phase: str,
    t: Thresholds,
) -> list[HealthReason]:
    """``all-reduce-wrong`` (``degraded-node``) for every reading whose sum was wrong."""
    out = []
    for a in readings:
        if not a.correct:
            group = group_label(a.ranks, a.world_size)
            out.append(
                HealthReason(
                    code="all-reduce-wrong",
                    flag="degraded-node",
                    figure=f"all-reduce {group} {size_label(a.size_bytes)}",
                    message=f"all-reduce over {group} of {size_label(a.size_bytes)} returned a wrong sum",
                )
            )
    return out


def summary(report: Any, readings: Sequence[AllReduceReading]) -> list[str]:
    """``all-reduce nccl x2: 8 B 8.9 µs, 1 MiB 20.1 µs WRONG`` per group, sizes ascending."""
    groups: dict[tuple[str, int, tuple[int, ...]], list[str]] = {}
    for r in sorted(readings, key=lambda r: r.size_bytes):
        key = (r.backend, r.world_size, tuple(r.ranks))
        mark = "" if r.correct else " WRONG"
        groups.setdefault(key, []).append(f"{format_bytes(r.size_bytes)} {r.time_us:.1f} µs{mark}")
    return [
        f"all-reduce {backend} x{world}: " + ", ".join(sizes) for (backend, world, _), sizes in groups.items()
    ]


def _title(report: Any, readings: Sequence[AllReduceReading]) -> str:
    first = readings[0]
    return f"all-reduce ({first.backend}, {first.world_size} ranks, float32 sum, timed by {first.timed_by})"


def _shown(keys: Sequence[tuple[Any, ...]]) -> set[tuple[Any, ...]]:
    """The smallest and largest message sizes start visible; the others hidden in the legend."""
    sizes = sorted({size for _, size in keys})
    return {k for k in keys if sizes and k[1] in (sizes[0], sizes[-1])}


PROBE = register(
    Probe(
        name="all_reduce",
        label="all-reduce",
        reading=AllReduceReading,
        units={"size_bytes": "B", "time_us": "us", "algbw_gbps": "GB/s", "busbw_gbps": "GB/s"},
        max_readings=MAX_ALL_REDUCE_READINGS,
        position=20,
        runner="kernelab.runners.probes.links:measure_links",
        generic_runner=False,
        figures=figures,
        instant=instant,
        text=TextSection(
            title=_title,
            columns=(
                Column(
                    "group",
                    lambda r: (
                        (",".join(map(str, r.ranks)) or f"x{r.world_size}")
                        + (" graph" if r.cuda_graph else "")
                    ),
                ),  # fmt: skip
                Column("size", lambda r: format_bytes(r.size_bytes)),
                Column("time us", lambda r: format(r.time_us, ".2f")),
                Column("algbw GB/s", lambda r: format(r.algbw_gbps, ".2f")),
                Column("busbw GB/s", lambda r: format(r.busbw_gbps, ".2f")),
                Column("correct", lambda r: "yes" if r.correct else "NO"),
            ),
        ),
        summary=summary,
        pivot=Pivot(
            table_id="probe-allreduce",
            caption="All-reduce: time per op (µs) / bus bandwidth (GB/s)",
            key=lambda r: (r.backend, r.world_size, r.size_bytes),
            label_headers=("group", "size"),
            labels=lambda r: (
                Cell(f"{r.backend} ×{r.world_size}", num=False, nowrap=True),
                Cell(format_bytes(r.size_bytes)),
            ),
            value_suffixes=(" µs", " busbw"),
            values=lambda r: (
                Cell(f"{r.time_us:.1f}", badge=None if r.correct else "wrong"),
                Cell(f"{r.busbw_gbps:.2f}"),
            ),
        ),
        panel=Panel(
            title="All-reduce time per op (µs)",
            trace=lambda r: (
                (r.world_size, r.size_bytes),
                f"all-reduce ×{r.world_size} {format_bytes(r.size_bytes)}",
            ),
            value=lambda r: r.time_us,
            hover="%{y:.1f} µs",
            log=True,
            shown=_shown,
            band=lambda b: "line" if b.unit == "us" else None,
        ),
        flat=lambda r: Flat(
            world_size=r.world_size,
            size_bytes=r.size_bytes,
            time_us=r.time_us,
            value_gbps=r.algbw_gbps,
            busbw_gbps=r.busbw_gbps,
        ),  # fmt: skip
    )
)
