"""Many input sets rotated between the sides (``measurement.input_sets``), driven through the engine
with fake sides (``fake_timing.FakeSide``) and judged by the real statistics (``compare_cell``).

The case they model was measured on an H200: output buffers of one kernel at four places in
device memory differ by -0.18% to +0.23% in time, under CUDA-graph replay and under events alike
(``docs/results/2026-12-03-h200-placement.md``). Each side's ``prepare`` allocates its own output
buffers, so that offset belongs to the side, not to the input set the rotation swaps."""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
from fake_timing import FakeClock, FakeSide, WarmData, uniform
from test_crosscheck_placement import job, measure, settings

from kernelab.kernels.base import Benchmark, Params
from kernelab.runners.cells import sets_that_fit
from kernelab.runners.engine import (
    MIN_BETWEEN_SETS,
    SWAP_EVERY_ROUNDS,
    LocalPairTimer,
    input_set,
    measure_interleaved,
    sets_for_budget,
)
from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import JobSpec, MeasurementSpec, Placement, Work
from kernelab.service.judge.estimators import (
    candidate_assignment,
    candidate_set,
    cluster_cis,
    paired_sets_ci,
    placement_strata,
)
from kernelab.service.judge.stats import compare_cell
from kernelab.service.judge.verdicts import placement_reasons

BUFFER_SD_NS = 1.5  # per-buffer offset, 0.15% of a 1 us launch: the H200's spread over four places


@pytest.mark.parametrize("sets", [2, 4, 8, 16])
def test_pairs_rotation_is_a_latin_rectangle_of_crossovers(sets: int) -> None:
    """Over one cycle of K assignments each side runs each of its sets once, each set serves the
    baseline once and the candidate once, the two sides are never on one set, and within each pair
    of sets (0, 1), (2, 3), ... the sides swap (a 2x2 crossover); with two sets it is the 2x2
    crossover (the candidate on 1 - a)."""
    rounds = range(0, SWAP_EVERY_ROUNDS * sets, SWAP_EVERY_ROUNDS)
    base = [input_set(r, "baseline", SWAP_EVERY_ROUNDS, sets) for r in rounds]
    cand = [input_set(r, "candidate", SWAP_EVERY_ROUNDS, sets) for r in rounds]
    assert sorted(base) == sorted(cand) == list(range(sets))
    assert all(b != c for b, c in zip(base, cand, strict=True))
    assert all(c == b ^ 1 for b, c in zip(base, cand, strict=True))
    if sets == 2:
        assert cand == [1 - b for b in base]
    strata = placement_strata(np.arange(SWAP_EVERY_ROUNDS * sets), sets, SWAP_EVERY_ROUNDS)
    assert strata is not None and sorted(Counter(strata.tolist()).values()) == [SWAP_EVERY_ROUNDS] * sets


def test_the_mapping_of_sets_follows_the_recorded_schedule() -> None:
    """A result measured under the cyclic schedule (stored before 2026-12-04, no ``schedule``
    field) is judged with its own mapping; the pairs schedule needs an even count of sets."""
    assert [candidate_set(a, 5, "cyclic") for a in range(5)] == [1, 2, 3, 4, 0]
    assert [candidate_assignment(s, 5, "cyclic") for s in range(5)] == [4, 0, 1, 2, 3]
    assert [candidate_set(a, 6, "pairs") for a in range(6)] == [1, 0, 3, 2, 5, 4]
    assert all(candidate_assignment(candidate_set(a, 8), 8) == a for a in range(8))
    assert Placement.model_validate({"input_sets": 5}).schedule == "cyclic"
    with pytest.raises(ValueError, match="even number of sets"):
        candidate_set(0, 5, "pairs")
    with pytest.raises(ValueError, match="input_sets"):
        Placement(input_sets=5, schedule="pairs")


def _scaled(script, factor: float):  # type: ignore[no-untyped-def]
    return lambda: script() * factor


