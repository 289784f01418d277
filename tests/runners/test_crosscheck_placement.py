"""The timer cross-check and the rotating input-set placement, driven through the engine with fake
sides (``fake_timing.FakeSide``: readings scripted per buffer set, on the engine's fake clock) and
judged by the real statistics (``kernelab.service.judge.stats.compare_cell``)."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import numpy as np
import pytest
from fake_timing import FakeClock, FakeSide, Script, uniform

from kernelab.runners.engine import (
    SWAP_EVERY_ROUNDS,
    LocalPairTimer,
    cross_check,
    input_set,
    measure_interleaved,
    placement_of,
    round_order,
)
from kernelab.runners.timing import TimerUnsupported
from kernelab.service.contract.schemas import (
    CellResult,
    JobResult,
    JobSpec,
    MeasurementSpec,
    NodeInfo,
    Placement,
)
from kernelab.service.judge.stats import compare_cell

T0 = datetime(2026, 12, 1, tzinfo=UTC)
NOISE_NS = 3.0  # ±0.3% uniform noise on a 1 us launch


def settings(**kw: object) -> MeasurementSpec:
    base: dict[str, object] = dict(
        warmup_ms=1, budget_ms=2_000, min_rounds=20, max_rounds=60, target_ci_pct=0.05, min_time_ms=0
    )
    base.update(kw)
    return MeasurementSpec.model_validate(base)


def job(spec: MeasurementSpec, cell: CellResult) -> JobResult:
    job_spec = JobSpec.model_validate(
        {
            "benchmark": "softmax",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "torch"},
            "sweep": {"M": [4], "N": [64]},
            "device": "cpu",
            "measurement": spec.model_dump(),
            "correctness": {"enabled": False},
        }
    )
    return JobResult(
        idempotency_key="crosscheck-test-0001", spec=job_spec,
        node=NodeInfo(hostname="node-a", device_type="cpu", device_name="cpu"),
        timer="fake", started_at=T0, finished_at=T0, cells=[cell],
    )  # fmt: skip


def measure(
    sides: dict[str, FakeSide], spec: MeasurementSpec, clock: FakeClock
) -> tuple[CellResult, LocalPairTimer]:
    """One cell through the engine (rounds, then the cross-check), as ``run_cell`` records it."""
    pair = LocalPairTimer(sides)  # type: ignore[arg-type]
    cell = CellResult(index=0, params={"M": 4, "N": 64}, placement=placement_of(pair, spec))
    cell.samples = measure_interleaved(pair, spec, clock=clock)
    cell.placement = placement_of(pair, spec)  # the sets the rounds rotated (the budget may cut them)
    cell.cross_check = cross_check(pair, cell.samples, spec)
    cell.timers = {v: pair.timer_kind(v) for v in sides}  # type: ignore[arg-type]
    return cell, pair


def scripts(centres: dict[str, float], seed: int) -> dict[str, Script]:
    return {name: uniform(ns, NOISE_NS, seed + i) for i, (name, ns) in enumerate(centres.items())}


def test_input_set_rotation_is_a_crossover() -> None:
    """Each side meets each set equally often in every swap cycle, the two sides never on one set."""
    cycle = 2 * SWAP_EVERY_ROUNDS
    for start in range(0, 4 * cycle, cycle):
        sets = {v: [input_set(r, v) for r in range(start, start + cycle)] for v in ("baseline", "candidate")}
        assert sets["baseline"] == [0] * SWAP_EVERY_ROUNDS + [1] * SWAP_EVERY_ROUNDS
        assert all(b != c for b, c in zip(sets["baseline"], sets["candidate"], strict=True))


def test_warm_data_falls_on_both_sides_alike() -> None:
    """The samples that follow one of their own side on the same input set (its data warm in a
    cache) are as many for the baseline as for the candidate, and the mean round position of each
    side is the same over a swap cycle (a linear drift cancels), under ABBA with rotation."""
    spec = settings()
    rng = np.random.default_rng(0)
    sequence = [
        (v, r, input_set(r, v)) for r in range(12 * SWAP_EVERY_ROUNDS) for v in round_order(r, spec, rng)
    ]
    warm = {"baseline": 0, "candidate": 0}
    for (prev_side, _, prev_set), (side, _, used) in zip(sequence, sequence[1:], strict=False):
        warm[side] += prev_side == side and prev_set == used
    assert warm["baseline"] == warm["candidate"] > 0
    positions = {v: [i for i, (s, _, _) in enumerate(sequence) if s == v] for v in ("baseline", "candidate")}
    assert np.mean(positions["baseline"]) == pytest.approx(np.mean(positions["candidate"]), abs=0.5)


@pytest.mark.parametrize(
    "fast",
    [
        {"b0", "c1"},  # allocated first in each set (the set's prepare order is reversed in set 1)
        {"b0", "c0"},  # set 0 fast, set 1 slow, whoever runs it
    ],
)
def test_placement_effect_reads_slower_fixed_and_same_rotated(fast: set[str]) -> None:
    """A/A: the time depends only on which buffer set runs (+1.5% on the slow ones, beyond the 1%
    threshold). With each side on its own buffers the candidate reads ``slower``; with the sets
    rotated between the sides the same code reads ``same``, with a CI that covers 1."""
    centres = {b: (1000.0 if b in fast else 1015.0) for b in ("b0", "b1", "c0", "c1")}
    # fixed: each side times its set 0 only; the candidate's set 0 is the slow one of the pair
    clock = FakeClock()
    slow_c = "c0" if "c0" not in fast else "c1"
    shared = scripts(centres, seed=1)
    fixed = {"baseline": FakeSide(clock, ["b0"], shared), "candidate": FakeSide(clock, [slow_c], shared)}
    spec = settings(placement="fixed", cross_check=False)
    cell, _ = measure(fixed, spec, clock)
    before = compare_cell(job(spec, cell), cell, {})
    assert cell.placement.input_sets == 1
    assert before.verdict == "slower" and before.ratio == pytest.approx(1.015, abs=0.003)

    clock = FakeClock()
    shared = scripts(centres, seed=1)
    rotated = {
        "baseline": FakeSide(clock, ["b0", "b1"], shared),
        "candidate": FakeSide(clock, ["c0", "c1"], shared),
    }
    spec = settings(cross_check=False)
    cell, _ = measure(rotated, spec, clock)
    after = compare_cell(job(spec, cell), cell, {})
    assert cell.placement == Placement(input_sets=2, swap_every_rounds=SWAP_EVERY_ROUNDS, schedule="pairs")
    assert after.verdict == "same", [r.message for r in after.reasons]
    assert after.ci_low is not None and after.ci_high is not None
    assert 0.99 <= after.ci_low <= 1.0 <= after.ci_high <= 1.01
    # every buffer set ran, and each side ran both of its own
    runs = {v: {b for _, b in s.log} for v, s in rotated.items()}
    assert runs == {"baseline": {"b0", "b1"}, "candidate": {"c0", "c1"}}


def test_rotation_keeps_a_real_change() -> None:
    """A candidate 3% slower on every buffer, with a 1.5% placement effect on top: rotated, the
    ratio is the code's 1.03, not 1.03 x 1.015."""
    clock = FakeClock()
    base = {"b0": 1000.0, "b1": 1015.0}
    cand = {"c0": 1030.0 * 1.015, "c1": 1030.0}
    shared = scripts({**base, **cand}, seed=5)
    sides = {
        "baseline": FakeSide(clock, ["b0", "b1"], shared),
        "candidate": FakeSide(clock, ["c0", "c1"], shared),
    }
    spec = settings(cross_check=False)
    cell, _ = measure(sides, spec, clock)
    c = compare_cell(job(spec, cell), cell, {})
    assert c.verdict == "slower"
    assert c.ratio == pytest.approx(1.03, abs=0.003)


