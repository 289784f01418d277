"""All-reduce probe: real gloo process groups on the CPU, NCCL on GPUs; timeouts and failures."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from kernelab.runners.probes.all_reduce import algbw_gbps, busbw_gbps, measure_all_reduce

MIB = 1024**2


def test_bandwidth_formulas() -> None:
    assert algbw_gbps(MIB, 100.0) == pytest.approx(10.48576)  # 1048576 B / 100e-6 s
    assert busbw_gbps(10.0, 1) == 0.0
    assert busbw_gbps(10.0, 2) == pytest.approx(10.0)
    assert busbw_gbps(10.0, 8) == pytest.approx(17.5)  # 2 * 7 / 8
    with pytest.raises(ValueError):
        busbw_gbps(1.0, 0)
    with pytest.raises(ValueError):
        algbw_gbps(8, 0.0)


@pytest.mark.slow
def test_gloo_two_processes_sum_correctly() -> None:
    readings = measure_all_reduce("cpu", sizes_bytes=[8, 64 * 1024], warmup_iters=2, iters=5)
    assert [r.size_bytes for r in readings] == [8, 64 * 1024]
    for r in readings:
        assert r.backend == "gloo" and r.world_size == 2
        assert r.correct
        assert r.time_us > 0
        assert r.algbw_gbps == pytest.approx(r.size_bytes / (r.time_us * 1e3), rel=1e-9)
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * 2 * (2 - 1) / 2, rel=1e-9)


@pytest.mark.slow
def test_gloo_three_processes_bus_bandwidth_factor() -> None:
    # n = 3: every rank holds r + 1, the sum must be 6 everywhere, busbw = algbw * 4/3.
    (reading,) = measure_all_reduce("cpu", sizes_bytes=[10], world_size=3, warmup_iters=1, iters=3)
    assert reading.world_size == 3 and reading.correct
    assert reading.size_bytes == 8  # rounded down to whole float32 elements
    assert reading.busbw_gbps == pytest.approx(reading.algbw_gbps * 4 / 3, rel=1e-9)


def _in_a_fresh_process(code: str) -> None:
    """Run ``code`` in a new interpreter: a pytest-xdist worker has threads of its own, where
    ``all_reduce`` never forks its ranks (``_may_fork``)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.slow
def test_hung_or_slow_ranks_are_killed_at_the_deadline() -> None:
    # The CPU ranks are forked from the measuring process, so they run its code as patched there:
    # a rank that never returns.
    _in_a_fresh_process(
        "import time, pytest\n"
        "from kernelab.runners.probes import all_reduce\n"
        "all_reduce._child_main = lambda: time.sleep(600)\n"
        "all_reduce.allow_forked_ranks()\n"
        "assert all_reduce._may_fork('cpu')\n"
        "t0 = time.monotonic()\n"
        "with pytest.raises(TimeoutError, match='did not finish'):\n"
        "    all_reduce.measure_all_reduce('cpu', sizes_bytes=[8], timeout_s=0.5)\n"
        "assert time.monotonic() - t0 < 5.0\n"
    )


def test_cpu_ranks_are_forked_only_from_a_process_without_other_threads() -> None:
    """Forked ranks (no second ``import torch``) where no other Python thread could hold a lock;
    fresh interpreters otherwise, and for CUDA always. Both measure the same way."""
    _in_a_fresh_process(
        "import subprocess, threading\n"
        "from kernelab.runners.probes import all_reduce\n"
        "assert not all_reduce._may_fork('cpu')  # only a process that allowed it (a probing child)\n"
        "all_reduce.allow_forked_ranks()\n"
        "assert all_reduce._may_fork('cpu') and not all_reduce._may_fork('cuda')\n"
        "def one(fresh):\n"
        "    with all_reduce.start_all_reduce('cpu', sizes_bytes=[8], warmup_iters=1, iters=2) as run:\n"
        "        assert all(isinstance(p, subprocess.Popen) == fresh for p in run._procs)\n"
        "        run.go()\n"
        "        (reading,), _ = run.wait()\n"
        "    assert reading.correct and reading.size_bytes == 8\n"
        "stop = threading.Event()\n"
        "other = threading.Thread(target=stop.wait)\n"
        "other.start()\n"
        "assert not all_reduce._may_fork('cpu')\n"
        "one(fresh=True)\n"
        "stop.set(); other.join()\n"
        "one(fresh=False)\n"
    )


@pytest.mark.slow
def test_a_failing_rank_raises_with_its_error() -> None:
    # gloo cannot bind to an interface that does not exist: every rank fails at init.
    with pytest.raises(RuntimeError, match="exited with status(.|\n)*kernelab-no-such-if0"):
        measure_all_reduce("cpu", sizes_bytes=[8], extra_env={"GLOO_SOCKET_IFNAME": "kernelab-no-such-if0"})


@pytest.mark.parametrize(
    "kwargs",
    [
        {"world_size": 0},
        {"sizes_bytes": []},
        {"sizes_bytes": [0]},
        {"iters": 0},
        {"warmup_iters": -1},
        {"timeout_s": 0.0},
    ],
)
def test_bad_configuration_is_rejected(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        measure_all_reduce("cpu", **kwargs)


def test_unknown_device_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="not supported"):
        measure_all_reduce("tpu")


def test_timing_is_validated_before_any_rank_starts() -> None:
    with pytest.raises(ValueError, match="timing must be one of"):
        measure_all_reduce("cpu", timing="wall")
    with pytest.raises(ValueError, match="needs CUDA devices"):
        measure_all_reduce("cpu", timing="cuda-events")


