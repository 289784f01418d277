"""kernelab's pytest plugin (``runners/pytest_plugin.py``, entry point ``pytest11``) through ``pytester``.

Each run is a subprocess (``runpytest_subprocess``): pytest finds the plugin by its entry point as a
user's pytest does, and numpy's extension modules cannot load twice in one process (pytester's
in-process runs restore ``sys.modules`` after each)."""

from __future__ import annotations

import json
import os

import pytest

from kernelab.service.contract.schemas import Comparison

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

pytest_plugins = ["pytester"]

BENCH_TESTS = """
import torch


def slow_double(x):
    for _ in range(300):  # the same answer, 300 launches
        y = x * 2
    return y


FAST = {"budget_ms": 150, "min_time_ms": 0}
# a 250x slowdown is decided within a few rounds; the room is for a loaded 2-core CI machine, where
# 150 ms held too few rounds (an honest too-few-rounds inconclusive, which no gate fails on)
DECIDED = {"budget_ms": 3000, "min_time_ms": 0, "stop_rule": "decided"}


def test_slower(kernelab_bench):
    kernelab_bench.compare(lambda x: x * 2, slow_double, inputs={"x": torch.randn(4096)}, measurement=DECIDED)


def test_wrong(kernelab_bench):
    kernelab_bench.compare(lambda x: x * 2, lambda x: x * 3, inputs={"x": torch.randn(64)}, measurement=FAST)
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_bench=BENCH_TESTS)
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)


def test_slower_and_incorrect_fail_the_test_with_the_table(pytester: pytest.Pytester) -> None:
    result = _run(pytester)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(
        ["*kernelab: * (fail on failed,incorrect,slower)*", "*slower*", "*incorrect*"]
    )
    results = pytester.path / ".kernelab" / "results"
    names = sorted(p.name for p in results.iterdir())
    assert names == ["test_bench.py_test_slower.json", "test_bench.py_test_wrong.json"]
    slower = Comparison.model_validate_json((results / names[0]).read_text())
    assert [c.verdict for c in slower.cells] == ["slower"]


def test_fail_on_is_configurable_and_json_goes_where_asked(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--kernelab-fail-on", "incorrect", "--kernelab-json", "out")
    result.assert_outcomes(passed=1, failed=1)
    assert json.loads((pytester.path / "out" / "test_bench.py_test_slower.json").read_text())["cells"]


def test_a_bad_fail_on_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = _run(pytester, "--kernelab-fail-on", "faster")
    assert result.ret != 0
    assert "faster is no failing verdict" in result.stdout.str() + result.stderr.str()


def test_a_threshold_out_of_bounds_is_a_usage_error(pytester: pytest.Pytester) -> None:
    for value in ("150", "0", "-1"):
        result = _run(pytester, "--kernelab-threshold-pct", value)
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        text = result.stdout.str() + result.stderr.str()
        assert f"--kernelab-threshold-pct: {value}" in text and "Traceback" not in text


MISTAKES = """
import torch


def test_signature(kernelab_bench):
    kernelab_bench.compare(lambda x: x, lambda x, y: x, inputs={"x": torch.randn(8)})


def test_work(kernelab_bench):
    kernelab_bench.compare(lambda x: x, lambda x: x, inputs={"x": torch.randn(8)}, work=lambda: 1)
"""


def test_a_benchmark_mistake_fails_the_test_in_one_line_naming_the_function(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_mistakes=MISTAKES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert "kernelab: candidate <lambda>(x, y) does not fit the inputs (x)" in out
    assert "(@compare.work) raised TypeError" in out
    assert "Traceback" not in out and "site-packages" not in out


def test_gpu_only_tests_skip_cleanly_without_a_gpu(pytester: pytest.Pytester) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    pytester.makepyfile(
        test_gpu="""
import pytest

@pytest.mark.kernelab(gpu=True)
def test_marked(kernelab_bench):
    raise AssertionError("not skipped")

def test_unmarked(kernelab_bench):
    raise AssertionError("not skipped")
"""
    )
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_gpu.py").assert_outcomes(
        skipped=1, failed=1
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--kernelab-gpu-only", "test_gpu.py", "-rs"
    )
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines(["*kernelab: no CUDA GPU here*"])


def test_the_entry_point_loads_the_plugin_and_sets_the_interpreter_first(pytester: pytest.Pytester) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("an NVIDIA device is present")
    pytester.makepyfile(
        test_env="""
import os

def test_env(kernelab_bench):
    assert os.environ["TRITON_INTERPRET"] == "1"
"""
    )
    env_without = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    pytester._monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the child's environment
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_env.py")
    assert "TRITON_INTERPRET" not in env_without
    result.assert_outcomes(passed=1)


def test_the_short_summary_names_the_verdict_first(pytester: pytest.Pytester) -> None:
    """``FAILED ... - Failed: kernelab: incorrect: x=...``: pytest cuts the short summary's line,
    so the verdict comes before the cells and the gate."""
    pytester.makepyfile(test_bench=BENCH_TESTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rf", "-k", "test_wrong")
    result.assert_outcomes(failed=1, deselected=1)
    result.stdout.fnmatch_lines(["FAILED test_bench.py::test_wrong - Failed: kernelab: incorrect: *"])