def _warm_cell(sets: int, seed: int, cold_pct: float = 5.0, change: float = 0.0):  # type: ignore[no-untyped-def]
    """An A/A cell (or a ``change`` slower candidate) on input sets both sides share, whose data
    runs ``cold_pct`` slower when it was not run lately (``fake_timing.WarmData``)."""
    clock = FakeClock()
    cache = WarmData(1000.0, cold_pct, seed=seed)
    names = [f"s{k}" for k in range(sets)]
    scripts = {n: cache.script(n) for n in names}
    slower = {n: _scaled(f, 1 + change) for n, f in scripts.items()}
    sides = {"baseline": FakeSide(clock, names, scripts), "candidate": FakeSide(clock, names, slower)}
    spec = settings(cross_check=False, input_sets=sets, threshold_pct=1.0, target_ci_pct=0.1,
                    budget_ms=10_000, max_rounds=480, min_rounds=5)  # fmt: skip
    cell, _ = measure(sides, spec, clock)  # type: ignore[arg-type]
    return compare_cell(job(spec, cell), cell, {}), cell


def test_warm_data_carried_over_between_assignments_falls_on_both_sides_alike() -> None:
    """Shared input sets whose data runs 5% slower when cold (the CPU softmax A/A of 2026-12-03,
    where the candidate's slot read 1.5-3.8% slower): under the pairs schedule with mirrored
    blocks, 20 A/A cells give 0 ``faster``/``slower`` and ratios centred on 1, and a real +3% still
    reads ``slower``. Under the old cyclic schedule (the candidate always moved to the set run
    longest ago) the same cache makes every cell's candidate slower."""
    ratios = []
    verdicts = Counter()
    for seed in range(20):
        comparison, cell = _warm_cell(8, seed)
        verdicts[comparison.verdict] += 1
        ratios.append(comparison.ratio)
    assert verdicts["faster"] == verdicts["slower"] == 0, verdicts
    assert abs(float(np.mean(np.log(ratios)))) < 0.002, ratios
    real = Counter(_warm_cell(8, seed, change=0.03)[0].verdict for seed in range(5))
    assert real["slower"] == 5, real