def two_sides(
    clock: FakeClock, primary: tuple[float, float], cross: tuple[float, float] | None, **kw: object
) -> dict[str, FakeSide]:
    names = {"baseline": "b", "candidate": "c"}
    out = {}
    for i, (v, name) in enumerate(names.items()):
        p = {name: uniform(primary[i], NOISE_NS * primary[i] / 1000, 10 + i)}
        x = None if cross is None else {name: uniform(cross[i], NOISE_NS * cross[i] / 1000, 20 + i)}
        out[v] = FakeSide(clock, [name], p, kind="cuda-graph", cross_ns=x, cross_kind="cuda-event", **kw)  # type: ignore[arg-type]
    return out


def judged(primary: tuple[float, float], cross: tuple[float, float] | None, **kw: object):  # type: ignore[no-untyped-def]
    clock = FakeClock()
    spec = settings(placement="fixed", **kw.pop("spec", {}))  # type: ignore[arg-type]
    cell, pair = measure(two_sides(clock, primary, cross, **kw), spec, clock)
    return cell, compare_cell(job(spec, cell), cell, {})


def test_cross_check_agreeing_methods_leave_the_verdict() -> None:
    cell, c = judged((1000.0, 1050.0), (1010.0, 1061.0))
    assert cell.cross_check is not None and cell.cross_check.methods == {
        "baseline": "cuda-event",
        "candidate": "cuda-event",
    }
    assert len(cell.cross_check.samples_ns["baseline"]) == cell.cross_check.rounds == 10
    assert c.cross_check is not None and not c.cross_check.disagrees
    assert c.cross_check.cross_ratio == pytest.approx(1.05, abs=0.003)
    assert c.verdict == "slower" and "timer-disagreement" not in c.flags


