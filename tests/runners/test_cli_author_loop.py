"""``kernelab run``/``validate``/``submit`` as a kernel author meets them: a benchmark module in the
current folder imports without ``PYTHONPATH``; a single-file Triton benchmark works on a CPU (the
interpreter mode is set before its import); several specs, ``--quiet``, ``--no-probes``,
``timeout_s``; ``--version``, shell completion, the configuration file; ``kernelab init``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelab.runners.cli import app
from kernelab.runners.local import free_port
from kernelab.service.contract.schemas import Comparison

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

KERNELAB = str(Path(sys.executable).parent / "kernelab")  # the console script, as a user runs it

TRITON_MODULE = """
import torch
import triton
import triton.language as tl

import kernelab


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


# a self-check at import, as a single-file script has
_x = torch.ones(8)
_o = torch.empty_like(_x)
add_kernel[(1,)](_x, _x, _o, 8, BLOCK=8)
assert bool((_o == 2).all())

bench = kernelab.benchmark("add", params={"n": 64})


@bench.inputs
def inputs(p, device, seed):
    g = torch.Generator(device).manual_seed(seed)
    x = torch.randn(p.n, generator=g, device=device)
    return {"x": x, "y": torch.randn(p.n, generator=g, device=device)}


@bench.variant("torch")
def eager(p, x, y):
    return x + y


@bench.prepared("triton")
def fused(p, x, y):
    out = torch.empty_like(x)
    return lambda: (add_kernel[(1,)](x, y, out, p.n, BLOCK=64), out)[1]


@bench.reference
def reference(p, x, y):
    return x.double() + y.double()


@bench.work
def work(p, variant):
    return {"flops": p.n, "bytes_read": 8 * p.n, "bytes_written": 4 * p.n}
"""

TORCH_MODULE = """
import time

import torch

import kernelab

bench = kernelab.benchmark("neg", params={"n": 64, "sleep_s": 0.0})


@bench.inputs
def inputs(p, device, seed):
    return {"x": torch.randn(p.n, generator=torch.Generator().manual_seed(seed)).to(device)}


@bench.prepared("a")
def a(p, x):
    time.sleep(p.sleep_s)
    return lambda: torch.neg(x)


@bench.variant("b")
def b(p, x):
    return -x


@bench.reference
def reference(p, x):
    return -x.double()


@bench.work
def work(p, variant):
    return kernelab.Work(bytes_read=4 * p.n, bytes_written=4 * p.n)
