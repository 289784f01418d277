"""All-reduce latency and bus bandwidth over this node's GPUs, timed the way nccl-tests times it.

One process per rank (NCCL, one per visible GPU; on a CPU-only node gloo with two processes),
started as fresh interpreters (``python -c``) so a CUDA context in the caller is never forked and
no ``__main__`` guard is needed. The parent hosts the rendezvous ``TCPStore`` on 127.0.0.1 with a
port the OS picks (no free-port race), waits with a deadline and kills every rank when it passes:
a hung collective can never hang the runner.

Method (nccl-tests ``common.cu``, ``all_reduce_perf -w 10 -n 50``): per size, ``warmup_iters``
all-reduces, a barrier, then ``iters`` back-to-back in-place all-reduces timed as one window and
divided by ``iters``; the per-rank times are averaged over the ranks (nccl-tests' default ``-a 1``).
How the window is timed (``timing``):

* ``"cuda-events"`` (the CUDA default): the window sits between two CUDA events behind a spin
  kernel that holds the stream while the host enqueues the ``iters`` ops (as nvbandwidth holds its
  stream); every rank spins equally long right after a group barrier, so the ranks' windows open
  together (with per-rank spins the skew between ranks landed in the window: 7.7 or 21 us per 8 B
  op between runs); median of ``EVENT_WINDOWS`` windows. nccl-tests' host clock around the loop +
  one sync reads the same thing when the host enqueues faster than the GPU runs the ops, which
  holds for ``ncclAllReduce`` called from C (~19.5 us per 8 B op on 2xH200) but not for
  ``torch.distributed.all_reduce`` from Python: its per-call host dispatch (~20-40 us in a VM,
  varying between runs) made the host-clock figure 25-46 us at 8 B on an idle node against 6.0 us
  event-timed (``docs/results/2026-11-30-h200x2-probe-accuracy.md``): a reading of the host.
* ``"host-clock"`` (gloo always; CUDA on request): ``time.perf_counter_ns`` around the loop and one
  ``torch.cuda.synchronize`` (gloo's blocking all-reduce has already completed when it returns),
  exactly as nccl-tests.

algbw = bytes / time; busbw = algbw * 2(n-1)/n (nccl-tests ``doc/PERFORMANCE.md``). The timed
buffer holds zeros so repeated sums never overflow; correctness is checked afterwards on a separate
buffer where rank r holds r + 1 everywhere and every element must read n(n+1)/2; wrong elements are
summed over the ranks like nccl-tests' ``#wrong``. Reference on a 2xH200 node: 19.5 us at 8 B,
313 GB/s busbw at 512 MiB (nccl-tests' ``all_reduce_perf``, its output in
``tests/service/fixtures/nccl-tests-all_reduce_perf-2xH200.txt``).

Measured with the host clock on a 2xH200 node (2026-11-30, torch 2.11, driver 580): 512 MiB in
1713 us (313 GB/s busbw, as nccl-tests), 64 MiB in 256 us, but 22-43 us at 8 B and 1 MiB: below
a few MiB each ``torch.distributed.all_reduce`` call costs more host time than the collective
itself, hence the ``cuda-events`` default.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from kernelab.runners.jobenv import job_env
from kernelab.runners.probes.telemetry import POOL_ENV, register_own_pids, unregister_own_pids
from kernelab.service.contract.schemas import AllReduceReading

MIB = 1024**2
CUDA_SIZES_BYTES = (8, 1 * MIB, 64 * MIB)
CPU_SIZES_BYTES = (8, 1 * MIB)
CUDA_WARMUP_ITERS, CUDA_ITERS = 10, 50  # nccl-tests -w 10 -n 50
EVENT_WINDOWS = 5  # cuda-events timing: windows of `iters` ops per size; the median is reported
TIMINGS = ("cuda-events", "host-clock")
CPU_WARMUP_ITERS, CPU_ITERS = 3, 20
CPU_WORLD_SIZE = 2
TIMEOUT_S = 120.0
_POLL_S = 0.02
_ELEMENT_BYTES = 4  # float32, as all_reduce_perf's default -d float
# NVLink SHARP / multicast must stay off on the shared GPU hosts this runs on (a program using it
# can take the host's GPUs out of service); set in every rank whatever the caller's environment.
_FORCED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
_CHILD_CODE = "from kernelab.runners.probes.all_reduce import _child_main; _child_main()"
_CONFIG_ENV = "KERNELAB_ALL_REDUCE_CONFIG"
_GO_KEY = "kernelab/go"  # set in the rendezvous store when the ranks may start measuring
_REQ_KEY, _DONE_KEY, _SEQ_KEY = "kernelab/req", "kernelab/done", "kernelab/seq"  # AllReducePool
_POOL_IDLE_WAIT_S = 30.0  # an idle pool rank re-checks its parent this often


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


def full_sizes_bytes() -> tuple[int, ...]:
    """The full probe's sizes: 8 B x 4^k up to 128 MiB (nccl-tests ``-b 8 -e 128M -f 4``), then 256 MiB."""
    sizes = []
    size = 8
    while size <= 128 * MIB:
        sizes.append(size)
        size *= 4
    return (*sizes, 256 * MIB)


