"""``run_job`` end to end on the CPU: the real softmax benchmark, and a small benchmark of this
module whose cells fail, skip output elements or override parameters on purpose."""

from __future__ import annotations

import os
import re
from datetime import UTC
from typing import Any

import pytest
import torch
from pydantic import Field

from kernelab.kernels import Benchmark, BenchmarkError, Params
from kernelab.kernels.tolerances import Tolerance
from kernelab.runners.cells import check_variant, resolve_device
from kernelab.runners.devices import device_name
from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import JobResult, JobSpec, Work
from kernelab.service.judge.stats import compare

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

EXACTISH = Tolerance(rtol=1e-6, atol=0.0)
NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False}
QUICK = {"warmup_ms": 1.0, "budget_ms": 100.0, "min_rounds": 3, "max_rounds": 12, "target_ci_pct": 50.0}


class DoubleParams(Params):
    n: int = Field(gt=1)
    fail: bool = False


class DoubleBenchmark(Benchmark):
    """out = 2 * x over n float32 elements. ``skips-last`` never writes the last element."""

    name = "double"
    Params = DoubleParams
    variants = ("full", "skips-last")

    def make_inputs(self, params: DoubleParams, device: Any, seed: int) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        return {"x": torch.randn(params.n, generator=gen, device=device)}

    def prepare(self, variant: str, params: DoubleParams, inputs: dict[str, Any]):
        if params.fail:
            raise RuntimeError("compile error: the toy kernel refuses this cell\nsecond line of detail")
        x = inputs["x"]
        out = x * 2  # the buffer starts out holding the right answer: only poisoning can catch a skip
        if variant == "full":
            return lambda: torch.mul(x, 2, out=out)
        if variant == "skips-last":

            def run() -> torch.Tensor:
                torch.mul(x[:-1], 2, out=out[:-1])
                return out

            return run
        raise BenchmarkError(f"unknown variant {variant!r}")

    def reference(self, params: DoubleParams, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"].to(torch.float64) * 2

    def work(self, params: DoubleParams, variant: str) -> Work:
        return Work(flops=params.n, bytes_read=4 * params.n, bytes_written=4 * params.n)


DOUBLE = f"{__name__}:DoubleBenchmark"


def double_spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {
        "benchmark": DOUBLE,
        "baseline": {"variant": "full"},
        "candidate": {"variant": "full"},
        "params": {"n": 64},
        "measurement": QUICK,
        "probes": NO_PROBES,
        "device": "cpu",
    }
    return JobSpec.model_validate({**base, **kw})


def test_softmax_job_on_cpu():
    spec = JobSpec.model_validate(
        {
            "name": "softmax torch vs triton",
            "benchmark": "softmax",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"},
            "sweep": {"M": [2], "N": [8, 33]},
            "measurement": QUICK,
            "probes": NO_PROBES,
        }
    )
    calls: list[tuple[int, int, str]] = []
    threads = torch.get_num_threads()
    result = run_job(spec, job_id=42, progress=lambda i, n, msg: calls.append((i, n, msg)))

    assert result.job_id == 42
    assert re.fullmatch(r"[0-9a-f]{32}", result.idempotency_key)
    assert result.started_at.tzinfo == UTC and result.finished_at.tzinfo == UTC
    assert result.started_at <= result.finished_at
    assert result.timer == "perf_counter"
    assert result.node.device_type == "cpu"
    assert result.node.triton_interpret  # the Triton variant ran under the interpreter
    assert result.probes == []
    assert torch.get_num_threads() == threads  # the single-thread setting is restored
    assert [c.params for c in result.cells] == [{"M": 2, "N": 8}, {"M": 2, "N": 33}]
    for cell in result.cells:
        assert cell.interpreted == ["candidate"]  # the Triton side, not the eager one
        assert cell.error is None
        assert cell.correctness["baseline"].passed and cell.correctness["candidate"].passed
        assert {s.variant for s in cell.samples.rows()} == {"baseline", "candidate"}
        assert len({s.round for s in cell.samples.rows()}) >= 3
        nbytes = cell.params["M"] * cell.params["N"] * 4
        assert cell.work["baseline"].bytes_read == nbytes == cell.work["candidate"].bytes_written
    assert {(i, n) for i, n, _ in calls} == {(0, 2), (1, 2)}
    assert any("measuring" in msg for _, _, msg in calls)
    # What the runner posts is what the server and `kernelab run` read back.
    again = JobResult.model_validate_json(result.model_dump_json())
    assert again == result
    comparison = compare(again)
    assert len(comparison.cells) == 2
    assert all(c.ratio is not None for c in comparison.cells)
    # the interpreter's time is no timing verdict: never "1,900x slower" as a headline
    assert {c.verdict for c in comparison.cells} == {"inconclusive"}
    assert all("interpreted" in {r.code for r in c.reasons} for c in comparison.cells)


def test_a_failing_cell_is_recorded_and_the_job_goes_on():
    spec = double_spec(sweep={"fail": [True, False]})
    result = run_job(spec)
    failed, ok = result.cells
    assert failed.error == "RuntimeError: compile error: the toy kernel refuses this cell"
    assert len(failed.samples) == 0 and failed.correctness == {}
    assert ok.error is None and ok.samples
    assert ok.correctness["baseline"].passed
    assert result.error is None  # one cell measured: the job succeeded


def test_a_job_whose_every_cell_failed_is_an_error():
    result = run_job(double_spec(sweep={"fail": [True]}))
    assert result.error == (
        "all 1 cells failed; first: RuntimeError: compile error: the toy kernel refuses this cell"
    )


def test_poisoning_exposes_an_unwritten_element():
    result = run_job(double_spec(candidate={"variant": "skips-last"}))
    (cell,) = result.cells
    assert cell.correctness["baseline"].passed
    candidate = cell.correctness["candidate"]
    assert not candidate.passed
    assert candidate.nonfinite == 1  # the one element never written kept the NaN poison
    assert cell.samples  # an incorrect variant is still measured; the verdict flags it


def test_check_variant_poisons_the_output():
    x = torch.randn(16)
    out = x * 2
    inputs = {"x": x}
    ref = x.to(torch.float64) * 2

    def skips_last() -> torch.Tensor:
        torch.mul(x[:-1], 2, out=out[:-1])
        return out

    result = check_variant(skips_last, ref, inputs, tolerance=EXACTISH, device=torch.device("cpu"))
    assert not result.passed and result.nonfinite == 1


def test_check_variant_never_poisons_an_input():
    x = torch.randn(16)
    before = x.clone()
    ref = x.to(torch.float64)
    cpu = torch.device("cpu")
    result = check_variant(lambda: x.mul_(1.0), ref, {"x": x}, tolerance=EXACTISH, device=cpu)
    assert result.passed
    assert torch.equal(x, before)


def test_side_overrides_and_tolerances():
    spec = double_spec(
        candidate={"variant": "full", "params": {"n": 128}},
        correctness={"rtol": 1e-3, "atol": 1e-4},
    )
    result = run_job(spec, idempotency_key="fixed-key-0001")
    (cell,) = result.cells
    assert result.idempotency_key == "fixed-key-0001"
    assert cell.baseline_params == {"n": 64} and cell.candidate_params == {"n": 128}
    assert cell.work["baseline"].flops == 64 and cell.work["candidate"].flops == 128
    assert cell.correctness["candidate"].rtol == 1e-3 and cell.correctness["candidate"].atol == 1e-4


def test_correctness_can_be_disabled():
    result = run_job(double_spec(candidate={"variant": "skips-last"}, correctness={"enabled": False}))
    (cell,) = result.cells
    assert cell.correctness == {} and cell.samples


def test_probes_before_and_after():
    spec = double_spec(probes={"copy_bandwidth": True, "all_reduce": False, "nvml": True})
    result = run_job(spec)
    assert [p.phase for p in result.probes] == ["before", "after"]
    assert all(p.copy_bandwidth for p in result.probes)
    assert all(p.errors == {} for p in result.probes)


def test_unknown_benchmark_raises():
    with pytest.raises(BenchmarkError):
        run_job(double_spec(benchmark="no-such-benchmark"))


def test_resolve_device():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(None, "cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu"), "cuda") == torch.device("cpu")  # the argument wins
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device(None, "auto").type == expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
def test_resolve_device_cuda_without_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        resolve_device(None, "cuda")


