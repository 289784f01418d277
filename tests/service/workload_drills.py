"""What the workload drills (``test_workload_server.py``, ``test_workload_gang.py``) share: the
example's spec, a ``kernelab runner --workloads`` process (``Runner``), a server of the drill's own,
the ``kernelab`` CLI, and the fixtures that clean up after a failed drill. The drills are two
modules so that ``--dist loadfile`` can hand the gang drill (minutes) to another process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, admin_token, free_port
from kernelab.runners.workload.launch import descendants

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "workload"
PHASES = ["rollout", "log_probs", "actor_train", "step"]


def _spec(
    runs: int, *, nnodes: int = 1, nproc: int = 2, die_once: Path | None = None, probes: bool = True
) -> str:
    """The example's spec with absolute paths (runners run it from their own folder), ``runs`` of
    each arm, tiny; ``die_once``: the candidate's last rank kills itself once (its marker file)."""
    env = f'\n  env: {{EXAMPLE_DIE_ONCE: "{die_once}"}}' if die_once is not None else ""
    script = EXAMPLE / "train_step.py"
    return f"""\
kind: workload
name: server workload e2e
baseline:
  command: [{script}]
  args: [--attention, sdpa, --steps, "1", --new-tokens, "4"]
candidate:
  command: [{script}]
  args: [--attention, math, --steps, "1", --new-tokens, "4"]{env}
launch: {{nproc_per_node: {nproc}, nnodes: {nnodes}, rdzv_timeout_s: 60}}
runs: {runs}
run_timeout_s: 240
budget_s: 900
threshold_pct: 5
probes: {{between_runs: {str(probes).lower()}, all_reduce: false, nvml: false}}
"""


def _wait(predicate: Callable[[], Any], timeout_s: float, what: str, every_s: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every_s)


class Runner:
    """A ``kernelab runner --workloads`` process (real HTTP to ``url``), its log in ``work_dir``."""

    def __init__(self, url: str, token: str, name: str, work_dir: Path, *, lease_s: float = 8.0):
        self.url, self.token, self.name, self.work_dir, self.lease_s = url, token, name, work_dir, lease_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.below: set[int] = set()  # processes it started (torchrun, ranks), for the cleanup

    def start(self) -> Runner:
        self.starts += 1
        self.work_dir.mkdir(parents=True, exist_ok=True)
        log = (self.work_dir / f"runner-{self.starts}.log").open("wb")
        cmd = [
            sys.executable,
            "-m",
            "kernelab.runners.cli",
            "runner",
            "--server",
            self.url,
            "--name",
            self.name,
            "--work-dir",
            str(self.work_dir),
            "--workloads",
            "--rdzv-host",
            "127.0.0.1",
            "--poll-s",
            "1",
            "--lease-s",
            str(self.lease_s),
            "--heartbeat-s",
            "1",
            "--job-isolation",
            "none",
            "--grace-s",
            "5",
        ]
        env = {**os.environ, "KERNELAB_TOKEN": self.token}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work_dir)
        log.close()
        return self

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.work_dir.glob("runner-*.log")))

    def note_children(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.below.update(descendants(self.proc.pid))

    def kill(self) -> None:
        """SIGKILL the daemon alone (its torchrun lives on, as on a node whose daemon died)."""
        assert self.proc is not None
        self.note_children()
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.note_children()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in self.below:  # what a killed daemon left behind (only the processes it started)
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    started: list[Runner] = []
    yield started
    for r in started:
        r.stop()


@pytest.fixture
def opened() -> Iterator[list[KernelabClient]]:
    clients: list[KernelabClient] = []
    yield clients
    for c in clients:
        c.close()


@pytest.fixture
def cleanup() -> Iterator[list[subprocess.Popen[str]]]:
    """Client processes a failed test would leave running: killed after it."""
    procs: list[subprocess.Popen[str]] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _server(url: str, tmp_path: Path, name: str = "server") -> ServerProcess:
    token = admin_token(tmp_path)
    return ServerProcess(url, port=free_port(), admin_token=token, log_path=tmp_path / f"{name}.log")


def _cli(server: ServerProcess, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELAB_TOKEN": token, "KERNELAB_SERVER": server.url}
    return subprocess.run(
        [sys.executable, "-m", "kernelab.runners.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
    )


def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())