def sub_groups(world_size: int) -> list[list[int]]:
    """Groups measured besides the whole node: disjoint neighbour pairs (0-1, 2-3, ...) when there are
    more than 2 ranks, and the two TP4 halves (0-3, 4-7) on 8. Empty for 1 or 2 ranks."""
    if world_size <= 2:
        return []
    groups = [[r, r + 1] for r in range(0, world_size - 1, 2)]
    if world_size == 8:
        groups += [[0, 1, 2, 3], [4, 5, 6, 7]]
    return groups


def _resolve(
    device_type: str | None,
    sizes_bytes: Sequence[int] | None,
    world_size: int | None,
    warmup_iters: int | None,
    iters: int | None,
    timeout_s: float,
    timing: str | None = None,
) -> dict[str, Any]:
    """Validate the arguments of ``measure_all_reduce`` into a rank configuration (see there)."""
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
    if timing is None:
        timing = "cuda-events" if device_type == "cuda" else "host-clock"
    if timing not in TIMINGS:
        raise ValueError(f"timing must be one of {list(TIMINGS)}, got {timing!r}")
    if timing == "cuda-events" and device_type != "cuda":
        raise ValueError("timing 'cuda-events' needs CUDA devices; gloo on the CPU uses 'host-clock'")
    return {
        "backend": backend,
        "device_type": device_type,
        "world_size": world,
        "sizes_bytes": [int(s) for s in sizes],
        "warmup_iters": warmup,
        "iters": n_iters,
        "timeout_s": timeout_s,
        "timing": timing,
    }


