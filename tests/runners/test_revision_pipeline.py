"""Every spec option on a revision job (CPU, a real git repository in tmp_path, real worker
processes): the cell pipeline (``kernelab.runners.pipeline``) runs revision sides as it runs
in-process ones. The candidate commit of ``optpkg.bench`` has one defect per sweep cell (``mode``):
nondeterministic, batch-variant, bitwise-different (also a different compiled kernel), failing one
call in seven, wrong for |x| > 2 (right once ``input_scale`` keeps the inputs small)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from kernelab.runners.job import run_job
from kernelab.runners.probes.telemetry import own_pids
from kernelab.runners.revision_job import run_revision_job
from kernelab.runners.revisions import AllowList
from kernelab.service.contract.schemas import CellResult, ContentionReading, JobResult, JobSpec
from kernelab.service.judge.stats import compare
from tests.e2e.revision_repo import _git

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # revision workers: Python processes

BENCH = '''\
from typing import Any

import torch
import triton
import triton.language as tl
from pydantic import Field

from kernelab.kernels.base import Benchmark, Params
from kernelab.service.contract.schemas import Work

DEFECTIVE = False  # the candidate commit sets True


@triton.jit
def axpb_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ALT: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    if ALT:
        y = (x * 6.0 + 3.0) / 3.0  # 2 x + 1 with other roundings: within tolerance, not bitwise
    else:
        y = x * 2.0 + 1.0
    tl.store(out_ptr + offs, y, mask=mask)


class OptParams(Params):
    R: int = Field(default=16, gt=0)
    C: int = Field(default=32, gt=0)
    mode: str = "good"


class OptBenchmark(Benchmark[OptParams]):
    """y = 2 x + 1 over x (R, C) float32 by a Triton kernel; batched over rows."""

    name = "opt"
    Params = OptParams
    variants = ("triton",)

    def make_inputs(self, params: OptParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(params.R, params.C, generator=g).to(device)}

    def prepare(self, variant: str, params: OptParams, inputs: dict[str, Any]) -> Any:
        x = inputs["x"]
        out = torch.empty_like(x)
        n, block = x.numel(), 128
        grid = (triton.cdiv(n, block),)
        alt = DEFECTIVE and params.mode == "bitwise"
        axpb_kernel.warmup(x, out, n, BLOCK=block, ALT=alt, grid=grid)
        launch = axpb_kernel[grid]
        calls = [0]

        def fn() -> torch.Tensor:
            launch(x, out, n, BLOCK=block, ALT=alt)
            calls[0] += 1
            if DEFECTIVE and params.mode == "nondet":
                out.add_(torch.rand_like(out) * 1e-6)
            if DEFECTIVE and params.mode == "batch" and x.shape[0] > 8:
                out.add_(1e-6)
            if DEFECTIVE and params.mode == "flaky" and calls[0] % 7 == 0:
                out.add_(1.0)
            if DEFECTIVE and params.mode == "clamp":
                out.copy_(torch.clamp(x, -2.0, 2.0) * 2.0 + 1.0)
            return out

        return fn

    def reference(self, params: OptParams, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"].double() * 2.0 + 1.0

    def batch_rows(self, params: OptParams) -> int:
        return params.R

    def batch_slice(self, params: OptParams, inputs: dict[str, Any], start: int, stop: int) -> Any:
        return params.model_copy(update={"R": stop - start}), {"x": inputs["x"][start:stop].clone()}

    def work(self, params: OptParams, variant: str) -> Work:
        n = params.R * params.C
        return Work(flops=2.0 * n, bytes_read=4.0 * n, bytes_written=4.0 * n)
'''
MODES = ["good", "nondet", "batch", "bitwise", "flaky", "clamp"]
QUICK = {"warmup_ms": 1.0, "budget_ms": 40.0, "min_rounds": 2, "max_rounds": 4, "target_ci_pct": 50.0,
         "min_time_ms": 0.0}  # fmt: skip
NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False}
OPTIONS = {
    "repeats": 20,
    "determinism_runs": 3,
    "batch_invariance": True,
    "bitwise_vs_baseline": True,
    "input_scale": 0.25,
}


def _make_repo(path: Path) -> dict[str, str]:
    """``main``: the exact kernel; branch ``defective``: the candidate (checked out: ``main``)."""
    (path / "optpkg").mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "optpkg" / "__init__.py").write_text("")
    (path / "optpkg" / "bench.py").write_text(BENCH)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "exact")
    _git(path, "checkout", "-q", "-b", "defective")
    (path / "optpkg" / "bench.py").write_text(BENCH.replace("DEFECTIVE = False", "DEFECTIVE = True"))
    _git(path, "commit", "-q", "-am", "defective")
    _git(path, "checkout", "-q", "main")
    return {ref: _git(path, "rev-parse", ref) for ref in ("main", "defective")}


def _spec(repo: Path | None, **extra: Any) -> JobSpec:
    sides: dict[str, Any] = {"baseline": {"variant": "triton"}, "candidate": {"variant": "triton"}}
    if repo is not None:
        sides["baseline"]["source"] = {"repo": str(repo), "ref": "main"}
        sides["candidate"]["source"] = {"repo": str(repo), "ref": "defective"}
    return JobSpec.model_validate(
        {
            "benchmark": "optpkg.bench:OptBenchmark",
            "sweep": {"mode": MODES},
            "device": "cpu",
            "measurement": QUICK,
            "probes": NO_PROBES,
            "timeout_s": 500,
            **sides,
            **extra,
        }
    )


class RecordingMonitor:
    """A contention monitor (``kernelab.runners.pipeline.CellMonitor``) that records each reading
    with the pids counted as this runner's own at that moment."""

    def __init__(self) -> None:
        self.starts = 0
        self.readings: list[ContentionReading] = []
        self.own: list[frozenset[int]] = []

    def start(self) -> None:
        self.starts += 1
        self.readings = []

    def check(self, rounds: int) -> None:
        self.own.append(own_pids())
        self.readings.append(ContentionReading(round=rounds, processes=[]))

    def take(self) -> list[ContentionReading]:
        out, self.readings = self.readings, []
        return out


