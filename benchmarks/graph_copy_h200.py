"""Why does a large ``y.copy_(x)`` read slower under CUDA-graph replay than eagerly? (GPU only)

For each size: the node types a captured ``copy_`` becomes (``cudaGraphGetNodes`` +
``cudaGraphNodeGetType``: 0 kernel, 1 memcpy, 2 memset, ...; CUDA runtime API, Graph Management),
the device activities the torch profiler sees for one eager call and one replay (their names
tell a copy-engine ``Memcpy DtoD`` from an SM kernel), and the median time per call of:

* ``eager``: CUDA events around one eager ``copy_`` (L2 not flushed: every size is ≫ L2);
* ``graph``: CUDA events around one replay of a graph of one ``copy_``;
* ``graph-sm``: one replay of a graph of ``torch.add(x, 0, out=y)`` (an SM kernel, same bytes);
* ``triton``: one replay of a graph of a Triton copy kernel (where Triton is present).

Usage: ``python benchmarks/graph_copy_h200.py OUT_DIR``; prints a table, writes ``graph_copy.json``.
"""

from __future__ import annotations

import ctypes
import json
import statistics
import sys
from pathlib import Path

import torch

from kernelab.runners.timing import _new_graph, cuda_runtime

MiB = 1 << 20
SIZES = [
    64 * MiB,
    256 * MiB,
    264 * MiB,
    276_488_516,
    276_488_516 + 4,
    288 * MiB,
    384 * MiB,
    512 * MiB,
    1024 * MiB,
]
REPS = 30


def node_types(graph: torch.cuda.CUDAGraph) -> list[int]:
    lib = cuda_runtime()
    handle = ctypes.c_void_p(int(graph.raw_cuda_graph()))
    count = ctypes.c_size_t(0)
    assert lib.cudaGraphGetNodes(handle, None, ctypes.byref(count)) == 0
    nodes = (ctypes.c_void_p * count.value)()
    assert lib.cudaGraphGetNodes(handle, nodes, ctypes.byref(count)) == 0
    types = []
    for node in nodes:
        kind = ctypes.c_int(-1)
        assert lib.cudaGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind)) == 0
        types.append(kind.value)
    return types


def capture(fn) -> torch.cuda.CUDAGraph:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = _new_graph()
    with torch.cuda.graph(graph, stream=stream):
        fn()
    torch.cuda.synchronize()
    return graph


def median_us(call) -> float:
    times = []
    for _ in range(REPS):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        call()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def activities(call) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sorted({e.name for e in prof.events() if e.device_type.name == "CUDA"})


def triton_copy():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def _copy(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)

    def run(x: torch.Tensor, y: torch.Tensor) -> None:
        n = x.numel()
        _copy[(triton.cdiv(n, 4096),)](x, y, n, BLOCK=4096)

    return run


def measure_size(nbytes: int, tri) -> dict:
    """One row of the table for a copy of ``nbytes`` bytes (uint8 tensors on the current GPU)."""
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    y = torch.empty_like(x)
    g_copy = capture(lambda: y.copy_(x))
    g_sm = capture(lambda: torch.add(x, 0, out=y))
    row = {
        "bytes": nbytes,
        "copy_nodes": node_types(g_copy),
        "sm_nodes": node_types(g_sm),
        "eager_us": median_us(lambda: y.copy_(x)),
        "graph_us": median_us(g_copy.replay),
        "graph_sm_us": median_us(g_sm.replay),
        "eager_activities": activities(lambda: y.copy_(x)),
        "graph_activities": activities(g_copy.replay),
    }
    if tri is not None:
        g_tri = capture(lambda: tri(x, y))
        row["triton_us"] = median_us(g_tri.replay)
    assert torch.equal(x, y)
    return row


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tri = triton_copy()
    rows = []
    for nbytes in SIZES:
        rows.append(measure_size(nbytes, tri))
        torch.cuda.empty_cache()
    (out / "graph_copy.json").write_text(json.dumps(rows, indent=1))
    head = ("bytes", "nodes", "eager us", "graph us", "ratio", "graph-sm", "triton")
    print(" ".join(f"{h:>13}" for h in head))
    for r in rows:
        cols = [
            f"{r['bytes']:,}",
            ",".join(map(str, r["copy_nodes"])),
            f"{r['eager_us']:.1f}",
            f"{r['graph_us']:.1f}",
            f"{r['graph_us'] / r['eager_us']:.2f}",
            f"{r['graph_sm_us']:.1f}",
            f"{r.get('triton_us', float('nan')):.1f}",
        ]
        print(" ".join(f"{c:>13}" for c in cols))
    for r in rows:
        print(r["bytes"], "eager:", r["eager_activities"], "graph:", r["graph_activities"])


if __name__ == "__main__":
    main()