class AllReduceRun:
    """Rank processes started now, measuring once ``go()`` is called; ``wait()`` returns the readings.

    Starting the ranks (interpreter, ``import torch``, CUDA context, NCCL communicator: seconds) is
    the all-reduce probe's main cost; ``run_probes`` starts them first, runs the copy probe while they
    initialise, then calls ``go()``, so the two overlap without the ranks' traffic touching the copy's
    window (each rank waits for the ``go`` key of the rendezvous store after ``init_process_group``).
    Use as a context manager or call ``close()``: the ranks are killed if still running.
    """

    def __init__(self, config: dict[str, Any], env: dict[str, str], *, fork: bool = False):
        from torch.distributed import TCPStore

        self.config = config
        self._deadline = time.monotonic() + config["timeout_s"]
        self._tmp = tempfile.TemporaryDirectory(prefix="kernelab-allreduce-")
        tmp = Path(self._tmp.name)
        self._procs: list[subprocess.Popen[bytes] | _ForkedRank] = []
        self._logs = [tmp / f"rank{rank}.log" for rank in range(config["world_size"])]
        self.started_at = time.time()
        # Per rank, seconds from construction to each stage ("imported", "initialised", "ready",
        # "go", "measured"), filled by ``wait``: where the probe's wall time goes.
        self.timeline: list[dict[str, float]] = []
        self.config.update(result_dir=str(tmp))
        # Forked ranks are made before the store, whose server thread must not be forked; they
        # read its port from a pipe.
        ports = [_ForkedRank.start(rank, self.config, env, self._logs[rank]) for rank in
                 range(config["world_size"])] if fork else []  # fmt: skip
        self._procs.extend(ports)
        self._store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=config["timeout_s"]),
                               wait_for_workers=False)  # fmt: skip
        self.config.update(port=self._store.port)
        for forked in ports:
            forked.send_port(self._store.port)
        for rank in range(config["world_size"]) if not fork else ():
            log = self._logs[rank]
            rank_env = {**env, _CONFIG_ENV: json.dumps({**self.config, "rank": rank})}
            with log.open("wb") as out:
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-c", _CHILD_CODE],
                        env=rank_env,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )

    def go(self) -> None:
        """Let the ranks start measuring (they have been initialising since construction)."""
        self._store.set(_GO_KEY, "1")

    def wait(self) -> tuple[list[AllReduceReading], list[str]]:
        """Wait for every rank; ``(readings, notes)``. Raises ``RuntimeError`` when a rank fails and
        ``TimeoutError`` past ``timeout_s`` from construction (all ranks killed first)."""
        try:
            self._wait_ranks()
            payloads = [
                json.loads((Path(self.config["result_dir"]) / f"result{rank}.json").read_text())
                for rank in range(self.config["world_size"])
            ]
        finally:
            self.close()
        self.timeline = [
            {k: round(v - self.started_at, 4) for k, v in p.get("timeline", {}).items()} for p in payloads
        ]
        rows = sorted((row for p in payloads for row in p["rows"]), key=lambda row: row.pop("order"))
        notes = sorted({n for p in payloads for n in p["notes"]})
        return [AllReduceReading.model_validate(row) for row in rows], notes

    def _wait_ranks(self) -> None:
        while True:
            codes = [p.poll() for p in self._procs]
            failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                rank = failed[0]
                tail = _stderr_tail(self._logs[rank])
                raise RuntimeError(f"all-reduce rank {rank} exited with status {codes[rank]}: {tail}")
            if all(c == 0 for c in codes):
                return
            if time.monotonic() > self._deadline:
                raise TimeoutError(
                    f"all-reduce over {self.config['world_size']} ranks did not finish in "
                    f"{self.config['timeout_s']} s; killed. rank 0 said: {_stderr_tail(self._logs[0], 500)}"
                )
            time.sleep(_POLL_S)

    def close(self) -> None:
        """Kill ranks still running and remove the temporary folder. Idempotent."""
        for p in self._procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        self._tmp.cleanup()

    def __enter__(self) -> AllReduceRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _ForkedRank:
    """A gloo rank forked from this process instead of a new interpreter (``import torch`` again
    cost 1.6-1.9 CPU-s per rank on a 2-core machine). Only for CPU ranks, forked from a process with
    one thread and no CUDA context (``start_all_reduce``); the part of ``subprocess.Popen`` that
    ``AllReduceRun`` uses."""

    def __init__(self, pid: int, port_w: int):
        self.pid = pid
        self._port_w = port_w
        self.returncode: int | None = None

    @classmethod
    def start(cls, rank: int, config: dict[str, Any], env: Mapping[str, str], log: Path) -> _ForkedRank:
        port_r, port_w = os.pipe()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the rank: never returns
            code = 1
            try:
                os.close(port_w)
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                devnull = os.open(os.devnull, os.O_RDONLY)
                for fd, target in ((devnull, 0), (out, 1), (out, 2)):
                    os.dup2(fd, target)
                # the caller's sys.stdout/stderr may not be fds 1 and 2 (a test's capture)
                sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
                sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
                from kernelab.runners.reaper import PARENT_PID_ENV, die_with_parent

                os.environ.clear()
                os.environ.update({**env, PARENT_PID_ENV: str(parent)})
                die_with_parent(signal.SIGKILL)
                torch.set_num_threads(1)  # OMP_NUM_THREADS=1 of a fresh rank: one core per rank
                with os.fdopen(port_r, "r") as pipe:  # one line: a later rank holds this pipe too
                    port = int(pipe.readline() or 0)
                os.environ[_CONFIG_ENV] = json.dumps({**config, "port": port, "rank": rank})
                _child_main()
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(port_r)
        return cls(pid, port_w)

    def send_port(self, port: int) -> None:
        with os.fdopen(self._port_w, "w") as pipe:
            pipe.write(f"{port}\n")

    def poll(self) -> int | None:
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def _pid_running(pid: int) -> bool:
    """True when ``pid`` exists and is not a zombie (``/proc/<pid>/stat`` state, where readable)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no procfs: signal 0 is all we know
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def _check_groups(groups: Sequence[Sequence[int]], world: int) -> None:
    """Raise ``ValueError`` for a group that names a rank outside ``world`` or has fewer than 2 ranks."""
    for group in groups:
        if len(group) < 2 or any(not 0 <= r < world for r in group) or len(set(group)) != len(group):
            raise ValueError(f"group {list(group)} must name >= 2 distinct ranks of 0..{world - 1}")


class AllReducePool:
    """All-reduce ranks started once and kept for many measurements: the runner's probe pool.

    Starting the ranks costs 3-5 s on a 2xH200 node (measured: interpreter and ``import torch``
    3.0-4.3 s, NCCL communicator 0.4-0.6 s, teardown ~1 s; ``benchmarks/probe_latency.py``), more
    than the quick probe's 3 s budget, and a job runs a quick probe before and after. A pool pays
    it once per runner: its ranks wait (idle, no GPU work) on the rendezvous store between
    requests, each ``measure`` is one request, and groups are made once per rank list. The ranks
    are registered as this runner's own GPU processes (``telemetry.register_own_pids``), so they
    never read as another tenant; each holds a CUDA context (~0.5 GiB) on its GPU while the pool
    lives, and frees its buffers after every request (``torch.cuda.empty_cache``).

    ``handover()`` describes the pool for another process (the daemon hands it to each job's
    worker in ``telemetry.POOL_ENV``); ``AllReducePoolClient`` uses it there. Use as a context
    manager or call ``close()``. Raises what ``start_all_reduce`` raises for a bad configuration.
    """

    def __init__(
        self,
        device_type: str | None = None,
        *,
        world_size: int | None = None,
        timeout_s: float = TIMEOUT_S,
        extra_env: Mapping[str, str] | None = None,
    ):
        config = _resolve(device_type, None, world_size, None, None, timeout_s)
        config.update(pool=True, groups=[list(range(config["world_size"]))], cuda_graph=False)
        env = job_env({**(extra_env or {}), **_FORCED_ENV})  # no credentials in the ranks (docs/security.md)
        env.pop(POOL_ENV, None)
        if config["device_type"] == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")
        self.config = config
        self._run = AllReduceRun(config, env)
        self.pids = [p.pid for p in self._run._procs]
        register_own_pids(self.pids)
        self._client = AllReducePoolClient(self.handover(), store=self._run._store)

    @property
    def world_size(self) -> int:
        return int(self.config["world_size"])

    @property
    def device_type(self) -> str:
        return str(self.config["device_type"])

    def handover(self) -> dict[str, Any]:
        """JSON-able description for ``AllReducePoolClient`` in another process of this host."""
        return {
            key: self.config[key]
            for key in (
                "port",
                "result_dir",
                "world_size",
                "device_type",
                "warmup_iters",
                "iters",
                "timing",
                "timeout_s",
            )
        } | {"pids": self.pids}

    def alive(self) -> bool:
        """Whether every rank process is still running."""
        return all(p.poll() is None for p in self._run._procs)

    def measure(self, **request: Any) -> tuple[list[AllReduceReading], list[str]]:
        """``AllReducePoolClient.measure`` from the owning process."""
        return self._client.measure(**request)

    def close(self) -> None:
        """Ask the ranks to stop, wait up to 5 s, kill what is left. Idempotent."""
        if self.alive():
            try:
                self._client.stop()
                deadline = time.monotonic() + 5.0
                while time.monotonic() < deadline and self.alive():
                    time.sleep(_POLL_S)
            except (RuntimeError, OSError):  # torch's DistError: the store is gone; the kill below ends them
                pass
        self._run.close()
        unregister_own_pids(self.pids)

    def __enter__(self) -> AllReducePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AllReducePoolClient:
    """Requests measurements from an ``AllReducePool`` (maybe owned by another process).

    ``handover``: ``AllReducePool.handover()``. One request at a time per pool (the runner runs one
    job at a time); a request number comes from the store's atomic counter.
    """

    def __init__(self, handover: Mapping[str, Any], *, store: Any = None):
        from torch.distributed import TCPStore

        self.handover = dict(handover)
        self.world_size = int(handover["world_size"])
        self.device_type = str(handover["device_type"])
        self.pids = [int(p) for p in handover["pids"]]
        self._timeout_s = float(handover["timeout_s"])
        self._store = (
            store
            if store is not None
            else TCPStore("127.0.0.1", int(handover["port"]), None, False, timedelta(seconds=self._timeout_s))
        )

    def alive(self) -> bool:
        """Whether every rank process is still running (not gone, not a zombie)."""
        return all(_pid_running(pid) for pid in self.pids)

    def stop(self) -> None:
        """Ask the ranks to end (a stop request)."""
        k = int(self._store.add(_SEQ_KEY, 1)) - 1
        self._store.set(f"{_REQ_KEY}/{k}", json.dumps({"stop": True}))

    def kill(self) -> None:
        """Kill every rank (a hung or broken pool). Never raises."""
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def measure(
        self,
        *,
        sizes_bytes: Sequence[int] | None = None,
        groups: Sequence[Sequence[int]] = (),
        cuda_graph: bool = False,
        warmup_iters: int | None = None,
        iters: int | None = None,
        timing: str | None = None,
    ) -> tuple[list[AllReduceReading], list[str]]:
        """One measurement over the whole pool and ``groups`` (as ``measure_all_reduce``): ``(readings,
        notes)``. Raises ``ValueError`` for a bad request (nothing sent), ``RuntimeError`` when a rank
        has died and ``TimeoutError`` past the pool's ``timeout_s`` (every rank killed first: the pool
        is then dead and its owner must start a new one)."""
        config = _resolve(
            self.device_type, sizes_bytes, self.world_size, warmup_iters, iters, self._timeout_s, timing
        )
        _check_groups(groups, self.world_size)
        if not self.alive():
            raise RuntimeError("the all-reduce pool has lost a rank")
        request = {
            "sizes_bytes": config["sizes_bytes"],
            "warmup_iters": config["warmup_iters"],
            "iters": config["iters"],
            "timing": config["timing"],
            "groups": [list(range(self.world_size)), *(sorted(int(r) for r in g) for g in groups)],
            "cuda_graph": bool(cuda_graph) and self.device_type == "cuda",
        }
        k = int(self._store.add(_SEQ_KEY, 1)) - 1
        self._store.set(f"{_REQ_KEY}/{k}", json.dumps(request))
        done = [f"{_DONE_KEY}/{k}/{rank}" for rank in range(self.world_size)]
        deadline = time.monotonic() + self._timeout_s
        while not self._store.check(done):
            if not self.alive():
                self.kill()
                raise RuntimeError(f"an all-reduce pool rank died during request {k}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(
                    f"the all-reduce pool did not answer request {k} in {self._timeout_s} s; "
                    "its ranks were killed"
                )
            time.sleep(_POLL_S / 4)
        result_dir = Path(self.handover["result_dir"])
        payloads = [
            json.loads((result_dir / f"result{rank}-{k}.json").read_text()) for rank in range(self.world_size)
        ]
        for rank in range(self.world_size):
            (result_dir / f"result{rank}-{k}.json").unlink(missing_ok=True)
        rows = sorted((row for p in payloads for row in p["rows"]), key=lambda row: row.pop("order"))
        notes = sorted({n for p in payloads for n in p["notes"]})
        return [AllReduceReading.model_validate(row) for row in rows], notes


_POOL: AllReducePool | AllReducePoolClient | None = None


def set_pool(pool: AllReducePool | AllReducePoolClient | None) -> None:
    """Make ``pool`` the one ``active_pool`` returns in this process (None: forget it)."""
    global _POOL
    _POOL = pool


def active_pool() -> AllReducePool | AllReducePoolClient | None:
    """The pool the probes of this process use: the one given to ``set_pool``, else a client of the
    pool described in ``telemetry.POOL_ENV`` (set by the daemon for a job's worker), else None. A
    pool that has lost a rank is dropped (None)."""
    global _POOL
    if _POOL is None and os.environ.get(POOL_ENV):
        try:
            _POOL = AllReducePoolClient(json.loads(os.environ[POOL_ENV]))
        except (ValueError, KeyError, TypeError, RuntimeError):  # malformed, or no store: no pool
            _POOL = None
    if _POOL is not None and not _POOL.alive():
        _POOL = None
    return _POOL


def start_all_reduce(
    device_type: str | None = None,
    *,
    sizes_bytes: Sequence[int] | None = None,
    world_size: int | None = None,
    warmup_iters: int | None = None,
    iters: int | None = None,
    groups: Sequence[Sequence[int]] = (),
    cuda_graph: bool = False,
    timeout_s: float = TIMEOUT_S,
    extra_env: Mapping[str, str] | None = None,
    timing: str | None = None,
) -> AllReduceRun:
    """Start the ranks of ``measure_all_reduce`` (same arguments) without letting them measure yet.

    Raises ``ValueError``/``RuntimeError`` as ``measure_all_reduce`` does, before any process starts,
    and ``ValueError`` for a group that names a rank outside ``world_size`` or has fewer than 2 ranks.
    """
    config = _resolve(device_type, sizes_bytes, world_size, warmup_iters, iters, timeout_s, timing)
    world = config["world_size"]
    _check_groups(groups, world)
    config["groups"] = [list(range(world)), *(sorted(int(r) for r in g) for g in groups)]
    config["cuda_graph"] = bool(cuda_graph) and config["device_type"] == "cuda"
    env = job_env({**(extra_env or {}), **_FORCED_ENV})  # no credentials in the ranks (docs/security.md)
    if config["device_type"] == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")  # one core per rank: ranks must not fight for cores
    return AllReduceRun(config, env, fork=_may_fork(config["device_type"]))


_FORK_ALLOWED = [False]  # set by allow_forked_ranks() in a process that does nothing but probe


def allow_forked_ranks() -> None:
    """Let this process fork its CPU ranks (``_may_fork``): called by the job's probing child
    (``kernelab.runners.measure probes``), a process that holds nothing else. Elsewhere (a runner
    that probes between a workload's runs in its own process, holding its rendezvous store and the
    runs' pipes) the ranks stay new interpreters, which inherit none of that."""
    _FORK_ALLOWED[0] = True


def _may_fork(device_type: str) -> bool:
    """Whether the ranks may be forked from this process: CPU ranks, from a process that allowed it
    (``allow_forked_ranks``), with no other Python thread (a lock one holds would stay held in the
    rank) and no CUDA context. The native pools of the libraries (OpenBLAS, torch's intra-op
    threads) restart in a forked child by their own ``pthread_atfork`` handlers, as for torch's
    forked ``DataLoader`` workers. ``KERNELAB_FORK_RANKS=0`` turns it off."""
    import threading

    if not _FORK_ALLOWED[0] or device_type != "cpu" or os.environ.get("KERNELAB_FORK_RANKS", "1") == "0":
        return False
    return hasattr(os, "fork") and threading.active_count() == 1 and not torch.cuda.is_initialized()


def measure_all_reduce(
    device_type: str | None = None,
    *,
    sizes_bytes: Sequence[int] | None = None,
    world_size: int | None = None,
    warmup_iters: int | None = None,
    iters: int | None = None,
    groups: Sequence[Sequence[int]] = (),
    cuda_graph: bool = False,
    timeout_s: float = TIMEOUT_S,
    extra_env: Mapping[str, str] | None = None,
    timing: str | None = None,
) -> list[AllReduceReading]:
    """All-reduce (float32 sum) latency and bandwidth per group and size; one reading per pair.

    ``device_type``: ``"cuda"`` (NCCL, ``world_size`` defaults to every visible GPU; sizes 8 B,
    1 MiB, 64 MiB) or ``"cpu"`` (gloo, 2 processes; sizes 8 B, 1 MiB); None picks CUDA when
    available. Sizes are rounded down to whole float32 elements (at least one). The whole world is
    always measured first, then each of ``groups`` (rank lists, e.g. ``sub_groups(world)``) through
    ``torch.distributed.new_group``, one group at a time. ``cuda_graph`` (CUDA only) adds, per
    group and size, a reading timed as one CUDA-graph replay of ``iters`` all-reduces
    (``cuda_graph=True`` on the reading): no per-op host dispatch, as nccl-tests ``-G``. A graph
    that cannot be captured leaves a note instead of a reading (see ``AllReduceRun.wait``).
    ``timeout_s`` bounds the whole measurement, process start included. ``extra_env`` is added to
    each rank's environment (``NCCL_NVLS_ENABLE=0`` is always forced). ``timing``: how a window
    of ``iters`` ops is timed, ``"cuda-events"`` (CUDA default) or ``"host-clock"`` (gloo's only
    choice); see the module docstring.

    Raises ``ValueError`` for a bad configuration (world size, sizes, iteration counts, groups),
    ``RuntimeError`` when a rank fails (its stderr tail is in the message) and ``TimeoutError``
    when the ranks do not finish in ``timeout_s`` (all of them are killed first).
    """
    with start_all_reduce(
        device_type,
        sizes_bytes=sizes_bytes,
        world_size=world_size,
        warmup_iters=warmup_iters,
        iters=iters,
        groups=groups,
        cuda_graph=cuda_graph,
        timeout_s=timeout_s,
        extra_env=extra_env,
        timing=timing,
    ) as run:
        run.go()
        readings, _ = run.wait()
    return readings


def _stderr_tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


def _child_main() -> None:
    """Entry point of one rank (run as ``python -c``); configuration in ``KERNELAB_ALL_REDUCE_CONFIG``."""
    import torch.distributed as dist

    timeline = {"imported": time.time()}
    cfg = json.loads(os.environ[_CONFIG_ENV])
    rank, world = cfg["rank"], cfg["world_size"]
    timeout = timedelta(seconds=cfg["timeout_s"])
    device = torch.device("cpu")
    if cfg["device_type"] == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", cfg["port"], world, False, timeout)
    dist.init_process_group(
        cfg["backend"],
        store=store,
        rank=rank,
        world_size=world,
        timeout=timeout,
        device_id=device if device.type == "cuda" else None,
    )
    timeline["initialised"] = time.time()
    if cfg.get("pool"):
        try:
            _pool_loop(cfg, store, rank, world, device)
        finally:
            dist.destroy_process_group()
        return
    try:
        # new_group is collective: every rank creates every group, in the same order.
        groups = [(ranks, None if len(ranks) == world else dist.new_group(ranks)) for ranks in cfg["groups"]]
        timeline["ready"] = time.time()
        store.wait([_GO_KEY])
        timeline["go"] = time.time()
        rows, notes = _measure_groups(cfg, groups, rank, device)
    finally:
        timeline["measured"] = time.time()
        dist.destroy_process_group()
    out = Path(cfg["result_dir"]) / f"result{rank}.json"
    out.write_text(json.dumps({"rows": rows, "notes": sorted(set(notes)), "timeline": timeline}))


def _measure_groups(
    cfg: dict[str, Any], groups: list[tuple[list[int], Any]], rank: int, device: torch.device
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every size of ``cfg`` over every group this rank belongs to; ``(rows, notes)`` (rows only on
    each group's first rank, with an ``order`` key)."""
    import torch.distributed as dist

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for g, (ranks, group) in enumerate(groups):
        if rank in ranks:
            for s, size in enumerate(cfg["sizes_bytes"]):
                common = dict(
                    size_bytes=size,
                    device=device,
                    ranks=ranks,
                    rank=rank,
                    group=group,
                    warmup_iters=cfg["warmup_iters"],
                    iters=cfg["iters"],
                    backend=cfg["backend"],
                    timing=cfg["timing"],
                )
                # Every member measures; the group's first rank reports (times are averaged already).
                row = _measure_size(**common)  # type: ignore[arg-type]
                if rank == ranks[0]:
                    rows.append({**row, "order": [g, s, 0]})
                if cfg.get("cuda_graph"):
                    try:
                        row = _measure_size(**common, cuda_graph=True)  # type: ignore[arg-type]
                        if rank == ranks[0]:
                            rows.append({**row, "order": [g, s, 1]})
                    except RuntimeError as exc:
                        notes.append(f"CUDA-graph all-reduce over {ranks} at {size} B failed: {exc}")
        dist.barrier()
    return rows, notes


def _pool_loop(cfg: dict[str, Any], store: Any, rank: int, world: int, device: torch.device) -> None:
    """A pool rank: serve measurement requests ``kernelab/req/<k>`` (k = 0, 1, ...) until a stop
    request or until the parent's store goes away (then ``store.wait`` raises and the rank ends).

    Each request is a JSON object with ``sizes_bytes``, ``groups``, ``warmup_iters``, ``iters``,
    ``cuda_graph``, ``timing``; the rank writes ``result<rank>-<k>.json`` (rows, notes) and then
    sets ``kernelab/done/<k>/<rank>``. Groups are made once per rank list and kept.
    """
    import torch.distributed as dist

    made: dict[tuple[int, ...], Any] = {}
    k = 0
    while True:
        key = f"{_REQ_KEY}/{k}"
        try:
            store.wait([key], timedelta(seconds=_POOL_IDLE_WAIT_S))
        except RuntimeError:  # torch's DistStoreError (idle: wait again) or DistNetworkError (parent gone)
            if os.getppid() == 1 or not _store_alive(store):
                return
            continue
        request = json.loads(store.get(key))
        if request.get("stop"):
            return
        t0 = time.time()
        cfg_k = {**cfg, **request}
        groups = []
        for ranks in cfg_k["groups"]:
            ranks = [int(r) for r in ranks]
            if tuple(ranks) not in made:  # new_group is collective: every rank makes it, in order
                made[tuple(ranks)] = None if len(ranks) == world else dist.new_group(ranks)
            groups.append((ranks, made[tuple(ranks)]))
        rows, notes = _measure_groups(cfg_k, groups, rank, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()  # give the job the buffers back between probes
        out = Path(cfg["result_dir"]) / f"result{rank}-{k}.json"
        out.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "notes": sorted(set(notes)),
                    "timeline": {"request": t0, "measured": time.time()},
                }
            )
        )
        store.set(f"{_DONE_KEY}/{k}/{rank}", "1")
        k += 1


def _store_alive(store: Any) -> bool:
    try:
        store.check(["kernelab/alive"])
        return True
    except RuntimeError:  # torch.distributed.DistError: the store's host is gone
        return False


def _event_timed_ns(
    buf: torch.Tensor, group: Any, device: torch.device, iters: int, probe_iters: int
) -> float:
    """Median over ``EVENT_WINDOWS`` windows of ``iters`` all-reduces, ns per op, CUDA events.

    Each window: a host barrier of the group (so the ranks start within microseconds of each
    other), a spin kernel of the same length on every rank (the group's largest host enqueue time
    for ``iters`` ops, measured on ``probe_iters`` unsynchronised calls, x1.5 + 50 us), start event,
    the ops, stop event. A window whose host enqueue outlasted its spin (the GPU may have waited
    for the host inside it) is taken again with a spin twice as long, at most 3 times.
    """
    import torch.distributed as dist

    from kernelab.runners.timing import spin_cycles_per_ns

    cycles_per_ns = spin_cycles_per_ns(device)
    torch.cuda.synchronize(device)
    t0 = time.perf_counter_ns()
    for _ in range(probe_iters):
        dist.all_reduce(buf, group=group)
    host_ns = torch.tensor([(time.perf_counter_ns() - t0) / probe_iters], dtype=torch.float64, device=device)
    dist.all_reduce(host_ns, op=dist.ReduceOp.MAX, group=group)
    spin_ns = 1.5 * float(host_ns.item()) * iters + 50_000.0
    times: list[float] = []
    for _ in range(EVENT_WINDOWS):
        for _attempt in range(4):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            dist.barrier(group=group)
            torch.cuda.synchronize(device)
            torch.cuda._sleep(max(1, int(spin_ns * cycles_per_ns)))
            t_enqueue = time.perf_counter_ns()
            start.record()
            for _ in range(iters):
                dist.all_reduce(buf, group=group)
            stop.record()
            exposed = torch.tensor([float(time.perf_counter_ns() - t_enqueue > spin_ns)], device=device)
            stop.synchronize()
            # Every rank must agree whether to take the window again (or the ops would mismatch).
            dist.all_reduce(exposed, op=dist.ReduceOp.MAX, group=group)
            if exposed.item() == 0.0:
                break
            spin_ns *= 2
        times.append(start.elapsed_time(stop) * 1e6 / iters)
    return statistics.median(times)


def _measure_size(
    size_bytes: int,
    *,
    device: torch.device,
    ranks: list[int],
    rank: int,
    group: Any,
    warmup_iters: int,
    iters: int,
    backend: str,
    cuda_graph: bool = False,
    timing: str = "host-clock",
) -> dict[str, Any]:
    """Time one size over ``group`` (None: the world) on this rank (all members call it together);
    returns an AllReduceReading dict. ``cuda_graph``: capture ``iters`` ops into one graph and time
    one replay (host clock around replay + synchronize, / iters). Otherwise ``timing``
    ``"cuda-events"``: median of ``EVENT_WINDOWS`` event-timed windows of ``iters`` ops behind a spin
    kernel; ``"host-clock"``: one host-timed window."""
    import torch.distributed as dist

    n = len(ranks)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    numel = max(1, size_bytes // _ELEMENT_BYTES)
    buf = torch.zeros(numel, dtype=torch.float32, device=device)
    graph = None
    if cuda_graph:
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
            for _ in range(max(1, warmup_iters)):
                dist.all_reduce(buf, group=group)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(iters):
                dist.all_reduce(buf, group=group)
        graph.replay()
    else:
        for _ in range(warmup_iters):
            dist.all_reduce(buf, group=group)
    sync()
    dist.barrier(group=group)
    sync()
    timed_by = "host-clock"
    if graph is None and timing == "cuda-events":
        per_op_ns = _event_timed_ns(buf, group, device, iters, max(1, warmup_iters))
        timed_by = "cuda-events"
    else:
        t0 = time.perf_counter_ns()
        if graph is not None:
            graph.replay()
        else:
            for _ in range(iters):
                dist.all_reduce(buf, group=group)
        sync()
        per_op_ns = (time.perf_counter_ns() - t0) / iters
    mean_ns = torch.tensor([per_op_ns], dtype=torch.float64, device=device)
    dist.all_reduce(mean_ns, group=group)  # sum of the per-rank times -> average over ranks below

    check = torch.full((numel,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(check, group=group)
    expected = float(sum(r + 1 for r in ranks))
    wrong = (check != expected).sum().to(torch.int64).reshape(1)
    dist.all_reduce(wrong, group=group)

    time_us = float(mean_ns.item()) / n / 1e3
    actual_bytes = numel * _ELEMENT_BYTES
    alg = algbw_gbps(actual_bytes, time_us)
    return {
        "backend": backend,
        "world_size": n,
        "ranks": list(ranks),
        "size_bytes": actual_bytes,
        "time_us": time_us,
        "algbw_gbps": alg,
        "busbw_gbps": busbw_gbps(alg, n),
        "correct": int(wrong.item()) == 0,
        "cuda_graph": graph is not None,
        "timed_by": timed_by,
    }