def test_the_cyclic_schedule_carries_warm_data_against_the_candidate(monkeypatch: pytest.MonkeyPatch) -> None:
    """The case that the pairs schedule mends, kept as a test that can fail: the engine's rounds
    under the cyclic mapping, on the same cache, put the candidate on cold data after every change
    of assignment (its plain median ratio above 1 in every cell)."""
    import kernelab.runners.engine as engine

    monkeypatch.setattr(
        engine, "input_set",
        lambda r, v, swap=SWAP_EVERY_ROUNDS, k=2: (r // swap + (v == "candidate")) % k,
    )  # fmt: skip
    for seed in range(5):
        _, cell = _warm_cell(8, seed)
        times = np.asarray(cell.samples.duration_ns)
        cand = np.asarray(cell.samples.variant) == 1
        assert np.median(times[cand]) / np.median(times[~cand]) > 1.005


def _cell(sets: int, change: float, seed: int, **kw: object):  # type: ignore[no-untyped-def]
    """One cell whose every buffer (side x input set) has its own offset, N(0, 0.15%), and whose
    candidate is ``change`` slower on all of them; ±0.3% uniform noise per sample."""
    rng = np.random.default_rng(seed)
    names = {v: [f"{v[0]}{k}" for k in range(sets)] for v in ("baseline", "candidate")}
    centres = {
        b: 1000.0 * (1 + (change if v == "candidate" else 0.0)) + rng.normal(0, BUFFER_SD_NS)
        for v in names
        for b in names[v]
    }
    shared = {b: uniform(ns, 3.0, 100 * seed + i) for i, (b, ns) in enumerate(centres.items())}
    clock = FakeClock()
    sides = {v: FakeSide(clock, names[v], shared) for v in names}
    base: dict[str, object] = dict(
        cross_check=False, input_sets=sets, threshold_pct=0.25, target_ci_pct=0.1, budget_ms=10_000,
        max_rounds=400, min_rounds=5,
    )  # fmt: skip
    base.update(kw)
    spec = settings(**base)
    cell, _ = measure(sides, spec, clock)
    return compare_cell(job(spec, cell), cell, {}), cell, sides


def test_buffer_offsets_of_each_side_are_inside_the_interval_with_eight_sets() -> None:
    """A/A with per-buffer offsets: 0 of 20 cells read faster or slower at a 0.25% threshold; a
    real +0.5% reads ``slower`` in at least 19 of 20 (the sensitivity target). The old design (two
    sets, a change must show in both assignments) lost the real change in 8 of 20 here and read one
    A/A cell ``slower``: its CI does not cover the sides' own buffers."""
    aa = Counter(_cell(8, 0.0, seed)[0].verdict for seed in range(20))
    assert aa["faster"] == aa["slower"] == 0, aa
    real = Counter(_cell(8, 0.005, seed)[0].verdict for seed in range(20))
    assert real["slower"] >= 19, real
    two = Counter(_cell(2, 0.005, seed)[0].verdict for seed in range(20))
    assert two["slower"] < real["slower"], (two, real)


def test_every_side_runs_every_set_and_the_cell_records_them() -> None:
    comparison, cell, sides = _cell(8, 0.0, 3)
    assert cell.placement.input_sets == 8
    for v, side in sides.items():
        assert {b for _, b in side.log} == {f"{v[0]}{k}" for k in range(8)}
    assert comparison.ci_low is not None and comparison.ci_high is not None
    assert comparison.ci_low <= comparison.ratio <= comparison.ci_high  # type: ignore[operator]


def test_the_ci_may_end_the_cell_only_after_every_assignment_ran_twice() -> None:
    """Buffers without offsets and a loose CI target: the CI is narrow at once, but with eight sets
    the cell runs at least two cycles (2 x 3 x 8 rounds); with two sets it stops well before."""
    clock = FakeClock()
    names = {v: [f"{v[0]}{k}" for k in range(8)] for v in ("baseline", "candidate")}
    shared = {b: uniform(1000.0, 1.0, i) for i, b in enumerate(names["baseline"] + names["candidate"])}
    pair = LocalPairTimer({v: FakeSide(clock, names[v], shared) for v in names})  # type: ignore[arg-type]
    spec = settings(cross_check=False, target_ci_pct=5.0, min_rounds=5, max_rounds=1000)
    samples = measure_interleaved(pair, spec, clock=clock)
    # the CI is checked on its geometric schedule (every 20% more rounds), so the first check after
    # two cycles ends the cell
    assert 2 * SWAP_EVERY_ROUNDS * 8 <= int(samples.round.max()) + 1 <= 1.25 * 2 * SWAP_EVERY_ROUNDS * 8
    spec2 = settings(cross_check=False, target_ci_pct=5.0, min_rounds=5, max_rounds=1000, input_sets=2)
    clock2 = FakeClock()
    pair2 = LocalPairTimer({v: FakeSide(clock2, names[v][:2], shared) for v in names})  # type: ignore[arg-type]
    assert int(measure_interleaved(pair2, spec2, clock=clock2).round.max()) + 1 < 2 * SWAP_EVERY_ROUNDS * 8


def test_a_short_budget_rotates_fewer_sets() -> None:
    """Rounds of 2 ms (two 1 ms samples) and a 128 ms budget: 32 rounds in its half, two cycles
    of 5 sets, rounded down to 4 (the pairs schedule pairs the sets), not of 8. The cell records
    the sets it rotated, and its rounds rotate exactly those."""
    _, cell, sides = _cell(8, 0.0, 1, budget_ms=128.0)
    assert cell.placement.input_sets == 4 >= MIN_BETWEEN_SETS
    used = cell.placement.input_sets
    for v, side in sides.items():  # every set the rounds used was primed before them
        assert {b for _, b in side.log} >= {f"{v[0]}{k}" for k in range(4)}
    rounds = int(cell.samples.round.max()) + 1
    strata = placement_strata(np.arange(rounds), used, SWAP_EVERY_ROUNDS)
    assert strata is not None and set(strata.tolist()) == set(range(used))


@pytest.mark.parametrize(
    ("offered", "round_ms", "budget_ms", "want"),
    [
        (8, 1.0, 10_000, 8),  # 48 rounds in 48 ms
        (8, 10.0, 600, 4),  # 30 rounds in half the budget: 2 cycles of 5 sets, an even 4
        (8, 10.0, 720, 6),  # 36 rounds: 2 cycles of 6 sets
        (8, 10.0, 400, 2),  # 20 rounds: not even 2 cycles of 4 sets
        (2, 1.0, 10_000, 2),
        (1, 1.0, 10_000, 1),
        (8, math.nan, 10_000, 8),  # no estimate: max_rounds decides
    ],
)
def test_sets_for_budget(offered: int, round_ms: float, budget_ms: float, want: int) -> None:
    spec = MeasurementSpec(budget_ms=budget_ms)
    assert sets_for_budget(offered, round_ms * 1e6, spec) == want


def test_sets_for_budget_respects_max_rounds() -> None:
    assert sets_for_budget(8, 1e3, MeasurementSpec(max_rounds=30)) == 4  # 5 fit, an even 4
    assert sets_for_budget(8, 1e3, MeasurementSpec(max_rounds=36)) == 6


@pytest.mark.parametrize(
    ("set_bytes", "free", "wanted", "want"),
    [
        (1 << 30, 100 << 30, 8, 8),
        (1 << 30, 6 << 30, 8, 4),  # 3 more sets in half of 6 GiB
        (1 << 30, 1 << 30, 8, 1),  # not one more set fits in half the free memory
        (1 << 30, None, 8, 8),  # unknown free memory
        (0, 1 << 30, 8, 8),  # nothing measurable allocated
        (1 << 30, 100 << 30, 1, 1),
    ],
)
def test_sets_that_fit(set_bytes: int, free: int | None, wanted: int, want: int) -> None:
    assert sets_that_fit(set_bytes, free, wanted) == want


def test_paired_sets_interval_is_the_t_interval_of_the_per_set_differences() -> None:
    """Brute-force oracle for a result measured under the cyclic schedule: the Student-t interval by
    its definition, over d_s = log(candidate on set s / baseline on set s), where in assignment a
    the baseline ran set a and the candidate a + 1."""
    from scipy import stats

    base = {0: 1000.0, 1: 1100.0, 2: 950.0, 3: 1020.0}  # assignment a: the baseline on set a
    cand = {0: 1103.0, 1: 949.0, 2: 1024.0, 3: 1001.0}  # assignment a: the candidate on set a + 1
    d = np.log([cand[3] / base[0], cand[0] / base[1], cand[1] / base[2], cand[2] / base[3]])
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    got = paired_sets_ci(base, cand, 4, 0.95, "cyclic")
    assert got == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-12)
    # missing assignments leave out the sets they held: five sets, assignments 0-3 ran, so sets 1-3
    # are seen on both sides; with two pairs (one degree of freedom) there is no interval
    partial = paired_sets_ci(base, cand, 5, 0.95, "cyclic")
    d3 = np.log([cand[0] / base[1], cand[1] / base[2], cand[2] / base[3]])
    lo3, hi3 = stats.t.interval(0.95, 2, loc=d3.mean(), scale=stats.sem(d3))
    assert partial == pytest.approx((math.exp(lo3), math.exp(hi3)), rel=1e-12)
    assert paired_sets_ci({0: 1000.0, 1: 1100.0, 2: 950.0}, {0: 1103.0, 1: 949.0, 2: 1024.0}, 4, 0.95,
                          "cyclic") is None  # fmt: skip
    assert paired_sets_ci({0: 1.0}, {0: 1.0}, 4, 0.95, "cyclic") is None
    assert paired_sets_ci({0: 1.0, 1: math.nan, 2: 1.0}, {0: 1.0, 1: 1.0, 2: 1.0}, 3, 0.95, "cyclic") is None


