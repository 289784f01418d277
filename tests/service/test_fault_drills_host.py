"""Host drills, against a real ``kernelab serve`` and real ``kernelab runner`` processes: what job
code of one runner can reach on the host.

* Two runners of one user share the host, each with its own ``--work-dir``; a benchmark module
  of runner A reads every file it can under B's work dir, its own and the runners' registry, at
  import (in the advertisement child and in each job's measuring child) and, in a thread, for as
  long as its job measures. It finds no token file and no spool, including B's token when B starts
  for the first time while A's job runs (B waits for that job before it writes its token).
* A benchmark that starts a ``setsid`` process and a double-forked daemon at import: every such
  process is gone when the job ends (a success, a timeout), when the advertisement child ends, and
  when the daemon itself is killed with SIGKILL mid-job; with and without the namespace.

``-s`` shows each drill's tally, the figures of ``docs/results/2026-12-04-fault-drills.md``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from drills import TOKEN, spec, wait_for
from node_drills import RunnerCli, alive

from kernelab.runners import jobns
from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
SERVING = ": serving http"

THIEF = '''
"""Job code that looks for other runners' credentials, at import and while its job measures."""
import glob, json, os, threading, time

from kernelab.kernels.softmax import SoftmaxBenchmark


def _look(once):
    out, targets = os.environ["THIEF_OUT"], os.environ["THIEF_TARGETS"].split(os.pathsep)
    seen = {}
    deadline = time.monotonic() + (0.0 if once else float(os.environ["THIEF_WATCH_S"]))
    while True:
        for target in targets:
            for path in glob.glob(os.path.join(target, "**"), recursive=True):
                if os.path.isfile(path) and path not in seen:
                    try:
                        with open(path, errors="replace") as fh:
                            seen[path] = fh.read(4000)
                    except OSError as exc:
                        seen[path] = f"unreadable: {exc}"
        with open(os.path.join(out, f"{os.getpid()}.json"), "w") as fh:
            json.dump(seen, fh)
        if time.monotonic() >= deadline:
            return
        time.sleep(0.2)


_look(once=True)
threading.Thread(target=_look, args=(False,), daemon=True).start()


class Thief(SoftmaxBenchmark):
    name = "thief"
'''

LEAKER = '''
"""Job code that leaves processes behind at import: a setsid one (holding the job's output open)
and a double-forked daemon (its stdio on /dev/null, as daemon(3) does)."""
import os, subprocess, sys

from kernelab.kernels.softmax import SoftmaxBenchmark

_DAEMONIZE = (  # the classic double fork; returns once the daemon wrote its pid
    "import glob, os, sys, time\\n"
    "before = set(glob.glob(os.path.join(sys.argv[1], 'daemon-*')))\\n"
    "if os.fork():\\n"
    "    while set(glob.glob(os.path.join(sys.argv[1], 'daemon-*'))) == before:\\n"
    "        time.sleep(0.01)\\n"
    "    os._exit(0)\\n"
    "os.setsid()\\n"
    "if os.fork():\\n    os._exit(0)\\n"
    "null = os.open(os.devnull, os.O_RDWR)\\n"
    "for fd in (0, 1, 2):\\n    os.dup2(null, fd)\\n"  # as daemon(3) does: no pipe of the job's held
    "open(os.path.join(sys.argv[1], 'daemon-%d' % os.getpid()), 'w').close()\\n"
    "time.sleep(600)\\n"
)
_dir = os.environ["LEAK_DIR"]
_setsid = subprocess.Popen(["setsid", sys.executable, "-c", "import time; time.sleep(600)"])  # holds stdout
open(os.path.join(_dir, f"setsid-{_setsid.pid}"), "w").close()
subprocess.run([sys.executable, "-c", _DAEMONIZE, _dir], check=True)


class Leaker(SoftmaxBenchmark):
    name = "leaker"
