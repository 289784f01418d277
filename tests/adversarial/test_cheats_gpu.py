"""The adversarial suite's GPU members on a CUDA GPU (skipped without one): cheats that need a
device (graph replay, streams, device work, CUDA events, the context's cache policy) and the CPU
cheats again under the default CUDA-graph timer. Numbers of a run on an H200 are in
docs/results/2026-12-01-h200-adversarial.md (``benchmarks/adversarial_h200.py``)."""

from __future__ import annotations

from typing import Any

import pytest
from cheats import CHEATS, GPU_CHEATS, GPU_OVERRIDES

from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import JobSpec
from kernelab.service.judge.stats import compare

pytestmark = pytest.mark.gpu

QUICK = {"warmup_ms": 5.0, "budget_ms": 400.0, "min_rounds": 4, "max_rounds": 200, "min_time_ms": 20.0}
NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False, "matmul_peak": False}


def gpu_spec(candidate: str, **correctness: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "benchmark": "cheats:ScaleBenchmark",
            "baseline": {"variant": "honest"},
            "candidate": {"variant": candidate},
            "params": {"M": 2048, "N": 2048, "work": 8},
            "device": "cuda",
            "measurement": QUICK,
            "probes": NO_PROBES,
            "correctness": correctness,
        }
    )


@pytest.mark.parametrize("cheat", sorted(k for k, v in {**CHEATS, **GPU_CHEATS}.items() if v))
def test_every_cheat_is_caught_on_the_gpu(cheat: str) -> None:
    loose = {"rtol": 0.05, "atol": 0.1} if cheat == "less_accurate" else {}
    cell = compare(run_job(gpu_spec(cheat, **loose))).cells[0]
    codes = {r.code for r in cell.reasons}
    wanted = GPU_OVERRIDES.get(cheat) or GPU_CHEATS.get(cheat) or CHEATS[cheat]
    assert wanted & codes, (cheat, cell.verdict, [r.message for r in cell.reasons])
    assert cell.verdict not in ("faster", "same", "slower")


def test_an_honest_pair_raises_no_finding_on_the_gpu() -> None:
    result = run_job(gpu_spec("honest"))
    cell = compare(result).cells[0]
    assert cell.verdict == cell.timing_verdict, [r.message for r in cell.reasons]
    checks = result.cells[0].timed_checks
    assert all(c.passed and c.timer == "cuda-graph" for cs in checks.values() for c in cs)


def test_events_that_read_a_constant_for_everyone_end_the_cell_before_its_first_timing() -> None:
    """``torch.cuda.Event.elapsed_time`` made to read 0 ms at the benchmark's import (it hung the
    warm-up until the job's timeout: the spin calibration read 1e7 cycles per ns): every cell is
    ``failed`` (``timer-tampered``) with no sample. The spin calibration refuses such a reading
    itself as well (``kernelab.runners.timing.TimerImplausible``)."""
    import torch

    from kernelab.runners.timing import TimerImplausible, measure_spin_cycles_per_ns

    module = "cheats_events_constant:EventsConstantAtImport"
    spec = gpu_spec("honest").model_copy(update={"benchmark": module})
    result = run_job(spec)
    cell = compare(result).cells[0]
    assert cell.verdict == "failed" and cell.reasons[0].code == "timer-tampered", cell.reasons
    assert len(result.cells[0].samples) == 0
    real = torch.cuda.Event.elapsed_time
    try:
        torch.cuda.Event.elapsed_time = lambda self, end: 0.0  # type: ignore[method-assign,assignment]
        with pytest.raises(TimerImplausible, match="cycles per ns"):
            measure_spin_cycles_per_ns(0)
    finally:
        torch.cuda.Event.elapsed_time = real  # type: ignore[method-assign]
    assert 0.05 < measure_spin_cycles_per_ns(0) < 10
