"""The ``kernelab`` CLI: ``run`` on this CPU writes the Comparison JSON; bad specs exit 2 with FILE:LINE."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from servers import serve_process
from typer.testing import CliRunner

from kernelab.runners.cli import app
from kernelab.runners.local import example_spec_path
from kernelab.runners.specfile import SpecFileError, load_spec
from kernelab.service.contract.schemas import Comparison

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
VERDICTS = {"faster", "slower", "same", "inconclusive"}

GOOD_SPEC = """\
benchmark: softmax
baseline:
  variant: torch
candidate:
  variant: triton
sweep:
  M: [8]
  N: [16]
measurement:
  budget_ms: 50
"""


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def _write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.slow  # kernelab run with its probes and measuring processes: the slow tier
def test_run_softmax_example_writes_comparison_json(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "out.json", tmp_path / "out.md"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kernelab.runners.cli",
            "run",
            str(EXAMPLES / "softmax.yaml"),
            "--json",
            str(out_json),
            "--markdown",
            str(out_md),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    comparison = Comparison.model_validate_json(out_json.read_text())
    spec = load_spec(EXAMPLES / "softmax.yaml")
    assert [c.params for c in comparison.cells] == spec.cells("cpu")
    for cell in comparison.cells:
        assert cell.error is None
        for stats in (cell.baseline, cell.candidate):
            assert stats.n >= spec.measurement.min_rounds
            assert 0 < stats.min_ns <= stats.median_ns
        assert cell.ratio == pytest.approx(cell.candidate.median_ns / cell.baseline.median_ns)
        assert cell.ci_low <= cell.ratio <= cell.ci_high
        assert cell.verdict in VERDICTS
        assert cell.label in proc.stdout  # the table shows each cell
    phases = [p.phase for p in comparison.probes]
    assert phases == ["before", "after"]
    for report in comparison.probes:
        assert report.copy_bandwidth and all(r.bandwidth_gbps > 0 for r in report.copy_bandwidth)
        assert report.all_reduce and all(r.time_us > 0 and r.correct for r in report.all_reduce)
    assert "GB/s" in proc.stdout  # probe readings are printed
    markdown = out_md.read_text()
    assert "|" in markdown and comparison.cells[0].label in markdown
    assert "[1/2]" in proc.stderr and "[2/2]" in proc.stderr  # a progress line per cell


def test_bad_yaml_exits_2_with_file_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD_SPEC.replace("  M: [8]", "  M: [8, 16"))
    result = _invoke("run", str(path))
    assert result.exit_code == 2
    assert f"{path}:7:" in result.output or f"{path}:8:" in result.output
    assert "not valid YAML" in result.output
    assert "Traceback" not in result.output


def test_unknown_field_names_field_and_line(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD_SPEC.replace("  budget_ms: 50", "  budget_ms: 50\n  budget_msx: 3"))
    result = _invoke("run", str(path))
    assert result.exit_code == 2
    assert f"{path}:11: measurement.budget_msx: unknown field 'budget_msx'" in result.output


def test_benchmark_parameter_error_points_at_its_key(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD_SPEC.replace("  N: [16]", "  N: [-16]"))
    result = _invoke("run", str(path))
    assert result.exit_code == 2
    assert f"{path}:8: sweep.N:" in result.output
    assert "greater than 0" in result.output


def test_unknown_variant_and_missing_field(tmp_path: Path) -> None:
    text = GOOD_SPEC.replace("variant: triton", "variant: cuda-graph").replace("benchmark: softmax\n", "")
    path = _write(tmp_path, "name: x\n" + text)
    with pytest.raises(SpecFileError) as info:
        load_spec(path)
    assert [(p.line, p.loc) for p in info.value.problems] == [(1, "benchmark")]
    path = _write(tmp_path, GOOD_SPEC.replace("variant: triton", "variant: cuda-graph"))
    with pytest.raises(SpecFileError) as info:
        load_spec(path)
    assert [(p.line, p.loc) for p in info.value.problems] == [(5, "candidate.variant")]
    assert "cuda-graph" in info.value.problems[0].message


def test_duplicate_key_and_non_mapping(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD_SPEC + "benchmark: matmul\n")
    with pytest.raises(SpecFileError) as info:
        load_spec(path)
    assert info.value.render() == f"{path}:11: benchmark: duplicate key"
    path = _write(tmp_path, "- just\n- a list\n")
    result = _invoke("submit", str(path), "--token", "t")
    assert result.exit_code == 2
    assert f"{path}:1: a job spec must be a mapping" in result.output


def test_json_spec_line_numbers(tmp_path: Path) -> None:
    text = (
        '{\n  "benchmark": "softmax",\n  "baseline": {"variant": "torch"},\n'
        '  "candidate": {"variant": "triton"},\n  "sweep": {"M": [8], "N": [16]},\n  "colour": 1\n}\n'
    )
    path = _write(tmp_path, text, "spec.json")
    result = _invoke("submit", str(path), "--token", "t")
    assert result.exit_code == 2
    assert f"{path}:6: colour: unknown field 'colour'" in result.output


def test_missing_file_and_missing_token(tmp_path: Path) -> None:
    result = _invoke("run", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 2 and "cannot read" in result.output
    path = _write(tmp_path, GOOD_SPEC)
    result = _invoke("submit", str(path), "--token", "")
    assert result.exit_code == 2 and "no token" in result.output


@pytest.mark.parametrize("name", ["softmax", "matmul"])
def test_examples_validate_and_are_bundled(name: str) -> None:
    bundled = example_spec_path(name)
    assert bundled.read_text() == (EXAMPLES / f"{name}.yaml").read_text()
    spec = load_spec(bundled)
    cpu, cuda = spec.cells("cpu"), spec.cells("cuda")
    # CPU cells are small (Triton interpreter), GPU cells are real sizes.
    assert max(c["M"] for c in cpu) <= 128 < min(c["M"] for c in cuda)
    assert spec.timeout_s >= 60


def test_up_picks_the_gpu_demo_on_a_gpu_and_a_native_cpu_demo_on_a_cpu() -> None:
    """``kernelab up``'s demo: softmax.yaml (eager PyTorch vs Triton) with a CUDA GPU; without one,
    softmax_cpu.yaml first (both sides native PyTorch, no Triton), then softmax.yaml as the Triton
    kernel's correctness check, each with the note that says what its verdict means."""
    from kernelab.runners.local import CPU_DEMO_NOTE, TRITON_CHECK_NOTE, demo_specs

    assert demo_specs(True) == [(example_spec_path("softmax"), "")]
    assert demo_specs(False) == [
        (example_spec_path("softmax_cpu"), CPU_DEMO_NOTE),
        (example_spec_path("softmax"), TRITON_CHECK_NOTE),
    ]
    bundled = example_spec_path("softmax_cpu")
    assert bundled.read_text() == (EXAMPLES / "softmax_cpu.yaml").read_text()
    spec = load_spec(bundled)
    assert (spec.benchmark, spec.baseline.variant, spec.candidate.variant) == ("softmax", "unfused", "torch")
    assert "interpreted" in TRITON_CHECK_NOTE and "inconclusive" in TRITON_CHECK_NOTE