def test_paired_sets_interval_under_pairs_is_the_two_period_crossover_analysis() -> None:
    """Oracle for the pairs schedule: the Hills-Armitage interval by its definition. The even sets
    ran baseline first (in the pair's first assignment), the odd sets candidate first; a +3% order
    effect on whichever side ran a set second cancels from the centre and from the spread, where a
    plain t-interval over the sets holds it."""
    from scipy import stats

    rng = np.random.default_rng(5)
    own = rng.normal(0, 0.002, 8)  # each set's own difference between the sides
    base, cand = {}, {}
    for a in range(8):  # assignment a: the baseline on set a, the candidate on set a ^ 1
        second = a % 2 == 1  # the pair's second assignment
        base[a] = 1000.0 * (1.03 if second else 1.0)
        cand[a] = 1000.0 * (1.03 if second else 1.0) * math.exp(own[a ^ 1])
    d = {s: math.log(cand[s ^ 1] / base[s]) for s in range(8)}
    even, odd = np.array([d[s] for s in range(0, 8, 2)]), np.array([d[s] for s in range(1, 8, 2)])
    assert even.mean() - odd.mean() > 0.05  # the order effect splits the two sequence groups
    pooled = (((even - even.mean()) ** 2).sum() + ((odd - odd.mean()) ** 2).sum()) / 6
    se = math.sqrt(pooled) / 2 * math.sqrt(1 / 4 + 1 / 4)
    centre = (even.mean() + odd.mean()) / 2
    lo, hi = stats.t.interval(0.95, 6, loc=centre, scale=se)
    got = paired_sets_ci(base, cand, 8, 0.95, "pairs")
    assert got == pytest.approx((math.exp(lo), math.exp(hi)), rel=1e-12)
    assert math.log(got[1] / got[0]) < 0.01  # type: ignore[index]
    plain = paired_sets_ci(base, cand, 8, 0.95, "cyclic")  # the same numbers read as independent sets
    assert plain is None or math.log(plain[1] / plain[0]) > math.log(got[1] / got[0])  # type: ignore[index]
    # one pair observed: no degrees of freedom left
    assert paired_sets_ci({0: 1.0, 1: 1.0}, {0: 1.0, 1: 1.0}, 8, 0.95, "pairs") is None


