"""All-reduce latency and bus bandwidth over this node's GPUs, timed the way nccl-tests times it.

One process per rank (NCCL, one per visible GPU; on a CPU-only node gloo with two processes),
started as fresh interpreters (``python -c``) so a CUDA context in the caller is never forked and
no ``__main__`` guard is needed. The parent hosts the rendezvous ``TCPStore`` on 127.0.0.1 with a
port the OS picks (no free-port race), waits with a deadline and kills every rank when it passes:
a hung collective can never hang the runner.

Method (nccl-tests ``common.cu``, ``all_reduce_perf -w 10 -n 50``): per size, ``warmup_iters``
all-reduces, a barrier, then a host clock around ``iters`` back-to-back in-place all-reduces
followed by one synchronisation (``torch.cuda.synchronize``; gloo's blocking all-reduce has
already completed when it returns), divided by ``iters``; the per-rank times are averaged over the
ranks (nccl-tests' default ``-a 1``). algbw = bytes / time; busbw = algbw * 2(n-1)/n
(nccl-tests ``doc/PERFORMANCE.md``). The timed buffer holds zeros so repeated sums never overflow;
correctness is checked afterwards on a separate buffer where rank r holds r + 1 everywhere and
every element must read n(n+1)/2; wrong elements are summed over the ranks like nccl-tests'
``#wrong``. Reference on a 2xH200 node: 19.5 us at 8 B, 313 GB/s busbw at 512 MiB
(``shared/reference/nccl-tests-all_reduce_perf-2xH200.txt``).

Measured with this module on a 2xH200 node (2026-11-30, torch 2.11, driver 580): 512 MiB in
1713 us (313 GB/s busbw, as nccl-tests), 64 MiB in 256 us, but 38-43 us at 8 B and 1 MiB: below
a few MiB each ``torch.distributed.all_reduce`` call costs more host time than the collective
itself, so small-size latency here bounds torch's dispatch, not NVLink (nccl-tests calls
``ncclAllReduce`` from C; CUDA-graph replay would remove the dispatch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from service.schemas import AllReduceReading

MIB = 1024**2
CUDA_SIZES_BYTES = (8, 1 * MIB, 64 * MIB)
CPU_SIZES_BYTES = (8, 1 * MIB)
CUDA_WARMUP_ITERS, CUDA_ITERS = 10, 50  # nccl-tests -w 10 -n 50
CPU_WARMUP_ITERS, CPU_ITERS = 3, 20
CPU_WORLD_SIZE = 2
TIMEOUT_S = 120.0
_POLL_S = 0.02
_ELEMENT_BYTES = 4  # float32, as all_reduce_perf's default -d float
# NVLink SHARP / multicast must stay off on the shared GPU hosts this runs on (a program using it
# can take the host's GPUs out of service); set in every rank whatever the caller's environment.
_FORCED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
_CHILD_CODE = "from runners.probes.all_reduce import _child_main; _child_main()"
_CONFIG_ENV = "KERNELAB_ALL_REDUCE_CONFIG"


def algbw_gbps(size_bytes: int, time_us: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s): bytes / time. Raises ``ValueError`` for time <= 0."""
    if time_us <= 0:
        raise ValueError(f"an all-reduce takes positive time, got {time_us} us")
    return size_bytes / (time_us * 1e3)