@pytest.fixture(scope="module")
def revision_job(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[JobResult, RecordingMonitor, Path, frozenset[int]]:
    tmp = tmp_path_factory.mktemp("revopts")
    repo = tmp / "repo"
    _make_repo(repo)
    spec = _spec(repo, correctness=OPTIONS, static_metrics={"enabled": True, "target": "sm_90a"})
    monitor = RecordingMonitor()
    before = own_pids()
    result = run_revision_job(
        spec, allow=AllowList([str(repo)]), cache_dir=tmp / "cache", device="cpu", monitor=monitor
    )
    return result, monitor, repo, before


def _cell(result: JobResult, mode: str) -> CellResult:
    [cell] = [c for c in result.cells if c.params["mode"] == mode]
    assert cell.error is None, cell.error
    return cell


def test_determinism_runs_catch_a_nondeterministic_candidate_revision(revision_job) -> None:
    result, *_ = revision_job
    cell = _cell(result, "nondet")
    base, cand = cell.correctness["baseline"].determinism, cell.correctness["candidate"].determinism
    assert base is not None and base.runs == 3 and base.deterministic
    assert cand is not None and not cand.deterministic and cand.differing_runs == 2
    verdicts = {c.params["mode"]: c for c in compare(result).cells}
    assert "nondeterministic" in verdicts["nondet"].flags, verdicts["nondet"].flags


def test_batch_invariance_catches_a_batch_variant_candidate_revision(revision_job) -> None:
    result, *_ = revision_job
    cell = _cell(result, "batch")
    base, cand = cell.correctness["baseline"].batch_invariance, cell.correctness["candidate"].batch_invariance
    assert base is not None and base.invariant and base.batch_rows == 16
    assert cand is not None and not cand.invariant and cand.mismatched_rows["alone"] == 3
    assert _cell(result, "good").correctness["candidate"].batch_invariance.invariant  # type: ignore[union-attr]


def test_bitwise_vs_baseline_flags_a_bitwise_difference(revision_job) -> None:
    result, *_ = revision_job
    cell = _cell(result, "bitwise")
    vs = cell.correctness["candidate"].vs_baseline
    assert vs is not None and not vs.identical and vs.differing_elements > 0 and "bad" in vs.where
    assert (
        not cell.correctness["candidate"].passed
        and "differs bitwise" in cell.correctness["candidate"].message
    )
    assert cell.correctness["candidate"].max_abs_error is not None  # within tolerance of the reference
    good = _cell(result, "good").correctness["candidate"]
    assert good.passed and good.vs_baseline is not None and good.vs_baseline.identical
    assert cell.correctness["baseline"].vs_baseline is None


def test_repeats_catch_a_one_in_seven_failure(revision_job) -> None:
    result, *_ = revision_job
    cell = _cell(result, "flaky")
    base, cand = cell.correctness["baseline"], cell.correctness["candidate"]
    assert base.passed and base.repeats is not None and base.repeats.runs == 20 and base.repeats.failures == 0
    assert cand.repeats is not None and cand.repeats.failures >= 2 and not cand.passed
    assert "repeats:" in cand.message


def test_input_scale_is_applied_to_the_cell_and_to_the_checked_samples(revision_job) -> None:
    result, *_ = revision_job
    cell = _cell(result, "clamp")
    # The candidate clamps |x| > 2: inputs scaled by 0.25 (|x| < 2 for any likely randn) never reach it.
    assert cell.correctness["candidate"].passed, cell.correctness["candidate"].message
    checks = cell.timed_checks["candidate"]
    assert len(checks) == 2 and all(c.passed for c in checks), [c.findings for c in checks]
    assert not any(f.code == "wrong-under-timing" for f in cell.findings)


def test_static_metrics_are_compiled_from_each_sides_revision(revision_job) -> None:
    result, *_ = revision_job
    for cell in result.cells:
        static = cell.static
        assert static is not None and static.error is None and static.target == "sm_90a"
        [kernel] = static.kernels
        assert kernel.name == "axpb_kernel" and kernel.baseline is not None
        assert kernel.baseline.isa == "sass" and kernel.baseline.registers  # cuobjdump's reading
        # Only the bitwise cell's candidate compiles the other arithmetic.
        expected = "different" if cell.params["mode"] == "bitwise" else "identical"
        assert static.verdict == expected, (cell.params, kernel.summary)


def test_the_contention_monitor_runs_and_counts_the_workers_as_ours(revision_job) -> None:
    result, monitor, _, before = revision_job
    assert monitor.starts == len(MODES)
    for cell in result.cells:
        assert len(cell.contention) >= 2  # before the first round, after the last
        assert cell.contention[0].round == 0 and cell.contention[-1].round == max(cell.samples.round) + 1
    workers = {pid for pids in monitor.own for pid in pids} - before
    assert len(workers) == 2  # one worker per side, registered while the job ran
    assert not workers & own_pids()  # and no longer once it ended


def test_a_revision_job_fills_what_an_in_process_job_fills(
    revision_job, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, _, repo, _ = revision_job
    monkeypatch.syspath_prepend(str(repo))  # main: the exact kernel, installed code of both sides
    local = run_job(_spec(None, correctness=OPTIONS), device="cpu", isolate=False)

    def shape(cell: CellResult) -> dict[str, Any]:
        dumped = cell.model_dump(mode="json", exclude={"static"})
        keys = {k for k, v in dumped.items() if v not in (None, [], {})}
        checks = {
            v: sorted(k for k, x in c.items() if x is not None) for v, c in dumped["correctness"].items()
        }
        return {"keys": keys, "phases": sorted(dumped["phase_s"]), "checks": checks}

    # the timed checks and correctness of the good cell have the same fields on both kinds
    good_local = [c for c in local.cells if c.params["mode"] == "good"][0]
    assert shape(_cell(result, "good")) == shape(good_local) | {
        "keys": shape(good_local)["keys"] | {"contention"}
    }
    assert local.timer == result.timer == "perf_counter"

    def envelope(job: JobResult) -> dict[str, Any]:  # the fields around the cells (runners.job.job_result)
        dumped = job.model_dump(mode="json", exclude={"cells", "spec", "node", "probes"})
        return {"filled": sorted(k for k, v in dumped.items() if v not in (None, [], {})),
                "schema_version": job.schema_version, "error": job.error,
                "key": bool(re.fullmatch(r"[0-9a-f]{32}", job.idempotency_key)),
                "ordered": job.started_at <= job.finished_at, "cells": len(job.cells)}  # fmt: skip

    assert envelope(result) == envelope(local)


def test_a_revision_job_rotates_input_sets_between_its_workers(revision_job) -> None:
    """Each worker prepares its side on several input sets and the rounds rotate them
    (``measurement.placement: rotate``), as in an in-process job: every cell records the sets
    (this module's quick cells run 2-4 rounds, so their budget leaves two), and the rounds ran
    the assignments they reached."""
    from kernelab.service.judge.estimators import placement_strata

    result, *_ = revision_job
    for cell in result.cells:
        if cell.error is not None:
            continue
        sets = cell.placement.input_sets
        assert sets == 2, cell.placement
        rounds = int(cell.samples.round.max()) + 1
        strata = placement_strata(cell.samples.round, sets, cell.placement.swap_every_rounds)
        assert strata is not None
        assert set(strata.tolist()) == {(r // cell.placement.swap_every_rounds) % sets for r in range(rounds)}