def _rotated_samples(per_set: np.ndarray, side_set: np.ndarray, sets: int) -> tuple[np.ndarray, ...]:
    """48 rounds x 2 samples of a cyclic rotation of ``sets`` sets; a sample's time is 1000 ns x
    the set's effect x the (side, set) effect, with little noise."""
    rng = np.random.default_rng(0)
    rounds = np.repeat(np.arange(48), 2)
    candidate = np.tile([False, True], 48)
    side = candidate.astype(int)
    used = np.array([input_set(int(r), "candidate" if c else "baseline", SWAP_EVERY_ROUNDS, sets)
                     for r, c in zip(rounds, candidate, strict=True)])  # fmt: skip
    durations = 1000.0 * per_set[used] * side_set[side, used] + rng.uniform(-0.2, 0.2, rounds.size)
    strata = placement_strata(rounds, sets, SWAP_EVERY_ROUNDS)
    assert strata is not None
    return candidate, rounds, durations, strata


def test_a_set_effect_both_sides_share_cancels_and_keeps_the_interval_narrow() -> None:
    """What the H200 showed for a one-element kernel: its time moved by up to 12% between input sets,
    whichever side ran them. The assignments' own ratios then differ by several percent, but the
    per-set differences do not: the CI stays narrow."""
    per_set = np.array([1.0, 1.02, 0.99, 0.95])
    candidate, rounds, durations, strata = _rotated_samples(per_set, np.ones((2, 4)), 4)
    cis = cluster_cis(
        candidate, rounds, durations, confidence=0.95, n_resamples=500, seed=1, strata=strata, between_sets=4
    )
    assert cis is not None and cis.ratio is not None
    assert max(cis.strata) / min(cis.strata) > 1.05  # the assignments disagree by set effects
    assert cis.ratio[0] == pytest.approx(1.0, abs=1e-3)
    assert cis.ratio[2] - cis.ratio[1] < 0.002


