"""Job code runs without the daemon's credentials: the allow-listed job environment,
redacted and bounded error text, the private namespace that hides the work dir, and the attack
itself: a revision job whose install step prints the tokens, against a real server and daemon."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernelab.runners import jobns
from kernelab.runners.client import KernelabClient
from kernelab.runners.daemon import RunnerDaemon
from kernelab.runners.jobenv import JOB_ENV_NAMES_ENV, check_names, job_env
from kernelab.runners.redact import MAX_ERROR_CHARS, REDACTED, bound, redact, secret_values
from kernelab.runners.revisions import AllowList, RevisionCache, _git_env
from kernelab.service.contract.schemas import SourceSpec
from tests.e2e.revision_repo import make_repo

NO_PROBES = {"copy_bandwidth": False, "all_reduce": False, "nvml": False}


def _revision_job(name: str, repo: Path, *, install: list[str]) -> dict[str, object]:
    """A revision A/B job of ``make_repo``'s AxpyBenchmark (``main~2`` against ``slow``, tiny
    measurement) whose candidate runs the install steps ``install`` (the attack)."""
    return {
        "name": name,
        "benchmark": "revpkg.bench:AxpyBenchmark",
        "params": {"N": 1000},
        "device": "cpu",
        "probes": NO_PROBES,
        "timeout_s": 120,
        "measurement": {"warmup_ms": 1, "budget_ms": 20, "min_rounds": 2},
        "baseline": {"variant": "torch", "source": {"repo": str(repo), "ref": "main~2"}},
        "candidate": {"variant": "torch", "source": {"repo": str(repo), "ref": "slow", "install": install}},
    }


def test_job_env_keeps_the_allow_list_and_never_a_credential() -> None:
    daemon = {
        "PATH": "/usr/bin",
        "HOME": "/home/r",
        "LC_ALL": "C",
        "CUDA_VISIBLE_DEVICES": "1",
        "TRITON_CACHE_DIR": "/c",
        "NCCL_DEBUG": "WARN",
        "KERNELAB_TOKEN": "admin-token-123",
        "KERNELAB_ADMIN_TOKEN": "admin-token-123",
        "KERNELAB_DATABASE_URL": "postgresql://u:pw@h/db",
        "AWS_SECRET_ACCESS_KEY": "aws",
        "CUDA_API_KEY": "x",
        "TORCH_PASSWORD": "y",
        "MY_SETTING": "1",
        "GITHUB_TOKEN": "ghp_x",
        "SSH_AUTH_SOCK": "/run/agent",
    }
    env = job_env({"PYTHONPATH": "/k"}, source=daemon, names=["MY_SETTING"])
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/home/r",
        "LC_ALL": "C",
        "CUDA_VISIBLE_DEVICES": "1",
        "TRITON_CACHE_DIR": "/c",
        "NCCL_DEBUG": "WARN",
        "MY_SETTING": "1",
        JOB_ENV_NAMES_ENV: "MY_SETTING",
        "PYTHONPATH": "/k",
    }
    # a nested child (measure, revision worker) keeps the operator's names through KERNELAB_JOB_ENV
    assert job_env(source={**env, "OTHER": "2"}) == env | {"PYTHONPATH": "/k"}
    # an operator cannot allow-list a credential, on the command line or through the variable
    for bad in ("GITHUB_TOKEN", "db_password", "API_KEY", "BAD NAME"):
        with pytest.raises(ValueError, match=repr(bad)):
            check_names([bad])
    assert "GITHUB_TOKEN" not in job_env(source={**daemon, JOB_ENV_NAMES_ENV: "GITHUB_TOKEN"})


def test_git_and_install_env_is_the_job_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELAB_TOKEN", "admin-token-abcdef")
    monkeypatch.setenv("KERNELAB_DATABASE_URL", "sqlite:///x")
    env = _git_env()
    assert "KERNELAB_TOKEN" not in env and "KERNELAB_DATABASE_URL" not in env
    assert env["GIT_TERMINAL_PROMPT"] == "0" and env["PATH"] == os.environ["PATH"]


def test_redact_replaces_secrets_and_environment_lines_and_bounds() -> None:
    daemon = {
        "KERNELAB_TOKEN": "admin-token-123456",
        "PATH": "/usr/bin",
        "HOME": "/root",
        "DB_PASSWORD": "hunter2-long",
    }
    secrets = secret_values(daemon, ["runner-token-abcdef", None, "abc"])
    assert secrets == ["runner-token-abcdef", "admin-token-123456", "hunter2-long"]  # longest first
    text = (
        'install step 1 failed\nadmin-token-123456\n{"token": "runner-token-abcdef"}\n'
        "PATH=/usr/bin\nexport HOME=/root\nJOB_ONLY=1\nsee hunter2-long"
    )
    out = redact(text, secrets=secrets, env=daemon)
    assert "admin-token" not in out and "runner-token" not in out and "hunter2" not in out
    assert out.splitlines() == [
        "install step 1 failed",
        REDACTED,
        f'{{"token": "{REDACTED}"}}',
        f"PATH={REDACTED}",
        f"HOME={REDACTED}",
        "JOB_ONLY=1",
        f"see {REDACTED}",
    ]
    long = "why it failed\n" + "x" * 50_000 + "\nthe last line"
    cut = redact(long, secrets=[], env={})
    assert len(cut) <= MAX_ERROR_CHARS and cut.startswith("why it failed") and cut.endswith("the last line")
    assert "characters cut" in cut and bound("short") == "short"


def _namespace_or_skip() -> None:
    why = jobns.probe()
    if why:
        pytest.skip(f"no unprivileged user namespaces here: {why}")


def test_namespace_hides_the_work_dir_but_the_job_folder(tmp_path: Path) -> None:
    _namespace_or_skip()
    work = tmp_path / "work"
    (work / "jobs" / "7-1").mkdir(parents=True)
    (work / "revisions").mkdir()
    (work / "runner-node.json").write_text('{"token": "runner-token-secret"}')
    (work / "revisions" / "cached").write_text("clone")
    script = (
        "import ctypes, os, sys; w = sys.argv[1]; "
        "open(w + '/jobs/7-1/out', 'w').write(open(w + '/revisions/cached').read()); "
        "print(os.path.exists(w + '/runner-node.json'), sorted(os.listdir(w)), "
        "ctypes.CDLL(None).umount2(w.encode(), 2), os.getuid())"
    )
    cmd = jobns.wrap(
        [sys.executable, "-c", script, str(work)], hide=work, keep=[work / "jobs" / "7-1", work / "revisions"]
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "['jobs',", "'revisions']", "-1", str(os.getuid())]
    assert (work / "jobs" / "7-1" / "out").read_text() == "clone"  # the kept folders are the real ones
    # a --keep outside --hide is refused, never silently widened
    bad = subprocess.run(
        jobns.wrap(["true"], hide=work / "jobs", keep=[work / "revisions"]),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == jobns.EXIT_NO_NAMESPACE and "is not inside a --hide folder" in bad.stderr


def test_non_dumpable_process_hides_its_environ(tmp_path: Path) -> None:
    """Checked by a child that dropped its privileges would need root; here the flag itself."""
    code = (
        "from kernelab.runners.jobns import set_non_dumpable; import ctypes; "
        "ok = set_non_dumpable(); print(ok, ctypes.CDLL(None).prctl(3, 0, 0, 0, 0))"
    )  # PR_GET_DUMPABLE
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "0"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_install_step_cannot_leak_the_runner_tokens(
    server: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolation: str
) -> None:
    """The attack: a submit token's install step echoes ``$KERNELAB_TOKEN``, dumps the
    environment and cats the token files; the job's stored error (readable with a read token)
    holds neither token, and the install step's environment has no credential."""
    if isolation == "auto":
        _namespace_or_skip()
    url, admin = server
    home = tmp_path / "home"
    work_dir = home / ".kernelab"  # the default layout: ~/.kernelab/runner-<name>.json
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("KERNELAB_TOKEN", admin)
    monkeypatch.setenv("KERNELAB_TEST_PASSTHRU", "kept")
    monkeypatch.setenv("KERNELAB_TEST_OTHER", "dropped")
    repo = tmp_path / "repo"
    make_repo(repo)
    steal = (
        f'sh -c \'env > {{site}}/env.txt; env; echo "T=$KERNELAB_TOKEN"; '
        f"cat ~/.kernelab/runner-*.json {work_dir}/runner-*.json; exit 3'"
    )
    spec = _revision_job("steal", repo, install=[steal])
    name = f"sandbox-{isolation}"
    with KernelabClient(url, admin) as client:
        job_id = client.submit(spec).id
        with RunnerDaemon(
            client,
            name,
            once=True,
            work_dir=work_dir,
            allowed_repos=[str(repo)],
            job_isolation=isolation,
            job_env_names=["KERNELAB_TEST_PASSTHRU"],
        ) as runner:
            runner.run()
            assert runner.supervisor.check_isolation() is (isolation == "auto")
        runner_token = json.loads((work_dir / f"runner-{name}.json").read_text())["token"]
        job = client.get_job(job_id)
    assert job.status == "failed" and job.error is not None
    error = job.error
    assert error.startswith("candidate: install step 1 failed"), error
    assert "exited with status 3" in error
    assert admin not in error and runner_token not in error
    assert re.search(r"^T=$", error, re.MULTILINE), error  # the variable was not there to echo
    assert len(error) <= MAX_ERROR_CHARS
    if isolation == "auto":  # the token file is not there for job code
        assert f"{work_dir}/runner-*.json': No such file or directory" in error
    else:  # readable (the daemon warned), but its token never leaves the node
        assert f'"token": "{REDACTED}"' in error
    [env_file] = (work_dir / "revisions").glob("worktrees/*/*/.kernelab-site/env.txt")
    names = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert "KERNELAB_TOKEN" not in names and "KERNELAB_TEST_OTHER" not in names
    assert names["KERNELAB_TEST_PASSTHRU"] == "kept"
    assert names["HOME"] != str(home)  # install steps get a home of their own, not ~ (the token file)
    assert admin not in env_file.read_text() and runner_token not in env_file.read_text()


