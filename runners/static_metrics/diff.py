"""Baseline vs candidate: per-kernel deltas, the instructions added or removed, and a verdict.

A kernel's code is *identical* when its ``code_sha256`` (the instruction encodings, which hold
neither symbol names nor absolute addresses) is equal on both sides. Otherwise the opcode sequences
are aligned with ``difflib.SequenceMatcher`` (opcodes only: register numbers change wholesale when
one instruction is added) and the inserted/deleted opcodes are counted per code region, so a
change reads "+2 ISETP.GE.AND in the epilogue".
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from kernelab.runners.static_metrics.isa import Loop, region_of
from kernelab.service.contract.schemas import KernelDiff, KernelStatic, StaticChange, StaticComparison

_MAX_CHANGES = 40  # change rows kept per kernel: a rewrite is summarised by its deltas instead
_RESOURCES = (
    "registers",
    "spill_stores",
    "spill_loads",
    "stack_bytes",
    "shared_bytes",
    "occupancy_pct",
    "instructions",
    "predicated",
)


@dataclass(frozen=True)
class KernelCode:
    """One compiled kernel: its metrics and the (offset, opcode) sequence and loops they came from."""

    static: KernelStatic
    sequence: tuple[tuple[int, str], ...]
    loops: tuple[Loop, ...] = ()


def _delta(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    keys = sorted(set(a) | set(b))
    return {k: b.get(k, 0) - a.get(k, 0) for k in keys if b.get(k, 0) != a.get(k, 0)}


def _changes(base: KernelCode, cand: KernelCode) -> list[StaticChange]:
    """Opcodes inserted in the candidate (``+``, region in the candidate's code) and deleted from
    the baseline (``-``, region in the baseline's code), net per (opcode, region)."""
    # NOPs are alignment padding after EXIT (to 128 bytes): they move with any change, so they stay
    # in the histogram but not in the change list.
    seq_a = [(off, op) for off, op in base.sequence if op != "NOP"]
    seq_b = [(off, op) for off, op in cand.sequence if op != "NOP"]
    matcher = difflib.SequenceMatcher(a=[op for _, op in seq_a], b=[op for _, op in seq_b], autojunk=False)
    counts: Counter[tuple[str, str, str]] = Counter()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            for off, op in seq_a[i1:i2]:
                counts["-", op, region_of(off, base.loops)] += 1
        if tag in ("insert", "replace"):
            for off, op in seq_b[j1:j2]:
                counts["+", op, region_of(off, cand.loops)] += 1
    # Within a region, an opcode both removed and inserted (a reordered block) counts only its net.
    net: Counter[tuple[str, str]] = Counter()
    for (sign, op, region), n in counts.items():
        net[op, region] += n if sign == "+" else -n
    rows = [
        StaticChange(sign="+" if n > 0 else "-", opcode=op, count=abs(n), region=r)
        for (op, r), n in net.items()
        if n
    ]
    rows.sort(key=lambda c: (-c.count, c.sign, c.opcode, c.region))
    return rows[:_MAX_CHANGES]


def _fmt_pair(label: str, a: float | None, b: float | None) -> str:
    if a == b:
        return f"same {label} ({a:g})" if a is not None else ""
    return f"{label} {a if a is not None else 'n/a'} → {b if b is not None else 'n/a'}"


def summarize(diff: KernelDiff) -> str:
    """One line in the words of the seeds: ``IDENTICAL ISA (1767 instructions both)`` or
    ``+2 ISETP.GE.AND in the epilogue; same registers (40); no spills; loop body 242 → 203``."""
    b, c = diff.baseline, diff.candidate
    if b is None or c is None:
        only = c if b is None else b
        assert only is not None
        return f"only in the {'candidate' if b is None else 'baseline'} ({only.instructions} instructions)"
    if diff.verdict == "identical":
        return f"IDENTICAL ISA ({b.instructions} instructions both)"
    parts = [f"{ch.sign}{ch.count} {ch.opcode} in the {ch.region}" for ch in diff.changes[:4]]
    if len(diff.changes) > 4:
        parts.append(f"{len(diff.changes) - 4} more changes")
    parts.append(f"instructions {b.instructions} → {c.instructions}")
    parts.append(_fmt_pair("registers", b.registers, c.registers))
    spills = [b.spill_stores, b.spill_loads, c.spill_stores, c.spill_loads]
    if all(s == 0 for s in spills):
        parts.append("no spills")
    elif any(s is not None for s in spills):
        parts.append(f"spill st/ld {b.spill_stores}/{b.spill_loads} → {c.spill_stores}/{c.spill_loads}")
    for i, (lb, lc) in enumerate(zip(b.loops, c.loops, strict=False)):
        name = "loop body" if len(b.loops) == 1 else f"loop {i + 1} body"
        parts.append(_fmt_pair(name, lb.instructions, lc.instructions))
    if len(b.loops) != len(c.loops):
        parts.append(f"innermost loops {len(b.loops)} → {len(c.loops)}")
    return "; ".join(p for p in parts if p)


def diff_kernel(base: KernelCode | None, cand: KernelCode | None) -> KernelDiff:
    """Compare one kernel's two compilations (either may be None: the kernel exists on one side)."""
    if base is None and cand is None:
        raise ValueError("diff_kernel needs at least one side")
    name = (base or cand).static.name  # type: ignore[union-attr]
    if base is None or cand is None:
        d = KernelDiff(
            name=name,
            verdict="only-candidate" if base is None else "only-baseline",
            baseline=base.static if base else None,
            candidate=cand.static if cand else None,
        )
        d.summary = summarize(d)
        return d
    b, c = base.static, cand.static
    identical = bool(b.code_sha256) and b.code_sha256 == c.code_sha256
    resource_delta: dict[str, float] = {}
    for key in _RESOURCES:
        vb, vc = getattr(b, key), getattr(c, key)
        if vb is not None and vc is not None and vb != vc:
            resource_delta[key] = vc - vb
    for i, (lb, lc) in enumerate(zip(b.loops, c.loops, strict=False)):
        if lb.instructions != lc.instructions:
            resource_delta[f"loop{i + 1}_instructions"] = lc.instructions - lb.instructions
    d = KernelDiff(
        name=name,
        verdict="identical" if identical else "different",
        baseline=b,
        candidate=c,
        class_delta=_delta(b.by_class, c.by_class),
        opcode_delta=_delta(b.by_opcode, c.by_opcode),
        resource_delta=resource_delta,
        changes=[] if identical else _changes(base, cand),
    )
    d.summary = summarize(d)
    return d


def _pair(
    base: Sequence[KernelCode], cand: Sequence[KernelCode]
) -> list[tuple[KernelCode | None, KernelCode | None]]:
    """Pair kernels by name, then by order among kernels of one name; unmatched ones stand alone."""
    pairs: list[tuple[KernelCode | None, KernelCode | None]] = []
    names = list(dict.fromkeys([k.static.name for k in base] + [k.static.name for k in cand]))
    for name in names:
        kb = [k for k in base if k.static.name == name]
        kc = [k for k in cand if k.static.name == name]
        for i in range(max(len(kb), len(kc))):
            pairs.append((kb[i] if i < len(kb) else None, kc[i] if i < len(kc) else None))
    return pairs


def compare(base: Sequence[KernelCode], cand: Sequence[KernelCode], *, target: str) -> StaticComparison:
    """Static comparison of a cell: ``identical`` when every kernel pairs up with equal code (a cell
    without compiled kernels on either side has no verdict)."""
    kernels = [diff_kernel(b, c) for b, c in _pair(base, cand)]
    verdict = None
    if kernels:
        verdict = "identical" if all(k.verdict == "identical" for k in kernels) else "different"
    return StaticComparison(target=target, verdict=verdict, kernels=kernels)  # type: ignore[arg-type]