def test_each_sides_own_buffers_widen_the_interval() -> None:
    """Each side's own buffer on each set is off by ±0.2-0.4% (no common set effect): the
    stratified bootstrap alone gives a CI far narrower than that spread; with ``between_sets`` the
    CI holds the paired interval of the four sets."""
    side_set = np.array([[1.0, 1.002, 0.998, 1.0], [0.996, 1.0, 1.004, 1.002]])
    candidate, rounds, durations, strata = _rotated_samples(np.ones(4), side_set, 4)
    kw = dict(confidence=0.95, n_resamples=500, seed=1, strata=strata)
    narrow = cluster_cis(candidate, rounds, durations, **kw)  # type: ignore[arg-type]
    wide = cluster_cis(candidate, rounds, durations, between_sets=4, **kw)  # type: ignore[arg-type]
    assert narrow is not None and wide is not None and narrow.ratio is not None and wide.ratio is not None
    base = {a: float(np.median(durations[(strata == a) & ~candidate])) for a in range(4)}
    cand = {a: float(np.median(durations[(strata == a) & candidate])) for a in range(4)}
    t_lo, t_hi = paired_sets_ci(base, cand, 4, 0.95)  # type: ignore[misc]
    assert wide.ratio[0] == narrow.ratio[0]
    assert wide.ratio[1] == pytest.approx(min(narrow.ratio[1], t_lo)) and wide.ratio[1] < narrow.ratio[1]
    assert wide.ratio[2] == pytest.approx(max(narrow.ratio[2], t_hi)) and wide.ratio[2] > narrow.ratio[2]
    assert narrow.ratio[2] - narrow.ratio[1] < 0.002 < wide.ratio[2] - wide.ratio[1]


def test_a_set_effect_in_an_a_a_job_reads_same() -> None:
    """Through the engine: both sides share each set's inputs and the set moves the time by up to
    5% (the H200's one-element kernel); A/A reads ``same`` at the default 1% threshold."""
    clock = FakeClock()
    effect = [1.0, 1.02, 0.99, 0.95, 1.03, 0.97, 1.01, 0.98]
    names = {v: [f"{v[0]}{k}" for k in range(8)] for v in ("baseline", "candidate")}
    shared = {
        f"{v[0]}{k}": uniform(1000.0 * effect[k], 2.0, 10 * k + (v == "candidate"))
        for v in names
        for k in range(8)
    }
    sides = {v: FakeSide(clock, names[v], shared) for v in names}
    spec = settings(cross_check=False, max_rounds=200)
    cell, _ = measure(sides, spec, clock)
    c = compare_cell(job(spec, cell), cell, {})
    assert cell.placement.input_sets == 8
    assert c.verdict == "same", [r.message for r in c.reasons]


def test_the_per_placement_rule_applies_where_the_ci_does_not_cover_placement() -> None:
    """With two sets (or a rotation cut short) a change must show in every assignment; where the CI
    holds the paired interval it carries the spread instead."""
    assert [r.code for r in placement_reasons("slower", 1.005, [1.009, 1.001], 0.25)] == [
        "placement-disagreement"
    ]
    assert placement_reasons("slower", 1.005, [1.009, 1.001, 1.006, 1.004], 0.25, covered=True) == []


def test_a_rotation_the_budget_cut_short_falls_back_to_the_per_placement_rule() -> None:
    """What a loaded CPU did: four sets chosen, nine rounds run (three assignments, two sets seen
    on both sides). No paired interval (no degree of freedom); a 250x change still reads
    ``faster``, each assignment showing it, where the interval of two pairs had reached 1e-8..77."""
    rounds = np.repeat(np.arange(9), 2)
    candidate = np.tile([False, True], 9)
    rng = np.random.default_rng(4)
    durations = np.where(candidate, 4_000.0, 1_000_000.0) * rng.choice([1.0, 1.3, 8.0], rounds.size)
    strata = placement_strata(rounds, 4, SWAP_EVERY_ROUNDS)
    cis = cluster_cis(
        candidate, rounds, durations, confidence=0.95, n_resamples=500, seed=1, strata=strata, between_sets=4
    )
    assert cis is not None and cis.ratio is not None and not cis.placement_covered
    assert cis.ratio[2] < 0.01
    assert placement_reasons("faster", cis.ratio[0], list(cis.strata), 1.0, covered=False) == []