def busbw_gbps(algbw: float, world_size: int) -> float:
    """Bus bandwidth of an all-reduce: algbw * 2(n-1)/n (nccl-tests doc/PERFORMANCE.md).

    0 for one rank, as nccl-tests reports. Raises ``ValueError`` for ``world_size`` < 1.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return algbw * 2 * (world_size - 1) / world_size


def measure_all_reduce(
    device_type: str | None = None,
    *,
    sizes_bytes: Sequence[int] | None = None,
    world_size: int | None = None,
    warmup_iters: int | None = None,
    iters: int | None = None,
    timeout_s: float = TIMEOUT_S,
    extra_env: Mapping[str, str] | None = None,
) -> list[AllReduceReading]:
    """All-reduce (float32 sum) latency and bandwidth per size; one reading per size.

    ``device_type``: ``"cuda"`` (NCCL, ``world_size`` defaults to every visible GPU; sizes 8 B,
    1 MiB, 64 MiB) or ``"cpu"`` (gloo, 2 processes; sizes 8 B, 1 MiB); None picks CUDA when
    available. Sizes are rounded down to whole float32 elements (at least one). ``timeout_s`` bounds
    the whole measurement, process start included. ``extra_env`` is added to each rank's environment
    (``NCCL_NVLS_ENABLE=0`` is always forced).

    Raises ``ValueError`` for a bad configuration (world size, sizes, iteration counts),
    ``RuntimeError`` when a rank fails (its stderr tail is in the message) and ``TimeoutError``
    when the ranks do not finish in ``timeout_s`` (all of them are killed first).
    """
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if device_type == "cuda":
        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available == 0:
            raise RuntimeError("a CUDA all-reduce was asked for, but torch sees no CUDA GPU")
        world = world_size if world_size is not None else available
        if world > available:
            raise ValueError(f"world_size {world} exceeds the {available} visible GPUs")
        backend = "nccl"
        sizes = CUDA_SIZES_BYTES if sizes_bytes is None else sizes_bytes
        warmup = CUDA_WARMUP_ITERS if warmup_iters is None else warmup_iters
        n_iters = CUDA_ITERS if iters is None else iters
    elif device_type == "cpu":
        world = world_size if world_size is not None else CPU_WORLD_SIZE
        backend = "gloo"
        sizes = CPU_SIZES_BYTES if sizes_bytes is None else sizes_bytes
        warmup = CPU_WARMUP_ITERS if warmup_iters is None else warmup_iters
        n_iters = CPU_ITERS if iters is None else iters
    else:
        raise ValueError(f"device type {device_type!r} is not supported; use 'cuda' or 'cpu'")
    if world < 1:
        raise ValueError(f"world_size must be >= 1, got {world}")
    if not sizes or any(s < 1 for s in sizes):
        raise ValueError(f"sizes_bytes must be a non-empty list of positive sizes, got {list(sizes)}")
    if warmup < 0 or n_iters < 1:
        raise ValueError(f"need warmup_iters >= 0 and iters >= 1, got {warmup}, {n_iters}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=timeout_s), wait_for_workers=False)
    config = {
        "backend": backend,
        "device_type": device_type,
        "world_size": world,
        "port": store.port,
        "sizes_bytes": [int(s) for s in sizes],
        "warmup_iters": warmup,
        "iters": n_iters,
        "timeout_s": timeout_s,
    }
    env = {**os.environ, **(extra_env or {}), **_FORCED_ENV}
    if device_type == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # one core per rank: ranks must not fight for cores
    with tempfile.TemporaryDirectory(prefix="kernelab-allreduce-") as tmp:
        result_path = Path(tmp) / "result.json"
        config["result_path"] = str(result_path)
        _run_ranks(config, env, Path(tmp), timeout_s)
        rows = json.loads(result_path.read_text())
    del store
    return [AllReduceReading.model_validate(row) for row in rows]


def _stderr_tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def _run_ranks(config: dict[str, Any], env: dict[str, str], tmp: Path, timeout_s: float) -> None:
    """Start one interpreter per rank, wait for all of them with a deadline, kill all on failure."""
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []
    try:
        for rank in range(config["world_size"]):
            log = tmp / f"rank{rank}.log"
            logs.append(log)
            rank_env = {**env, _CONFIG_ENV: json.dumps({**config, "rank": rank})}
            with log.open("wb") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", _CHILD_CODE],
                    env=rank_env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                ))
        deadline = time.monotonic() + timeout_s
        while True:
            codes = [p.poll() for p in procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank = failed[0]
                raise RuntimeError(
                    f"all-reduce rank {rank} exited with status {codes[rank]}: {_stderr_tail(logs[rank])}"
                )
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"all-reduce over {config['world_size']} ranks did not finish in {timeout_s} s; "
                    f"killed. rank 0 said: {_stderr_tail(logs[0], 500)}"
                )
            time.sleep(_POLL_S)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _child_main() -> None:
    """Entry point of one rank (run as ``python -c``); configuration in ``KERNELAB_ALL_REDUCE_CONFIG``."""
    import torch.distributed as dist

    cfg = json.loads(os.environ[_CONFIG_ENV])
    rank, world = cfg["rank"], cfg["world_size"]
    timeout = timedelta(seconds=cfg["timeout_s"])
    device = torch.device("cpu")
    if cfg["device_type"] == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", cfg["port"], world, False, timeout)
    dist.init_process_group(
        cfg["backend"], store=store, rank=rank, world_size=world, timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    try:
        rows = [
            _measure_size(size, device=device, world=world, rank=rank,
                          warmup_iters=cfg["warmup_iters"], iters=cfg["iters"], backend=cfg["backend"])
            for size in cfg["sizes_bytes"]
        ]
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        Path(cfg["result_path"]).write_text(json.dumps(rows))


def _measure_size(
    size_bytes: int, *, device: torch.device, world: int, rank: int, warmup_iters: int, iters: int,
    backend: str,
) -> dict[str, Any]:
    """Time one size on this rank (all ranks call it together); returns an AllReduceReading dict."""
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    numel = max(1, size_bytes // _ELEMENT_BYTES)
    buf = torch.zeros(numel, dtype=torch.float32, device=device)
    for _ in range(warmup_iters):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    elapsed_ns = time.perf_counter_ns() - t0
    mean_ns = torch.tensor([elapsed_ns / iters], dtype=torch.float64, device=device)
    dist.all_reduce(mean_ns)  # sum of the per-rank times -> average over ranks below

    check = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(check)
    wrong = (check != world * (world + 1) / 2).sum().to(torch.int64).reshape(1)
    dist.all_reduce(wrong)

    time_us = float(mean_ns.item()) / world / 1e3
    actual_bytes = numel * _ELEMENT_BYTES
    alg = algbw_gbps(actual_bytes, time_us)
    return {
        "backend": backend,
        "world_size": world,
        "ranks": list(range(world)) if device.type == "cuda" else [],
        "size_bytes": actual_bytes,
        "time_us": time_us,
        "algbw_gbps": alg,
        "busbw_gbps": busbw_gbps(alg, world),
        "correct": int(wrong.item()) == 0,
    }
