"""A running daemon's status and metrics over HTTP (``kernelab runner --status-port PORT``).

Served from memory, so a daemon whose disk is full still says so: ``GET /status`` answers
``RunnerDaemon.status()`` as JSON (``state``: ``starting``, ``waiting`` for older jobs of the
host's other runners, ``claiming``, ``running``, ``not-claiming``, ``stopping``, ``stopped``;
``can_write`` and ``write_problem``: why the node cannot take a job's writes, since when;
``post_problem``: why measured results wait; the counters), ``GET /metrics`` the same in
Prometheus's text format (rendered by ``prometheus_client``), one sample per runner name:

* ``kernelab_runner_can_write`` 1/0, ``kernelab_runner_claiming`` 1/0 (it would claim now),
  ``kernelab_runner_write_problem_since_seconds`` (Unix time; absent while it can write);
* ``kernelab_runner_jobs_total{outcome}`` done, failed, lost, released, node_fault;
* ``kernelab_runner_results_posted_total``, ``kernelab_runner_results_unposted`` (measured, not yet
  acknowledged), ``kernelab_runner_results_in_memory`` (of those, in memory only).

The server binds ``127.0.0.1`` by default: nothing it says is secret (no token, no path of a
token), but it is the operator's, not the jobs'.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from kernelab.runners.daemon.loop import RunnerDaemon

JOB_OUTCOMES = {"done": "done", "failed": "failed", "lost": "lost", "released": "released",
                "node_faults": "node_fault"}  # fmt: skip


class _DaemonCollector(Collector):
    def __init__(self, daemon: RunnerDaemon) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[Any]:
        s = self.daemon.status()
        runner = [s["name"]]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=["runner"])
            g.add_metric(runner, value)
            return g

        yield gauge("kernelab_runner_can_write", "1 while the node takes a job's writes.",
                    float(s["can_write"]))  # fmt: skip
        yield gauge("kernelab_runner_claiming", "1 while the runner claims jobs (or runs one).",
                    float(s["state"] in ("claiming", "running")))  # fmt: skip
        if s["write_problem_since"] is not None:
            yield gauge("kernelab_runner_write_problem_since_seconds", "Since when the node cannot write.",
                        s["write_problem_since"])  # fmt: skip
        jobs = CounterMetricFamily("kernelab_runner_jobs", "Jobs this runner ended, by outcome.",
                                   labels=["runner", "outcome"])  # fmt: skip
        for key, outcome in JOB_OUTCOMES.items():
            jobs.add_metric([s["name"], outcome], s[key])
        yield jobs
        posted = CounterMetricFamily("kernelab_runner_results_posted", "Results the server acknowledged.",
                                     labels=["runner"])  # fmt: skip
        posted.add_metric(runner, s["posted"])
        yield posted
        yield gauge("kernelab_runner_results_unposted", "Results measured, not yet acknowledged.",
                    s["unposted"])  # fmt: skip
        yield gauge("kernelab_runner_results_in_memory", "Results held in memory only.", s["in_memory"])


class StatusServer:
    """``/status`` and ``/metrics`` of ``daemon`` on ``host:port`` (0: a free port), served by a
    thread until ``close()``. ``url``: where. Raises ``OSError`` when the address cannot be bound."""

    def __init__(self, daemon: RunnerDaemon, host: str, port: int) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_DaemonCollector(daemon))

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?", 1)[0]
                if path == "/status":
                    body, kind = json.dumps(daemon.status()).encode(), "application/json"
                elif path == "/metrics":
                    body, kind = generate_latest(registry), CONTENT_TYPE_LATEST
                else:
                    body, kind = b'{"detail": "Not Found"}', "application/json"
                self.send_response(200 if path in ("/status", "/metrics") else 404)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # the daemon's log is for jobs
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="runner-status", daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()
