"""Machine code of one kernel as data: instructions, classes, loops, resources, occupancy.

Pure functions over text and numbers (no subprocess, no triton): ``parse_nvdisasm_json`` and
``parse_hex_encodings`` read what ``nvdisasm -json -c`` and ``nvdisasm -c -hex`` print for a cubin,
``parse_ptx`` and ``parse_amdgcn`` read Triton's PTX and AMDGCN assembly. Each gives a list of
``Instruction``; ``instruction_mix``, ``innermost_loops`` and ``code_digest`` summarise it.

Loops are found from the control flow as compilers lay it out: a *backward* branch (target address
before the branch) closes a loop whose body is the contiguous range [target, branch]; a loop
is *innermost* when no other loop's range lies inside it. This is the natural-loop rule for
reducible, contiguously laid out loops, which is what ptxas and LLVM's AMDGPU back end emit for
Triton's ``for`` loops (software-pipelined loops included: the steady state is the loop).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Instruction classes of the static comparison (``kernelab static``); ``OTHER`` catches the rest
# (ALU, moves, ...).
MMA = "mma"
GLOBAL_LOAD = "global_load"
GLOBAL_STORE = "global_store"
SHARED_LOAD = "shared_load"
SHARED_STORE = "shared_store"
LOCAL = "local_spill"
COMPARE = "compare"
BRANCH = "branch_predicate"
BARRIER = "barrier"
CONVERT = "convert"
OTHER = "other"
CLASSES = (
    MMA,
    GLOBAL_LOAD,
    GLOBAL_STORE,
    SHARED_LOAD,
    SHARED_STORE,
    LOCAL,
    COMPARE,
    BRANCH,
    BARRIER,
    CONVERT,
    OTHER,
)

# SASS base opcodes (text before the first '.') per class, from NVIDIA's "CUDA Binary Utilities"
# instruction set reference (Hopper/Ampere/Blackwell tables). Async copies and TMA count as
# global loads/stores; atomics and reductions as global stores.
_SASS_CLASSES: dict[str, str] = {
    **dict.fromkeys(
        (
            "HMMA",
            "IMMA",
            "DMMA",
            "BMMA",
            "HGMMA",
            "IGMMA",
            "QGMMA",
            "BGMMA",
            "OMMA",
            "QMMA",
            "UTCHMMA",
            "UTCIMMA",
            "UTCQMMA",
            "UTCOMMA",
            "UTCMMA",
        ),
        MMA,
    ),
    **dict.fromkeys(("LDG", "LDGSTS", "UTMALDG", "UBLKCP", "UTMAPF", "LD", "CCTL"), GLOBAL_LOAD),
    **dict.fromkeys(
        ("STG", "UTMASTG", "UTMAREDG", "ATOM", "ATOMG", "RED", "REDG", "ST", "UBLKRED"), GLOBAL_STORE
    ),
    **dict.fromkeys(("LDS", "LDSM", "LDTM", "ATOMS"), SHARED_LOAD),
    **dict.fromkeys(("STS", "STSM", "STTM"), SHARED_STORE),
    **dict.fromkeys(("LDL", "STL"), LOCAL),
    **dict.fromkeys(("ISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "UISETP", "FCHK"), COMPARE),
    **dict.fromkeys(
        (
            "BRA",
            "BRX",
            "BRXU",
            "JMP",
            "JMX",
            "JMXU",
            "CALL",
            "RET",
            "EXIT",
            "BSSY",
            "BSYNC",
            "BREAK",
            "BPT",
            "KILL",
            "PLOP3",
            "UPLOP3",
            "P2R",
            "R2P",
            "VOTE",
            "VOTEU",
            "NANOSLEEP",
        ),
        BRANCH,
    ),
    **dict.fromkeys(
        (
            "BAR",
            "MEMBAR",
            "DEPBAR",
            "LDGDEPBAR",
            "ARRIVES",
            "SYNCS",
            "WARPGROUP",
            "WARPSYNC",
            "ERRBAR",
            "FENCE",
            "CGAERRBAR",
            "UCGABAR_ARV",
            "UCGABAR_WAIT",
            "ELECT",
        ),
        BARRIER,
    ),
    **dict.fromkeys(
        ("F2F", "F2I", "I2F", "I2I", "F2FP", "I2FP", "FRND", "F2IP", "UF2FP", "UI2F", "UF2I"), CONVERT
    ),
}


@dataclass(frozen=True)
class Instruction:
    """One machine instruction. ``offset`` is its byte offset in the function (index order for
    PTX/AMDGCN, where there are no addresses); ``target`` the branch target's offset or None."""

    offset: int
    opcode: str
    operands: str = ""
    predicate: str = ""
    target: int | None = None