class _Recorded(Params):
    n: int = 4096


class _RecordingScale(Benchmark[_Recorded]):
    """``y = 2 x`` on a CPU, logging each ``make_inputs`` and ``prepare`` call in order."""

    name = "recording_scale"
    Params = _Recorded
    variants = ("a", "b")

    def __init__(self) -> None:
        self.calls: list[str] = []

    def make_inputs(self, params: _Recorded, device: Any, seed: int) -> dict[str, Any]:
        self.calls.append("inputs")
        g = torch.Generator(device=device).manual_seed(seed)
        return {"x": torch.rand(params.n, generator=g, device=device) + 0.5}

    def prepare(self, variant: str, params: _Recorded, inputs: dict[str, Any]) -> Any:
        self.calls.append(variant)
        x, y = inputs["x"], torch.empty_like(inputs["x"])
        return lambda: torch.mul(x, 2.0, out=y)

    def reference(self, params: _Recorded, inputs: dict[str, Any]) -> Any:
        return inputs["x"].double() * 2.0

    def work(self, params: _Recorded, variant: str) -> Work:
        return Work(flops=float(params.n), bytes_read=4.0 * params.n, bytes_written=4.0 * params.n)


def test_a_cpu_job_prepares_every_set_with_the_order_alternating() -> None:
    """``kernelab.runners.job``: four input sets, each its inputs then both sides' ``prepare``, the
    baseline first in sets 0 and 2 and the candidate first in 1 and 3 (neither side's buffers first
    more often); the cell records the four, and with ``placement: fixed`` there is one set."""
    bench = _RecordingScale()
    spec = JobSpec.model_validate(
        {
            "benchmark": "tests:RecordingScale", "baseline": {"variant": "a"}, "candidate": {"variant": "b"},
            "device": "cpu", "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
            "correctness": {"enabled": False},
            "measurement": {"input_sets": 4, "budget_ms": 5000, "warmup_ms": 5, "cross_check": False,
                            "target_ci_pct": 5},
        }
    )  # fmt: skip
    result = run_job(spec, isolate=False, bench=bench, device="cpu")
    assert result.cells[0].error is None, result.cells[0].error
    prepared = bench.calls[: 4 * 3]
    assert prepared == ["inputs", "a", "b", "inputs", "b", "a", "inputs", "a", "b", "inputs", "b", "a"]
    assert result.cells[0].placement.input_sets == 4
    bench.calls.clear()
    fixed = spec.model_copy(
        update={"measurement": spec.measurement.model_copy(update={"placement": "fixed"})}
    )
    result = run_job(fixed, isolate=False, bench=bench, device="cpu")
    assert bench.calls[:3] == ["inputs", "a", "b"] and "inputs" not in bench.calls[3:]
    assert result.cells[0].placement.input_sets == 1


def test_a_cut_short_rotation_of_shared_set_effects_is_judged_per_set() -> None:
    """A/A, four sets whose shared effects fall 1% per set (both sides alike), and the budget ended
    the cell after 10 rounds (assignments 0-2 and one round of 3, which is too short to count):
    the three assignments' geometric mean reads 0.9966, a ``faster`` at 0.25% by the assignments'
    rule. Judged by the pairs of sets both sides ran (the first pair's sets, the sides on the same
    sets), no change shows: ``inconclusive``, never ``faster``."""
    from kernelab.service.contract.schemas import CellResult, Placement, Sample

    effect = [1.00, 0.99, 0.98, 0.97]
    rng = np.random.default_rng(2)
    rows = []
    for r in range(10):
        order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        for position, side in enumerate(order):
            used = input_set(r, side, SWAP_EVERY_ROUNDS, 4)  # type: ignore[arg-type]
            ns = 1000.0 * effect[used] * (1 + rng.uniform(-2e-4, 2e-4))
            rows.append(Sample(variant=side, round=r, position=position, duration_ns=ns, launches=1000))  # type: ignore[arg-type]
    spec = settings(cross_check=False, threshold_pct=0.25, min_rounds=5)
    cell = CellResult(
        index=0,
        params={"M": 4, "N": 64},
        samples=rows,
        placement=Placement(input_sets=4, swap_every_rounds=3, schedule="pairs"),
    )
    c = compare_cell(job(spec, cell), cell, {})
    assert c.ratio is not None and c.ratio < 0.9975  # the assignments' geometric mean is biased
    assert c.verdict == "inconclusive", [r.code for r in c.reasons]
    assert "placement-disagreement" in [r.code for r in c.reasons]


