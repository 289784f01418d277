"""The gang workload drill, real processes as in ``test_workload_server.py``: two ``kernelab runner
--workloads`` daemons on this machine claim an ``nnodes: 2`` job together and meet at a c10d
rendezvous on loopback; one is killed with SIGKILL mid-run: the attempt fails on both and the retry
(the killed runner started again, as a rebooted node would) succeeds. A module of its own so that
``--dist loadfile`` can hand it and the example's drills (minutes each on a 2-core machine) to different
processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from workload_drills import Runner, _server, _spec, _wait, _yaml, cleanup, opened, runners

from kernelab.runners.client import KernelabClient
from kernelab.runners.local import admin_token

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

__all__ = ["cleanup", "opened", "runners"]  # fixtures of workload_drills, used here by name


@pytest.mark.xfail(
    strict=False,
    reason="known flake under a full suite's load on 2 cores: failed in 3 of 3 clean-clone CI runs on "
    "2026-12-04 (a crashed run, or no run finished), passed in 3 of 3 runs alone; under investigation",
)
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