@dataclass(frozen=True)
class Loop:
    """An innermost loop: instructions [start, end] (offsets, inclusive), closed by a backward branch."""

    start: int
    end: int
    instructions: tuple[Instruction, ...]


def classify(opcode: str, isa: str) -> str:
    """Instruction class of ``opcode`` (one of ``CLASSES``) for ``isa`` ``"sass"``, ``"ptx"`` or ``"amdgcn"``.

    SASS uses the table above; PTX follows the PTX ISA manual's instruction names (``mma``/``wgmma``,
    ``ld.global``/``cp.async``, ``ld.shared``, ``setp``, ``bra``, ``bar``/``barrier``/``mbarrier``,
    ``cvt``); AMDGCN follows the AMD ISA manuals' prefixes (``v_mfma``/``v_wmma``, ``global_load``/
    ``buffer_load``, ``ds_read``/``ds_write``, ``v_cmp``/``s_cmp``, ``s_cbranch``, ``s_barrier``,
    ``v_cvt``). Raises ``ValueError`` for an unknown ``isa``.
    """
    if isa == "sass":
        return _SASS_CLASSES.get(opcode.split(".", 1)[0], OTHER)
    if isa == "ptx":
        return _classify_ptx(opcode)
    if isa == "amdgcn":
        return _classify_amdgcn(opcode)
    raise ValueError(f"unknown ISA {isa!r}; known: sass, ptx, amdgcn")


def _classify_ptx(op: str) -> str:
    parts = op.split(".")
    base = parts[0]
    space = set(parts[1:])
    if base in ("mma", "wgmma", "tcgen05") or base.startswith("wmma"):
        return MMA
    if base in ("ld", "ldu", "cp", "prefetch") or base.startswith("cp"):
        if "shared" in space and base == "ld":
            return SHARED_LOAD
        if "local" in space:
            return LOCAL
        return GLOBAL_LOAD
    if base == "ldmatrix":
        return SHARED_LOAD
    if base in ("st", "atom", "red", "stmatrix"):
        if "shared" in space or base == "stmatrix":
            return SHARED_STORE
        if "local" in space:
            return LOCAL
        return GLOBAL_STORE
    if base in ("setp", "set", "slct", "selp"):
        return COMPARE if base in ("setp", "set") else OTHER
    if base in ("bra", "brx", "call", "ret", "exit", "vote", "trap"):
        return BRANCH
    if base in ("bar", "barrier", "mbarrier", "membar", "fence", "elect"):
        return BARRIER
    if base == "cvt":
        return CONVERT
    return OTHER


def _classify_amdgcn(op: str) -> str:
    if op.startswith(("v_mfma", "v_smfmac", "v_wmma", "v_swmmac")):
        return MMA
    if op.startswith(("global_load", "buffer_load", "flat_load", "s_load", "s_buffer_load")):
        return GLOBAL_LOAD
    if op.startswith(("global_store", "buffer_store", "flat_store", "global_atomic", "buffer_atomic")):
        return GLOBAL_STORE
    if op.startswith(("ds_read", "ds_load", "ds_bpermute", "ds_permute")):
        return SHARED_LOAD
    if op.startswith(("ds_write", "ds_store", "ds_add", "ds_max", "ds_min")):
        return SHARED_STORE
    if op.startswith(("scratch_load", "scratch_store")):
        return LOCAL
    if op.startswith(("v_cmp", "s_cmp", "v_cmpx")):
        return COMPARE
    if op.startswith(
        (
            "s_cbranch",
            "s_branch",
            "s_setpc",
            "s_swappc",
            "s_endpgm",
            "s_and_saveexec",
            "s_or_saveexec",
            "s_andn2_saveexec",
            "v_cndmask",
        )
    ):
        return BRANCH
    if op.startswith(("s_barrier", "s_waitcnt", "buffer_wbinvl1", "s_sleep")):
        return BARRIER
    if op.startswith("v_cvt"):
        return CONVERT
    return OTHER