def test_device_name_without_torch_names_what_torch_would():
    expected = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert device_name(None, "auto") == expected == str(resolve_device(None, "auto"))
    assert device_name("cpu", "cuda") == "cpu"  # the argument wins
    assert device_name(torch.device("cpu")) == "cpu"
    with pytest.raises(RuntimeError):  # torch's own error for a name it does not know
        device_name("no-such-device")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA"):
            device_name("cuda:1")
    for odd in ("cuda:01", "cuda:\u00b2", "cuda:-1", "cuda:x"):  # indexes torch refuses, refused alike
        with pytest.raises(RuntimeError):
            device_name(odd)


_ORCHESTRATOR_SCRIPT = """
import json, sys
from kernelab.runners.devices import torch_sees_cuda
from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import JobSpec
seen = torch_sees_cuda()
before = "torch" in sys.modules
result = run_job(JobSpec.model_validate_json(sys.argv[1]))
cells = result.cells
print(json.dumps({"seen": seen, "torch_before": before, "torch_after": "torch" in sys.modules,
                  "errors": [c.error for c in cells], "samples": [len(c.samples) for c in cells]}))
"""


def test_the_orchestrating_process_never_imports_torch_on_a_cpu_build() -> None:
    """A job's orchestrating process (the runner's job worker, ``kernelab run``) leaves torch to the
    measuring child: one torch import per job, not two. Where the installed torch has a GPU backend
    the answer to ``torch_sees_cuda`` may need torch; it must still agree with torch's."""
    import json
    import subprocess
    import sys

    spec = double_spec(device="auto")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [sys.executable, "-c", _ORCHESTRATOR_SCRIPT, spec.model_dump_json()],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["seen"] == torch.cuda.is_available()
    assert out["errors"] == [None] and out["samples"][0] > 0  # the child measured
    if torch.version.cuda is None and torch.version.hip is None:  # a CPU build: settled without torch
        assert out["torch_before"] is False and out["torch_after"] is False
    # A CUDA or ROCm build may need torch to answer (on the H200 it does); the answer is checked above.


