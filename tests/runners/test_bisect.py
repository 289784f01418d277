"""``kernelab bisect``'s rules without a server: the search over commits (``Bisection``) against an
oracle for every position of the first bad commit, what an undecided step does, and how a
finished step's job and comparison are judged (``judge``)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Literal

import pytest

from kernelab.runners.bisect import MAX_ATTEMPTS, Bisection, judge, steps_needed
from kernelab.service.contract.schemas import (
    BisectCommit,
    CellComparison,
    Comparison,
    JobPublic,
    JobSpec,
    NodeInfo,
    SideStats,
)

Outcome = Literal["good", "bad", "undecided"]


def _commits(n: int) -> list[BisectCommit]:
    return [BisectCommit(sha=f"{i:04x}" * 10, subject=f"commit {i}") for i in range(n)]


def _drive(search: Bisection, oracle: dict[str, list[Outcome]]) -> list[str]:
    """Run the search, each commit's outcomes taken in turn from ``oracle``; the commits tested."""
    tested = []
    while (commit := search.next()) is not None:
        tested.append(commit.sha)
        search.record(oracle[commit.sha].pop(0), f"outcome of {commit.subject}")
    return tested


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 9, 16])
def test_finds_the_first_bad_commit_wherever_it_is_in_log2_steps(n: int) -> None:
    commits = _commits(n)
    for first_bad in range(n):
        oracle: dict[str, list[Outcome]] = {
            c.sha: ["bad" if i >= first_bad else "good"] * 4 for i, c in enumerate(commits)
        }
        search = Bisection(commits)
        tested = _drive(search, oracle)
        assert search.first_bad == commits[first_bad] and search.stopped is None
        assert tested[0] == commits[-1].sha  # the ends are checked first
        assert len(tested) <= steps_needed(n) == (1 + math.ceil(math.log2(n)) if n > 1 else 1)


def test_an_undecided_step_is_run_once_more_and_then_the_bisect_stops_saying_where() -> None:
    commits = _commits(8)
    oracle: dict[str, list[Outcome]] = {c.sha: ["bad"] for c in commits}
    mid = commits[3]
    oracle[mid.sha] = ["undecided", "good"]  # a second attempt decides it
    oracle[commits[5].sha] = ["undecided", "undecided"]  # this one never decides
    search = Bisection(commits)
    tested = _drive(search, oracle)
    assert tested.count(mid.sha) == MAX_ATTEMPTS == 2
    assert tested.count(commits[5].sha) == 2
    assert search.first_bad is None and search.stopped is not None
    assert f"could not decide {commits[5].sha[:12]}" in search.stopped
    # after the last good commit (3), at or before the first bad one known (the bad end, 7)
    assert f"after {commits[3].sha[:12]}, at or before {commits[7].sha[:12]}" in search.stopped


def test_ends_not_slower_stops_with_the_reason() -> None:
    commits = _commits(5)
    search = Bisection(commits)
    assert _drive(search, {commits[-1].sha: ["good"]}) == [commits[-1].sha]
    assert search.first_bad is None and search.stopped is not None
    assert "is not slower than the good end" in search.stopped


def _job(status: str = "succeeded", error: str | None = None) -> JobPublic:
    spec = JobSpec.model_validate({"benchmark": "softmax", "baseline": {"variant": "torch"},
                                   "candidate": {"variant": "triton"}})  # fmt: skip
    return JobPublic(id=7, name="", benchmark="softmax", status=status, spec=spec, attempts=1,  # type: ignore[arg-type]
                     max_attempts=3, created_at=datetime(2026, 12, 1, tzinfo=UTC), error=error)  # fmt: skip


def _comparison(*cells: tuple[str, float]) -> Comparison:
    side = SideStats(n=10, median_ns=100.0)
    return Comparison(
        benchmark="softmax", baseline_label="a", candidate_label="b", threshold_pct=1.0, timer="perf_counter",
        node=NodeInfo(hostname="h", device_type="cpu"),
        cells=[CellComparison(index=i, params={"N": i}, label=f"N={i}", baseline=side, candidate=side,
                              verdict=v, ratio=r, ci_low=r * 0.99, ci_high=r * 1.01)  # type: ignore[arg-type]
               for i, (v, r) in enumerate(cells)],
    )  # fmt: skip


def test_judge_slower_is_bad_with_the_slowest_cell_as_evidence() -> None:
    j = judge(_job(), _comparison(("same", 1.0), ("slower", 2.5), ("slower", 4.0), ("inconclusive", 1.1)))
    assert (j.outcome, j.verdict, j.cell, j.ratio) == ("bad", "slower", "N=2", 4.0)
    assert j.ci_low == pytest.approx(3.96) and j.summary == {"same": 1, "slower": 2, "inconclusive": 1}


def test_judge_good_needs_every_cell_same_or_faster() -> None:
    assert judge(_job(), _comparison(("same", 1.0), ("faster", 0.5))).outcome == "good"
    inconclusive = judge(_job(), _comparison(("same", 1.0), ("inconclusive", 1.1)))
    assert inconclusive.outcome == "undecided" and inconclusive.cell == "N=1"


@pytest.mark.parametrize("verdict", ["failed", "incorrect", "nondeterministic", "implausible"])
def test_judge_a_problem_cell_is_undecided_even_beside_a_slower_one(verdict: str) -> None:
    j = judge(_job(), _comparison(("slower", 3.0), (verdict, 3.0)))
    assert j.outcome == "undecided" and j.verdict == verdict and j.reason.startswith(f"N=1: {verdict}: ")


def test_judge_a_failed_or_cancelled_job_is_undecided() -> None:
    failed = judge(_job("failed", "revision does not build\nmore"), None)
    assert failed.outcome == "undecided" and failed.reason == "job #7 failed: revision does not build"
    assert judge(_job("cancelled"), None).reason == "job #7 cancelled: no comparison"
