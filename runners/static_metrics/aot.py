"""Ahead-of-time compilation for a named GPU, with or without that GPU: the child process side.

Run as ``python -m kernelab.runners.static_metrics.aot`` with a JSON request on stdin (see
``kernelab.runners.static_metrics.compile_kernels``; ``revision``, when given, names the source
revision whose benchmark the items name); it prints one JSON answer on stdout. It must start
without ``TRITON_INTERPRET`` (the parent removes it): ``triton.jit`` fixes compiled vs interpreted
mode at import (``kernelab.kernels._device``).

How: Triton's ``JITFunction.run(..., warmup=True)`` specialises the arguments, compiles and
returns without launching. It asks the *active driver* for the device, stream and target only, so
an ``_AotDriver`` that answers with the requested ``GPUTarget`` (e.g. ``cuda``/90/32 for
``sm_90a``) compiles for that GPU on any machine, through the same specialisation (divisibility by
16, pointer alignment) and the same pipeline (ttir → ttgir → llir → ptx → cubin with the bundled
``ptxas``) as a GPU runner. Inputs are ``meta`` tensors (shapes, dtypes, no memory; their address
0 is 16-byte aligned like any CUDA allocation). Every compiled kernel is caught by
``knobs.runtime.jit_post_compile_hook``; JIT caches are emptied between items so a kernel shared
by both sides is recompiled (from Triton's disk cache) and seen on both.

A cubin is analysed with the ``nvdisasm`` and ``cuobjdump`` Triton ships in its NVIDIA backend:
``nvdisasm -json -c`` (instructions, branch targets), ``nvdisasm -c -hex`` (encodings for the
identity digest) and ``cuobjdump --dump-resource-usage`` (registers, stack, static shared memory).
Without those tools the PTX is analysed instead (no registers, no spills).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any, Literal

from kernelab.kernels import get_benchmark
from kernelab.runners.revision_benchmark import load_benchmark, revision_reference
from kernelab.runners.static_metrics import isa
from kernelab.runners.static_metrics.target import parse_target
from kernelab.service.contract.schemas import KernelLoopStats, KernelStatic

_TOOL_TIMEOUT_S = 120.0  # one nvdisasm/cuobjdump call on a large cubin takes about a second


def _run_tool(args: list[str]) -> str:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=_TOOL_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{Path(args[0]).name} failed ({proc.returncode}): {proc.stderr.strip()[:500]}")
    return proc.stdout


def _tools() -> tuple[str, str] | None:
    from triton import knobs  # heavy, optional: triton (imported only once ``main`` set its mode)

    try:
        nvdisasm, cuobjdump = knobs.nvidia.nvdisasm.path, knobs.nvidia.cuobjdump.path
    except (RuntimeError, FileNotFoundError):
        return None
    return (nvdisasm, cuobjdump) if os.path.exists(nvdisasm) and os.path.exists(cuobjdump) else None


def analyze(kernel: Any, target: str) -> dict[str, Any]:
    """Metrics of one Triton ``CompiledKernel`` for ``target``: ``{"static": KernelStatic as JSON,
    "sequence": [[offset, opcode], ...], "loops": [[start, end], ...]}``.

    Raises ``RuntimeError`` when a tool fails.
    """
    md = kernel.metadata
    name = md.name
    capability = parse_target(target)[1]
    tools = _tools()
    resources: dict[str, int] = {}
    encodings: list[bytes] | None = None
    if "cubin" in kernel.asm and tools is not None:
        nvdisasm, cuobjdump = tools
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, f"{name}.cubin")
            Path(path).write_bytes(kernel.asm["cubin"])
            instrs = isa.parse_nvdisasm_json(_run_tool([nvdisasm, "-json", "-c", path]), name)[name]
            encodings = isa.parse_hex_encodings(_run_tool([nvdisasm, "-c", "-hex", path])).get(name)
            resources = isa.parse_resource_usage(_run_tool([cuobjdump, "--dump-resource-usage", path])).get(
                name, {}
            )
        kind: Literal["sass", "ptx"] = "sass"
    else:
        instrs = isa.parse_ptx(kernel.asm["ptx"], name)
        kind = "ptx"
    by_class, by_opcode = isa.instruction_mix(instrs, kind)
    loops = isa.innermost_loops(instrs)
    shared = (getattr(md, "shared", 0) or 0) + resources.get("SHARED", 0)
    registers = resources.get("REG")
    occ = None
    if registers is not None:
        occ = isa.occupancy(capability, registers=registers, num_warps=md.num_warps, shared_bytes=shared)
    static = KernelStatic(
        name=name,
        isa=kind,
        target=target,
        num_warps=md.num_warps,
        num_stages=getattr(md, "num_stages", None),
        registers=registers,
        spill_stores=by_opcode.get("STL", 0) + sum(n for op, n in by_opcode.items() if op.startswith("STL."))
        if kind == "sass"
        else None,
        spill_loads=by_opcode.get("LDL", 0) + sum(n for op, n in by_opcode.items() if op.startswith("LDL."))
        if kind == "sass"
        else None,
        stack_bytes=resources.get("STACK"),
        shared_bytes=shared,
        occupancy_blocks_per_sm=occ[0] if occ else None,
        occupancy_pct=round(occ[1] * 100, 2) if occ else None,
        instructions=len(instrs),
        predicated=sum(1 for i in instrs if i.predicate),
        by_class=by_class,
        by_opcode=by_opcode,
        loops=[
            KernelLoopStats(
                start_offset=lp.start,
                end_offset=lp.end,
                instructions=len(lp.instructions),
                by_class=isa.instruction_mix(lp.instructions, kind)[0],
            )
            for lp in loops
        ],
        code_sha256=isa.code_digest(encodings, instrs),
    )
    return {
        "static": static.model_dump(mode="json"),
        "sequence": [[i.offset, i.opcode] for i in instrs],
        "loops": [[lp.start, lp.end] for lp in loops],
    }


def _install_driver(target: str) -> None:
    # heavy: torch and triton, imported only after ``main`` dropped TRITON_INTERPRET (triton fixes
    # compiled vs interpreted mode at its import)
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.backends.driver import DriverBase
    from triton.runtime.driver import driver

    backend, arch, warp = parse_target(target)

    class _AotDriver(DriverBase):  # type: ignore[misc]
        """Answers Triton's device/stream/target questions for a GPU that need not be here."""

        @classmethod
        def is_active(cls) -> bool:
            return False

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise NotImplementedError("ahead-of-time compilation never launches")

        def get_current_target(self) -> Any:
            return GPUTarget(backend, arch, warp)

        def get_active_torch_device(self) -> Any:
            return torch.device("meta")

        def get_benchmarker(self) -> Any:
            raise NotImplementedError("ahead-of-time compilation never launches")

        def get_current_device(self) -> int:
            return 0

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            return None

    driver.set_active(_AotDriver())