def test_cross_check_disagreement_with_agreeing_ratios_keeps_the_verdict_and_is_a_note() -> None:
    """The other method reads both sides 30% slower (a fixed cost per launch), ratio still 1.05:
    the verdict stands, both figures kept, and the difference is told in the reasons, not raised
    as a flag (a badge that neither changes nor qualifies the verdict says nothing: it was on every
    honest small-kernel cell of an H200)."""
    cell, c = judged((1000.0, 1050.0), (1300.0, 1365.0))
    assert c.cross_check is not None and c.cross_check.disagrees and c.cross_check.ratio_agrees
    assert c.cross_check.difference_pct["baseline"] == pytest.approx(30.0, abs=1.0)
    assert c.verdict == "slower"
    assert "timer-disagreement" not in c.flags
    assert [r.code for r in c.reasons if r.code.startswith("timer-")] == ["timer-disagreement-ratio-agrees"]


def test_cross_check_disagreeing_ratios_make_the_cell_inconclusive() -> None:
    """The graph-copy case: the spec's method reads 1.05, the other 1.60 (a memcpy node replayed
    slow on one side): the method decides the verdict, so none is given."""
    cell, c = judged((1000.0, 1050.0), (1500.0, 2400.0))
    assert c.cross_check is not None and c.cross_check.disagrees and c.cross_check.ratio_agrees is False
    assert c.verdict == "inconclusive"
    assert c.timing_verdict == "slower"
    deciding = c.reasons[0]
    assert deciding.code == "timer-disagreement"
    assert re.search(r"ratio 1\.0[45]\d* vs 1\.60", deciding.message), deciding.message


def test_cross_check_direction_counts() -> None:
    """Ratios 0.97 and 1.02 (within 5% of each other in size) disagree in direction: inconclusive."""
    _, c = judged((1000.0, 970.0), (1200.0, 1224.0))
    assert c.cross_check is not None and c.cross_check.disagrees
    assert c.verdict == "inconclusive"


def test_cross_check_unavailable_is_told_not_flagged() -> None:
    cell, c = judged(
        (1000.0, 1050.0), None, cross_error=TimerUnsupported("the captured graph holds 1 memcpy node")
    )
    assert cell.cross_check is not None and "memcpy" in (cell.cross_check.error or "")
    assert c.cross_check is not None and c.cross_check.error is not None
    assert c.verdict == "slower" and "timer-disagreement" not in c.flags
    cell, c = judged((1000.0, 1050.0), None)  # one method on this device: nothing to cross-check
    assert cell.cross_check is None and c.cross_check is None and c.verdict == "slower"


def test_cross_check_off() -> None:
    cell, c = judged((1000.0, 1050.0), (1500.0, 2400.0), spec={"cross_check": False})
    assert cell.cross_check is None and c.cross_check is None and c.verdict == "slower"