@pytest.mark.slow
def test_gloo_readings_say_host_clock() -> None:
    readings = measure_all_reduce("cpu", sizes_bytes=[8], iters=2, warmup_iters=1)
    assert [r.timed_by for r in readings] == ["host-clock"]


# A one-rank all-reduce moves no data (NCCL returns at once; the node probe skips it on one GPU):
# timing comparisons between sizes and methods need two ranks.
needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2,
    reason="needs 2 GPUs (a one-rank all-reduce moves no data)",
)


@pytest.mark.gpu
@needs_two_gpus
def test_nccl_event_timing_is_default_and_not_slower_than_the_host_clock() -> None:
    events = measure_all_reduce("cuda", sizes_bytes=[8, 64 * MIB])
    host = measure_all_reduce("cuda", sizes_bytes=[8, 64 * MIB], timing="host-clock")
    assert [r.timed_by for r in events] == ["cuda-events"] * 2
    assert [r.timed_by for r in host] == ["host-clock"] * 2
    assert all(r.correct for r in events + host)
    # The host clock around the ops and one sync also holds the device time of the ops.
    assert events[0].time_us <= host[0].time_us * 1.1
    # At 64 MiB both time the link: within 10%.
    assert events[1].time_us == pytest.approx(host[1].time_us, rel=0.1)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_without_gpu_raises() -> None:
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        measure_all_reduce("cuda")


@pytest.mark.gpu
@needs_two_gpus
def test_nccl_all_gpus_quick_sizes() -> None:
    n = torch.cuda.device_count()
    readings = measure_all_reduce("cuda")
    assert [r.size_bytes for r in readings] == [8, MIB, 64 * MIB]
    for r in readings:
        assert r.backend == "nccl" and r.world_size == n and r.ranks == list(range(n))
        assert r.correct and r.time_us > 0
        assert r.busbw_gbps == pytest.approx(r.algbw_gbps * 2 * (n - 1) / n, rel=1e-9)
    # latency grows with size: 64 MiB cannot be cheaper than 8 B
    assert readings[-1].time_us > readings[0].time_us


@pytest.mark.gpu
def test_nccl_world_size_above_gpu_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        measure_all_reduce("cuda", world_size=torch.cuda.device_count() + 1)


# --------------------------------------------------------------------------------------------------
# AllReducePool: ranks kept alive between probes (gloo on the CPU; the same code serves NCCL)
# --------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_pool_serves_many_requests_from_the_same_ranks_and_other_processes() -> None:
    from kernelab.runners.probes.all_reduce import AllReducePool
    from kernelab.runners.probes.telemetry import own_pids

    with AllReducePool("cpu") as pool:
        assert set(pool.pids) <= own_pids()  # never another tenant in telemetry
        first, notes = pool.measure(sizes_bytes=[8, 1024])
        assert notes == [] and [r.size_bytes for r in first] == [8, 1024]
        assert all(r.correct and r.world_size == 2 and r.timed_by == "host-clock" for r in first)
        # A second request, with a sub-group, is served by the same processes.
        pids = list(pool.pids)
        second, _ = pool.measure(sizes_bytes=[8], groups=[[0, 1]])
        assert [r.ranks for r in second] == [[0, 1], [0, 1]] and pool.pids == pids and pool.alive()
        # Another process uses the pool through its hand-over (as the daemon's job worker does).
        code = (
            "import json, sys; from kernelab.runners.probes.all_reduce import AllReducePoolClient; "
            "c = AllReducePoolClient(json.loads(sys.argv[1])); r, _ = c.measure(sizes_bytes=[64]); "
            "print(json.dumps([x.size_bytes for x in r if x.correct]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(pool.handover())],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [64]
        with pytest.raises(ValueError, match="distinct ranks"):
            pool.measure(groups=[[0, 5]])
    assert not pool.alive()
    assert not set(pool.pids) & own_pids()


@pytest.mark.slow
def test_pool_that_lost_a_rank_is_dropped_and_the_probe_starts_its_own() -> None:
    from kernelab.runners.probes import run_probes
    from kernelab.runners.probes.all_reduce import AllReducePool, active_pool, set_pool
    from kernelab.service.contract.schemas import ProbeSpec

    pool = AllReducePool("cpu")
    try:
        pool.measure(sizes_bytes=[8])
        set_pool(pool)
        os.kill(pool.pids[1], signal.SIGKILL)
        _wait_dead(pool)
        with pytest.raises(RuntimeError, match="lost a rank|died"):
            pool.measure(sizes_bytes=[8])
        assert active_pool() is None  # dropped
        set_pool(pool)  # as if the probe had not checked first: it must still measure
        report = run_probes(ProbeSpec(mode="quick", nvml=False, copy_bandwidth=False), device_type="cpu")
        assert report.errors == {} and [r.size_bytes for r in report.all_reduce] == [8, 1024 * 1024]
    finally:
        set_pool(None)
        pool.close()


def _wait_dead(pool) -> None:
    for _ in range(100):
        if not pool.alive():
            return
        time.sleep(0.05)
    raise AssertionError("the killed rank still runs")


@pytest.mark.gpu
@needs_two_gpus
def test_nccl_pool_serves_quick_and_full_requests() -> None:
    from kernelab.runners.probes.all_reduce import AllReducePool, sub_groups

    n = torch.cuda.device_count()
    with AllReducePool("cuda") as pool:
        quick, _ = pool.measure()
        assert [r.size_bytes for r in quick] == [8, MIB, 64 * MIB] and all(r.correct for r in quick)
        assert all(r.timed_by == "cuda-events" for r in quick)
        again, notes = pool.measure(sizes_bytes=[8], groups=sub_groups(n), cuda_graph=True)
        assert all(r.correct for r in again) and any(r.cuda_graph for r in again), notes
        assert pool.alive()