@pytest.mark.skipif(
    torch.version.cuda is not None or torch.version.hip is not None, reason="a CPU build of torch"
)
def test_a_patched_torch_cuda_does_not_turn_a_cpu_build_into_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Benchmark code imported in the orchestrating process (``kernelab run`` checks the benchmark
    before measuring) may patch ``torch.cuda``: the build still decides."""
    from kernelab.runners.devices import torch_sees_cuda

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch_sees_cuda() is False and device_name(None, "auto") == "cpu"


def test_torch_build_reads_the_version_file_without_importing(tmp_path) -> None:
    from kernelab.runners.devices import torch_build

    installed = torch_build()
    assert installed is not None
    assert installed["__version__"] == torch.__version__
    assert (installed["cuda"], installed["hip"]) == (torch.version.cuda, torch.version.hip)
    cuda = tmp_path / "cuda.py"
    cuda.write_text("from typing import Optional\n__version__ = '2.13.0+cu130'\n"
                    "cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n")  # fmt: skip
    assert torch_build(cuda) == {"__version__": "2.13.0+cu130", "cuda": "13.0", "hip": None}
    broken = tmp_path / "broken.py"
    broken.write_text("cuda = (\n")
    assert torch_build(broken) is None  # unreadable: the caller asks torch itself
    assert torch_build(tmp_path / "missing.py") is None
    partial = tmp_path / "partial.py"
    partial.write_text("cuda = None\n")  # no hip: not a file this reader knows
    assert torch_build(partial) is None


_GPU_JOB_SCRIPT = """
import sys
from kernelab.runners.job import run_job
from kernelab.service.contract.schemas import JobSpec
print(run_job(JobSpec.model_validate_json(sys.argv[1])).model_dump_json())
"""


@pytest.mark.gpu
def test_softmax_job_on_gpu():
    # Triton's mode is fixed per process by its first import (kernels/_device.py), and this test
    # session may already hold interpreted kernels: run the GPU job in a fresh child process.
    import subprocess
    import sys

    spec = JobSpec.model_validate(
        {
            "benchmark": "softmax",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"},
            "sweep": {"M": [4096], "N": [4096]},
            "measurement": {"budget_ms": 500.0},
            "probes": NO_PROBES,
            "device": "cuda",
        }
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _GPU_JOB_SCRIPT, spec.model_dump_json()],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = JobResult.model_validate_json(done.stdout.strip().splitlines()[-1])
    (cell,) = result.cells
    assert result.timer == "cuda-graph"  # the GPU default; both softmax variants can be captured
    assert cell.timers == {"baseline": "cuda-graph", "candidate": "cuda-graph"}
    assert cell.error is None
    assert cell.correctness["baseline"].passed and cell.correctness["candidate"].passed
    # 4096*4096 float32 read + written = 128 MiB; at <= 4.8 TB/s (HBM3e datasheet) >= 28 us.
    assert min(s.duration_ns for s in cell.samples.rows()) > 128 * 2**20 / 4.8e12 * 1e9
    assert any(s.sm_clock_mhz is not None for s in cell.samples.rows())


def test_a_nul_in_a_benchmark_error_is_escaped_not_fatal() -> None:
    """A cell's error comes from benchmark code: a NUL in it (refused by every stored text) must
    not make the cells the worker measured unreadable."""
    from kernelab.runners.cells import _short_error
    from kernelab.service.contract.schemas import CellResult

    text = _short_error(RuntimeError("bad\x00byte"))
    assert text == "RuntimeError: bad\\x00byte"
    assert CellResult.model_validate({"index": 0, "params": {}, "error": text}).error == text
