"""Registry: built-in names, entry points, ``module:object`` references, errors."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kernelab.kernels import (
    Benchmark,
    BenchmarkError,
    Params,
    available_benchmarks,
    get_benchmark,
    load_object,
)
from kernelab.kernels.base import _entry_point_benchmarks
from kernelab.kernels.matmul import MatmulBenchmark
from kernelab.kernels.softmax import SoftmaxBenchmark
from kernelab.service.contract.schemas import Work


class _LocalParams(Params):
    n: int


class LocalBenchmark(Benchmark):
    """A test-local benchmark, reachable as ``f"{__name__}:LocalBenchmark"``."""

    name = "local"
    Params = _LocalParams
    variants = ("a", "b")

    def make_inputs(self, params: Any, device: Any, seed: int) -> dict[str, Any]:
        return {"n": params.n}

    def prepare(self, variant: str, params: Any, inputs: dict[str, Any]) -> Callable[[], Any]:
        return lambda: inputs["n"]

    def reference(self, params: Any, inputs: dict[str, Any]) -> Any:
        return inputs["n"]

    def work(self, params: Any, variant: str) -> Work:
        return Work(flops=float(params.n))


NOT_A_BENCHMARK = object()
LOCAL_INSTANCE = LocalBenchmark()


def test_builtins_resolve_by_name() -> None:
    assert isinstance(get_benchmark("softmax"), SoftmaxBenchmark)
    assert isinstance(get_benchmark("matmul"), MatmulBenchmark)
    assert get_benchmark("softmax").variants == ("torch", "triton", "unfused")
    assert get_benchmark("matmul").variants == ("torch", "triton")


def test_installed_entry_points_list_the_builtins() -> None:
    names = available_benchmarks()
    assert {"softmax", "matmul"} <= set(names)
    assert names == sorted(names)
    eps = _entry_point_benchmarks()
    assert eps["softmax"].load() is SoftmaxBenchmark
    assert eps["matmul"].load() is MatmulBenchmark


def test_module_object_reference_to_a_class_and_an_instance() -> None:
    bench = get_benchmark(f"{__name__}:LocalBenchmark")
    assert isinstance(bench, LocalBenchmark)
    assert get_benchmark(f"{__name__}:LOCAL_INSTANCE") is LOCAL_INSTANCE
    assert bench.work(bench.parse_params({"n": 3}), "a").flops == 3.0


def test_entry_point_of_another_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kl_extra_bench.py").write_text(f"from {__name__} import LocalBenchmark as ExtraBenchmark\n")
    dist = tmp_path / "kl_extra-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kl-extra\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        textwrap.dedent("""\
            [kernelab.benchmarks]
            extra = kl_extra_bench:ExtraBenchmark
            """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    _entry_point_benchmarks.cache_clear()
    try:
        assert "extra" in available_benchmarks()
        assert isinstance(get_benchmark("extra"), LocalBenchmark)
    finally:
        _entry_point_benchmarks.cache_clear()
        sys.modules.pop("kl_extra_bench", None)


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("no-such-bench", "unknown benchmark 'no-such-bench'; known: "),
        ("kernels_no_such_module:Thing", "cannot import module 'kernels_no_such_module'"),
        ("kernelab.kernels.softmax:NoSuchThing", "has no attribute 'NoSuchThing'"),
        (f"{__name__}:NOT_A_BENCHMARK", "is not a kernelab.kernels.Benchmark subclass or instance"),
        (":LocalBenchmark", "is not of the form 'module:object'"),
        (".x:y", "no relative import"),  # importlib.import_module raised TypeError for these
        ("..:y", "no relative import"),
        ("kernels..softmax:SoftmaxBenchmark", "no empty segment"),
        ("kernelab.kernels.base:Benchmark", "abstract benchmark class"),  # Benchmark() raised TypeError
    ],
)
def test_unresolvable_references_raise_benchmark_error(ref: str, fragment: str) -> None:
    with pytest.raises(BenchmarkError, match=None) as info:
        get_benchmark(ref)
    assert fragment in str(info.value)
    assert info.value.loc == ("benchmark",)


def test_load_object_walks_dotted_attributes() -> None:
    assert load_object("kernelab.kernels.softmax:SoftmaxBenchmark.name") == "softmax"
