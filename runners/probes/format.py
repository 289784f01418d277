"""Plain-text rendering of a probe report (``kernelab probe``, ``kernelab up``)."""

from __future__ import annotations

from collections.abc import Sequence

from kernelab.service.schemas import HealthReason, NodeInfo, ProbeReport
from kernelab.service.units import format_bytes


def _num(value: float | int | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Right-aligned columns except the first, separated by two spaces."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        first = str(cells[0]).ljust(widths[0])
        rest = (str(c).rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _node_lines(node: NodeInfo) -> list[str]:
    device = f"{node.device_type} x{node.device_count}  {node.device_name}".rstrip()
    software = (
        f"torch {node.torch_version or '-'}  triton {node.triton_version or '-'}"
        f"  python {node.python_version or '-'}"
    )
    if node.cuda_version:
        software += f"  cuda {node.cuda_version}"
    if node.driver_version:
        software += f"  driver {node.driver_version}"
    lines = [
        f"node      {node.hostname}",
        f"device    {device}",
        f"L2        {format_bytes(node.l2_bytes)}",
        f"software  {software}",
    ]
    if node.triton_interpret:
        lines.append("          TRITON_INTERPRET=1 (Triton kernels run in the interpreter)")
    return lines


def format_probe_report(report: ProbeReport, node: NodeInfo) -> str:
    """A readable plain-text report: node, copy bandwidth, all-reduce, telemetry, errors.

    Bandwidths in GB/s (1e9 B/s), times in microseconds, sizes in binary units; a missing reading
    shows ``-``. Sections with no readings are omitted; errors are always listed last.
    """
    taken = report.taken_at.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    out = [f"probe ({report.phase})  {taken}  took {report.wall_s:.2f} s", *_node_lines(node)]
    if report.copy_bandwidth:
        out += ["", "copy bandwidth (bytes read + written)"]
        out += _table(
            ["device", "size", "time us", "GB/s"],
            [
                [str(r.device_index), format_bytes(r.size_bytes), _num(r.time_us), _num(r.bandwidth_gbps)]
                for r in report.copy_bandwidth
            ],
        )
    if report.all_reduce:
        first = report.all_reduce[0]
        out += [
            "",
            f"all-reduce ({first.backend}, {first.world_size} ranks, float32 sum, timed by {first.timed_by})",
        ]
        out += _table(
            ["group", "size", "time us", "algbw GB/s", "busbw GB/s", "correct"],
            [
                [
                    (",".join(map(str, r.ranks)) or f"x{r.world_size}") + (" graph" if r.cuda_graph else ""),
                    format_bytes(r.size_bytes),
                    _num(r.time_us, ".2f"),
                    _num(r.algbw_gbps, ".2f"),
                    _num(r.busbw_gbps, ".2f"),
                    "yes" if r.correct else "NO",
                ]
                for r in report.all_reduce
            ],
        )
    out += ["", f"nvml: {report.nvml_status}"]
    if report.telemetry:
        out += _table(
            [
                "gpu",
                "sm MHz",
                "max MHz",
                "temp C",
                "mem C",
                "power W",
                "limit W",
                "util %",
                "mem used",
                "ecc",
                "reasons",
                "others",
            ],
            [
                [
                    str(t.device_index),
                    _num(t.sm_clock_mhz, ".0f"),
                    _num(t.max_sm_clock_mhz, ".0f"),
                    _num(t.temperature_c, ".0f"),
                    _num(t.memory_temperature_c, ".0f"),
                    _num(t.power_w),
                    _num(t.power_limit_w, ".0f"),
                    _num(t.utilization_pct, ".0f"),
                    format_bytes(t.memory_used_bytes),
                    _num(t.ecc_volatile_uncorrected, "d"),
                    ",".join(t.clock_event_reason_names) or "-",
                    str(sum(1 for p in t.other_processes if not p.get("own"))),
                ]
                for t in report.telemetry
            ],
        )
    if report.peer_copy:
        out += ["", "peer copy (bytes copied once)"]
        out += _table(
            ["src", "dst", "peer access", "size", "time us", "GB/s"],
            [
                [
                    str(r.src_device),
                    str(r.dst_device),
                    "yes" if r.peer_access else "no",
                    format_bytes(r.size_bytes),
                    _num(r.time_us),
                    _num(r.bandwidth_gbps),
                ]
                for r in report.peer_copy
            ],
        )
    out += [f"note: {n}" for n in report.notes]
    if report.errors:
        out += ["", "errors"]
        out += [f"  {name}: {text}" for name, text in sorted(report.errors.items())]
    return "\n".join(out) + "\n"


def format_verdict(reasons: Sequence[HealthReason], source: str) -> str:
    """``verdict: healthy|degraded|contended (judged by <source>)`` and one line per reason."""
    status = (
        "degraded"
        if any(r.flag == "degraded-node" for r in reasons)
        else ("contended" if reasons else "healthy")
    )
    lines = [f"verdict: {status} (judged by {source})", *(f"  {r.flag}: {r.message}" for r in reasons)]
    return "\n".join(lines) + "\n"