@pytest.mark.slow  # measures the CPU demo's cell for real
def test_the_cpu_demo_measures_two_native_sides_and_the_fused_one_wins(tmp_path: Path) -> None:
    """The CPU demo's comparison is a real one: no side ran in Triton's interpreter, both outputs
    pass, and ATen's fused softmax is faster than the unfused formula (its 95% CI below 1; the
    demo's 2-3x on a 2-core machine: four passes and two temporaries against one pass)."""
    out = tmp_path / "cmp.json"
    spec = (EXAMPLES / "softmax_cpu.yaml").read_text().replace("N: [1024, 4096]", "N: [4096]")
    path = _write(tmp_path, spec)
    result = _invoke("run", str(path), "--json", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    comparison = Comparison.model_validate_json(out.read_text())
    (cell,) = comparison.cells
    assert "interpreted" not in {r.code for r in cell.reasons}, cell.reasons
    assert cell.verdict in ("faster", "inconclusive"), cell.verdict  # never "slower"; noise may leave it open
    assert cell.ci_high is not None and cell.ci_high < 1.0, (cell.ratio, cell.ci_low, cell.ci_high)


def test_up_refuses_a_port_already_in_use(tmp_path: Path) -> None:
    # Another server on the port would answer /healthz in place of ours and reject our token.
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "kernelab.runners.cli",
                "up",
                "--exit",
                "--port",
                str(port),
                "--data-dir",
                str(tmp_path / "data"),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr + proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        (".x:y", "no relative import"),
        ("..:y", "no relative import"),
        ("kernelab.kernels.base:Benchmark", "abstract benchmark class"),
        ("kernelab.kernels.base:Params", "is not a kernelab.kernels.Benchmark"),
    ],
)
@pytest.mark.parametrize("command", ["run", "validate"])
def test_bad_benchmark_references_are_one_line_naming_file_and_line(
    tmp_path: Path, command: str, ref: str, fragment: str
) -> None:
    path = _write(tmp_path, "name: bad\n" + GOOD_SPEC.replace("benchmark: softmax", f'benchmark: "{ref}"'))
    result = _invoke(command, str(path))
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    [line] = result.output.strip().splitlines()
    assert line.startswith(f"{path}:2: benchmark: ") and fragment in line


def test_validate_prints_the_cell_counts_and_refuses_a_seed_torch_cannot_take(tmp_path: Path) -> None:
    path = _write(tmp_path, GOOD_SPEC + "  seed: 100000000000000000000000000000\n")
    result = _invoke("validate", str(path))
    assert result.exit_code == 2
    expected = f"{path}:11: measurement.seed: Input should be less than or equal to {2**62}"
    assert result.output.strip() == expected
    path = _write(tmp_path, GOOD_SPEC)
    result = _invoke("validate", str(path))
    assert result.exit_code == 0
    assert result.output.strip() == f"{path}: ok: softmax, torch vs triton; 1 cell(s) on cpu, 1 on cuda"


