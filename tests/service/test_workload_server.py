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

The gang drill is ``test_workload_gang.py`` (a module of its own, so that another process can run it);
the helpers both use are ``workload_drills.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from workload_drills import PHASES, ROOT, Runner, _cli, _server, _spec, _wait, _yaml, cleanup, opened, runners

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import admin_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

__all__ = ["cleanup", "opened", "runners"]  # fixtures of workload_drills, used here by name


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
        # the arms differ for real (sdpa vs written-out attention): a phase may read slower, which the
        # default gate holds; this drill is about the job's path, so it gates on problems only
        cli = [sys.executable, "-m", "kernelab.runners.cli", "submit", str(spec_path), "--wait",
               "--fail-on", "failed,incorrect", "--json"]  # fmt: skip
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
        assert waiting.returncode == 0, (err[-3000:], runners[0].log()[-6000:])
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
        assert sorted(outcomes) == ["crashed", "ok", "ok", "ok"], runners[0].log()[-6000:]
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
