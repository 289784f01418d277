"""Plain-text rendering of a probe report (``kernelab probe``, ``kernelab up``)."""

from __future__ import annotations

from collections.abc import Sequence

from kernelab.service.contract.schemas import HealthReason, NodeInfo, ProbeReport
from kernelab.service.contract.schemas.probe_protocol import probes_with
from kernelab.service.contract.units import format_bytes


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
    """A readable plain-text report: node, then each registered probe's section in report order
    (its ``text``: ``kernelab.service.contract.schemas.probe_protocol.TextSection``; today copy bandwidth,
    all-reduce, NVML telemetry, peer copy), notes, errors.

    Bandwidths in GB/s (1e9 B/s), times in microseconds, sizes in binary units; a missing reading
    shows ``-``. Sections with no readings are omitted (but for a title shown even then, as NVML's
    status); errors are always listed last.
    """
    taken = report.taken_at.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    out = [f"probe ({report.phase})  {taken}  took {report.wall_s:.2f} s", *_node_lines(node)]
    for probe in probes_with("text"):
        section = probe.text
        readings = probe.readings(report)
        if section is None or not (readings or section.show_empty):
            continue
        out += ["", section.title(report, readings)]
        if readings:
            out += _table(
                [c.header for c in section.columns], [[c.cell(r) for c in section.columns] for r in readings]
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
