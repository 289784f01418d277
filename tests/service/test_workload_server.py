"""Workload jobs through the server and runner daemons, all real: ``kernelab serve`` processes on a
SQLite file and on PostgreSQL, ``kernelab runner --workloads`` processes talking real HTTP,
``torchrun`` with gloo ranks on the CPU.

* The example (``examples/workload``, 2 gloo ranks) submitted with ``kernelab submit`` and run by
  one runner daemon, a run killed mid-way (a rank's SIGKILL): recorded, the job completes, and the
  REST comparison, the job page and ``kernelab report --format markdown`` show the phase verdicts,
  per-rank times and the consistency table (SQLite and PostgreSQL).
* A gang: two runner daemons on this machine claim an ``nnodes: 2`` job together and meet at a
  c10d rendezvous on loopback; one is killed with SIGKILL mid-run: the attempt fails on both and
  the retry (the killed runner started again, as a rebooted node would) succeeds.
* A 503 on the result post (the database really stopped): the result stays in the runner's
  spool and is posted, whole, once the database is back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import ServerProcess, admin_token, free_port
from kernelab.runners.workload.launch import descendants

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

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


def test_example_workload_through_server_and_runner(
    db_url: str,
    tmp_path: Path,
    runners: list[Runner],
    opened: list[KernelabClient],
    cleanup: list[subprocess.Popen[str]],
) -> None:
    """(a) The example, 2 gloo ranks, 2 runs of each arm, one candidate run killed mid-step."""
    marker = tmp_path / "died"
    spec_path = tmp_path / "w.yaml"
    spec_path.write_text(_spec(2, die_once=marker))
    with _server(db_url, tmp_path) as server:
        token = admin_token(tmp_path)  # the one _server gave it (kept in the folder)
        env = {**os.environ, "KERNELAB_TOKEN": token, "KERNELAB_SERVER": server.url}
        cli = [sys.executable, "-m", "kernelab.runners.cli", "submit", str(spec_path), "--wait", "--json"]
        waiting = subprocess.Popen([*cli, str(tmp_path / "c.json")], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)  # fmt: skip
        cleanup.append(waiting)
        client = KernelabClient(server.url, token)
        opened.append(client)
        queued = _wait(lambda: client.list_jobs().data, 120, "the submitted job")
        job_id = queued[0].id
        job = client.get_job(job_id)
        assert job.kind == "workload" and job.status == "queued" and job.spec.kind == "workload"  # type: ignore[union-attr]
        assert (
            job.waiting_for
            == "waiting for 1 runner(s) that run workloads (kernelab runner --workloads): 0 live"
        )
        runners.append(Runner(server.url, token, "wl-a", tmp_path / "wl-a").start())
        out, err = waiting.communicate(timeout=600)  # kernelab submit --wait: until compared
        assert waiting.returncode == 0, err[-3000:]
        assert out.splitlines()[0] == str(job_id) and "Phases and metrics" in out and "Consistency" in out
        assert "waiting for 1 runner(s) that run workloads" in err  # said while no runner was there
        job = client.get_job(job_id)
        assert job.status == "succeeded" and job.comparison_status == "ready", (
            job.error,
            runners[0].log()[-3000:],
        )
        assert json.loads((tmp_path / "c.json").read_text())["job_id"] == job_id
        assert job.summary and sum(job.summary.values()) >= len(PHASES)
        assert marker.exists()
        c = client.workload(job_id).model_dump(mode="json")
        outcomes = [line["outcome"] for line in c["timeline"]]
        assert sorted(outcomes) == ["crashed", "ok", "ok", "ok"]
        assert all(line["copy_gbps"] is not None for line in c["timeline"])  # the probe after each run
        phases = {q["name"]: q for q in c["quantities"] if q["kind"] == "phase"}
        assert list(phases) == PHASES
        for q in phases.values():
            assert q["verdict"] == "inconclusive" and q["reasons"][0]["code"] == "too-few-runs"
            assert {r["side"] for r in q["ranks"]} == {"baseline", "candidate"}
            assert all(set(r["medians_s"]) == {"0", "1"} and r["slowest_rank"] in (0, 1) for r in q["ranks"])
        arms = next(r for r in c["consistency"] if r["against"] == "arms")
        assert arms["elements"] == 2 * 4 * 4 and arms["mismatches"] is not None
        headers = {"Authorization": f"Bearer {token}"}
        page = httpx.get(f"{server.url}/jobs/{job_id}", headers=headers, timeout=60)
        assert page.status_code == 200
        for text in (
            "Phases and metrics",
            "Per-rank times",
            "Consistency",
            "Runs (probe after each run)",
            "Slowest rank",
            "crashed",
            "inconclusive",
            "actor_train",
        ):
            assert text in page.text, text
        md = _cli(server, token, "report", str(job_id), "--format", "markdown")
        assert md.returncode == 0, md.stderr
        assert "| metric | baseline | candidate | Δ% [95% CI] | verdict | runs |" in md.stdout
        assert "**Consistency**" in md.stdout and "**Per-rank times**" in md.stdout
        rest_md = httpx.get(f"{server.url}/api/v1/jobs/{job_id}/report.md", headers=headers, timeout=60)
        assert rest_md.status_code == 200 and rest_md.text == md.stdout.rstrip("\n") + "\n"


def test_gang_of_two_runners_and_a_runner_killed_mid_run(
    tmp_path: Path, runners: list[Runner], opened: list[KernelabClient]
) -> None:
    """(b) ``nnodes: 2``: two runners claim it together, rendezvous on 127.0.0.1; one SIGKILLed
    mid-run: the attempt fails on both (its lease runs out), the retry succeeds."""
    spec_path = tmp_path / "gang.yaml"
    spec_path.write_text(_spec(2, nnodes=2, nproc=1, probes=False))
    with _server(f"sqlite:///{tmp_path / 'k.db'}", tmp_path) as server:
        token = admin_token(tmp_path)  # the one _server gave it (kept in the folder)
        client = KernelabClient(server.url, token)
        opened.append(client)
        job_id = client.submit(_yaml(spec_path)).id
        a = Runner(server.url, token, "gang-a", tmp_path / "gang-a").start()
        runners.append(a)
        gathering = _wait(lambda: (j := client.get_job(job_id)).gang is not None and j, 120, "the first seat")
        assert (
            gathering.status == "queued"
            and gathering.gang.gathering
            and gathering.gang.members == {0: "gang-a"}
        )
        assert gathering.waiting_for and "gathering: 1 of 2 runners" in gathering.waiting_for
        b = Runner(server.url, token, "gang-b", tmp_path / "gang-b").start()
        runners.append(b)
        running = _wait(lambda: (j := client.get_job(job_id)).status == "running" and j, 120, "the gang")
        assert running.gang is not None and set(running.gang.members.values()) == {"gang-a", "gang-b"}
        assert running.gang.endpoint is not None and running.gang.endpoint.startswith("127.0.0.1:")
        _wait(
            lambda: (p := client.get_job(job_id).progress) is not None and p.cells_done >= 1,
            300,
            "a run done",
        )
        b.kill()
        retried = _wait(
            lambda: (j := client.get_job(job_id)).status == "queued" and j.attempts == 1 and j,
            120,
            "the attempt to fail on both",
        )
        attempts = client.call("GET", f"/jobs/{job_id}/attempts", lambda r: r.json(), idempotent=True)["data"]
        assert attempts[0]["outcome"] == "expired"
        assert "lease lost" in _wait(
            lambda: "lease lost" in a.log() and a.log(), 60, "gang-a to stop its runs"
        )
        b.start()  # the node comes back
        done = _wait(
            lambda: (j := client.get_job(job_id)).comparison_status == "ready" and j, 600, "the retry"
        )
        assert done.status == "succeeded" and done.attempts == 2, (
            done.error,
            a.log()[-2000:],
            b.log()[-2000:],
        )
        assert retried.attempts == 1
        c = client.workload(job_id)
        assert [line.outcome for line in c.timeline] == ["ok"] * 4
        ranks = {rank for q in c.quantities for r in q.ranks for rank in r.medians_s}
        assert ranks == {0, 1}  # a rank on each node, both nodes' records merged


def _yaml(path: Path) -> Any:
    import yaml

    return yaml.safe_load(path.read_text())


@pytest.mark.postgres
def test_a_503_on_the_result_post_is_retried_and_nothing_is_lost(
    tmp_path: Path, opened: list[KernelabClient]
) -> None:
    """(c) The database stops while the job runs: heartbeats and the result post answer 503; the
    result stays in the runner's workload spool; once the database is back it is posted whole."""
    from pg_cluster import PgCluster

    from kernelab.runners.daemon import RunnerDaemon

    cluster = PgCluster()
    cluster.start()
    try:
        url = cluster.create_database("kernelab")
        spec_path = tmp_path / "w.yaml"
        spec_path.write_text(_spec(1, nproc=1, probes=False))
        with _server(url, tmp_path) as server:
            token = admin_token(tmp_path)  # the one _server gave it (kept in the folder)
            admin = KernelabClient(server.url, token)
            opened.append(admin)
            job_id = admin.submit(_yaml(spec_path)).id
            client = KernelabClient(server.url, token, retries=1, backoff_s=0.05)
            opened.append(client)
            with RunnerDaemon(
                client,
                "r503",
                work_dir=tmp_path / "r503",
                workloads=True,
                lease_s=600,
                heartbeat_s=1,
                job_isolation="none",
            ) as daemon:
                daemon.ensure_token()
                claim = daemon._claim()
                assert claim is not None and claim.gang is not None and claim.gang.ready
                cluster.stop()
                assert daemon.run_claim(claim) == "done"
                pending = daemon.workload_spool.pending()
                assert len(pending) == 1 and daemon.posted == 0
                spooled = json.loads(pending[0].read_text())
                assert [r["outcome"] for r in spooled["runs"]] == ["ok", "ok"]
                cluster.start()
                assert daemon.flush_spool() == 1 and daemon.workload_spool.pending() == []
            assert "workload-result 503" in (tmp_path / "server.log").read_text()
            job = _wait(
                lambda: (j := admin.get_job(job_id)).comparison_status == "ready" and j, 120, "comparison"
            )
            assert job.status == "succeeded"
            c = admin.workload(job_id)
            assert [line.wall_s for line in c.timeline] == [r["wall_s"] for r in spooled["runs"]]
    finally:
        cluster.close()