def test_an_assignment_with_too_few_rounds_gives_no_verdict() -> None:
    """What the budget did to a CPU A/A (a one-time import inside the first stop check): 6 rounds
    under a rotation of 8 sets, 3 in each of the 2 assignments reached, candidate 10% slower by
    chance. Each assignment is bootstrapped within itself (3 rounds: 10 distinct resamples), so
    the cell is ``inconclusive`` (``too-few-rounds``, naming the assignments), never ``slower``;
    after two cycles (48 rounds, 6 in each assignment) the same 10% reads ``slower``."""
    from kernelab.service.contract.schemas import CellResult, Placement, Sample

    def cell(rounds: int) -> CellResult:
        rng = np.random.default_rng(9)
        rows = []
        for r in range(rounds):
            order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
            for position, side in enumerate(order):
                ns = 1000.0 * (1.10 if side == "candidate" else 1.0) * (1 + rng.uniform(-0.002, 0.002))
                rows.append(Sample(variant=side, round=r, position=position, duration_ns=ns, launches=8))  # type: ignore[arg-type]
        placement = Placement(input_sets=8, swap_every_rounds=3, schedule="pairs")
        return CellResult(index=0, params={"M": 4, "N": 64}, samples=rows, placement=placement)

    spec = settings(cross_check=False, threshold_pct=1.0, min_rounds=5)
    short = compare_cell(job(spec, cell(6)), cell(6), {})
    assert short.verdict == "inconclusive" and short.reasons[0].code == "too-few-rounds"
    assert "over 2 of the 8 input-set assignments, the fewest 3" in short.reasons[0].message
    enough = compare_cell(job(spec, cell(48)), cell(48), {})
    assert enough.verdict == "slower", [r.message for r in enough.reasons]


def test_the_median_says_which_median_it_is() -> None:
    """Under rotation a side's ``median_ns`` is the set-balanced median (the geometric mean of the
    assignments' medians, which the ratio is formed from), named so in ``estimator``, with the
    pooled median beside it; the table and the Markdown say what "median" means when they differ.
    One input set: a plain median, equal to the pooled one, and no note."""
    from kernelab.service.judge.report import estimator_note, format_table, to_markdown
    from kernelab.service.judge.stats import compare

    comparison, cell, _ = _cell(8, 0.0, 4)
    assert comparison.baseline.estimator == comparison.candidate.estimator == "set-balanced median"
    kept = np.asarray(cell.samples.duration_ns)[np.asarray(cell.samples.variant) == 0]
    assert comparison.baseline.pooled_median_ns == pytest.approx(float(np.median(kept)))
    assert comparison.baseline.median_ns != comparison.baseline.pooled_median_ns
    whole = compare(job(settings(cross_check=False, input_sets=8), cell))
    note = estimator_note(whole)
    assert note is not None and "set-balanced" in note and "pooled" in note
    assert note in format_table(whole) and "set-balanced median" in to_markdown(whole)
    fixed, fixed_cell, _ = _cell(8, 0.0, 4, placement="fixed")
    assert fixed.baseline.estimator == "median"
    assert fixed.baseline.median_ns == fixed.baseline.pooled_median_ns
    assert estimator_note(compare(job(settings(cross_check=False, placement="fixed"), fixed_cell))) is None
