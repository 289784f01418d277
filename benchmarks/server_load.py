"""Load test of the result server on loopback (CPU only; no GPU needed).

    python benchmarks/server_load.py OUT_DIR [--runners 200] [--workers 4] [--seconds 20]
        [--big-samples 10000000] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

1. ``kernelab serve --workers W`` on a fresh PostgreSQL database; ``--runners`` simulated runners
   (one thread and one HTTP connection each) loop for ``--seconds``: claim (no wait) and, holding
   a job, heartbeat twice. Reports claim/heartbeat p50/p99 (ms), errors (any answer other than
   200/204, or a transport error) and jobs claimed twice (must be 0).
2. Ingest one 1,000-cell sweep result (2 variants x 3 rounds x 100 samples per cell: 600,000
   samples) with ``POST /jobs/{id}/results``, on SQLite and on PostgreSQL (wall time of the POST).
3. The dashboard job page of that sweep (``GET /jobs/{id}``): 20 renders, p50/p95 (ms).
4. PostgreSQL only: ``--big-samples`` raw samples added with one ``INSERT ... SELECT FROM
   generate_series`` (under one filler result/cell), then the job page again (p95).

Writes ``OUT_DIR/server_load.json`` (every number) and server logs; prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from runners.local import free_port, wait_healthy
from service.core.db import upgrade
from service.schemas import CellResult, CorrectnessResult, JobResult, JobSpec, NodeInfo, Sample, Work

TOKEN = "server-load-admin-token-0123456789abcdef"
SPEC = {
    "name": "load",
    "benchmark": "softmax",
    "baseline": {"variant": "torch"},
    "candidate": {"variant": "triton"},
    "sweep": {"M": [8], "N": [16]},
    "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
}


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


class Server:
    """``kernelab serve`` as a child process with ``workers`` uvicorn workers."""

    def __init__(self, url: str, workers: int, log_path: Path):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        upgrade(url)
        env = {
            **os.environ,
            "KERNELAB_DATABASE_URL": url,
            "KERNELAB_ADMIN_TOKEN": TOKEN,
            "KERNELAB_CLAIM_WAIT_MAX_S": "0",
            "KERNELAB_MAX_REQUEST_BYTES": str(512 * 2**20),
            "KERNELAB_LOG_LEVEL": "WARNING",
            "KERNELAB_PUBLIC_DASHBOARD": "1",
        }
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runners.cli",
                "serve",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
            ],
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_healthy(self.base, self.proc, timeout_s=120, log_path=log_path)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def claim_load(base: str, runners: int, seconds: float, jobs: int) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=admin, timeout=60) as http:
        for _ in range(jobs):
            http.post("/api/v1/jobs", json=SPEC).raise_for_status()
        tokens = []
        for i in range(runners):
            r = http.post(
                "/api/v1/runners/register",
                json={"name": f"load-{i}", "node": {"hostname": f"load-{i}", "device_type": "cpu"}},
            )
            r.raise_for_status()
            tokens.append(r.json()["token"])
    lat: dict[str, list[float]] = {"claim": [], "heartbeat": []}
    errors: list[str] = []
    claimed: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(runners)
    deadline = [0.0]

    def runner(token: str) -> None:
        mine: dict[str, list[float]] = {"claim": [], "heartbeat": []}
        got: list[int] = []
        errs: list[str] = []
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30) as c:
            start.wait()
            while time.monotonic() < deadline[0]:
                t = time.perf_counter()
                try:
                    r = c.post("/api/v1/runners/claim", json={"wait_s": 0, "lease_s": 600})
                except httpx.HTTPError as exc:
                    errs.append(f"claim: {type(exc).__name__}")
                    continue
                mine["claim"].append((time.perf_counter() - t) * 1e3)
                if r.status_code == 204:
                    time.sleep(0.5)  # an idle runner polls again
                    continue
                if r.status_code != 200:
                    errs.append(f"claim: HTTP {r.status_code}")
                    continue
                job_id = r.json()["job_id"]
                got.append(job_id)
                for _ in range(2):
                    t = time.perf_counter()
                    try:
                        h = c.post(f"/api/v1/runners/jobs/{job_id}/heartbeat", json={"lease_s": 600})
                        mine["heartbeat"].append((time.perf_counter() - t) * 1e3)
                        if h.status_code != 200:
                            errs.append(f"heartbeat: HTTP {h.status_code}")
                    except httpx.HTTPError as exc:
                        errs.append(f"heartbeat: {type(exc).__name__}")
                    time.sleep(0.2)
        with lock:
            for k in lat:
                lat[k].extend(mine[k])
            claimed.extend(got)
            errors.extend(errs)

    threads = [threading.Thread(target=runner, args=(t,)) for t in tokens]
    deadline[0] = time.monotonic() + seconds + 5  # includes the barrier wait
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    twice = sum(1 for n in Counter(claimed).values() if n > 1)
    return {
        "runners": runners,
        "seconds": seconds,
        "jobs_queued": jobs,
        "jobs_claimed": len(claimed),
        "claimed_twice": twice,
        "errors": len(errors),
        "error_kinds": dict(Counter(errors)),
        "claim_requests": len(lat["claim"]),
        "heartbeat_requests": len(lat["heartbeat"]),
        **{f"{k}_p50_ms": _pct(v, 50) for k, v in lat.items()},
        **{f"{k}_p99_ms": _pct(v, 99) for k, v in lat.items()},
    }


def sweep_result(
    job_id: int, spec: JobSpec, cells: int = 1000, rounds: int = 3, per_round: int = 100
) -> JobResult:
    """A valid result of ``cells`` cells, each with 2 variants x ``rounds`` x ``per_round`` samples."""
    rng = np.random.default_rng(0)
    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    work = Work(flops=1e9, bytes_read=1e8, bytes_written=1e8)
    ok = CorrectnessResult(
        passed=True, rel_error=1e-7, max_abs_error=1e-8, cosine_similarity=1.0, rtol=1e-5, atol=1e-6
    )
    out = []
    for i in range(cells):
        base = 1e4 * (1 + i % 17)
        samples = [
            Sample(
                variant=v,
                round=r,
                position=p * 2 + (v == "candidate"),
                duration_ns=float(
                    base * (0.9 if v == "candidate" else 1.0) * (1 + 0.01 * rng.standard_normal())
                ),
            )  # type: ignore[arg-type]
            for r in range(rounds)
            for p in range(per_round)
            for v in ("baseline", "candidate")
        ]
        out.append(
            CellResult(
                index=i,
                params={"M": 8, "N": 16 + i},
                work={"baseline": work, "candidate": work},
                correctness={"baseline": ok, "candidate": ok},
                samples=samples,
            )
        )
    return JobResult(
        idempotency_key=f"load-sweep-{uuid.uuid4().hex}",
        job_id=job_id,
        spec=spec,
        node=NodeInfo(hostname="load-node", device_type="cpu"),
        timer="perf_counter",
        started_at=t0,
        finished_at=t0 + timedelta(minutes=5),
        cells=out,
    )


def ingest_and_page(base: str, renders: int = 20) -> dict[str, Any]:
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=admin, timeout=600) as http:
        job = http.post("/api/v1/jobs", json=SPEC).json()["id"]
        tok = http.post(
            "/api/v1/runners/register",
            json={"name": "sweep", "node": {"hostname": "sweep", "device_type": "cpu"}},
        ).json()["token"]
        runner = {"Authorization": f"Bearer {tok}", "content-type": "application/json"}
        claim = None
        while claim is None or claim.json()["job_id"] != job:  # older queued jobs are taken and dropped
            claim = http.post("/api/v1/runners/claim", json={"wait_s": 0, "lease_s": 600}, headers=runner)
            claim.raise_for_status()
        body = sweep_result(job, JobSpec.model_validate(claim.json()["spec"])).model_dump_json()
        t = time.perf_counter()
        r = http.post(f"/api/v1/jobs/{job}/results", content=body, headers=runner)
        ingest_s = time.perf_counter() - t
        r.raise_for_status()
        page = _page(http, job, renders)
    return {"job_id": job, "ingest_s": ingest_s, "body_mib": len(body) / 2**20, **page}


def _page(http: httpx.Client, job: int, renders: int) -> dict[str, float]:
    times = []
    for _ in range(renders):
        t = time.perf_counter()
        r = http.get(f"/jobs/{job}")
        times.append((time.perf_counter() - t) * 1e3)
        r.raise_for_status()
    return {"page_p50_ms": _pct(times, 50), "page_p95_ms": _pct(times, 95)}


def fill_samples(url: str, n: int) -> dict[str, Any]:
    """Add ``n`` raw samples under one filler result with one ``INSERT ... SELECT generate_series``."""
    engine = create_engine(url)
    t = time.perf_counter()
    with engine.begin() as conn:
        job = conn.execute(
            text(
                "INSERT INTO jobs (name, benchmark, spec, device, status, attempts, max_attempts, "
                "created_at) "
                "VALUES ('filler', 'softmax', '{}', 'auto', 'succeeded', 1, 1, now()) RETURNING id"
            )
        ).scalar()
        result = conn.execute(
            text(
                "INSERT INTO results (job_id, idempotency_key, node_name, node, timer, started_at, "
                "finished_at, received_at, spec) "
                "VALUES (:j, :k, 'filler', '{}', 'perf_counter', now(), now(), now(), '{}') RETURNING id"
            ),
            {"j": job, "k": f"filler-{uuid.uuid4().hex}"},
        ).scalar()
        cell = conn.execute(
            text(
                "INSERT INTO cells (result_id, cell_index, params, baseline_params, candidate_params, "
                "work, correctness) "
                "VALUES (:r, 0, '{}', '{}', '{}', '{}', '{}') RETURNING id"
            ),
            {"r": result},
        ).scalar()
        conn.execute(
            text(
                "INSERT INTO samples (cell_id, variant, round, position, duration_ns, launches, throttled) "
                "SELECT :c, CASE WHEN g % 2 = 0 THEN 'baseline' ELSE 'candidate' END, g / 200, g % 200, "
                "1000 + (g % 97), 1, false FROM generate_series(0, :n - 1) AS g"
            ),
            {"c": cell, "n": n},
        )
    with engine.connect() as conn:
        total = conn.execute(text("SELECT count(*) FROM samples")).scalar()
        conn.execute(text("COMMIT"))
        conn.execute(text("ANALYZE samples"))
    engine.dispose()
    return {"samples_added": n, "fill_s": time.perf_counter() - t, "samples_total": total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--runners", type=int, default=200)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--big-samples", type=int, default=10_000_000)
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    admin = create_engine(args.pg_url, isolation_level="AUTOCOMMIT")
    name = f"kl_load_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    pg = make_url(args.pg_url).set(database=name).render_as_string(hide_password=False)
    report: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count()}
    try:
        server = Server(pg, args.workers, args.out_dir / "server-pg.log")
        try:
            report["claims"] = claim_load(server.base, args.runners, args.seconds, args.jobs)
            report["pg_sweep"] = ingest_and_page(server.base)
            if args.big_samples:
                report["pg_big"] = fill_samples(pg, args.big_samples)
                with httpx.Client(base_url=server.base, timeout=60) as http:
                    report["pg_big"].update(_page(http, report["pg_sweep"]["job_id"], 20))
        finally:
            server.stop()
        sqlite = f"sqlite:///{args.out_dir / 'load.db'}"
        server = Server(sqlite, 1, args.out_dir / "server-sqlite.log")
        try:
            report["sqlite_sweep"] = ingest_and_page(server.base)
        finally:
            server.stop()
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
    (args.out_dir / "server_load.json").write_text(json.dumps(report, indent=2))
    c, ps, ss = report["claims"], report["pg_sweep"], report["sqlite_sweep"]
    rows = [
        (
            "claim p99 (ms), target <= 100",
            f"{c['claim_p99_ms']:.1f} (p50 {c['claim_p50_ms']:.1f}; {c['claim_requests']} requests)",
        ),
        (
            "heartbeat p99 (ms), target <= 100",
            f"{c['heartbeat_p99_ms']:.1f} (p50 {c['heartbeat_p50_ms']:.1f}; "
            f"{c['heartbeat_requests']} requests)",
        ),
        (
            "errors / jobs claimed twice, target 0 / 0",
            f"{c['errors']} / {c['claimed_twice']} ({c['jobs_claimed']} claimed)",
        ),
        (
            "ingest 1,000 cells x 600 samples, PostgreSQL (s), target <= 2",
            f"{ps['ingest_s']:.2f} ({ps['body_mib']:.0f} MiB body)",
        ),
        ("ingest 1,000 cells x 600 samples, SQLite (s), target <= 2", f"{ss['ingest_s']:.2f}"),
        (
            "job page of the sweep, PostgreSQL p50/p95 (ms), target <= 500",
            f"{ps['page_p50_ms']:.0f} / {ps['page_p95_ms']:.0f}",
        ),
        (
            "job page of the sweep, SQLite p50/p95 (ms), target <= 500",
            f"{ss['page_p50_ms']:.0f} / {ss['page_p95_ms']:.0f}",
        ),
    ]
    if "pg_big" in report:
        b = report["pg_big"]
        rows.append(
            (
                f"job page with {b['samples_total']:,} samples in the DB, p95 (ms), target <= 300",
                f"{b['page_p95_ms']:.0f} (fill {b['fill_s']:.0f} s)",
            )
        )
    print(
        f"\n| {args.runners} runners, {args.workers} API workers, {args.seconds:g} s | value |\n| --- | --- |"
    )
    for k, v in rows:
        print(f"| {k} | {v} |")


if __name__ == "__main__":
    main()
