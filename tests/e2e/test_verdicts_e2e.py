"""Wrong and broken kernels read ``incorrect``/``failed`` everywhere, end to end over real HTTP.

``kernelab serve`` on a temp SQLite file; ``kernelab submit`` (with and without ``--wait``) of a
fast-but-wrong row softmax, an attention that forgot its padding mask, a kernel that raises, and a
revision A/B job whose candidate commit has a SyntaxError in a module every cell imports; one
``kernelab runner --once --allow-repo`` process runs them all. Then: the exit status of
``submit --wait`` and ``report`` under several ``--fail-on`` sets, the REST job and comparison,
the Markdown export, the jobs list and the job page (HTML).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from kernelab.runners.cli import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_VERDICT, EXIT_OK
from kernelab.runners.local import ServerProcess, admin_token, free_port
from tests.e2e.revision_repo import BENCH, _git, make_repo
from tests.wrong_kernels.cases import FAST_WRONG, FORGOTTEN_MASK, RAISES, WRONG_DIR, write_spec

pytestmark = [pytest.mark.slow]

REV_SPEC = """\
name: syntax error in the candidate
benchmark: "revpkg.bench:AxpyBenchmark"
baseline: {variant: torch}
candidate: {variant: torch}
sweep: {N: [1000, 100000]}
device: cpu
measurement: {warmup_ms: 5, budget_ms: 100, min_rounds: 6}
probes: {copy_bandwidth: false, all_reduce: false, nvml: false}
"""
SYNTAX_ERROR = "candidate: SyntaxError: expected ':' (impl.py, line 1)"


@dataclass
class Site:
    url: str
    token: str
    env: dict[str, str]
    specs: dict[str, Path]
    ids: dict[str, int]
    waited: dict[str, subprocess.CompletedProcess[str]]

    def get(self, path: str) -> httpx.Response:
        return httpx.get(self.url + path, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)


def cli(*args: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def _broken_commit(repo: Path) -> None:
    """On top of ``make_repo``: a commit whose ``prepare`` imports a module with a SyntaxError."""
    (repo / "revpkg" / "impl.py").write_text("def axpy(x, out)\n    return out\n")
    lazy = BENCH.replace(
        '        x = inputs["x"]\n',
        '        from revpkg import impl  # noqa: F401\n        x = inputs["x"]\n',
        1,
    )
    (repo / "revpkg" / "bench.py").write_text(lazy)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "syntax error in impl")


def _waiting(
    args: list[str], env: dict[str, str], cwd: Path | None = None
) -> tuple[subprocess.Popen[str], int]:
    """``kernelab submit ... --wait`` started; returns once it printed its job id."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**env, "PYTHONUNBUFFERED": "1"},
        cwd=cwd,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.strip().isdigit():
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"submit printed no job id: {line + out!r} {err!r}")
    return proc, int(line)