'''


def _namespace_or_skip() -> None:
    why = jobns.probe()
    if why:
        pytest.skip(f"no unprivileged user namespaces here: {why}")


def _module(tmp_path: Path, name: str, text: str) -> Path:
    folder = tmp_path / "mods"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(text)
    return folder


def _server(url: str, tmp_path: Path) -> ServerProcess:
    return ServerProcess(url, port=free_port(), admin_token=TOKEN, log_path=tmp_path / "server.log")


def _seen(out: Path) -> dict[str, str]:
    """Every file any process of the thief read (path -> its first characters)."""
    seen: dict[str, str] = {}
    for report in out.glob("*.json"):
        try:
            seen.update(json.loads(report.read_text()))
        except ValueError:  # a report being rewritten
            continue
    return seen


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_runners_sharing_a_host_cannot_read_each_others_tokens(
    migrated_url: str, tmp_path: Path, runner_registry: Path
) -> None:
    _namespace_or_skip()
    a_dir, b_dir, out = tmp_path / "a", tmp_path / "b", tmp_path / "out"
    out.mkdir()
    mods = _module(tmp_path, "thiefbench", THIEF)
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(mods), os.environ.get("PYTHONPATH", "")])),
        "THIEF_OUT": str(out),
        "THIEF_TARGETS": os.pathsep.join(map(str, [b_dir, a_dir, runner_registry])),
        "THIEF_WATCH_S": "12",
    }
    job_env = ("--job-env", "THIEF_OUT", "--job-env", "THIEF_TARGETS", "--job-env", "THIEF_WATCH_S")
    thief_spec = {**spec(budget_ms=10_000), "benchmark": "thiefbench:Thief"}
    with _server(migrated_url, tmp_path) as server:
        admin = KernelabClient(server.url, TOKEN)
        a = RunnerCli(server.url, "gpu0", a_dir, tmp_path / "a.log", env=env,
                      extra=("--benchmark", "thiefbench:Thief", *job_env))  # fmt: skip
        b = RunnerCli(server.url, "gpu1", b_dir, tmp_path / "b.log", env=env)
        a.start()
        try:
            wait_for(lambda: a.count(SERVING) == 1, 180, "runner A to serve")
            first = admin.submit(thief_spec).id  # A's job runs (and reads) while B starts for the first time
            wait_for(lambda: a.children("kernelab.runners.measure cells"), 120, "A's measuring child")
            b.start()
            waits = "is new to this host's runners; waiting for jobs"
            wait_for(lambda: b.count(waits) == 1, 120, "B to wait")
            assert not list(b_dir.glob("runner-*.json"))  # no token written while A's older job runs
            wait_for(lambda: admin.get_job(first).status == "succeeded", 180, "A's first job")
            wait_for(lambda: b.count(SERVING) == 1, 120, "runner B to serve")
            assert list(b_dir.glob("runner-*.json"))  # now it is written
            second = admin.submit(thief_spec).id  # both registered: B's work dir hidden from the start
            wait_for(lambda: admin.get_job(second).status == "succeeded", 180, "A's second job")
        finally:
            codes = (a.stop(), b.stop() if b.proc is not None else 0)
        admin.close()
    assert codes == (0, 0), (a.text()[-2000:], b.text()[-2000:])
    seen = _seen(out)
    b_token = json.loads(next(b_dir.glob("runner-*.json")).read_text())["token"]
    a_token = json.loads(next(a_dir.glob("runner-*.json")).read_text())["token"]
    tokens = (a_token, b_token)
    leaked = [p for p, text in seen.items()
              if any(t in text for t in tokens) or "runner-" in Path(p).name or "/spool/" in p]  # fmt: skip
    own = (str(a_dir / "jobs") + os.sep, str(a_dir / "adverts") + os.sep)  # A's own scratch folders
    others = [p for p in seen if not p.startswith(own)]
    tally = {"jobs": 2, "files_read": len(seen), "tokens_leaked": len(leaked), "other_files": len(others)}
    print(f"\nrunners sharing a host: {json.dumps(tally)}")
    assert leaked == [] and others == [], (leaked, others)
    assert len(list(out.glob("*.json"))) >= 3  # it looked: the advertisement child and two measuring children


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("isolation", ["auto", "none"])
def test_processes_a_job_leaves_behind_die_with_it(migrated_url: str, tmp_path: Path, isolation: str) -> None:
    if isolation == "auto":
        _namespace_or_skip()
    leaks = tmp_path / "leaks"
    leaks.mkdir()
    mods = _module(tmp_path, "leakbench", LEAKER)
    env = {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(mods), os.environ.get("PYTHONPATH", "")])),
        "LEAK_DIR": str(leaks),
    }
    extra = ("--benchmark", "leakbench:Leaker", "--job-env", "LEAK_DIR", "--job-isolation", isolation)
    leaker = {**spec(budget_ms=1000), "benchmark": "leakbench:Leaker"}
    long = {"budget_ms": 120_000, "min_rounds": 100_000, "max_rounds": 1_000_000}  # no early stop
    seen: set[int] = set()

    def new_leaks(count: int) -> list[int]:
        wait_for(lambda: len(list(leaks.iterdir())) >= len(seen) + count, 120, f"{count} leaked processes")
        pids = {int(p.name.rsplit("-", 1)[1]) for p in leaks.iterdir()} - seen
        seen.update(pids)
        return sorted(pids)

    left: dict[str, list[int]] = {}
    with _server(migrated_url, tmp_path) as server:
        admin = KernelabClient(server.url, TOKEN)
        runner = RunnerCli(server.url, f"leaky-{isolation}", tmp_path / "work", tmp_path / "runner.log",
                           env=env, extra=extra)  # fmt: skip
        runner.start()
        try:
            wait_for(lambda: runner.count(SERVING) == 1, 180, "the runner to serve")
            pids = new_leaks(2)  # the advertisement child imported the module
            time.sleep(1.0)
            left["advertisement"] = [p for p in pids if alive(p)]
            job = admin.submit(leaker).id
            pids = new_leaks(2)
            wait_for(lambda: admin.get_job(job).status == "succeeded", 180, "the job")
            left["a job that succeeded"] = [p for p in pids if alive(p)]
            job = admin.submit({**leaker, "timeout_s": 12, "measurement": long}).id
            pids = new_leaks(2)
            wait_for(lambda: admin.get_job(job).status == "failed", 180, "the job to time out")
            left["a job that timed out"] = [p for p in pids if alive(p)]
            job = admin.submit({**leaker, "measurement": long}).id
            pids = new_leaks(2)
            runner.kill()  # SIGKILL of the daemon mid-job: its worker is told (PR_SET_PDEATHSIG)
            time.sleep(0.5)
            wait_for(lambda: not any(alive(p) for p in pids), 20, "the leaks of a dead daemon's job to die")
            left["the daemon killed mid-job"] = [p for p in pids if alive(p)]
            admin.cancel(job)
        finally:
            if runner.alive():
                runner.stop()
            for pid in seen:  # a failed drill leaves nothing behind either
                if alive(pid):
                    os.kill(pid, 9)
        admin.close()
    tally = {"jobs": 3, "started": len(seen), "leaked": sum(map(len, left.values()))}
    print(f"\nleft-behind processes ({isolation}): {json.dumps(tally)}")
    assert left == dict.fromkeys(left, []), left
    assert len(seen) == 8
