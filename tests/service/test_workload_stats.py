"""Workload verdicts (``kernelab.service.judge.workload_stats``) on results built here: phases and
metrics across paired runs, the precedence (absent > too few pairs > CI), per-rank times, the
consistency table, the sick-node signature and a probe that changed between runs."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime

import numpy as np
import pytest

from kernelab.runners.workload import run_order
from kernelab.service.contract.schemas import (
    GpuTelemetry,
    NodeInfo,
    ProbeReport,
    WorkloadResult,
    WorkloadRun,
    WorkloadSpec,
)
from kernelab.service.judge.workload_report import format_workload, workload_markdown
from kernelab.service.judge.workload_stats import MIN_PAIRS, SICK_RATIO, compare_workload

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _spec(runs: int, **kw: object) -> WorkloadSpec:
    return WorkloadSpec.model_validate(
        {
            "kind": "workload",
            "baseline": {"command": ["a.py"]},
            "candidate": {"command": ["b.py"]},
            "runs": runs,
            "threshold_pct": 5,
            **kw,
        }
    )


def _digest(name: str, values: np.ndarray, rank: int = 0) -> dict[str, object]:
    a = np.ascontiguousarray(values, dtype=np.float32)
    return {
        "type": "digest",
        "name": name,
        "rank": rank,
        "dtype": "float32",
        "shape": list(a.shape),
        "sha256": hashlib.sha256(a.tobytes()).hexdigest(),
        "values_b64": base64.b64encode(a.astype("<f8").tobytes()).decode(),
    }


def _run(
    index: int,
    side: str,
    phases: dict[str, list[float]],
    *,
    metric: float | None = None,
    digest: np.ndarray | None = None,
    outcome: str = "ok",
    probe: ProbeReport | None = None,
) -> WorkloadRun:
    records: list[dict[str, object]] = []
    for name, per_rank in phases.items():
        records += [{"type": "phase", "name": name, "rank": r, "seconds": s} for r, s in enumerate(per_rank)]
    if metric is not None:
        records.append({"type": "metric", "name": "tokens_per_s", "value": metric, "unit": "tok/s"})
    if digest is not None:
        records.append(_digest("logprobs", digest))
    return WorkloadRun.model_validate(
        {
            "index": index,
            "side": side,
            "started_at": NOW,
            "wall_s": 1.0,
            "outcome": outcome,
            "records": records,
            "probe_after": probe,
        }
    )


def _result(
    spec: WorkloadSpec,
    runs: list[WorkloadRun],
    *,
    before: ProbeReport | None = None,
    device_type: str = "cpu",
) -> WorkloadResult:
    return WorkloadResult(
        spec=spec,
        node=NodeInfo(hostname="n", device_type=device_type),
        runs=runs,  # type: ignore[arg-type]
        probe_before=before,
    )


def _paired(
    spec: WorkloadSpec, base: float, cand: float, *, noise: float = 0.01, seed: int = 1, **run_kw: object
) -> list[WorkloadRun]:
    rng = np.random.default_rng(seed)
    out = []
    for i, side in enumerate(run_order(spec)):
        t = (base if side == "baseline" else cand) * (1 + noise * rng.standard_normal())
        out.append(_run(i, side, {"rollout": [t, 1.1 * t], "train": [t / 2, t / 2]}, **run_kw))  # type: ignore[arg-type]
    return out


def test_run_order_pairs_hold_one_run_of_each_arm() -> None:
    for order in ("abba", "random"):
        spec = _spec(6, order=order, seed=3)
        seq = run_order(spec)
        assert len(seq) == 12
        assert all({seq[2 * k], seq[2 * k + 1]} == {"baseline", "candidate"} for k in range(6))
    assert run_order(_spec(4))[:4] == ["baseline", "candidate", "candidate", "baseline"]


def test_slower_candidate_is_slower_with_the_slowest_rank_named() -> None:
    spec = _spec(MIN_PAIRS + 1)
    c = compare_workload(_result(spec, _paired(spec, 1.0, 1.5)))
    rollout = next(q for q in c.quantities if q.name == "rollout")
    assert rollout.verdict == "slower"
    assert rollout.ci_low is not None and rollout.ci_low > 1.05
    assert rollout.candidate.median == pytest.approx(1.5 * 1.1, rel=0.05)  # the slowest rank's seconds
    assert {r.side: r.slowest_rank for r in rollout.ranks} == {"baseline": 1, "candidate": 1}
    assert c.flags == []


def test_same_within_threshold() -> None:
    spec = _spec(MIN_PAIRS + 3)
    c = compare_workload(_result(spec, _paired(spec, 1.0, 1.0, noise=0.002)))
    assert {q.verdict for q in c.quantities} == {"same"}


def test_few_pairs_are_inconclusive_however_large_the_change() -> None:
    spec = _spec(MIN_PAIRS - 1)
    c = compare_workload(_result(spec, _paired(spec, 1.0, 3.0)))
    for q in c.quantities:
        assert q.verdict == "inconclusive"
        assert q.reasons[0].code == "too-few-runs"


def test_higher_metric_is_better() -> None:
    spec = _spec(MIN_PAIRS + 1)
    runs = [
        _run(i, s, {"rollout": [1.0]}, metric=100.0 * (1.3 if s == "candidate" else 1.0) + i * 0.01)
        for i, s in enumerate(run_order(spec))
    ]
    metric = next(q for q in compare_workload(_result(spec, runs)).quantities if q.kind == "metric")
    assert metric.verdict == "better" and metric.delta_pct == pytest.approx(30, abs=1)


def test_a_crashed_run_is_recorded_and_an_arm_without_finished_runs_fails() -> None:
    spec = _spec(2)
    runs = [
        _run(0, "baseline", {"rollout": [1.0]}),
        _run(1, "candidate", {"rollout": [0.5]}, outcome="crashed"),
        _run(2, "candidate", {}, outcome="timeout"),
        _run(3, "baseline", {"rollout": [1.0]}),
    ]
    c = compare_workload(_result(spec, runs))
    assert c.quantities[0].verdict == "failed" and c.quantities[0].reasons[0].code == "absent"
    assert any(n.code == "runs-failed" and "run 1 (candidate) crashed" in n.message for n in c.notes)
    assert [line.outcome for line in c.timeline] == ["ok", "crashed", "timeout", "ok"]


def test_consistency_between_arms_and_across_runs() -> None:
    spec = _spec(2)
    x = np.linspace(-1, 1, 50, dtype=np.float32)
    y = x.copy()
    y[[3, 7]] += np.float32(0.25)
    runs = [
        _run(i, s, {"p": [1.0]}, digest=x if s == "baseline" else y) for i, s in enumerate(run_order(spec))
    ]
    rows = {(r.against, r.side): r for r in compare_workload(_result(spec, runs)).consistency}
    arms = rows[("arms", None)]
    assert (arms.mismatches, arms.elements, arms.bitwise_equal) == (2, 50, False)
    assert arms.max_abs_diff == pytest.approx(0.25, rel=1e-6)
    assert rows[("runs", "baseline")].bitwise_equal is True and rows[("runs", "baseline")].mismatches == 0


def test_sick_node_run_is_flagged_and_verdicts_become_inconclusive() -> None:
    spec = _spec(MIN_PAIRS + 1)
    runs = _paired(spec, 1.0, 1.5)
    sick = runs[4]
    slowed = 4 * SICK_RATIO
    runs[4] = _run(4, sick.side, {"rollout": [slowed, slowed], "train": [slowed, slowed]})
    c = compare_workload(_result(spec, runs))
    assert "sick-node" in c.flags
    assert c.timeline[4].flags == ["sick-node"]
    assert all(line.flags == [] for i, line in enumerate(c.timeline) if i != 4)
    assert {q.verdict for q in c.quantities} == {"inconclusive"}


def test_one_slow_phase_is_no_sick_node() -> None:
    spec = _spec(MIN_PAIRS + 1)
    runs = _paired(spec, 1.0, 1.0)
    runs[4] = _run(4, runs[4].side, {"rollout": [5.0, 5.0], "train": [0.5, 0.5]})
    assert "sick-node" not in compare_workload(_result(spec, runs)).flags


def _probe(gbps: float, others: int) -> ProbeReport:
    return ProbeReport.model_validate(
        {
            "taken_at": NOW,
            "copy_bandwidth": [
                {"device_index": 0, "size_bytes": 1 << 30, "time_us": 1.0, "bandwidth_gbps": gbps}
            ],
            "telemetry": [
                GpuTelemetry(device_index=0, other_processes=[{"pid": 100 + i} for i in range(others)])
            ],
        }
    )


def test_probe_between_runs_that_changes_is_flagged() -> None:
    spec = _spec(MIN_PAIRS + 1)
    runs = _paired(spec, 1.0, 1.5)
    runs = [r.model_copy(update={"probe_after": _probe(4000.0, 0)}) for r in runs]
    runs[2] = runs[2].model_copy(update={"probe_after": _probe(2000.0, 1)})
    c = compare_workload(_result(spec, runs, before=_probe(4000.0, 0), device_type="cuda"))
    assert c.flags == ["probe-changed"]
    assert c.timeline[2].flags == ["probe-changed"] and c.timeline[2].other_processes == 1
    messages = [n.message for n in c.notes if n.code == "probe-changed"]
    assert any("copy GPU 0" in m for m in messages) and any("process(es) of others" in m for m in messages)
    assert {q.verdict for q in c.quantities} == {"inconclusive"}


def test_report_tables_hold_every_section() -> None:
    spec = _spec(MIN_PAIRS)
    x = np.arange(4, dtype=np.float32)
    runs = [_run(i, s, {"rollout": [1.0 + i * 0.01]}, digest=x) for i, s in enumerate(run_order(spec))]
    c = compare_workload(_result(spec, runs))
    text, md = format_workload(c), workload_markdown(c)
    for part in (
        "Phases and metrics",
        "Per-rank times",
        "Consistency",
        "Runs (probe after each run)",
        "rollout",
    ):
        assert part in text and part in md
    assert "| metric | baseline | candidate | Δ% [95% CI] | verdict | runs |" in md