# ---------------------------------------------------------------------------------------------------
# Parsers
# ---------------------------------------------------------------------------------------------------

_SASS_WORD = 16  # bytes per SASS instruction since Volta (sm_70): one 128-bit word


def parse_nvdisasm_json(text: str, function: str | None = None) -> dict[str, list[Instruction]]:
    """Instructions per function from ``nvdisasm -json -c`` output (nvdisasm >= 12.8 schema).

    Returns ``{function name: [Instruction]}``, or only ``function`` when given. Branch targets
    are nvdisasm's absolute hexadecimal operands of control-flow instructions. Raises
    ``ValueError`` when the text is not that JSON or ``function`` is absent.
    """
    try:
        doc = json.loads(text)
        functions = doc[1]
    except (json.JSONDecodeError, IndexError, KeyError, TypeError) as exc:
        raise ValueError(f"not nvdisasm -json output: {exc}") from exc
    out: dict[str, list[Instruction]] = {}
    for fn in functions:
        name = fn["function-name"]
        start = int(fn.get("start", 0))
        instrs = []
        for i, raw in enumerate(fn.get("sass-instructions", [])):
            operands = raw.get("operands", "")
            target = None
            if raw.get("other-attributes", {}).get("control-flow") == "True":
                m = re.fullmatch(r"0x([0-9a-fA-F]+)", operands.strip())
                if m:
                    target = int(m.group(1), 16) - start
            instrs.append(
                Instruction(
                    offset=i * _SASS_WORD,
                    opcode=raw["opcode"],
                    operands=operands,
                    predicate=raw.get("predicate", ""),
                    target=target,
                )
            )
        out[name] = instrs
    if function is not None:
        if function not in out:
            raise ValueError(f"function {function!r} not in the cubin; it has {sorted(out)}")
        return {function: out[function]}
    return out


_HEX_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/[^\n]*?/\* (0x[0-9a-f]{16}) \*/\s*\n\s*/\* (0x[0-9a-f]{16}) \*/")
_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)", re.MULTILINE)


def parse_hex_encodings(text: str) -> dict[str, list[bytes]]:
    """128-bit encodings per function from ``nvdisasm -c -hex`` (or ``cuobjdump -sass``) output.

    Each instruction prints as two 64-bit words (low word first, as the tools print them); the
    result is 16 bytes per instruction, little-endian per word.
    """
    out: dict[str, list[bytes]] = {}
    sections = list(_SECTION.finditer(text))
    for i, sec in enumerate(sections):
        end = sections[i + 1].start() if i + 1 < len(sections) else len(text)
        words = _HEX_LINE.findall(text, sec.end(), end)
        out[sec.group(1)] = [
            int(lo, 16).to_bytes(8, "little") + int(hi, 16).to_bytes(8, "little") for _, lo, hi in words
        ]
    return out


_PTX_LABEL = re.compile(r"^\s*(\$?[A-Za-z_.$][\w.$]*):\s*$")
_PTX_INSTR = re.compile(r"^\s*(@!?%\w+\s+)?([a-z][\w.:]*)\s*([^;]*);")