"""


def _spec(module: str, baseline: str, candidate: str, extra: str = "") -> str:
    return (
        f'benchmark: "{module}"\nbaseline: {{variant: {baseline}}}\ncandidate: {{variant: {candidate}}}\n'
        f"measurement: {{budget_ms: 60, min_time_ms: 0}}\n{extra}"
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "PYTHONPATH")}
    return {**env, **extra}


def _kernelab(cwd: Path, *args: str, timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [KERNELAB, *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="the CPU case: no NVIDIA device")
def test_a_single_file_triton_benchmark_in_the_current_folder_runs_on_the_cpu(tmp_path: Path) -> None:
    (tmp_path / "addbench.py").write_text(TRITON_MODULE, encoding="utf-8")
    (tmp_path / "add.yaml").write_text(_spec("addbench:bench", "torch", "triton"), encoding="utf-8")
    checked = _kernelab(tmp_path, "validate", "add.yaml")  # no PYTHONPATH, no TRITON_INTERPRET
    assert checked.returncode == 0, checked.stderr
    assert "active drivers" not in checked.stderr
    ran = _kernelab(tmp_path, "run", "add.yaml", "--no-probes", "--json", "out.json")
    assert ran.returncode == 0, ran.stderr
    comparison = Comparison.model_validate_json((tmp_path / "out.json").read_text())
    assert comparison.cells[0].error is None and comparison.cells[0].verdict != "incorrect"
    assert comparison.node.triton_interpret


def test_a_benchmark_module_beside_its_spec_imports_from_another_folder(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "negbench.py").write_text(TORCH_MODULE, encoding="utf-8")
    (tmp_path / "bench" / "neg.yaml").write_text(_spec("negbench:bench", "a", "b"), encoding="utf-8")
    checked = _kernelab(tmp_path, "validate", "bench/neg.yaml")
    assert checked.returncode == 0, checked.stderr


def test_several_specs_quiet_no_probes_one_json_list(tmp_path: Path) -> None:
    (tmp_path / "negbench.py").write_text(TORCH_MODULE, encoding="utf-8")
    (tmp_path / "one.yaml").write_text(_spec("negbench:bench", "a", "b"), encoding="utf-8")
    (tmp_path / "two.yaml").write_text(
        _spec("negbench:bench", "b", "a", "params: {n: 32}\n"), encoding="utf-8"
    )
    # about several specs, not the gate: a and b really differ a little, so one order may read slower
    ran = _kernelab(tmp_path, "run", "one.yaml", "two.yaml", "--quiet", "--no-probes", "--json", "out.json",
                    "--fail-on", "failed,incorrect")  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert "[1/1]" not in ran.stderr and "running" not in ran.stderr  # --quiet: no progress lines
    assert ran.stdout.count("negbench:bench") == 2  # both tables
    comparisons = [Comparison.model_validate(c) for c in json.loads((tmp_path / "out.json").read_text())]
    assert [c.cells[0].params for c in comparisons] == [{}, {"n": 32}]
    assert all(c.probes == [] for c in comparisons)


def test_every_spec_is_checked_before_the_first_runs(tmp_path: Path) -> None:
    (tmp_path / "negbench.py").write_text(TORCH_MODULE, encoding="utf-8")
    (tmp_path / "one.yaml").write_text(_spec("negbench:bench", "a", "b"), encoding="utf-8")
    (tmp_path / "bad.yaml").write_text(_spec("negbench:bench", "a", "c"), encoding="utf-8")
    ran = _kernelab(tmp_path, "run", "one.yaml", "bad.yaml", "--no-probes")
    assert ran.returncode == 2
    assert "bad.yaml:3: candidate.variant: unknown variant 'c'" in ran.stderr
    assert "running" not in ran.stderr and ran.stdout == ""


def test_run_enforces_the_specs_timeout(tmp_path: Path) -> None:
    (tmp_path / "negbench.py").write_text(TORCH_MODULE, encoding="utf-8")
    spec = _spec("negbench:bench", "a", "b", "params: {sleep_s: 600.0}\ntimeout_s: 3\n")
    (tmp_path / "slow.yaml").write_text(spec, encoding="utf-8")
    ran = _kernelab(tmp_path, "run", "slow.yaml", "--no-probes", timeout=120)
    assert ran.returncode == 1
    assert "timed out" in ran.stderr and "timeout_s = 3 s" in ran.stderr


def test_a_revision_spec_needs_no_local_import_of_its_benchmark(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "onlyinrepo.py").write_text(TORCH_MODULE, encoding="utf-8")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for cmd in (["init", "-q", "-b", "main"], ["add", "."], ["commit", "-qm", "bench"]):
        subprocess.run([*git, *cmd], cwd=repo, check=True)
    (tmp_path / "s.yaml").write_text(_spec("onlyinrepo:bench", "a", "b"), encoding="utf-8")
    port = free_port()
    ran = _kernelab(
        tmp_path, "submit", "s.yaml", "--repo", str(repo), "--baseline-ref", "main",
        "--candidate-ref", "HEAD", "--server", f"http://127.0.0.1:{port}", "--token", "t" * 20,
    )  # fmt: skip
    assert "cannot import" not in ran.stderr
    assert ran.returncode == 3 and "server unreachable" in ran.stderr  # it got as far as the server


def test_version_and_completion() -> None:
    from kernelab import __version__

    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"kernelab {__version__}"
    assert "--install-completion" in CliRunner().invoke(app, ["--help"]).output


def test_the_config_file_gives_server_and_token_below_options_and_environment(tmp_path: Path) -> None:
    port, other = free_port(), free_port()
    config = tmp_path / "config.toml"
    config.write_text(f'server = "http://127.0.0.1:{port}"\ntoken = "{"c" * 20}"\n', encoding="utf-8")
    config.chmod(0o600)
    env = {"KERNELAB_CONFIG": str(config), "KERNELAB_SERVER": "", "KERNELAB_TOKEN": ""}
    env_clean = {k: None for k in ("KERNELAB_SERVER", "KERNELAB_TOKEN")}
    result = CliRunner().invoke(app, ["report", "1"], env={**env_clean, "KERNELAB_CONFIG": str(config)})
    assert result.exit_code == 3 and f"127.0.0.1:{port}" in result.output  # the file's server, its token
    result = CliRunner().invoke(
        app,
        ["report", "1"],
        env={**env, "KERNELAB_SERVER": f"http://127.0.0.1:{other}", "KERNELAB_TOKEN": None},
    )
    assert result.exit_code == 3 and f"127.0.0.1:{other}" in result.output  # the environment wins
    result = CliRunner().invoke(
        app,
        ["report", "1", "--server", f"http://127.0.0.1:{other}"],
        env={**env_clean, "KERNELAB_CONFIG": str(config)},
    )
    assert f"127.0.0.1:{other}" in result.output  # the option wins


def test_the_config_file_reaches_every_client_command_and_no_runner(tmp_path: Path) -> None:
    import typer

    from kernelab.runners.cli.config import NOT_CLIENT_COMMANDS, default_map

    group = typer.main.get_command(app)
    ctx = typer.Context(group)
    # the commands load lazily (kernelab.runners.cli.COMMANDS); the invoked one is loaded by the time
    # the group's callback builds the default map, here all of them are
    loaded = {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}  # type: ignore[attr-defined]
    values = {"server": "http://127.0.0.1:1", "token": "t" * 20}
    given = default_map(group, values)
    clients = []
    for name, command in loaded.items():
        subs = getattr(command, "commands", None) or {name: command}
        for sub_name, sub in subs.items():
            takes = {p.name for p in sub.params} & {"server", "token"}
            got = given.get(name, {}) if sub is command else given.get(name, {}).get(sub_name, {})
            if name in NOT_CLIENT_COMMANDS:
                assert got == {}, name  # a runner's token is of another kind
            elif takes:
                clients.append(name if sub is command else f"{name} {sub_name}")
                assert set(got) == takes, (name, sub_name)
    assert {"jobs", "history", "compare-jobs", "cancel", "rerun", "bisect", "submit", "report"} <= set(
        clients
    )
    # through the real command line: `jobs` reads the file's server
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f'server = "http://127.0.0.1:{port}"\n', encoding="utf-8")
    env = {"KERNELAB_CONFIG": str(config), "KERNELAB_SERVER": None, "KERNELAB_TOKEN": None}
    no_token = CliRunner().invoke(app, ["jobs"], env=env)
    assert no_token.exit_code == 2 and "configuration file" in no_token.output
    config.write_text(f'server = "http://127.0.0.1:{port}"\ntoken = "{"c" * 20}"\n', encoding="utf-8")
    config.chmod(0o600)
    for args in (["jobs"], ["history", "softmax"], ["cancel", "1"], ["compare-jobs", "1", "2"]):
        result = CliRunner().invoke(app, args, env=env)
        assert f"127.0.0.1:{port}" in result.output, (args, result.output)


def test_a_bad_config_file_is_named_and_exits_2(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('server = "http://x"\nsevrer = "typo"\n', encoding="utf-8")
    result = CliRunner().invoke(app, ["report", "1"], env={"KERNELAB_CONFIG": str(config)})
    assert result.exit_code == 2 and f"{config}: unknown key(s) sevrer" in result.output
    result = CliRunner().invoke(app, ["report", "1"], env={"KERNELAB_CONFIG": str(tmp_path / "none.toml")})
    assert result.exit_code == 2 and "no such file" in result.output
    # a command that reads neither server nor token never reads the file
    spec = tmp_path / "ok.yaml"
    spec.write_text("benchmark: softmax\nbaseline: {variant: torch}\ncandidate: {variant: torch}\n"
                    "sweep: {M: [8], N: [16]}\ndevice: cpu\n", encoding="utf-8")  # fmt: skip
    checked = CliRunner().invoke(app, ["validate", str(spec)], env={"KERNELAB_CONFIG": str(config)})
    assert checked.exit_code == 0 and "ok" in checked.output, checked.output


@pytest.mark.slow
def test_init_scaffolds_a_benchmark_spec_and_test_that_run_on_the_cpu(tmp_path: Path) -> None:
    made = _kernelab(tmp_path, "init", "rowsoftmax")
    assert made.returncode == 0, made.stderr
    assert {p.name for p in tmp_path.iterdir()} == {
        "rowsoftmax.py", "rowsoftmax_kernel.py", "rowsoftmax.yaml", "test_rowsoftmax.py",
    }  # fmt: skip
    again = _kernelab(tmp_path, "init", "rowsoftmax")
    assert again.returncode == 2 and "exist" in again.stderr  # nothing overwritten
    ran = _kernelab(tmp_path, "run", "rowsoftmax.yaml", "--no-probes", "--quiet", "--json", "out.json")
    assert ran.returncode == 0, ran.stderr
    cell = Comparison.model_validate_json((tmp_path / "out.json").read_text()).cells[0]
    assert cell.error is None and cell.verdict not in ("incorrect", "failed")
    tested = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_rowsoftmax.py"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert (
        tmp_path / ".kernelab" / "results" / "test_rowsoftmax.py_test_rowsoftmax_triton_not_slower.json"
    ).exists()
