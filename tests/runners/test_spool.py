"""The spool: files named from the claim (never by reading the result), ``schema_version`` in every
file, a newer version kept and logged, an older one posted as it is (its bytes unchanged)."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kernelab.runners.client import KernelabClient
from kernelab.runners.daemon import RunnerDaemon
from kernelab.runners.spool import NewerResultFile, Spool, UnreadableResultFile
from kernelab.service.contract.schemas import RESULT_SCHEMA_VERSION, JobResult, JobSpec

pytestmark = pytest.mark.timeout(60)


def _result(job_id: int = 7, key: str = "node-j7-a2-0123abcd") -> JobResult:
    spec = JobSpec(benchmark="softmax", baseline={"variant": "torch"}, candidate={"variant": "triton"})  # type: ignore[arg-type]
    t0 = datetime(2026, 12, 1, tzinfo=UTC)
    return JobResult(
        idempotency_key=key, job_id=job_id, spec=spec, node={"hostname": "n", "device_type": "cpu"},  # type: ignore[arg-type]
        timer="perf_counter", started_at=t0, finished_at=t0, cells=[], error="no cells",
    )  # fmt: skip


def test_a_worker_file_is_named_from_the_claim_and_not_read(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    worker_file = tmp_path / "result.json"
    worker_file.write_text("not even JSON")  # adopt never reads it: the server judges it when posted
    path = spool.adopt(worker_file, job_id=7, key="node-j7-a2-0123abcd")
    assert path == spool.root / "7-node-j7-a2-0123abcd.json" and not worker_file.exists()
    assert spool.job_id_of(path) == 7
    with pytest.raises(UnreadableResultFile, match="7-node-j7-a2-0123abcd.json"):
        spool.read(path)  # what flush_spool moves to rejected/
    assert spool.path_for(7, "a/b c") == spool.root / "7-a_b_c.json"


def test_every_spooled_file_carries_schema_version(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    path = spool.put(_result())
    assert path.name == "7-node-j7-a2-0123abcd.json"
    assert json.loads(path.read_bytes())["schema_version"] == RESULT_SCHEMA_VERSION
    job_id, body = spool.read(path)
    assert job_id == 7 and body == path.read_bytes()  # posted as it is
    assert spool.load(path) == _result()


def test_an_older_file_is_read_and_a_newer_one_refused(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    doc = json.loads(_result().model_dump_json())
    older = spool.root / "7-old.json"
    older.write_text(json.dumps({k: v for k, v in doc.items() if k != "schema_version"}))
    assert spool.read(older)[0] == 7 and spool.load(older).idempotency_key == doc["idempotency_key"]
    newer = spool.root / "8-new.json"
    newer.write_text(
        json.dumps({**doc, "job_id": 8, "schema_version": RESULT_SCHEMA_VERSION + 1, "cells": "?"})
    )
    with pytest.raises(NewerResultFile, match="newer"):
        spool.read(newer)
    with pytest.raises(NewerResultFile):
        spool.load(newer)
    mislabelled = spool.root / "9-other.json"
    mislabelled.write_text(json.dumps(doc))  # job 7's result under job 9's name
    with pytest.raises(UnreadableResultFile, match="job 7"):
        spool.read(mislabelled)


class _Recorder(BaseHTTPRequestHandler):
    """Answers every result POST with 201 and keeps the bodies it got."""

    bodies: list[tuple[str, bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append((self.path, body))
        job_id = int(self.path.split("/")[-2])
        answer = json.dumps({"job_id": job_id, "result_id": 1, "duplicate": False}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorder() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.bodies = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_flush_posts_the_files_bytes_and_keeps_a_newer_file_with_one_log_line(
    recorder: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runner = RunnerDaemon(KernelabClient(recorder, "t", retries=0), "spooler", work_dir=tmp_path / "runner")
    current = runner.spool.put(_result())
    body = current.read_bytes()
    doc = json.loads(body)
    newer = runner.spool.root / "8-newer-key.json"
    newer.write_text(json.dumps({**doc, "job_id": 8, "schema_version": RESULT_SCHEMA_VERSION + 1}))
    with caplog.at_level(logging.ERROR, logger="kernelab.runners.daemon"):
        assert runner.flush_spool() == 1
        assert runner.flush_spool() == 0
    assert _Recorder.bodies == [("/api/v1/jobs/7/results", body)]  # the file's bytes, unchanged
    assert runner.spool.pending() == [newer] and not runner.spool.rejected_dir.exists()  # kept
    lines = [r.getMessage() for r in caplog.records if "8-newer-key.json" in r.getMessage()]
    assert len(lines) == 1 and "newer" in lines[0] and "kept" in lines[0]
    runner.client.close()