def parse_ptx(text: str, function: str | None = None) -> list[Instruction]:
    """Instructions of one ``.entry`` (the first, or ``function``) of PTX text; offsets are indices.

    Directives (``.reg``, ``.loc``, ...), comments and labels are not instructions; a ``bra`` to a
    label gets that label's instruction index as ``target``. Raises ``ValueError`` without an entry.
    """
    entries = list(re.finditer(r"\.entry\s+([\w$]+)", text))
    chosen = next((e for e in entries if function is None or e.group(1) == function), None)
    if chosen is None:
        raise ValueError(f"no .entry {function or ''} in the PTX".replace("  ", " "))
    body = text[text.index("{", chosen.end()) :]
    raw: list[tuple[str, str, str, str | None]] = []
    labels: dict[str, int] = {}
    for line in body.splitlines():
        line = line.split("//", 1)[0]
        if m := _PTX_LABEL.match(line):
            labels[m.group(1)] = len(raw)
            continue
        m = _PTX_INSTR.match(line)
        if not m or m.group(2).startswith("."):
            continue
        op, operands = m.group(2), m.group(3).strip()
        label = operands if op.startswith("bra") else None
        raw.append(((m.group(1) or "").strip(), op, operands, label))
        if line.strip() == "}":
            break
    return [
        Instruction(
            offset=i, opcode=op, operands=ops, predicate=pred, target=labels.get(label) if label else None
        )
        for i, (pred, op, ops, label) in enumerate(raw)
    ]


_AMD_LABEL = re.compile(r"^([.\w$]+):")
_AMD_INSTR = re.compile(r"^\s+([sv]_\w+|global_\w+|buffer_\w+|flat_\w+|ds_\w+|scratch_\w+)\b\s*([^;\n]*)")


def parse_amdgcn(text: str) -> list[Instruction]:
    """Instructions of AMDGCN assembly (Triton's ``asm["amdgcn"]``); offsets are indices.

    ``s_branch``/``s_cbranch_*`` to a label get that label's index as ``target``.
    """
    raw: list[tuple[str, str]] = []
    labels: dict[str, int] = {}
    for line in text.splitlines():
        if m := _AMD_LABEL.match(line):
            labels[m.group(1)] = len(raw)
            continue
        if m := _AMD_INSTR.match(line):
            raw.append((m.group(1), m.group(2).split(";", 1)[0].strip()))
    out = []
    for i, (op, operands) in enumerate(raw):
        target = labels.get(operands.split(",")[-1].strip()) if "branch" in op else None
        out.append(Instruction(offset=i, opcode=op, operands=operands, target=target))
    return out


# ---------------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------------


def instruction_mix(instrs: Iterable[Instruction], isa: str) -> tuple[dict[str, int], dict[str, int]]:
    """``(by class, by opcode)`` counts; every class key is present (zeros included), opcodes sorted."""
    by_opcode = Counter(i.opcode for i in instrs)
    by_class = dict.fromkeys(CLASSES, 0)
    for op, n in by_opcode.items():
        by_class[classify(op, isa)] += n
    return by_class, dict(sorted(by_opcode.items()))


def innermost_loops(instrs: Sequence[Instruction]) -> list[Loop]:
    """Innermost loops of ``instrs`` in address order (module docstring for the rule)."""
    # A branch to itself is no loop: ptxas ends every function with ``.L_x_N: BRA .L_x_N`` after EXIT.
    spans = sorted({(i.target, i.offset) for i in instrs if i.target is not None and i.target < i.offset})
    inner = [
        (s, e) for s, e in spans if not any((s2, e2) != (s, e) and s <= s2 and e2 <= e for s2, e2 in spans)
    ]
    return [Loop(s, e, tuple(i for i in instrs if s <= i.offset <= e)) for s, e in inner]


def region_of(offset: int, loops: Sequence[Loop]) -> str:
    """``"loop"``, ``"prologue"`` (before the first loop), ``"epilogue"`` (after the last), ``"between"``
    loops, or ``"body"`` when there is no loop."""
    if not loops:
        return "body"
    if any(lp.start <= offset <= lp.end for lp in loops):
        return "loop"
    if offset < loops[0].start:
        return "prologue"
    if offset > loops[-1].end:
        return "epilogue"
    return "between"


