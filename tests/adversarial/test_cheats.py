"""The adversarial suite on the CPU: every cheat of ``cheats.py`` ends in its named reason and a
verdict that is not ``faster``, through ``run_job`` (the measuring child process) and
``kernelab.service.judge.stats.compare``; the timing alone (``timing_verdict``) would have read faster, which
is
what each defence prevents. GPU members: ``test_cheats_gpu.py``."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from cheats import CHEATS, ScaleBenchmark

from kernelab.runners import integrity
from kernelab.runners.job import run_job
from kernelab.runners.sides import modified_inputs, refill_inputs, snapshot_inputs
from kernelab.service.contract.schemas import JobSpec
from kernelab.service.judge.stats import compare

QUICK = {"warmup_ms": 2.0, "budget_ms": 300.0, "min_rounds": 4, "max_rounds": 40, "min_time_ms": 0.0}
NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False}


def cheat_spec(candidate: str, **correctness: Any) -> JobSpec:
    return JobSpec.model_validate(
        {
            "benchmark": "cheats:ScaleBenchmark",
            "baseline": {"variant": "honest"},
            "candidate": {"variant": candidate},
            "params": {"M": 256, "N": 256},
            "device": "cpu",
            "measurement": QUICK,
            "probes": NO_PROBES,
            "correctness": correctness,
        }
    )


LOOSE = {"rtol": 0.05, "atol": 0.1}  # a tolerance loose enough for a bfloat16 result


@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_every_cheat_is_caught_by_its_defence(cheat: str) -> None:
    spec = cheat_spec(cheat, **(LOOSE if cheat == "less_accurate" else {}))
    cell = compare(run_job(spec)).cells[0]
    codes = {r.code for r in cell.reasons}
    assert CHEATS[cheat] <= codes, (cheat, cell.verdict, [r.message for r in cell.reasons])
    assert cell.verdict not in ("faster", "same", "slower")
    assert cell.reasons[0].side in ("candidate", None)  # the cheat is named, not the honest side
    blamed = [r.message for r in cell.reasons if r.severity == "error" and r.side == "baseline"]
    assert not blamed, (cheat, blamed)


@pytest.mark.parametrize("cheat", ["cache_ptr", "constant", "deferred"])
def test_without_checked_samples_a_cached_answer_reads_faster(cheat: str) -> None:
    """The defence is what catches these: with the timed checks off, the eager check passes and the
    cheat reads faster (which is why they are on by default)."""
    cell = compare(run_job(cheat_spec(cheat, timed_checks=False))).cells[0]
    assert cell.correctness["candidate"].passed
    # nothing but the timing speaks, and the timing of a cached answer is far below the honest one
    assert cell.verdict == cell.timing_verdict, [r.message for r in cell.reasons]
    assert cell.ratio is not None and cell.ratio < 0.7


def test_an_honest_pair_passes_every_check() -> None:
    result = run_job(cheat_spec("honest"))
    cell = compare(result).cells[0]
    # no check fires on honest code: the verdict is the timing's (which, A/A on a shared CPU, is noise)
    assert cell.verdict == cell.timing_verdict and not cell.error
    assert {r.code for r in cell.reasons} <= {"ci-straddles", "no-interval"}
    checks = result.cells[0].timed_checks
    assert {v: len(c) for v, c in checks.items()} == {"baseline": 2, "candidate": 2}
    assert all(
        c.passed and c.timer == "perf_counter" and c.correctness is not None
        for cs in checks.values()
        for c in cs
    )
    assert checks["baseline"][0].round == 1 and checks["baseline"][1].round >= 4


def test_refill_keeps_storage_and_modified_inputs_are_named() -> None:
    bench = ScaleBenchmark()
    params = bench.parse_params({"M": 4, "N": 3})
    inputs = bench.make_inputs(params, torch.device("cpu"), 0)
    pointers = {k: t.data_ptr() for k, t in inputs.items()}
    before = snapshot_inputs(inputs)
    assert before is not None and modified_inputs(before, inputs) == []
    fresh = bench.make_inputs(params, torch.device("cpu"), 1)
    assert refill_inputs(inputs, {**fresh, "y": torch.zeros(2)}) == ["y"]  # wrong shape: left alone
    assert {k: t.data_ptr() for k, t in inputs.items()} == pointers
    assert torch.equal(inputs["x"], fresh["x"]) and modified_inputs(before, inputs) == ["x"]
    inputs["x"].copy_(before["x"])
    inputs["x"][0, 0] = -0.0 if before["x"][0, 0] == 0 else before["x"][0, 0]
    assert modified_inputs(before, inputs) == []
    inputs["y"][1, 2] = torch.nextafter(before["y"][1, 2], torch.tensor(float("inf")))  # one ulp
    assert modified_inputs(before, inputs) == ["y"]


def test_a_replaced_timing_function_is_named() -> None:
    snapshot = integrity.Snapshot()
    assert snapshot.tampered() == []
    real = torch.cuda.Event.elapsed_time
    try:
        torch.cuda.Event.elapsed_time = lambda self, end: 0.0  # type: ignore[method-assign,assignment]
        assert snapshot.tampered() == ["torch.cuda.Event.elapsed_time"]
    finally:
        torch.cuda.Event.elapsed_time = real  # type: ignore[method-assign]
    assert snapshot.tampered() == []
    import kernelab.runners.timing

    code = kernelab.runners.timing.CpuTimer.time_ns.__code__
    try:
        kernelab.runners.timing.CpuTimer.time_ns.__code__ = (lambda self, fn, launches: 1.0).__code__
        assert snapshot.tampered() == ["kernelab.runners.timing.CpuTimer.time_ns"]
    finally:
        kernelab.runners.timing.CpuTimer.time_ns.__code__ = code
    assert snapshot.tampered() == []


class _CountingScale(ScaleBenchmark):
    def __init__(self) -> None:
        self.references = 0

    def reference(self, params: Any, inputs: dict[str, Any]) -> torch.Tensor:
        self.references += 1
        return super().reference(params, inputs)


def test_sides_that_share_inputs_share_the_reference_of_a_checkpoint() -> None:
    from kernelab.kernels.tolerances import Tolerance
    from kernelab.runners.sides import LocalSide
    from kernelab.runners.timing import CpuTimer

    bench, timer, cpu = _CountingScale(), CpuTimer(), torch.device("cpu")
    params = bench.parse_params({"M": 8, "N": 8, "work": 1})
    inputs = bench.make_inputs(params, cpu, 0)
    sides = [
        LocalSide(
            side=v,
            bench=bench,
            variant=v2,
            params=params,
            inputs=inputs,
            fn=bench.prepare(v2, params, inputs),
            timer=timer,
            device=cpu,
            tolerance=Tolerance(rtol=1e-5, atol=1e-5),
        )
        for v, v2 in (("baseline", "honest"), ("candidate", "wrong"))
    ]
    for side in sides:
        side.time_ns(1)
    references: dict[tuple[int, int], Any] = {}
    checks = [side.checked_sample(seed=5, rounds=1, launches=1, references=references) for side in sides]
    assert bench.references == 1  # one fresh input set, one reference, both sides checked against it
    assert checks[0].passed and not checks[1].passed
    assert [f.code for f in checks[1].findings] == ["wrong-under-timing"]
    sides[0].checked_sample(seed=6, rounds=2, launches=1)
    assert bench.references == 2


def test_a_clock_replaced_for_everyone_at_import_ends_each_cell_before_its_first_timing() -> None:
    """The benchmark's module made ``time.perf_counter_ns`` read 0 when it was imported: every
    cell is ``failed`` (``timer-tampered``, naming the function) with no sample, no check and no
    warm-up taken with it (the measuring process would otherwise time with a constant: on an
    H200 a constant ``elapsed_time`` hung the warm-up until the job's timeout)."""
    spec = cheat_spec("honest").model_copy(update={"benchmark": "cheats_clock_patch:ClockPatchedAtImport"})
    spec = spec.model_copy(update={"sweep": {"M": [64, 256]}})
    result = run_job(spec)
    comparison = compare(result)
    assert [c.verdict for c in comparison.cells] == ["failed", "failed"]
    for cell, judged in zip(result.cells, comparison.cells, strict=True):
        assert len(cell.samples) == 0 and cell.correctness == {} and "measure" not in cell.phase_s
        assert judged.reasons[0].code == "timer-tampered"
        assert "time.perf_counter_ns" in judged.reasons[0].message


def test_a_graph_the_timer_refused_is_replayed_and_checked() -> None:
    """The graph-replay check through the CPU (no CUDA here): a timer that, as the auto timer does
    for a capture holding memcpy nodes, refused the graph of the side's input set 1 and replays it
    as stale output. The checked sample of set 0, timed by the fallback and right, reports
    ``wrong-under-graph-replay`` naming why the graph was refused; a timer with no refused graph
    (the CPU timer) adds nothing."""
    from kernelab.kernels.tolerances import Tolerance
    from kernelab.runners.sides import LocalSide
    from kernelab.runners.timing import CpuTimer

    class RefusingTimer(CpuTimer):
        def __init__(self, refused: Any) -> None:
            super().__init__()
            self.refused, self.replays = refused, 0

        def rejected_graph(self, fn: Any) -> str | None:
            return "the captured graph holds 1 memcpy node" if fn is self.refused else None

        def replay_rejected(self, fn: Any) -> Any:
            self.replays += 1
            return torch.zeros(8, 8)  # what a replay of stale buffers leaves

    bench, cpu = ScaleBenchmark(), torch.device("cpu")
    params = bench.parse_params({"M": 8, "N": 8, "work": 1})
    sets = [bench.make_inputs(params, cpu, s) for s in (0, 1)]
    fns = [bench.prepare("honest", params, inputs) for inputs in sets]
    for timer, expected in ((RefusingTimer(fns[1]), ["wrong-under-graph-replay"]), (CpuTimer(), [])):
        tolerance = Tolerance(rtol=1e-5, atol=1e-5)
        side = LocalSide(side="candidate", bench=bench, variant="honest", params=params, inputs=sets[0],
                         fn=fns[0], timer=timer, device=cpu, tolerance=tolerance)  # fmt: skip
        side.add_input_set(sets[1], fns[1])
        side.time_ns(1)
        check = side.checked_sample(seed=5, rounds=1, launches=1)
        assert check.correctness is not None and check.correctness.passed  # the timed sample is right
        assert [f.code for f in check.findings] == expected and check.passed == (not expected)
        if expected:
            assert "memcpy node" in check.findings[0].message and "candidate" in check.findings[0].message
            assert timer.replays == 1  # type: ignore[attr-defined]
