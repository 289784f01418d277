"""Generated results for the statistics tests (``test_stats_oracles.py``) and for the golden
files under ``tests/service/golden/``: cells of every kind ``kernelab.service.judge.stats.compare`` must
handle (failed, one-sided, tiny, tied, throttled, zero and constant durations, rounds missing a
variant, few and many rounds, uneven counts, contention), drawn from a seeded numpy generator."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np

from kernelab.service.contract.schemas import (
    CellResult,
    ContentionReading,
    CorrectnessResult,
    JobResult,
    JobSpec,
    NodeInfo,
    SampleColumns,
    Side,
    Work,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)

_OK = CorrectnessResult(
    passed=True, rel_error=1e-7, max_abs_error=1e-8, cosine_similarity=1.0, rtol=1e-5, atol=1e-6
)
_BAD = _OK.model_copy(update={"passed": False})
FOREIGN: list[dict[str, Any]] = [{"pid": 1, "own": True}, {"pid": 4242, "own": False, "sm_util_pct": 35.0}]
PEAKS = {"copy_gbps": 4000.0, "matmul_tflops": 900.0}


def columns(rows: list[tuple[Side, int, float, bool]]) -> SampleColumns:
    """Samples from ``(variant, round, duration_ns, throttled)`` rows, positions numbered per round."""
    position: dict[int, int] = {}
    pos = []
    for _, r, _, _ in rows:
        pos.append(position.get(r, 0))
        position[r] = pos[-1] + 1
    return SampleColumns(
        variant=[v for v, _, _, _ in rows],
        round=[r for _, r, _, _ in rows],
        position=pos,
        duration_ns=[d for _, _, d, _ in rows],
        throttled=[t for _, _, _, t in rows],
    )


def round_rows(
    rng: np.random.Generator,
    rounds: int,
    per_round: tuple[int, int],
    *,
    ratio: float = 1.0,
    noise: float = 0.02,
    grain: float = 0.0,
    throttled: float = 0.0,
    uneven: bool = False,
) -> list[tuple[Side, int, float, bool]]:
    """ABBA rounds of ``per_round`` (baseline, candidate) samples; ``uneven`` draws 0..2x per round,
    ``grain`` rounds durations (ties), ``throttled`` marks that fraction of samples throttled."""
    base = float(rng.uniform(1e3, 1e6))
    rows: list[tuple[Side, int, float, bool]] = []
    for r in range(rounds):
        drift = 1 + 0.01 * rng.standard_normal()
        order: tuple[Side, Side] = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        for v in order:
            k = per_round[v == "candidate"]
            if uneven:
                k = int(rng.integers(0, 2 * k + 1))
            centre = base * (ratio if v == "candidate" else 1.0) * drift
            for _ in range(k):
                d = centre * (1 + noise * rng.standard_normal())
                if grain:
                    d = round(d / (grain * base)) * grain * base
                rows.append((v, r, max(d, 0.0), bool(rng.random() < throttled)))
    return rows


def cell(rng: np.random.Generator, index: int) -> CellResult:
    kind = index % 12
    extra: dict = {}
    ratio = float(rng.choice([0.85, 0.97, 1.0, 1.003, 1.05, 1.3]))
    if kind == 0:
        return CellResult(index=index, params={"N": index}, error="CUDA error: out of memory")
    if kind == 1:  # a sweep cell of fixed shape (many share it: one Mann-Whitney batch)
        rows = round_rows(rng, 3, (30, 30), ratio=ratio)
    elif kind == 2:  # uneven counts over a few rounds
        rows = round_rows(
            rng,
            int(rng.integers(2, 8)),
            (int(rng.integers(1, 30)), int(rng.integers(1, 30))),
            ratio=ratio,
            uneven=True,
        )
    elif kind == 3:  # heavy ties
        rows = round_rows(
            rng, int(rng.integers(2, 6)), (20, 15), ratio=ratio, grain=float(rng.choice([0.01, 0.05]))
        )
    elif kind == 4:  # throttled samples, dropped or kept by the spec
        rows = round_rows(rng, int(rng.integers(2, 7)), (10, 10), ratio=ratio, throttled=0.3)
    elif kind == 5:  # one variant only
        rows = [r for r in round_rows(rng, 4, (5, 5)) if r[0] == ("baseline", "candidate")[index % 2]]
    elif kind == 6:  # tiny: exact Mann-Whitney, no or some ties, one round
        rows = round_rows(
            rng,
            int(rng.integers(1, 4)),
            (int(rng.integers(1, 4)), int(rng.integers(1, 4))),
            ratio=ratio,
            grain=float(rng.choice([0.0, 0.05])),
        )
    elif kind == 7:  # many rounds: the bootstrap draws every resample
        rows = round_rows(
            rng,
            int(rng.choice([8, 25, 60])),
            (int(rng.integers(1, 4)), int(rng.integers(1, 4))),
            ratio=ratio,
            uneven=bool(rng.integers(2)),
        )
    elif kind == 8:  # a variant absent from most rounds
        rows = [r for r in round_rows(rng, 12, (4, 4), ratio=ratio) if r[0] == "candidate" or r[1] % 5 == 0]
    elif kind == 9:  # a zero baseline median or constant durations
        rows = round_rows(rng, 3, (6, 6), ratio=ratio)
        if index % 2:
            rows = [(v, r, 0.0 if v == "baseline" else d, t) for v, r, d, t in rows]
        else:
            rows = [(v, r, 5000.0, t) for v, r, _, t in rows]
    elif kind == 10:  # integer durations (differences land on bisection midpoints)
        rows = [(v, r, float(int(d) % 7), t) for v, r, d, t in round_rows(rng, 4, (9, 11), ratio=ratio)]
    else:  # the server-load sweep's shape, throttled rows and contention
        rows = round_rows(rng, 3, (100, 100), ratio=ratio, noise=0.01, throttled=0.02)
        extra["contention"] = [ContentionReading(round=0, processes=FOREIGN)]
    work = Work(flops=1e9, bytes_read=float(rng.choice([1e8, 1e14])), bytes_written=1e8)
    return CellResult(
        index=index,
        params={"M": 8, "N": 16 + index},
        samples=columns(rows),
        work={"baseline": work, "candidate": work},
        correctness={"baseline": _OK, "candidate": _BAD if index % 17 == 0 else _OK},
        **extra,
    )


def result(seed: int, cells: int) -> JobResult:
    rng = np.random.default_rng(seed)
    spec = JobSpec.model_validate(
        {
            "benchmark": "softmax",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"},
            "sweep": {"N": [16]},
            "params": {"M": 8},
            "measurement": {
                "threshold_pct": [1.0, 0.5, 5.0][seed % 3],
                "exclude_throttled": seed % 2 == 0,
                "l2_flush": True,
            },
        }
    )
    return JobResult(
        idempotency_key=f"identity-{seed}",
        spec=spec,
        node=NodeInfo(hostname="n", device_type="cuda"),
        timer="perf_counter",
        started_at=NOW,
        finished_at=NOW,
        cells=[cell(rng, i) for i in range(cells)],
    )