def test_cross_check_tolerance_is_the_spec_field() -> None:
    """The sides 4% and 9% apart under the two methods: within a 20% allowance the methods agree.
    At the default 5%, sides 10% and 20% apart disagree, and the ratios 1.05 vs 1.15 (9.5% apart in
    size) do not agree: inconclusive; 1.05 vs 1.10 (4.8% apart) agree: the verdict stands."""
    _, c = judged((1000.0, 1050.0), (1040.0, 1144.0), spec={"cross_check_pct": 20.0})
    assert c.cross_check is not None and not c.cross_check.disagrees and c.verdict == "slower"
    _, c = judged((1000.0, 1050.0), (1100.0, 1265.0))
    assert c.cross_check is not None and c.cross_check.disagrees and c.verdict == "inconclusive"
    _, c = judged((1000.0, 1050.0), (1100.0, 1210.0))
    assert c.cross_check is not None and c.cross_check.disagrees and c.cross_check.ratio_agrees
    assert c.verdict == "slower"


def test_cross_check_rotates_with_the_rounds() -> None:
    clock = FakeClock()
    shared = scripts({"b0": 1000.0, "b1": 1000.0, "c0": 1000.0, "c1": 1000.0}, seed=3)
    sides = {
        "baseline": FakeSide(clock, ["b0", "b1"], shared, cross_ns=shared),
        "candidate": FakeSide(clock, ["c0", "c1"], shared, cross_ns=shared),
    }
    spec = settings()
    cell, _ = measure(sides, spec, clock)
    crossed = {v: {b for m, b in s.log if m == "fake-other"} for v, s in sides.items()}
    assert crossed == {"baseline": {"b0", "b1"}, "candidate": {"c0", "c1"}}
    assert all(s.current == 0 for s in sides.values())  # left on set 0 for the checks


def test_ratios_agree_reads_the_cross_ratio_with_its_interval() -> None:
    """A short cross measurement is noisy: its ratio agrees in direction when its interval reaches
    the primary verdict's region (one-element kernel on the H200: graph 1.0014, events 1.0225 over
    10 rounds), not when the whole interval lies beyond it; in size when its interval reaches the
    tolerance band around the primary ratio, not when it lies clear of it."""
    from kernelab.service.judge.verdicts import ratios_agree

    assert ratios_agree(1.0014, 1.0225, tolerance_pct=5.0, cross_ci=(0.99, 1.05))
    assert not ratios_agree(1.0014, 1.0225, tolerance_pct=5.0, cross_ci=(1.015, 1.03))
    assert not ratios_agree(1.0014, 1.0225, tolerance_pct=5.0)  # no interval: the point decides
    assert not ratios_agree(1.05, 1.60, tolerance_pct=5.0, cross_ci=(1.45, 1.75))  # size
    assert ratios_agree(1.05, 1.60, tolerance_pct=5.0, cross_ci=(1.0, 2.0))  # too noisy to show it
    assert ratios_agree(0.90, 0.93, tolerance_pct=5.0, cross_ci=(0.92, 0.94))
    assert not ratios_agree(0.98, 1.02, tolerance_pct=5.0, cross_ci=(1.015, 1.025), threshold_pct=1.0)


def test_a_noisy_short_cross_check_of_an_a_a_cell_does_not_unmake_same() -> None:
    """A/A whose primary ratio is 1.000 and whose 10-round cross measurement reads 0.93 with a 95%
    interval [0.86, 1.01] (one-element kernel on an H200: the events add launch jitter): the
    sizes differ by 7% at a 5% tolerance by the points alone, but the cross interval reaches the
    tolerance band, so the ratios agree and the cell reads ``same``; a cross interval clear of the
    band ([1.50, 1.70]) still disagrees."""
    from kernelab.service.judge.verdicts import ratios_agree

    assert ratios_agree(1.0, 0.93, tolerance_pct=5.0, threshold_pct=2.0, cross_ci=(0.86, 1.01))
    assert not ratios_agree(1.0, 0.93, tolerance_pct=5.0, threshold_pct=2.0)
    assert not ratios_agree(1.0, 1.60, tolerance_pct=5.0, threshold_pct=2.0, cross_ci=(1.50, 1.70))
    assert not ratios_agree(0.95, 1.06, tolerance_pct=12.0, threshold_pct=1.0, cross_ci=(1.02, 1.10))  # way