def test_an_alias_bomb_is_one_line_from_submit(tmp_path: Path) -> None:
    bomb = "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 9))
    path = _write(tmp_path, GOOD_SPEC + "a0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9]\n" + bomb)
    result = _invoke("submit", str(path), "--token", "t")
    assert result.exit_code == 2
    # a5 is 9**6 leaves: the first top-level key past MAX_EXPANDED_NODES
    expected = f"{path}:16: a5: the YAML expands to more than 100000 nodes through its aliases"
    assert result.output.strip() == expected


NOBODY_MODULE = """\
from pydantic import Field

from kernelab.kernels import Benchmark, Params


class NParams(Params):
    N: int = Field(gt=0)


class Bench(Benchmark[NParams]):
    name, Params, variants = "kl_nobody", NParams, ("a", "b")

    def make_inputs(self, params, device, seed): raise RuntimeError("never run")
    def prepare(self, variant, params, inputs): return lambda: None
    def reference(self, params, inputs): return None
    def work(self, params, variant): return None
"""


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A ``kernelab serve`` of this test's own: on the shared one, another module's runner (one that
    claims without an advertisement, and so takes any job) may still count as live."""
    token = "cli-own-server-admin-token-0123456789abcdef"
    with serve_process(tmp_path, {"KERNELAB_ADMIN_TOKEN": token}) as (_, url, _log):
        yield url, token


@pytest.mark.slow  # a server process of its own
def test_submit_says_why_the_job_waits_when_no_runner_offers_its_benchmark(
    own_server: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No live runner advertises the benchmark: ``submit`` prints the job's ``waiting_for`` on
    stderr after its id; ``submit --wait`` prints it once while it waits."""
    url, token = own_server
    (tmp_path / "kl_nobody.py").write_text(NOBODY_MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))  # the CLI imports it to check the spec
    spec = _write(tmp_path, "benchmark: kl_nobody:Bench\nbaseline: {variant: a}\ncandidate: {variant: b}\n"
                  "sweep: {N: [4]}\ndevice: cpu\n")  # fmt: skip
    result = _invoke("submit", str(spec), "--server", url, "--token", token)
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert job_id.isdigit()
    assert f"job {job_id}: waiting for a runner that offers benchmark" in result.stderr
    assert "no live runner advertises it" in result.stderr
    waited = _invoke("submit", str(spec), "--server", url, "--token", token, "--wait", "--timeout-s", "2")
    assert waited.exit_code == 3
    assert waited.stderr.count("no live runner advertises it") == 1, waited.stderr


@pytest.mark.slow  # a server process of its own
def test_submit_no_probes_queues_the_job_with_every_probe_off(
    own_server: tuple[str, str], tmp_path: Path
) -> None:
    """``submit --no-probes`` as ``run --no-probes``: the stored spec has every probe off."""
    import httpx

    url, token = own_server
    spec = _write(tmp_path, "benchmark: softmax\nbaseline: {variant: torch}\ncandidate: {variant: torch}\n"
                  "sweep: {M: [8], N: [16]}\ndevice: cpu\n")  # fmt: skip
    ids = {}
    for flag in ((), ("--no-probes",)):
        result = _invoke("submit", str(spec), "--server", url, "--token", token, *flag)
        assert result.exit_code == 0, result.output
        ids[flag] = result.stdout.strip()
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as http:
        probes = {flag: http.get(f"/api/v1/jobs/{i}").json()["spec"]["probes"] for flag, i in ids.items()}
    assert probes[()]["copy_bandwidth"] and probes[()]["all_reduce"]
    off = probes[("--no-probes",)]
    assert not any(off[k] for k in ("copy_bandwidth", "all_reduce", "nvml", "matmul_peak", "canary"))


def test_version_and_each_command_import_only_what_they_use() -> None:
    """``kernelab --version`` loads no command module, no schema, torch or scipy; a command loads
    its own module and not the others' (``kernelab.runners.cli.COMMANDS``)."""
    import subprocess
    import sys

    heavy = ("torch", "scipy", "httpx", "kernelab.service.contract.schemas", "kernelab.runners.cli.local",
             "kernelab.runners.cli.server", "kernelab.runners.cli.daemon")  # fmt: skip
    code = (
        "import sys\n"
        "from kernelab.runners.cli import app\n"
        "sys.argv = ['kernelab', *sys.argv[1:]]\n"
        "try:\n    app()\nexcept SystemExit:\n    pass\n"
        f"print([m for m in {heavy!r} if m in sys.modules])\n"
    )
    version = subprocess.run(
        [sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=120
    )
    assert version.stdout.splitlines() == [f"kernelab {kernelab_version()}", "[]"], version.stderr
    jobs = subprocess.run([sys.executable, "-c", code, "token", "--help"], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    loaded = eval(jobs.stdout.splitlines()[-1])  # noqa: S307 (our own print of a list of names)
    assert "kernelab.runners.cli.local" not in loaded and "kernelab.runners.cli.server" not in loaded
    assert "torch" not in loaded


def kernelab_version() -> str:
    from kernelab import __version__

    return __version__
