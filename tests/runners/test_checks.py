"""Correctness and determinism checks (kernelab.runners.checks) on the issue-5 kernels, Triton interpreter."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kernelab.kernels import Benchmark, Params
from kernelab.kernels.bi_matmul import BatchInvariantMatmulBenchmark
from kernelab.kernels.conv3d import Conv3dBenchmark, Conv3dParams, alias_offsets, aliases
from kernelab.kernels.preflight import tolerance_of
from kernelab.runners.checks import describe_where, run_checks
from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import CorrectnessSpec, JobSpec, Work
from kernelab.service.judge.report import check_summary, format_table, to_markdown
from kernelab.service.judge.stats import compare
from kernelab.service.judge.verdicts import is_nondeterministic

pytestmark = pytest.mark.timeout(120)
CPU = torch.device("cpu")
# The seed's spatial shape (npq 288 = 2 * 128 + 32: 96 padded rows) with fewer channels, so the
# interpreter runs it in a second: 15 * 96 = 1440 clobberable outputs.
SEED_SHAPE = {"N": 1, "C": 8, "D": 4, "H": 8, "W": 9, "K": 16, "BLOCK_N": 16, "BLOCK_K": 64}


def _checks(bench: Benchmark[Any], variant: str, values: dict[str, Any], spec: CorrectnessSpec):
    params = bench.parse_params(values)
    inputs = bench.make_inputs(params, CPU, 0)
    fn = bench.prepare(variant, params, inputs)
    return run_checks(
        bench,
        variant,
        params,
        inputs,
        fn,
        bench.reference(params, inputs),
        spec,
        seed=0,
        device=CPU,
        tolerance=tolerance_of(bench, params),
    )


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ({"N": 1, "C": 96, "D": 4, "H": 8, "W": 9, "K": 96}, 9120),  # the seed: npq 288, 96 padded rows
        ({"N": 2, "C": 96, "D": 4, "H": 8, "W": 9, "K": 96}, 0),  # n >= 2: padded rows past the buffer
        ({"N": 1, "C": 8, "D": 4, "H": 8, "W": 8, "K": 96}, 0),  # npq 256: no padded rows
        ({"N": 1, "C": 8, "D": 4, "H": 8, "W": 9, "K": 1}, 0),  # one channel: nothing after it
        ({"N": 1, "C": 8, "D": 2, "H": 2, "W": 2, "K": 4}, 3 * 8 + 0),  # pad 120 > dhw 8: reaches 3 channels
    ],
)
def test_which_conv3d_shapes_alias(shape: dict[str, int], expected: int) -> None:
    p = Conv3dParams(**shape)
    assert len(alias_offsets(p)) == expected
    assert aliases(p) == (expected > 0)


def test_unguarded_conv3d_is_reported_with_the_clobbered_pattern() -> None:
    bench = Conv3dBenchmark()
    spec = CorrectnessSpec(repeats=2, determinism_runs=2)
    bad, out = _checks(bench, "triton", {**SEED_SHAPE, "row_guard": False}, spec)
    assert not bad.passed and bad.repeats is not None
    assert bad.repeats.failures == 2 and bad.repeats.failure_errors_identical is True
    assert bad.repeats.bad_set_jaccard == pytest.approx(1.0)
    # The padded rows' zeros land exactly on the predicted alias set (the seed's 9120 offsets).
    zeroed = set((out.flatten() == 0).nonzero().flatten().tolist())
    assert zeroed == alias_offsets(bench.parse_params({**SEED_SHAPE, "row_guard": False}))
    assert "channel 1-15 (15/16)" in bad.where and "pixel 0-95 (96/288)" in bad.where
    assert not bad.passed and not is_nondeterministic(bad)  # a deterministic clobber under the interpreter
    assert "identical error (clobber)" in check_summary(bad)
    # the rule it failed, with its sources: float16's pair and the C * 3**3 = 216 sums
    assert "(float16 defaults of torch.testing) + 6 (sqrt(216) 2^-24 [float32 sums of 216]" in bad.tolerance
    assert "2^-11 [float16 partials]" in bad.tolerance and f"tolerance: {bad.tolerance}" in check_summary(bad)

    good, _ = _checks(bench, "triton", {**SEED_SHAPE, "row_guard": True}, spec)
    assert good.passed and good.where == "" and good.repeats is not None and good.repeats.failures == 0
    assert good.determinism is not None and good.determinism.deterministic
    assert good.passed and not is_nondeterministic(good)


def test_batch_invariant_gemm_passes_batch_invariance() -> None:
    bench = BatchInvariantMatmulBenchmark()
    values = {
        "M": 40,
        "N": 48,
        "K": 200,
        "dtype": "bfloat16",
        "BLOCK_M": 16,
        "BLOCK_N": 32,
        "BLOCK_K": 32,
        "CHUNK_K": 64,
    }
    result, _ = _checks(bench, "triton", values, CorrectnessSpec(batch_invariance=True))
    assert result.passed
    bi = result.batch_invariance
    # rows 0-7, 20, 32-39
    assert bi is not None and bi.invariant and bi.batch_rows == 40 and bi.rows_checked == 17
    assert bi.mismatched_elements == 0 and "batch-invariant" in check_summary(result)


class DropParams(Params):
    M: int = 64
    N: int = 32


class DropOneElement(Benchmark[DropParams]):
    """A planted race: each run leaves one random element of out unwritten (NaN after poisoning)."""

    name = "drop_one"
    Params = DropParams
    variants = ("copy", "dropping")

    def make_inputs(self, params: DropParams, device: Any, seed: int) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(params.M, params.N, generator=gen)}

    def prepare(self, variant: str, params: DropParams, inputs: dict[str, Any]) -> Callable[[], Any]:
        x, out = inputs["x"], torch.empty_like(inputs["x"])
        rng = torch.Generator().manual_seed(1234)

        def run() -> torch.Tensor:
            keep = torch.ones(x.numel(), dtype=torch.bool)
            if variant == "dropping":
                keep[int(torch.randint(x.numel(), (1,), generator=rng))] = False
            out.view(-1)[keep] = x.view(-1)[keep]
            return out

        return run

    def reference(self, params: DropParams, inputs: dict[str, Any]) -> Any:
        return inputs["x"].double()

    def work(self, params: DropParams, variant: str) -> Work:
        return Work(bytes_read=params.M * params.N * 4.0, bytes_written=params.M * params.N * 4.0)

    def output_axes(self, params: DropParams) -> tuple[tuple[str, int | None], ...]:
        return (("row", 16), ("col", None))


def test_planted_dropped_element_is_nondeterministic_with_a_moving_bad_set() -> None:
    spec = CorrectnessSpec(repeats=8, determinism_runs=8)
    result, _ = _checks(DropOneElement(), "dropping", {}, spec)
    r, d = result.repeats, result.determinism
    assert r is not None and d is not None and not result.passed
    assert r.failures == 8 and r.failure_errors_identical is False  # same rel. error, other elements
    assert r.bad_set_jaccard is not None and r.bad_set_jaccard < 0.5  # the dropped element moves
    assert not d.deterministic and d.differing_runs >= 6 and d.max_differing_elements <= 2
    assert d.bad_set_jaccard is not None and d.bad_set_jaccard < 1.0
    assert not result.passed and is_nondeterministic(result)
    assert "NON-DETERMINISTIC" in check_summary(result)
    clean, _ = _checks(DropOneElement(), "copy", {}, spec)
    assert clean.passed and clean.determinism is not None and clean.determinism.deterministic


def test_describe_where_names_rows_modulo_the_tile() -> None:
    mask = torch.zeros(2, 4, 256, 8, dtype=torch.bool)
    mask[:, :, 64:128, :] = True
    mask[:, :, 192:256, :] = True
    line = describe_where(mask, [("batch", None), ("head", None), ("row", 128), ("dim", None)])
    assert line == (
        "8192/16384 bad (50%): batch all 2; head all 4; row 64-127, 192-255 (128/256), "
        "row % 128 in 64-127; dim all 8"
    )
    assert describe_where(torch.zeros(3, dtype=torch.bool), [("x", None)]) == ""


@pytest.mark.slow  # a whole job in a measuring process: the slow tier
def test_chunked_attention_schedules_bitwise_equal_through_run_job() -> None:
    spec = JobSpec.model_validate(
        {
            "benchmark": "chunked_attention",
            "baseline": {"variant": "monolithic"},
            "candidate": {"variant": "split"},
            "params": {
                "B": 2,
                "H": 2,
                "S": 80,
                "L": 200,
                "D": 48,
                "dtype": "float16",
                "BLOCK_M": 32,
                "BLOCK_N": 32,
                "CHUNK": 64,
            },
            "measurement": {"warmup_ms": 0, "budget_ms": 50, "min_rounds": 2, "max_rounds": 2},
            "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
            "correctness": {"bitwise_vs_baseline": True, "determinism_runs": 2},
            "device": "cpu",
        }
    )
    result = run_job(spec)
    cell = result.cells[0]
    assert cell.error is None
    vs = cell.correctness["candidate"].vs_baseline
    assert vs is not None and vs.identical and vs.differing_elements == 0
    comparison = compare(result)
    assert (
        "incorrect" not in comparison.cells[0].flags and "nondeterministic" not in comparison.cells[0].flags
    )
    assert "bitwise = baseline" in format_table(comparison)
    assert "**Correctness checks**" in to_markdown(comparison)


class _RowsParams(Params):
    M: int = 40
    K: int = 256


class _SplitWhenBatched(Benchmark[_RowsParams]):
    """``x @ w`` (float32): ``rows`` one row at a time (batch-invariant by construction), ``split``
    over two halves of K once the batch has more than 32 rows (another rounding order: the rows of
    a large batch differ bitwise from the same rows alone, as the seed's cuBLAS GEMM did from M=33)."""

    name = "split_when_batched"
    Params = _RowsParams
    variants = ("rows", "split")

    def make_inputs(self, params: _RowsParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator(device=device).manual_seed(seed)
        return {"x": torch.randn(params.M, params.K, generator=g, device=device),
                "w": torch.randn(params.K, 8, generator=g, device=device)}  # fmt: skip

    def prepare(self, variant: str, params: _RowsParams, inputs: dict[str, Any]) -> Callable[[], Any]:
        x, w, half = inputs["x"], inputs["w"], params.K // 2
        if variant == "rows" or params.M <= 32:
            return lambda: torch.cat([x[i : i + 1] @ w for i in range(x.shape[0])])
        return lambda: x[:, :half] @ w[:half] + x[:, half:] @ w[half:]

    def reference(self, params: _RowsParams, inputs: dict[str, Any]) -> Any:
        return inputs["x"].double() @ inputs["w"].double()

    def work(self, params: _RowsParams, variant: str) -> Work:
        return Work(flops=2.0 * params.M * params.K * 8, bytes_read=4.0 * params.M * params.K,
                    bytes_written=32.0 * params.M)  # fmt: skip

    def tolerances(self, params: _RowsParams) -> tuple[float, float]:
        return 1e-4, 1e-4  # a K-long float32 reduction (this test is about batch invariance)

    def batch_rows(self, params: _RowsParams) -> int:
        return params.M

    def batch_slice(self, params: _RowsParams, inputs: dict[str, Any], start: int, stop: int) -> Any:
        return params.model_copy(update={"M": stop - start}), {"x": inputs["x"][start:stop], "w": inputs["w"]}


def test_a_requested_batch_invariance_that_fails_outranks_the_speed() -> None:
    """The spec asks for batch invariance: the candidate that is batch-variant from M=33 on reads
    ``nondeterministic`` (reason ``batch-variant``, counted in the summary), whatever its timing;
    at M=16 (never split) it is invariant and its speed decides. Without the request the same
    cell is judged by its speed."""
    spec = JobSpec.model_validate({
        "benchmark": "tests:SplitWhenBatched", "baseline": {"variant": "rows"},
        "candidate": {"variant": "split"},
        "device": "cpu", "sweep": {"M": [16, 40]}, "correctness": {"batch_invariance": True},
        "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
        "measurement": {"budget_ms": 300, "warmup_ms": 5, "cross_check": False},
    })  # fmt: skip
    comparison = compare(run_job(spec, isolate=False, bench=_SplitWhenBatched(), device="cpu"))
    small, large = comparison.cells
    assert large.verdict == "nondeterministic", [r.code for r in large.reasons]
    assert large.reasons[0].code == "batch-variant" and large.reasons[0].side == "candidate"
    assert "not batch-invariant" in large.reasons[0].message and "nondeterministic" in large.flags
    assert small.verdict not in ("nondeterministic", "incorrect", "failed"), [r.code for r in small.reasons]
    assert comparison.summary.get("nondeterministic") == 1
    off = spec.correctness.model_copy(update={"batch_invariance": False})
    unasked = spec.model_copy(update={"correctness": off})
    plain = compare(run_job(unasked, isolate=False, bench=_SplitWhenBatched(), device="cpu"))
    assert plain.cells[1].verdict != "nondeterministic"
