"""A job that changed the node makes the runner probe the node again before its next claim: the
worker says so on stdout, the daemon takes the probes in a fresh process and posts the report."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

from kernelab.runners.client import KernelabClient
from kernelab.runners.daemon import RunnerDaemon
from kernelab.runners.worker import NODE_CHANGED_MARK, _node_changed
from kernelab.service.contract.schemas import CopyBandwidthReading, JobResult, JobSpec, NodeInfo, ProbeReport

T0 = datetime(2026, 12, 1, 7, tzinfo=UTC)
SPEC = JobSpec.model_validate(
    {
        "benchmark": "softmax",
        "baseline": {"variant": "torch"},
        "candidate": {"variant": "triton"},
        "device": "cpu",
        "probes": {"copy_bandwidth": True, "all_reduce": False, "nvml": False},
    }
)


def _result(before_gbps: float, after_gbps: float) -> JobResult:
    def probe(phase: str, gbps: float) -> ProbeReport:
        reading = CopyBandwidthReading(device_index=0, size_bytes=1 << 26, time_us=1.0, bandwidth_gbps=gbps)
        return ProbeReport(phase=phase, taken_at=T0, copy_bandwidth=[reading])  # type: ignore[arg-type]

    node = NodeInfo(hostname="h", device_type="cuda")
    probes = [probe("before", before_gbps), probe("after", after_gbps)]
    return JobResult(
        idempotency_key="reprobe-test",
        spec=SPEC,
        node=node,
        timer="cuda-graph",
        started_at=T0,
        finished_at=T0,
        cells=[],
        probes=probes,
    )


def test_the_worker_says_when_the_job_changed_the_node() -> None:
    assert _node_changed(_result(4190.0, 4185.0)) == ""
    assert "copy GPU 0" in _node_changed(_result(4190.0, 1391.0))


class _Proc:
    def __init__(self, text: str) -> None:
        self.stdout = io.StringIO(text)


def test_after_such_a_job_the_daemon_probes_again_and_posts_the_report(server, tmp_path: Path) -> None:
    url, admin = server
    with KernelabClient(url, admin, retries=1) as client:
        runner = RunnerDaemon(client, "reprobe-node", once=True, work_dir=tmp_path)
        try:
            runner.ensure_token()
            runner.supervisor.running_spec = SPEC
            lines = f"progress: [1/1] done\n{NODE_CHANGED_MARK}copy GPU 0 read ...\n"
            runner.supervisor.relay_stdout(_Proc(lines), 7, "k", [])  # type: ignore[arg-type]
            assert runner.supervisor.reprobe == SPEC
            node = runner.node_info()
            assert node is not None
            before = len(client.get_node(node.hostname)["probes"]) if _known(client, node.hostname) else 0
            runner.run()  # --once: the probe first, then a claim that finds no job
            assert runner.supervisor.reprobe is None
            probes = [p["report"] for p in client.get_node(node.hostname)["probes"]]
            assert len(probes) == before + 1 and probes[0]["phase"] == "adhoc"
            assert probes[0]["copy_bandwidth"] and probes[0]["copy_bandwidth"][0]["bandwidth_gbps"] > 0
        finally:
            runner.close()


def _known(client: KernelabClient, name: str) -> bool:
    from kernelab.runners.client import KernelabAPIError

    try:
        client.get_node(name)
    except KernelabAPIError:
        return False
    return True