def _finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    tmp = tmp_path_factory.mktemp("verdicts")
    token = admin_token(tmp)
    path = os.pathsep.join([str(WRONG_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with pytest.MonkeyPatch.context() as mp:  # the server imports no benchmark: this shows it needs none
        mp.setenv("PYTHONPATH", path)
        server = ServerProcess(
            f"sqlite:///{tmp / 'kernelab.db'}",
            port=free_port(),
            admin_token=token,
            log_path=tmp / "server.log",
        ).start()
    try:
        env = {**os.environ, "PYTHONPATH": path, "KERNELAB_SERVER": server.url, "KERNELAB_TOKEN": token}
        env.pop("NO_COLOR", None)
        specs = {case["candidate"]: write_spec(tmp, case) for case in (FAST_WRONG, FORGOTTEN_MASK, RAISES)}
        repo = tmp / "kernels-repo"
        make_repo(repo)
        _broken_commit(repo)
        specs["revision"] = tmp / "rev.yaml"
        specs["revision"].write_text(REV_SPEC)
        ids = {}
        for name in ("nomask", "raises"):
            submitted = cli("submit", str(specs[name]), env=env)
            assert submitted.returncode == 0, submitted.stderr
            ids[name] = int(submitted.stdout)
        wrong, ids["unnormalised"] = _waiting(["submit", str(specs["unnormalised"]), "--wait"], env)
        refs = ["--baseline-ref", "main~3", "--candidate-ref", "main", "--repo", "."]
        revision, ids["revision"] = _waiting(
            ["submit", str(specs["revision"]), "--wait", *refs], env, cwd=repo
        )
        runner = cli(
            "runner",
            "--once",
            "--name",
            "verdict-node",
            "--work-dir",
            str(tmp / "runner"),
            "--allow-repo",
            str(repo),
            # the runner offers the user's benchmarks it can import: the server routes it their jobs
            "--benchmark",
            "wrongbench:RowSoftmax",
            "--benchmark",
            "wrongbench:PaddedAttention",
            env=env,
        )
        assert runner.returncode == 0, runner.stderr[-4000:]
        waited = {"unnormalised": _finish(wrong), "revision": _finish(revision)}
        yield Site(server.url, token, env, specs, ids, waited)
    finally:
        server.stop()


@pytest.mark.timeout(600)
def test_submit_wait_of_a_fast_but_wrong_kernel_reads_incorrect_and_exits_1(site: Site) -> None:
    waited = site.waited["unnormalised"]
    assert waited.returncode == EXIT_FAILED, waited.stderr
    assert "verdicts: 2 incorrect" in waited.stdout and "faster" not in waited.stdout
    assert re.search(r"^M=32, N=256 .*\)\s+incorrect\s+.*incorrect$", waited.stdout, re.M)
    assert "  incorrect  M=32, N=256: candidate: FAIL: 8192/8192 elements (100%)" in waited.stdout
    assert waited.stderr.splitlines()[-2:] == [
        "gate failed (--fail-on failed,incorrect,slower): 2 of 2 cells",
        "  incorrect: 2 cells (M=32, N=256; M=32, N=1024)",
    ]
    job = site.get(f"/api/v1/jobs/{site.ids['unnormalised']}").json()
    assert job["status"] == "succeeded" and job["summary"] == {"incorrect": 2}
    comparison = site.get(f"/api/v1/jobs/{site.ids['unnormalised']}/comparison").json()
    assert [c["verdict"] for c in comparison["cells"]] == ["incorrect", "incorrect"]
    assert all(
        c["reasons"][0]["code"] == "wrong-output" and c["reasons"][0]["side"] == "candidate"
        for c in comparison["cells"]
    )


@pytest.mark.timeout(600)
def test_report_of_the_forgotten_mask_follows_fail_on(site: Site) -> None:
    job_id = str(site.ids["nomask"])
    default = cli("report", job_id, env=site.env)
    assert default.returncode == EXIT_FAILED, default.stderr
    assert "  incorrect  B=2, H=2, S=64, D=16, valid=40: candidate: FAIL:" in default.stdout
    assert "gate failed (--fail-on failed,incorrect,slower): 1 of 1 cells" in default.stderr
    every = cli("report", job_id, "--reasons", env=site.env).stdout  # every reason, before the table
    assert every.index("reasons:") < every.index("[") < every.index("verdicts: 1 incorrect")
    assert cli("report", job_id, "--fail-on", "failed", env=site.env).returncode == EXIT_OK
    assert (
        cli(
            "report",
            job_id,
            "--fail-on",
            "slower,incorrect,failed,inconclusive,nondeterministic",
            env=site.env,
        ).returncode
        == EXIT_FAILED
    )
    markdown = cli("report", job_id, "--markdown", env=site.env)
    assert markdown.returncode == EXIT_FAILED
    assert re.search(r"\| ❌ \*\*incorrect\*\* \| [a-z, ]*incorrect \|", markdown.stdout)
    assert "- ❌ **incorrect** · B=2, H=2, S=64, D=16, valid=40: candidate: FAIL:" in markdown.stdout
    assert "**Verdicts:** ❌ 1 incorrect" in markdown.stdout
    assert markdown.stdout.strip() == site.get(f"/api/v1/jobs/{job_id}/report.md").text.strip()


@pytest.mark.timeout(600)
def test_failed_jobs_exit_1_whatever_fail_on_says(site: Site) -> None:
    raised = site.get(f"/api/v1/jobs/{site.ids['raises']}").json()
    assert raised["status"] == "failed" and raised["summary"] == {"failed": 2}
    assert raised["error"].startswith("all 2 cells failed; first: RuntimeError: kernel launch failed")
    reported = cli("report", str(site.ids["raises"]), "--fail-on", "slower", env=site.env)
    assert reported.returncode == EXIT_FAILED
    assert reported.stderr.strip().splitlines()[-1] == f"job {site.ids['raises']} failed: {raised['error']}"
    assert "verdicts: 2 failed" in reported.stdout

    # the pull-request workflow: a candidate revision with a SyntaxError in every cell
    waited = site.waited["revision"]
    assert waited.returncode == EXIT_FAILED, waited.stderr
    revision = site.get(f"/api/v1/jobs/{site.ids['revision']}").json()
    assert revision["status"] == "failed" and revision["summary"] == {"failed": 2}
    assert revision["error"] == f"all 2 cells failed; first: {SYNTAX_ERROR}"
    assert f"  failed  2 cells (N=1000; N=100000): {SYNTAX_ERROR}" in waited.stdout
    assert waited.stderr.strip().splitlines()[-1] == f"job {site.ids['revision']} failed: {revision['error']}"


@pytest.mark.timeout(600)
def test_jobs_list_and_job_pages_read_incorrect_and_failed(site: Site) -> None:
    listing = site.get("/").text
    row = re.compile(r'<tr>\s*<td class="num"><a href="/jobs/(\d+)">.*?</tr>', re.S)
    rows = {int(m.group(1)): m.group(0) for m in row.finditer(listing)}
    assert (
        '<span class="badge verdict-incorrect" title="2 cell(s) incorrect">2 incorrect</span>'
        in rows[site.ids["unnormalised"]]
    )
    assert '<span class="badge verdict-incorrect"' in rows[site.ids["nomask"]]
    for name in ("raises", "revision"):
        assert '<span class="badge status-failed">failed</span>' in rows[site.ids[name]]
        badge = '<span class="badge verdict-failed" title="2 cell(s) failed">2 failed</span>'
        assert badge in rows[site.ids[name]]
    # no row reads faster (the page's <style id="verdict-style"> names every verdict's class)
    assert not any("verdict-faster" in r for r in rows.values()) and len(rows) >= 4

    page = html.unescape(site.get(f"/jobs/{site.ids['revision']}").text)
    attempts = re.search(r'<section id="attempts"[^>]*>.*?</section>', page, re.S)
    assert attempts is not None and "status-failed" in attempts.group(0)  # the attempt's own row
    rest = page.replace(attempts.group(0), "")
    assert rest.count(f"all 2 cells failed; first: {SYNTAX_ERROR}") == 1  # the job's error, once
    assert 'id="job-error"' in rest and 'id="runner-error"' not in rest
    reason = f'<span class="reason-verdict">failed</span>: {SYNTAX_ERROR}'
    assert page.count(reason) == 2  # each cell's reason, on the page
    wrong = html.unescape(site.get(f"/jobs/{site.ids['unnormalised']}").text)
    assert wrong.count('<span class="badge verdict-incorrect">incorrect</span>') == 2
    assert wrong.count('<span class="reason-verdict">incorrect</span>: candidate: FAIL: ') == 2
    assert wrong.count('class="num void-timing"') == 4 and "Greyed numbers:" in wrong


@pytest.mark.timeout(600)
def test_no_verdict_exits_3_and_an_unknown_job_2(site: Site) -> None:
    timed_out = cli("submit", str(site.specs["unnormalised"]), "--wait", "--timeout-s", "1", env=site.env)
    assert timed_out.returncode == EXIT_NO_VERDICT, timed_out.stderr
    job_id = timed_out.stdout.strip()
    assert f"job {job_id} still queued after 1 s" in timed_out.stderr
    queued = cli("report", job_id, env=site.env)
    assert queued.returncode == EXIT_NO_VERDICT, queued.stderr
    assert f"job {job_id} is queued: no verdict yet" in queued.stderr
    cancelled = httpx.post(
        f"{site.url}/api/v1/jobs/{job_id}/cancel",
        timeout=30,
        headers={"Authorization": f"Bearer {site.token}"},
    )
    assert cancelled.status_code == 200, cancelled.text
    after = cli("report", job_id, env=site.env)
    assert after.returncode == EXIT_NO_VERDICT and f"job {job_id} cancelled: no verdict" in after.stderr
    unknown = cli("report", "987654", env=site.env)
    assert unknown.returncode == EXIT_BAD_INPUT and "404" in unknown.stderr, unknown.stderr