def code_digest(encodings: Sequence[bytes] | None, instrs: Sequence[Instruction]) -> str:
    """SHA-256 of the machine code: the instruction encodings when known (SASS: every byte of the
    function's code, which holds neither its name nor absolute addresses: branches are relative),
    else the instruction text with branch targets as instruction-relative distances and labels
    dropped (PTX/AMDGCN). Equal digests mean equal code."""
    h = hashlib.sha256()
    if encodings:
        for word in encodings:
            h.update(word)
        return h.hexdigest()
    for i in instrs:
        operands = i.operands if i.target is None else f"->{i.target - i.offset:+d}"
        if i.target is not None and "," in i.operands:
            operands = i.operands.rsplit(",", 1)[0] + "," + operands
        h.update(f"{i.predicate} {i.opcode} {operands}\n".encode())
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------------
# Resources and occupancy
# ---------------------------------------------------------------------------------------------------

_RESOURCE_LINE = re.compile(r"Function\s+([\w$.]+):\s*\n\s*(REG:.*)")


def parse_resource_usage(text: str) -> dict[str, dict[str, int]]:
    """``cuobjdump --dump-resource-usage`` output → ``{function: {"REG": n, "STACK": bytes, "SHARED":
    bytes, "LOCAL": bytes, ...}}`` (``CONSTANT[0]`` becomes ``CONSTANT0``)."""
    out: dict[str, dict[str, int]] = {}
    for m in _RESOURCE_LINE.finditer(text):
        fields = dict(re.findall(r"([A-Z]+(?:\[\d+\])?):(\d+)", m.group(2)))
        out[m.group(1)] = {k.replace("[", "").replace("]", ""): int(v) for k, v in fields.items()}
    return out


@dataclass(frozen=True)
class SmLimits:
    """Per-SM limits of one compute capability (CUDA C++ Programming Guide, "Compute Capabilities",
    Table "Technical Specifications per Compute Capability"; allocation granularities from the CUDA
    Occupancy Calculator: registers per warp in units of 256, shared memory in 128-byte units plus
    1 KiB reserved per block since sm_80)."""

    max_warps: int
    max_blocks: int
    registers: int
    shared_bytes: int
    reg_unit: int = 256
    smem_unit: int = 128
    smem_reserved: int = 1024


SM_LIMITS: dict[int, SmLimits] = {
    80: SmLimits(max_warps=64, max_blocks=32, registers=65536, shared_bytes=167936),  # A100: 164 KiB
    86: SmLimits(max_warps=48, max_blocks=16, registers=65536, shared_bytes=102400),  # 100 KiB
    89: SmLimits(max_warps=48, max_blocks=24, registers=65536, shared_bytes=102400),  # 100 KiB
    90: SmLimits(max_warps=64, max_blocks=32, registers=65536, shared_bytes=233472),  # H100/H200: 228 KiB
    100: SmLimits(max_warps=64, max_blocks=32, registers=65536, shared_bytes=233472),  # B200: 228 KiB
    120: SmLimits(max_warps=48, max_blocks=32, registers=65536, shared_bytes=102400),  # 100 KiB
}


def occupancy(
    capability: int, *, registers: int, num_warps: int, shared_bytes: int
) -> tuple[int, float] | None:
    """Resident blocks per SM and occupancy (resident warps / max warps, 0..1), or None for an
    unknown ``capability`` (e.g. 90 for sm_90a). ``registers`` per thread, ``shared_bytes`` per block
    (static + dynamic). The minimum over the register, shared-memory, warp and block limits, as the
    CUDA Occupancy Calculator computes it."""
    lim = SM_LIMITS.get(capability)
    if lim is None or num_warps <= 0:
        return None
    regs_per_warp = math.ceil(max(registers, 1) * 32 / lim.reg_unit) * lim.reg_unit
    by_regs = (lim.registers // regs_per_warp) // num_warps
    smem = math.ceil((shared_bytes + lim.smem_reserved) / lim.smem_unit) * lim.smem_unit
    by_smem = lim.shared_bytes // smem
    blocks = min(by_regs, by_smem, lim.max_warps // num_warps, lim.max_blocks)
    return blocks, blocks * num_warps / lim.max_warps
