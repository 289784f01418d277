"""Static kernel metrics: real ahead-of-time compiles for sm_90a on this CPU-only machine.

The kernels are Triton's own pipeline output read with the nvdisasm/cuobjdump Triton ships, so
these tests need no GPU: the same kernel twice is IDENTICAL, one extra compare in an epilogue is
named, and the loop body of the tiled matmul changes with its inner loop (BLOCK_K).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kernelab.runners.static_metrics import KernelCode, compile_kernels
from kernelab.runners.static_metrics.diff import compare
from kernelab.service.contract.schemas import JobSpec

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

TARGET = "sm_90a"
HERE = Path(__file__).parent
_X = {"tensor": [4096], "dtype": "float32"}
_MM = {"M": 256, "N": 256, "K": 256, "dtype": "float16", "BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 3}
ITEMS = [
    {
        "key": "plain",
        "kernel": "guard_kernels:sum_kernel",
        "args": [_X, _X, 4096, 7],
        "kwargs": {"BLOCK": 256, "GUARD": False},
    },
    {
        "key": "guarded",
        "kernel": "guard_kernels:sum_kernel",
        "args": [_X, _X, 4096, 7],
        "kwargs": {"BLOCK": 256, "GUARD": True},
    },
    {"key": "mm_k32", "benchmark": "matmul", "variant": "triton", "params": {**_MM, "BLOCK_K": 32}},
    {"key": "mm_k64", "benchmark": "matmul", "variant": "triton", "params": {**_MM, "BLOCK_K": 64}},
    {"key": "mm_k32_again", "benchmark": "matmul", "variant": "triton", "params": {**_MM, "BLOCK_K": 32}},
    {"key": "torch", "benchmark": "matmul", "variant": "torch", "params": {**_MM, "BLOCK_K": 32}},
    {"key": "broken", "kernel": "guard_kernels:no_such_kernel", "args": []},
]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list[KernelCode], str | None]]:
    mp = pytest.MonkeyPatch()
    mp.setenv("PYTHONPATH", f"{HERE / 'static_kernels'}:{HERE.parent.parent}")
    try:
        return compile_kernels(ITEMS, TARGET)
    finally:
        mp.undo()


def _one(compiled: dict[str, tuple[list[KernelCode], str | None]], key: str) -> list[KernelCode]:
    kernels, error = compiled[key]
    assert error is None, error
    return kernels


def test_same_kernel_twice_is_identical(compiled) -> None:
    a, b = _one(compiled, "mm_k32"), _one(compiled, "mm_k32_again")
    c = compare(a, b, target=TARGET)
    assert c.verdict == "identical"
    (k,) = c.kernels
    assert k.name == "matmul_kernel" and not k.changes and not k.opcode_delta
    assert k.summary == f"IDENTICAL ISA ({k.baseline.instructions} instructions both)"


def test_resources_of_a_compiled_matmul(compiled) -> None:
    (k,) = _one(compiled, "mm_k32")
    s = k.static
    assert s.isa == "sass" and s.target == TARGET and s.num_warps == 4
    assert 0 < s.registers <= 255 and s.spill_stores == 0 and s.spill_loads == 0
    # 3 stages of A (64x32) and B (32x64) fp16 tiles in shared memory: at least 3 * 8 KiB.
    assert s.shared_bytes >= 3 * (64 * 32 + 32 * 64) * 2
    assert s.by_class["mma"] > 0 and s.by_class["global_load"] > 0 and s.by_class["barrier"] > 0
    assert sum(s.by_class.values()) == s.instructions == sum(s.by_opcode.values())
    assert 0 < s.occupancy_pct <= 100 and s.occupancy_blocks_per_sm >= 1
    assert len(s.code_sha256) == 64


def test_extra_compare_in_the_epilogue_is_named(compiled) -> None:
    c = compare(_one(compiled, "plain"), _one(compiled, "guarded"), target=TARGET)
    assert c.verdict == "different"
    (k,) = c.kernels
    assert k.class_delta.get("compare") == 1
    added = [ch for ch in k.changes if ch.sign == "+" and ch.opcode.startswith("ISETP")]
    assert added and all(ch.region == "epilogue" for ch in added)
    assert added[0].opcode in k.summary and "in the epilogue" in k.summary
    assert k.baseline.loops[0].instructions == k.candidate.loops[0].instructions  # loop untouched


def test_loop_body_count_follows_the_inner_loop(compiled) -> None:
    (k32,), (k64,) = _one(compiled, "mm_k32"), _one(compiled, "mm_k64")
    assert len(k32.static.loops) == len(k64.static.loops) == 1
    n32, n64 = k32.static.loops[0].instructions, k64.static.loops[0].instructions
    assert n32 != n64
    # BLOCK_K 64 does twice the MMA work per iteration.
    assert k64.static.loops[0].by_class["mma"] == 2 * k32.static.loops[0].by_class["mma"]
    d = compare([k32], [k64], target=TARGET).kernels[0]
    assert d.resource_delta["loop1_instructions"] == n64 - n32
    assert f"loop body {n32} → {n64}" in d.summary


def test_a_side_without_triton_kernels(compiled) -> None:
    assert _one(compiled, "torch") == []
    c = compare([], _one(compiled, "mm_k32"), target=TARGET)
    assert c.verdict == "different" and c.kernels[0].verdict == "only-candidate"


def test_a_failing_item_reports_its_error(compiled) -> None:
    kernels, error = compiled["broken"]
    assert kernels == [] and "no_such_kernel" in error


def test_bad_target_is_refused() -> None:
    with pytest.raises(ValueError, match="sm_90a"):
        compile_kernels([], "gfx942")
    with pytest.raises(ValidationError, match="static_metrics.target"):
        JobSpec.model_validate(
            {
                "benchmark": "matmul",
                "baseline": {"variant": "torch"},
                "candidate": {"variant": "triton"},
                "static_metrics": {"target": "h200"},
            }
        )


def test_run_job_stores_static_comparison_and_markdown_shows_it() -> None:
    from kernelab.runners.job import run_job
    from kernelab.service.judge.report import to_markdown
    from kernelab.service.judge.stats import compare as compare_job

    small = {
        "M": 32,
        "N": 32,
        "K": 64,
        "dtype": "float16",
        "BLOCK_M": 16,
        "BLOCK_N": 16,
        "num_stages": 2,
        "num_warps": 1,
    }
    spec = JobSpec.model_validate(
        {
            "benchmark": "matmul",
            "params": small,
            "baseline": {"variant": "triton", "params": {"BLOCK_K": 16}},
            "candidate": {"variant": "triton", "params": {"BLOCK_K": 32}},
            "sweep": {"GROUP_M": [1, 8]},
            "measurement": {
                "warmup_ms": 1.0,
                "budget_ms": 50.0,
                "min_rounds": 2,
                "max_rounds": 4,
                "target_ci_pct": 50.0,
                "min_time_ms": 0.0,
            },
            "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
            "correctness": {"enabled": False},
            "device": "cpu",
            "static_metrics": {"enabled": True, "target": TARGET},
        }
    )
    result = run_job(spec)
    for cell in result.cells:
        assert cell.static is not None and cell.static.error is None
        assert cell.static.verdict == "different" and cell.static.target == TARGET
    # The stored JSON round-trips (what the server keeps in cells.static).
    again = type(result).model_validate_json(result.model_dump_json())
    assert again.cells[0].static == result.cells[0].static
    md = to_markdown(compare_job(result))
    assert "**Static metrics**" in md and "matmul\\_kernel" in md and "loop body" in md


def test_cpu_job_without_target_records_why() -> None:
    from kernelab.runners.static_metrics import attach_static
    from kernelab.service.contract.schemas import CellResult

    spec = JobSpec.model_validate(
        {
            "benchmark": "matmul",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"},
            "static_metrics": {"enabled": True},
        }
    )
    cells = [CellResult(index=0, params={})]
    attach_static(spec, cells, "cpu")
    assert cells[0].static is not None and "sm_90a" in (cells[0].static.error or "")
