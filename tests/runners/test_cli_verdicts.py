"""``kernelab run`` on this CPU with kernels that are fast and wrong, forget a mask or raise: the
table reads ``incorrect``/``failed`` with the reason, the exit status follows ``--fail-on``, a bad
``--fail-on`` is exit 2 naming the option, an unreachable server exit 3, and on a terminal the
verdict is red (plain with ``NO_COLOR`` or through a pipe).

The benchmarks are a user's own module (``tests/wrong_kernels/wrongbench.py``), named in the spec
as ``wrongbench:Object`` with its folder on the import path (specs: ``tests/wrong_kernels/cases.py``)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelab.runners.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK, app
from kernelab.runners.local import free_port
from kernelab.service.contract.schemas import Comparison
from kernelab.service.judge.report import format_duration_ns
from tests.wrong_kernels.cases import FAST_WRONG, FORGOTTEN_MASK, RAISES, WRONG_DIR, write_spec

pytestmark = pytest.mark.slow  # the slow tier: processes and servers (docs/testing.md, "Tiers")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def wrongbench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(WRONG_DIR))


def _run(spec: Path, *args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["run", str(spec), *args])


def _row(text: str, label: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(label + " "))


@pytest.mark.usefixtures("wrongbench")
def test_fast_but_wrong_reads_incorrect_and_exits_1(tmp_path: Path) -> None:
    out_json, out_md = tmp_path / "c.json", tmp_path / "c.md"
    result = _run(write_spec(tmp_path, FAST_WRONG), "--json", str(out_json), "--markdown", str(out_md))
    assert result.exit_code == EXIT_FAILED, result.output
    comparison = Comparison.model_validate_json(out_json.read_text())
    assert [c.verdict for c in comparison.cells] == ["incorrect", "incorrect"]
    assert comparison.summary == {"incorrect": 2}
    text = result.stdout
    for cell in comparison.cells:
        row = _row(text, cell.label)
        assert re.search(r"\)\s+incorrect\s+.*incorrect$", row), row  # timing in ( ), then the verdict
        assert f"({format_duration_ns(cell.candidate.median_ns)})" in row
    assert "faster" not in text and "verdicts: 2 incorrect" in text
    why = text.split("\nwhy:\n", 1)[1].splitlines()
    assert why[0].startswith("  incorrect  M=32, N=256: candidate: FAIL: 8192/8192 elements (100%) outside")
    rule = "tolerance: |out - ref| <= 1e-05 + 1.3e-06 |ref|: rtol 1.3e-06, atol 1e-05 (float32 defaults of"
    assert rule in why[0] and "torch.testing); no reduction declared" in why[0]
    assert result.stderr.splitlines()[-2:] == [
        "gate failed (--fail-on failed,incorrect,slower): 2 of 2 cells",
        "  incorrect: 2 cells (M=32, N=256; M=32, N=1024)",
    ]
    markdown = out_md.read_text()
    assert markdown.count("| ❌ **incorrect** |") == 2 and "**faster**" not in markdown
    assert "- ❌ **incorrect** · M=32, N=256: candidate: FAIL:" in markdown
    assert "tolerance: \\|out - ref\\| \\<= 1e-05 + 1.3e-06 \\|ref\\|: rtol 1.3e-06" in markdown


@pytest.mark.usefixtures("wrongbench")
def test_forgotten_mask_reads_incorrect_and_fail_on_picks_the_set(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, FORGOTTEN_MASK)
    gated = _run(spec)
    assert gated.exit_code == EXIT_FAILED, gated.output
    row = _row(gated.stdout, "B=2, H=2, S=64, D=16, valid=40")
    assert re.search(r"\)\s+incorrect\s+.*incorrect$", row), row
    assert "  incorrect  B=2, H=2, S=64, D=16, valid=40: candidate: FAIL:" in gated.stdout
    assert "bad rows 2/2" in gated.stdout  # every sequence of the batch is wrong
    assert "  incorrect: B=2, H=2, S=64, D=16, valid=40" in gated.stderr
    # the same wrong cell passes a gate that does not name incorrect, and fails one that does
    lenient = _run(spec, "--fail-on", "failed,nondeterministic")
    assert lenient.exit_code == EXIT_OK, lenient.output
    passed = "gate passed: no cell is failed or nondeterministic (--fail-on failed,nondeterministic)"
    assert passed in lenient.stderr
    assert "incorrect" in _row(lenient.stdout, "B=2, H=2, S=64, D=16, valid=40")  # still told
    strict = _run(spec, "--fail-on", " Slower, INCORRECT ")
    assert strict.exit_code == EXIT_FAILED
    assert "gate failed (--fail-on incorrect,slower): 1 of 1 cells" in strict.stderr


@pytest.mark.usefixtures("wrongbench")
def test_a_failed_job_exits_1_whatever_fail_on_says(tmp_path: Path) -> None:
    result = _run(write_spec(tmp_path, RAISES), "--fail-on", "slower")
    assert result.exit_code == EXIT_FAILED, result.output
    assert "verdicts: 2 failed" in result.stdout
    message = "RuntimeError: kernel launch failed: invalid configuration argument"
    assert f"job failed: all 2 cells failed; first: {message}" in result.stdout
    assert f"  failed  2 cells (M=8, N=64; M=8, N=128): {message}" in result.stdout
    assert result.stderr.splitlines()[-1] == f"job failed: all 2 cells failed; first: {message}"
    assert "gate passed" not in result.stderr


@pytest.mark.parametrize("value", ["bogus", "faster", "same", "", "incorrect,,failed", "failed;incorrect"])
@pytest.mark.parametrize("command", ["run", "submit", "report"])
def test_bad_fail_on_exits_2_naming_the_option(tmp_path: Path, command: str, value: str) -> None:
    """Checked before anything runs or is sent: the server here is unreachable, the spec not even read."""
    target = "1" if command == "report" else str(tmp_path / "never-read.yaml")
    extra = [] if command == "run" else ["--server", f"http://127.0.0.1:{free_port()}", "--token", "t"]
    result = CliRunner().invoke(app, [command, target, "--fail-on", value, *extra])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.startswith("--fail-on: "), result.stderr
    allowed = "failed, incorrect, nondeterministic, implausible, inconclusive, slower"
    assert f"choose from {allowed}" in result.stderr or f"give a comma list of {allowed}" in result.stderr
    assert "Traceback" not in result.output


def test_unreachable_server_is_exit_3(tmp_path: Path) -> None:
    server = ["--server", f"http://127.0.0.1:{free_port()}", "--token", "t"]
    spec = tmp_path / "softmax.yaml"
    spec.write_text(
        "benchmark: softmax\nbaseline: {variant: torch}\ncandidate: {variant: triton}\nparams: {M: 4, N: 8}\n"
    )
    submitted = CliRunner().invoke(app, ["submit", str(spec), "--wait", *server])
    assert submitted.exit_code == EXIT_NO_VERDICT, submitted.output
    assert "server unreachable" in submitted.stderr
    reported = CliRunner().invoke(app, ["report", "7", *server])
    assert reported.exit_code == EXIT_NO_VERDICT and "server unreachable" in reported.stderr


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``kernelab ARGS`` with stdout on a pseudo-terminal: (exit status, stdout, stderr)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        stdout=slave,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    _, stderr = proc.communicate(timeout=120)
    return proc.returncode, b"".join(chunks).decode(), stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_incorrect_is_red_on_a_terminal_and_plain_otherwise(tmp_path: Path) -> None:
    spec = str(write_spec(tmp_path, FAST_WRONG))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(WRONG_DIR), str(REPO)])}
    env.pop("NO_COLOR", None)
    code, out, _ = _on_a_terminal(["run", spec], env)
    assert code == EXIT_FAILED
    red_incorrect = "\x1b[31m\x1b[1mincorrect\x1b[0m"  # click.style(fg="red", bold=True)
    assert out.count(red_incorrect) == 2 + 2  # two table rows, two lines of reasons
    assert re.search(r"\x1b\[31m\x1b\[1m2 incorrect\x1b\[0m", out)
    code, out, _ = _on_a_terminal(["run", spec], {**env, "NO_COLOR": "1"})
    assert code == EXIT_FAILED and "incorrect" in out and "\x1b[" not in out
    piped = subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", "run", spec],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.returncode == EXIT_FAILED and "incorrect" in piped.stdout and "\x1b[" not in piped.stdout