def _runner_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", "runner", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_runner_cli_refuses_credentials_and_says_its_isolation(
    server: tuple[str, str], tmp_path: Path
) -> None:
    url, admin = server
    work = ["--work-dir", str(tmp_path / "w"), "--server", url, "--token", admin, "--once"]
    refused = _runner_cli(*work, "--job-env", "GITHUB_TOKEN")
    assert refused.returncode == 2 and "--job-env 'GITHUB_TOKEN' looks like a credential" in refused.stderr
    assert "Traceback" not in refused.stderr
    bad_mode = _runner_cli(*work, "--job-isolation", "chroot")
    assert bad_mode.returncode == 2 and "job_isolation must be one of" in bad_mode.stderr
    plain = _runner_cli(*work, "--name", "cli-none", "--job-isolation", "none")
    assert plain.returncode == 0, plain.stderr
    assert "JOB CODE CAN READ THIS RUNNER'S TOKEN FILE" in plain.stderr and admin not in plain.stderr
    if not jobns.probe():
        isolated = _runner_cli(*work, "--name", "cli-ns", "--job-isolation", "namespace")
        assert isolated.returncode == 0, isolated.stderr
        assert "job isolation: allow-listed environment; private user+mount namespace" in isolated.stderr


def test_namespace_makes_a_folder_read_only_but_the_writable_paths(tmp_path: Path) -> None:
    _namespace_or_skip()
    cache = tmp_path / "cache"
    for sub in ("worktrees/r/own", "worktrees/r/other", "repos/r.git/hooks"):
        (cache / sub).mkdir(parents=True)
    script = (
        "import ctypes, sys, pathlib; c = pathlib.Path(sys.argv[1]); out = []\n"
        "for rel in ('worktrees/r/own/f', 'worktrees/r/other/f', 'repos/r.git/config', "
        "'repos/r.git/hooks/post-checkout'):\n"
        "    try:\n        (c / rel).write_text('x'); out.append('wrote')\n"
        "    except OSError as exc:\n        out.append(type(exc).__name__)\n"
        "out.append(str(ctypes.CDLL(None).umount2(str(c).encode(), 2)))\nprint(' '.join(out))"
    )
    cmd = jobns.wrap(
        [sys.executable, "-c", script, str(cache)],
        readonly=[cache],
        writable=[cache / "worktrees" / "r" / "own"],
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["wrote", "OSError", "OSError", "OSError", "-1"], proc.stdout
    assert (cache / "worktrees" / "r" / "own" / "f").read_text() == "x"
    assert not (cache / "worktrees" / "r" / "other" / "f").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_job_code_cannot_change_the_revision_cache_or_read_a_hidden_folder(
    server: tuple[str, str], tmp_path: Path
) -> None:
    """An attack on main after the first fixes: an install step rewrote another revision's
    worktree, left a hook and a url rewrite in the cached clone (later jobs ran them), and read
    the admin token from the data dir beside the runner's work dir (``kernelab up``)."""
    _namespace_or_skip()
    url, admin = server
    work_dir, data = tmp_path / "data" / "runner", tmp_path / "data"
    data.mkdir()
    (data / "admin-token").write_text("data-dir-secret-123")
    repo = tmp_path / "repo"
    make_repo(repo)
    cache = work_dir / "revisions"
    kernelab_root = Path(jobns.__file__).resolve().parent.parent
    planted = [
        Path.home() / f"kernelab-planted-{os.getpid()}",
        Path(sys.prefix) / f"planted-{os.getpid()}",
        kernelab_root / f"planted-{os.getpid()}",
    ]  # later jobs and the daemon's next start read these
    tamper = (
        f"sh -c 'cat {data}/admin-token; cat $(readlink -f /proc/$PPID/cwd)/../../admin-token; "
        f"for f in {cache}/worktrees/*/*/revpkg/bench.py; do echo PWNED >> $f; done; "
        f'for g in {cache}/repos/*; do echo "[url \\"/evil\\"]" >> $g/config; '
        f'echo "#!/bin/sh" > $g/hooks/post-checkout; done; '
        f"for p in {' '.join(map(str, planted))}; do echo x > $p; done; exit 3'"
    )
    spec = _revision_job("tamper", repo, install=[tamper])
    # another submitter's revision, already in the cache
    other = RevisionCache(cache).materialise(
        SourceSpec(repo=str(repo), ref="main"), "baseline", allow=AllowList([str(repo)])
    )
    before = (other.path / "revpkg" / "bench.py").read_text()
    with KernelabClient(url, admin) as client:
        job_id = client.submit(spec).id
        with RunnerDaemon(
            client, "tamper", once=True, work_dir=work_dir, allowed_repos=[str(repo)], job_hide=[data]
        ) as runner:
            runner.run()
        job = client.get_job(job_id)
    assert job.status == "failed" and job.error is not None
    assert "data-dir-secret-123" not in job.error and "Read-only file system" in job.error, job.error
    assert (other.path / "revpkg" / "bench.py").read_text() == before
    assert not any(p.exists() for p in planted), [p for p in planted if p.exists()]
    for clone in cache.glob("repos/*"):
        assert "/evil" not in (clone / "config").read_text()
        assert not (clone / "hooks" / "post-checkout").exists()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_token_given_on_the_command_line_leaves_it(server: tuple[str, str], tmp_path: Path) -> None:
    """``/proc/PID/cmdline`` is readable by every process: the daemon starts again with the token
    in its (non-dumpable) environment only."""
    url, admin = server
    log = tmp_path / "runner.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelab.runners.cli",
                "runner",
                "--server",
                url,
                "--token",
                admin,
                "--name",
                "argv",
                "--work-dir",
                str(tmp_path / "w"),
                "--poll-s",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(600):
            if ": serving http" in log.read_text(errors="replace") or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert proc.poll() is None, log.read_text()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().decode()
        assert admin not in cmdline and "kernelab.runners.cli" in cmdline and "--name" in cmdline
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()


def test_a_writable_path_through_a_planted_link_is_refused(tmp_path: Path) -> None:
    """A job's install step linked ``.kernelab-triton -> ../../../repos``; the revision worker's
    writable hole must not follow it into the cached clones."""
    _namespace_or_skip()
    cache = tmp_path / "cache"
    (cache / "repos" / "r.git").mkdir(parents=True)
    own = cache / "worktrees" / "r" / "sha"
    own.mkdir(parents=True)
    (own / ".kernelab-triton").symlink_to("../../../repos")
    cmd = jobns.wrap(["true"], readonly=[cache], writable=[own / ".kernelab-triton"])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == jobns.EXIT_NO_NAMESPACE and "symbolic link" in proc.stderr, proc.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_install_step_cannot_shadow_kernelab_nor_plant_links_for_it(
    server: tuple[str, str], tmp_path: Path
) -> None:
    """Second attack: a ``runners/jobns.py`` in the worktree (the nested helper ran with the worktree
    as its current folder, so ``python -m kernelab.runners.jobns`` imported it and never isolated the next
    step); ``.kernelab-triton`` and ``.kernelab-ready`` made links into the cached clone."""
    _namespace_or_skip()
    url, admin = server
    work_dir = tmp_path / "work"
    cache = work_dir / "revisions"
    repo = tmp_path / "repo"
    make_repo(repo)
    fake = "import os, sys; a = sys.argv; os.execvp(a[a.index('--') + 1], a[a.index('--') + 1:])"
    steps = [
        f"sh -c 'mkdir -p runners && : > runners/__init__.py && echo \"{fake}\" > runners/jobns.py'",
        f"sh -c 'echo x >> {cache}/repos/*/config; ln -s ../../../repos .kernelab-triton; "
        f"ln -s $(ls -d {cache}/repos/*)/config .kernelab-ready; true'",
    ]
    spec = _revision_job("shadow", repo, install=steps)
    with KernelabClient(url, admin) as client:
        job_id = client.submit(spec).id
        with RunnerDaemon(
            client, "shadow", once=True, work_dir=work_dir, allowed_repos=[str(repo)]
        ) as runner:
            runner.run()
        job = client.get_job(job_id)
    [clone] = cache.glob("repos/*")
    config = (clone / "config").read_text()
    assert config.startswith("[core]") and "\nx\n" not in config, config  # not written, not replaced
    [worktree] = [p for p in cache.glob("worktrees/*/*") if (p / "runners" / "jobns.py").exists()]
    assert not (worktree / ".kernelab-ready").is_symlink()  # replaced by kernelab's own marker, or absent
    assert not (worktree / ".kernelab-triton").is_symlink()
    assert job.status in ("succeeded", "failed"), job.status