def _to_meta(value: Any) -> Any:
    import torch  # heavy: after ``main`` set triton's mode (module docstring)

    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, dict):
        return {k: _to_meta(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_meta(v) for v in value)
    return value


def _arg(value: Any) -> Any:
    """A JSON argument: ``{"tensor": [shape], "dtype": "float16"}`` → meta tensor; else as is."""
    import torch  # heavy: after ``main`` set triton's mode (module docstring)

    if isinstance(value, dict) and "tensor" in value:
        from kernelab.kernels._device import torch_dtype  # heavy: imports torch and triton

        return torch.empty(
            tuple(value["tensor"]), dtype=torch_dtype(value.get("dtype", "float32")), device="meta"
        )
    return value


def _use_revision(revision: dict[str, Any]) -> str | None:
    """Put a source revision's ``site`` then ``path`` first on ``sys.path`` (the request's
    ``revision``, as ``kernelab.runners.revision_worker`` does); its checkout path or None."""
    for entry in (revision.get("site"), revision.get("path")):  # path ends up first
        if entry:
            sys.path.insert(0, entry)
    path = revision.get("path")
    return str(path) if path else None


def _benchmark(ref: str, revision_path: str | None) -> Any:
    """The benchmark ``ref`` names: the installed one, or the revision's at ``revision_path``
    (``kernelab.runners.revision_benchmark.revision_reference``: a built-in name on a kernelab
    revision is that revision's)."""
    if revision_path is None:
        return get_benchmark(ref)
    return load_benchmark(revision_reference(ref, Path(revision_path)))


def _run_item(item: dict[str, Any], revision_path: str | None = None) -> None:
    """Compile what one request item names (kernels are caught by the hook)."""
    import torch  # heavy: after ``main`` set triton's mode (module docstring)

    if "kernel" in item:
        module, _, attr = item["kernel"].partition(":")
        fn = getattr(importlib.import_module(module), attr)
        args = [_arg(a) for a in item.get("args", [])]
        fn.warmup(*args, grid=(1,), **item.get("kwargs", {}))
        return
    bench = _benchmark(item["benchmark"], revision_path)
    params = bench.parse_params(item["params"])
    inputs = _to_meta(bench.make_inputs(params, torch.device("cpu"), int(item.get("seed", 0))))
    bench.prepare(item["variant"], params, inputs)


def main() -> int:
    """Read the request from stdin, compile and analyse every item, print the answer as JSON."""
    request = json.load(sys.stdin)
    target = request["target"]
    parse_target(target)
    os.environ.pop("TRITON_INTERPRET", None)
    revision_path = _use_revision(request.get("revision") or {})
    _install_driver(target)
    import triton  # heavy: only now, without TRITON_INTERPRET and with the driver installed

    caught: list[tuple[Any, Any]] = []
    seen_functions: list[Any] = []

    def hook(
        *, key: Any, repr: str, fn: Any, compile: Any, is_manual_warmup: bool, already_compiled: bool
    ) -> None:
        caught.append((fn.jit_function, key))
        if fn.jit_function not in seen_functions:
            seen_functions.append(fn.jit_function)

    triton.knobs.runtime.jit_post_compile_hook = hook
    answer: dict[str, Any] = {}
    for item in request["items"]:
        for jf in seen_functions:  # recompile (disk cache) so each item sees all its kernels
            jf.device_caches.clear()
        caught.clear()
        try:
            with contextlib.redirect_stdout(sys.stderr):  # ptxas failures print to stdout
                _run_item(item, revision_path)
            kernels = [jf.device_caches[0][0][key] for jf, key in caught]
            answer[item["key"]] = {"kernels": [analyze(k, target) for k in kernels], "error": None}
        except Exception as exc:  # one item's failure is reported, the others go on
            lines = str(exc).strip().splitlines()
            answer[item["key"]] = {
                "kernels": [],
                "error": f"{type(exc).__name__}: {lines[0] if lines else ''}",
                "traceback": traceback.format_exc()[-4000:],
            }
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
