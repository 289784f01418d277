"""``validate_spec``: every error names the spec field it came from."""

from __future__ import annotations

from typing import Any

from kernelab.kernels import validate_spec
from kernelab.service.contract.schemas import JobSpec


def _spec(**overrides: Any) -> JobSpec:
    body: dict[str, Any] = {
        "benchmark": "softmax",
        "baseline": {"variant": "torch"},
        "candidate": {"variant": "triton"},
        "sweep": {"M": [64, 128], "N": [200]},
    }
    body.update(overrides)
    return JobSpec.model_validate(body)


def _locs(spec: JobSpec) -> list[tuple[Any, ...]]:
    return [tuple(e["loc"]) for e in validate_spec(spec)]


def test_valid_specs_have_no_errors() -> None:
    assert validate_spec(_spec()) == []
    matmul = _spec(
        benchmark="matmul",
        baseline={"variant": "triton", "params": {"BLOCK_M": 64}},
        candidate={"variant": "triton", "params": {"BLOCK_M": 128}},
        sweep={"M": [64], "N": [48], "K": [40], "dtype": ["float16", "bfloat16"]},
    )
    assert validate_spec(matmul) == []


def test_negative_shape_names_the_sweep_field() -> None:
    errors = validate_spec(_spec(sweep={"M": [-1], "N": [200]}))
    assert [tuple(e["loc"]) for e in errors] == [("sweep", "M")]
    assert "greater than 0" in errors[0]["msg"]


def test_unknown_variant_names_the_side() -> None:
    errors = validate_spec(_spec(candidate={"variant": "cuda-graph"}))
    assert [tuple(e["loc"]) for e in errors] == [("candidate", "variant")]
    assert "'cuda-graph'" in errors[0]["msg"] and "known: torch, triton" in errors[0]["msg"]


def test_unknown_benchmark_names_the_benchmark_field() -> None:
    assert _locs(_spec(benchmark="nope")) == [("benchmark",)]


def test_side_params_errors_point_at_the_side() -> None:
    spec = _spec(
        benchmark="matmul",
        sweep={"M": [64], "N": [48], "K": [40]},
        baseline={"variant": "triton", "params": {"BLOCK_K": 24}},
        candidate={"variant": "torch"},
    )
    errors = validate_spec(spec)
    assert [tuple(e["loc"]) for e in errors] == [("baseline", "params", "BLOCK_K")]
    assert "power of two" in errors[0]["msg"]


def test_device_specific_sweep_and_shared_params_are_located() -> None:
    spec = _spec(
        params={"dtype": "float64"}, sweep={"M": [4]}, sweep_by_device={"cuda": {"N": [0]}, "cpu": {"N": [8]}}
    )
    assert sorted(_locs(spec)) == [("params", "dtype"), ("sweep_by_device", "cuda", "N")]


def test_unknown_and_missing_parameters_are_errors() -> None:
    assert _locs(_spec(sweep={"M": [4], "N": [8], "BLOCK_Q": [2]})) == [("sweep", "BLOCK_Q")]
    assert _locs(_spec(sweep={"M": [4]})) == [("params", "N")]


def test_tile_limits_are_checked_without_a_gpu() -> None:
    spec = _spec(
        benchmark="matmul",
        sweep={"M": [64], "N": [48], "K": [40]},
        baseline={"variant": "triton"},
        candidate={"variant": "triton", "params": {"BLOCK_M": 2048, "BLOCK_N": 1024, "num_warps": 64}},
    )
    assert sorted(_locs(spec)) == [("candidate", "params", "BLOCK_N"), ("candidate", "params", "num_warps")]


def test_a_reference_to_an_abstract_class_is_an_error_on_benchmark() -> None:
    errors = validate_spec(_spec(benchmark="kernelab.kernels.base:Benchmark"))
    assert [tuple(e["loc"]) for e in errors] == [("benchmark",)]
    assert "abstract benchmark class" in errors[0]["msg"]


def test_a_module_that_fails_to_import_is_an_error_on_benchmark(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "kl_spec_raises.py").write_text("import json\njson.loads('{')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    errors = validate_spec(_spec(benchmark="kl_spec_raises:Bench"))
    assert [tuple(e["loc"]) for e in errors] == [("benchmark",)]
    assert "cannot import module 'kl_spec_raises': JSONDecodeError" in errors[0]["msg"]
