"""Load test of the result server on loopback (CPU only; no GPU needed).

    python benchmarks/server_load.py OUT_DIR [--runners 200] [--workers 4] [--seconds 90]
        [--saturation-s 30] [--claim-args "--lease-s 15 ..."] [--claims-only]
        [--big-samples 10000000] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

1. ``kernelab serve --workers W`` on a fresh PostgreSQL database; ``--runners`` simulated runners
   in a separate process (``benchmarks/claim_client.py``: asyncio + httpx, one connection each)
   follow the runner daemon's protocol for ``--seconds`` (long-poll claims, heartbeats every
   lease/3, jobs of a few seconds ended through the fail endpoint, a submitter that alternates
   fed and quiet phases): p50/p95/p99 (ms) of claims answered with a queued job, heartbeats, job
   ends, submits, woken long polls (submit -> claim) and empty long polls (time past ``wait_s``);
   errors and jobs claimed twice (must be 0). Then ``--saturation-s`` of the closed loop with zero
   think time, reported as throughput (requests/s), not as a latency. ``--claims-only`` stops here.
2. Ingest 1,000-cell sweep results (2 variants x 3 rounds x 100 samples per cell: 600,000
   samples, columnar JSON) with ``POST /jobs/{id}/results``, on SQLite and on PostgreSQL: three in
   a row, each once the previous comparison is stored; the slowest POST (request start to 2xx).
3. The dashboard job page of the last sweep (``GET /jobs/{id}``): 20 renders, p50/p95 (ms).
4. PostgreSQL only: at least ``--big-samples`` raw samples added as filler results of the sweep's
   shape with binary ``COPY`` (``fill_samples``), then the job page again (p95) and the sweep's raw
   samples downloaded (JSON, CSV, one 10,000-row page).

Writes ``OUT_DIR/server_load.json`` (every number) and server logs; prints a Markdown table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from kernelab.runners.local import free_port, wait_healthy
from kernelab.service.contract.schemas import (
    CellResult,
    CorrectnessResult,
    JobResult,
    JobSpec,
    NodeInfo,
    SampleColumns,
    Side,
    Work,
)
from kernelab.service.server.core.db import upgrade

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
            "KERNELAB_CLAIM_WAIT_MAX_S": "30",  # claim_load long-polls 20 s; the ingest claims with wait_s 0
            "KERNELAB_MAX_REQUEST_BYTES": str(512 * 2**20),
            "KERNELAB_LOG_LEVEL": "WARNING",
            "KERNELAB_PUBLIC_DASHBOARD": "1",
        }
        self.log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelab.runners.cli",
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


def cpu_seconds(pids: list[int]) -> dict[str, float]:
    """CPU time (user + system, s) so far of the processes ``pids`` with their children (the API
    server: the uvicorn supervisor and its workers) and of every PostgreSQL process on this machine
    (its backends serve the API's connections). Processes that ended meanwhile are not counted."""

    def total(procs: list[psutil.Process]) -> float:
        s = 0.0
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            s += t.user + t.system
        return s

    api: list[psutil.Process] = []
    for pid in pids:
        root = psutil.Process(pid)
        api += [root, *root.children(recursive=True)]
    postgres = [p for p in psutil.process_iter(["name"]) if (p.info["name"] or "").startswith("postgres")]
    return {"api": total(api), "postgres": total(postgres)}


def claim_load(
    base: str, runners: int, seconds: float, out_dir: Path, *, mode: str = "protocol",
    extra: list[str] | None = None, server_pid: int | None = None,
) -> dict[str, Any]:  # fmt: skip
    """``runners`` simulated runners against ``base`` for ``seconds`` (``benchmarks/claim_client.py``
    in a child process: asyncio + httpx, one connection per runner). ``mode`` "protocol" follows
    the runner daemon's protocol and reports latency per request kind; "saturation" is the closed
    loop with zero think time and reports throughput. ``extra``: more client arguments. Returns
    the client's summary (latencies in ms: ``ms[kind]`` = n, p50, p95, p99, max); with
    ``server_pid`` also ``cpu_ms_per_request``: CPU ms of the API server (all workers) and of
    PostgreSQL per request of the load (counted in: registering the runners, idle queue polls)."""
    out = out_dir / f"claims-{mode}.json"
    before = cpu_seconds([server_pid]) if server_pid else None
    command = [
        sys.executable, str(Path(__file__).with_name("claim_client.py")), "--base", base, "--token", TOKEN,
        "--out", str(out), "--mode", mode, "--runners", str(runners), "--seconds", str(seconds),
        *(extra or []),
    ]  # fmt: skip
    subprocess.run(command, check=True, timeout=seconds + 600)
    summary = dict(json.loads(out.read_text()))
    if before is not None and server_pid is not None:
        after = cpu_seconds([server_pid])
        n = max(int(summary["requests"]), 1)
        summary["cpu_ms_per_request"] = {k: 1e3 * (after[k] - before[k]) / n for k in after}
    return summary


def request_cost(base: str, server_pid: int, n: int) -> dict[str, Any]:
    """Sequential cost of the runner endpoints, one client, no concurrency: ``n`` heartbeats of
    one leased job, then ``n`` (submit, claim, fail) cycles. Per request kind: latency p50/p99 (ms,
    client side) and CPU ms of the API server and of PostgreSQL per request (``cpu_seconds``).
    Start the server with one worker so nothing else runs in it."""
    out: dict[str, Any] = {"n": n}
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, timeout=60) as http:
        r = http.post("/api/v1/runners/register", headers=admin,
                      json={"name": "cost", "node": {"hostname": "cost", "device_type": "cpu"}})  # fmt: skip
        r.raise_for_status()
        runner = {"Authorization": f"Bearer {r.json()['token']}"}

        def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
            r = http.post(path, json=body, headers=headers)
            r.raise_for_status()
            return dict(r.json())

        def measure(kind: str, step: Callable[[], object], requests_per_step: int) -> None:
            ms: list[float] = []
            before = cpu_seconds([server_pid])
            for _ in range(n):
                t0 = time.perf_counter()
                step()
                ms.append(1e3 * (time.perf_counter() - t0) / requests_per_step)
            after = cpu_seconds([server_pid])
            calls = n * requests_per_step
            out[kind] = {"p50_ms": _pct(ms, 50), "p99_ms": _pct(ms, 99),
                         **{f"cpu_ms_{k}": 1e3 * (after[k] - before[k]) / calls for k in after}}  # fmt: skip

        post("/api/v1/jobs", SPEC, admin)
        job = post("/api/v1/runners/claim", {"wait_s": 0, "lease_s": 3600}, runner)["job_id"]
        beat = f"/api/v1/runners/jobs/{job}/heartbeat"
        measure("heartbeat", lambda: post(beat, {"lease_s": 3600}, runner), 1)

        def cycle() -> None:
            post("/api/v1/jobs", SPEC, admin)
            claimed = post("/api/v1/runners/claim", {"wait_s": 0, "lease_s": 60}, runner)["job_id"]
            post(f"/api/v1/runners/jobs/{claimed}/fail", {"error": "cost", "retry": False}, runner)

        measure("submit_claim_fail", cycle, 3)
    return out


def claims_both_modes(base: str, args: argparse.Namespace, server_pid: int | None = None) -> dict[str, Any]:
    """``claim_load`` in protocol mode for ``args.seconds``, then in saturation mode for
    ``args.saturation_s`` (skipped when 0)."""
    extra = shlex.split(args.claim_args)
    out = {"protocol": claim_load(base, args.runners, args.seconds, args.out_dir, extra=extra,
                                  server_pid=server_pid)}  # fmt: skip
    if args.saturation_s > 0:
        out["saturation"] = claim_load(
            base, args.runners, args.saturation_s, args.out_dir, mode="saturation",
            extra=["--depth", str(args.jobs), *extra], server_pid=server_pid,
        )  # fmt: skip
    return out


@contextmanager
def fresh_database(pg_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database next to ``pg_url``'s (named ``kl_load_<random>``): its
    URL, dropped (``WITH (FORCE)``) on exit."""
    admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
    name = f"kl_load_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(pg_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def request_cost_only(args: argparse.Namespace) -> None:
    """``request_cost`` alone: a fresh PostgreSQL database, one API worker; writes
    ``OUT_DIR/request_cost.json`` and prints the table."""
    report: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count()}
    with fresh_database(args.pg_url) as pg:
        server = Server(pg, 1, args.out_dir / "server-cost.log")
        try:
            report["request_cost"] = request_cost(server.base, server.proc.pid, args.request_cost)
        finally:
            server.stop()
    (args.out_dir / "request_cost.json").write_text(json.dumps(report, indent=2))
    print("\n| sequential, 1 API worker, PostgreSQL | p50 / p99 ms | CPU ms per request: API / PostgreSQL |")
    print("| --- | --- | --- |")
    for kind, c in report["request_cost"].items():
        if isinstance(c, dict):
            cpu = f"{c['cpu_ms_api']:.2f} / {c['cpu_ms_postgres']:.2f}"
            print(f"| {kind} | {c['p50_ms']:.2f} / {c['p99_ms']:.2f} | {cpu} |")


def claims_only(args: argparse.Namespace) -> None:
    """Part 1 alone: a fresh PostgreSQL database, ``--workers`` API workers, both claim modes;
    writes ``OUT_DIR/claims.json`` and prints the table."""
    report: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count(),
                              "workers": args.workers}  # fmt: skip
    with fresh_database(args.pg_url) as pg:
        server = Server(pg, args.workers, args.out_dir / "server-pg.log")
        try:
            report["claims"] = claims_both_modes(server.base, args, server.proc.pid)
        finally:
            server.stop()
    (args.out_dir / "claims.json").write_text(json.dumps(report, indent=2))
    print(f"\n| {args.runners} runners, {args.workers} API workers, PostgreSQL | value |\n| --- | --- |")
    for k, v in _claim_rows(report["claims"]):
        print(f"| {k} | {v} |")


def _claim_rows(claims: dict[str, Any]) -> list[tuple[str, str]]:
    """Table rows of ``claims_both_modes``'s answer."""
    c = claims["protocol"]

    def ms(kind: str) -> str:
        m = c["ms"][kind]
        return f"{m['p50']:.1f} / {m['p95']:.1f} / {m['p99']:.1f} (n={m['n']})" if m["n"] else "none"

    return [
        ("claim answered with an already-queued job, p50/p95/p99 ms (target p99 <= 50)", ms("claim_ready")),
        ("heartbeat, p50/p95/p99 ms (target p99 <= 50)", ms("heartbeat")),
        ("job end (fail endpoint), p50/p95/p99 ms", ms("fail")),
        ("submit, p50/p95/p99 ms", ms("submit")),
        (
            "long poll woken by a new job: submit answer -> claim answer, p50/p95/p99 ms "
            "(target p50 <= 20, p99 <= 100)",
            ms("claim_woken_dispatch"),
        ),
        (f"long poll ended empty: ms past wait_s={c['poll_s']:g} s", ms("claim_empty_overshoot")),
        (
            "errors / jobs claimed twice (target 0 / 0)",
            f"{c['errors']} / {c['claimed_twice']} ({c['jobs_claimed']} claimed, {c['requests']} requests, "
            f"{c['throughput_rps']:.0f} req/s)",
        ),
        *(
            [
                (
                    "CPU per request: API server (all workers) / PostgreSQL, ms",
                    f"{cpu['api']:.2f} / {cpu['postgres']:.2f}",
                )
            ]
            if (cpu := c.get("cpu_ms_per_request"))
            else []
        ),
        *(
            [
                (
                    "saturation (closed loop, zero think time): THROUGHPUT req/s, not a latency target",
                    f"{sat['throughput_rps']:.0f} req/s over {sat['wall_s']:.0f} s; errors {sat['errors']}, "
                    f"claimed twice {sat['claimed_twice']}; heartbeat p50/p99 "
                    f"{sat['ms']['heartbeat']['p50']:.0f} / {sat['ms']['heartbeat']['p99']:.0f} ms",
                )
            ]
            if (sat := claims.get("saturation"))
            else []
        ),
    ]


def sweep_spec(cells: int = 1000) -> dict[str, Any]:
    """``SPEC`` with a sweep of ``cells`` cells (``M=8``, ``N=16 .. 16 + cells - 1``)."""
    return {**SPEC, "sweep": {"M": [8], "N": [16 + i for i in range(cells)]}}


def sweep_result(
    job_id: int,
    spec: JobSpec,
    cells: int = 1000,
    rounds: int = 3,
    per_round: int = 100,
    *,
    abba: bool = False,
) -> JobResult:
    """A valid result of the first ``cells`` cells of ``spec``'s sweep (``sweep_spec(cells)``:
    all of them), each with 2 variants x ``rounds`` x ``per_round`` samples. ``abba``: the
    measurement's default order (``order: abba``), each round's sides in turn B, C then C, B."""
    sweep = spec.cells("cpu")
    if len(sweep) < cells:
        raise ValueError(f"the spec's sweep has {len(sweep)} cells, fewer than {cells}: see sweep_spec")
    rng = np.random.default_rng(0)
    t0 = datetime(2026, 11, 30, tzinfo=UTC)
    work = Work(flops=1e9, bytes_read=1e8, bytes_written=1e8)
    ok = CorrectnessResult(
        passed=True, rel_error=1e-7, max_abs_error=1e-8, cosine_similarity=1.0, rtol=1e-5, atol=1e-6
    )
    per_cell = rounds * per_round * 2
    variant: list[Side] = ["baseline", "candidate"] * (rounds * per_round)  # each round: B, C, B, C, ...
    if abba:  # odd rounds C first
        pair: tuple[list[Side], list[Side]] = (["baseline", "candidate"], ["candidate", "baseline"])
        variant = [v for r in range(rounds) for _ in range(per_round) for v in pair[r % 2]]
    round_ = np.repeat(np.arange(rounds), 2 * per_round).tolist()
    position = np.tile(np.arange(2 * per_round), rounds).tolist()
    factor = np.where(np.array(variant) == "candidate", 0.9, 1.0)  # the candidate 10% faster
    out = []
    for i in range(cells):
        duration = 1e4 * (1 + i % 17) * factor * (1 + 0.01 * rng.standard_normal(per_cell))
        samples = SampleColumns(
            variant=variant, round=round_, position=position, duration_ns=duration.tolist()
        )
        out.append(
            CellResult(
                index=i,
                params=sweep[i],
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


def _ingest_one(http: httpx.Client, runner: dict[str, str]) -> tuple[int, float, int]:
    """Submit, claim and post one 1,000-cell sweep result (``sweep_result``): ``(job id, seconds
    from the start of the POST to its 2xx answer, body bytes)``. The body is serialised first."""
    job = http.post("/api/v1/jobs", json=sweep_spec()).json()["id"]
    claim = None
    while claim is None or claim.json()["job_id"] != job:  # older queued jobs are taken and dropped
        claim = http.post("/api/v1/runners/claim", json={"wait_s": 0, "lease_s": 600}, headers=runner)
        claim.raise_for_status()
    body = sweep_result(job, JobSpec.model_validate(claim.json()["spec"])).model_dump_json()
    t = time.perf_counter()
    r = http.post(f"/api/v1/jobs/{job}/results", content=body, headers=runner)
    ingest_s = time.perf_counter() - t
    r.raise_for_status()
    return job, ingest_s, len(body)


def _wait_for_comparison(http: httpx.Client, job: int, timeout_s: float = 600.0) -> float:
    """Seconds until the job's background comparison is stored (its verdict summary is set)."""
    t = time.perf_counter()
    while not http.get(f"/api/v1/jobs/{job}").json()["summary"]:
        if time.perf_counter() - t > timeout_s:
            raise TimeoutError(f"job {job}: no comparison after {timeout_s} s")
        time.sleep(0.25)
    return time.perf_counter() - t


def ingest_and_page(base: str, renders: int = 20, ingests: int = 3) -> dict[str, Any]:
    """``ingests`` sweep results posted one after another, each once the previous one's background
    comparison is stored (so each POST meets an idle server, as the first does); ``ingest_s`` is
    the slowest. Then one render of the last job's page right after its ingest (``pending_ms``:
    the page says the comparison is being computed), and ``renders`` renders once its comparison
    is stored (the page a user reads: every cell's verdict, the figures, the first table page)."""
    admin = {"Authorization": f"Bearer {TOKEN}"}
    with httpx.Client(base_url=base, headers=admin, timeout=600) as http:
        tok = http.post(
            "/api/v1/runners/register",
            json={"name": "sweep", "node": {"hostname": "sweep", "device_type": "cpu"}},
        ).json()["token"]
        runner = {"Authorization": f"Bearer {tok}", "content-type": "application/json"}
        times: list[float] = []
        compare_s: list[float] = []
        jobs: list[int] = []
        for _ in range(ingests):
            if jobs:
                compare_s.append(_wait_for_comparison(http, jobs[-1]))
            job, ingest_s, size = _ingest_one(http, runner)
            jobs.append(job)
            times.append(ingest_s)
        pending = _page(http, job, 1)
        compare_s.append(_wait_for_comparison(http, job))
        page = _page(http, job, renders)
    return {"job_id": job, "ingest_s": max(times), "ingest_all_s": times, "comparison_wait_s": compare_s,
            "body_mib": size / 2**20, "pending_ms": pending["page_first_ms"],
            "pending_kib": pending["page_kib"], **page}  # fmt: skip


def _page(http: httpx.Client, job: int, renders: int, query: str = "") -> dict[str, float]:
    """``renders`` sequential ``GET /jobs/{job}{query}``: the first render's time, p50/p95 over all
    renders (ms, the first included) and the page size (KiB)."""
    times = []
    size = 0
    for _ in range(renders):
        t = time.perf_counter()
        r = http.get(f"/jobs/{job}{query}")
        times.append((time.perf_counter() - t) * 1e3)
        r.raise_for_status()
        size = len(r.content)
    return {
        "page_first_ms": times[0] if times else float("nan"),
        "page_p50_ms": _pct(times, 50),
        "page_p95_ms": _pct(times, 95),
        "page_kib": size / 1024,
    }


_FILL_CELLS = 1000  # cells per filler result: the 1,000-cell sweep's shape
_FILL_PER_CELL = 600  # samples per filler cell: 2 variants x 3 rounds x 100


def _filler_blocks(rng: np.random.Generator, cells: int, per_cell: int) -> list[dict[str, Any]]:
    """``sample_blocks`` columns of ``cells`` cells of GPU-like samples (every column filled: SM
    clock, clock-event reasons, temperature, power), encoded as ``kernelab.service.contract.sample_blocks``
    does,
    without building Python lists (numpy straight to bytes)."""
    half = per_cell // 2
    const = {
        "n": per_cell,
        "variant": np.tile(np.array([0, 1], "u1"), half).tobytes(),
        "round": np.repeat(np.arange(3, dtype="<i4"), -(-per_cell // 3))[:per_cell].tobytes(),
        "position": np.tile(np.arange(-(-per_cell // 3), dtype="<i4"), 3)[:per_cell].tobytes(),
        "launches": np.full(per_cell, 16, "<i4").tobytes(),
    }
    scale = np.tile([1.0, 0.9], half)
    base = 1e4 * (1 + np.arange(cells) % 17)[:, None] * scale
    duration = base * (1 + 0.01 * rng.standard_normal((cells, per_cell)))
    clock = np.round(1980 - 30 * rng.random((cells, per_cell)))
    reasons = np.where(rng.random((cells, per_cell)) < 0.01, 4, 0).astype("<i8")
    temperature = np.round(45 + 20 * rng.random((cells, per_cell)), 1)
    power = np.round(250 + 400 * rng.random((cells, per_cell)), 2)
    throttled = (clock < 1485).astype("u1")
    columns = {"duration_ns": duration, "sm_clock_mhz": clock, "temperature_c": temperature, "power_w": power}
    return [
        {**const, **{name: values[i].astype("<f8").tobytes() for name, values in columns.items()},
         "clock_event_reasons": reasons[i].tobytes(), "throttled": throttled[i].tobytes()}
        for i in range(cells)
    ]  # fmt: skip


def fill_samples(url: str, n: int, *, seed: int = 0) -> dict[str, Any]:
    """Add at least ``n`` raw samples to the PostgreSQL database ``url``: ceil(n / 600,000) filler
    results shaped like the 1,000-cell sweep (1,000 cells x 600 GPU-like samples, every column
    filled: 54 bytes a sample), one transaction each, written straight into ``jobs``/``results``
    (one row each, a valid spec and node), ``cells`` and ``sample_blocks`` with psycopg's binary
    ``COPY`` (``kernelab.service.server.bulk``, as the ingest does on PostgreSQL); not through the HTTP API
    (that
    would also run 167 background comparisons, ~10 s of CPU each on this machine). Each block
    decodes with ``kernelab.service.contract.sample_blocks.decode`` (checked on the first). Then ``VACUUM
    ANALYZE``.
    Returns the samples added and in total, the seconds taken and the database and table sizes."""
    from kernelab.service.contract import sample_blocks
    from kernelab.service.server import bulk
    from kernelab.service.server.core.db import make_session_factory
    from kernelab.service.server.models import Cell, Job, Result, SampleBlock

    per_result = _FILL_CELLS * _FILL_PER_CELL
    results = -(-n // per_result)
    spec = sweep_spec(_FILL_CELLS)
    node = {"hostname": "filler", "device_type": "cuda", "device_name": "filler GPU", "device_count": 1}
    rng = np.random.default_rng(seed)
    engine = create_engine(url)
    factory = make_session_factory(engine)
    t = time.perf_counter()
    for k in range(results):
        blocks = _filler_blocks(rng, _FILL_CELLS, _FILL_PER_CELL)
        if k == 0:
            assert len(sample_blocks.decode(blocks[0])) == _FILL_PER_CELL
        with factory.begin() as session:
            now = datetime.now(UTC)
            job = Job(
                name=f"filler {k}", benchmark="softmax", spec=spec, device="auto", status="succeeded",
                attempts=1, max_attempts=1, created_at=now, started_at=now, finished_at=now,
            )  # fmt: skip
            session.add(job)
            session.flush()
            result = Result(
                job_id=job.id, idempotency_key=f"filler-{uuid.uuid4().hex}", node_name="filler", node=node,
                timer="cuda-graph", started_at=now, finished_at=now, spec=spec,
            )  # fmt: skip
            session.add(result)
            session.flush()
            cell_rows = [
                {"result_id": result.id, "cell_index": i, "params": {"M": 8, "N": 16 + i},
                 "baseline_params": {}, "candidate_params": {}, "work": {}, "correctness": {}, "error": None,
                 "context": None, "static": None}
                for i in range(_FILL_CELLS)
            ]  # fmt: skip
            cell_ids = bulk.insert_rows_returning_ids(session, Cell, cell_rows)
            rows = [{"cell_id": c, **b} for c, b in zip(cell_ids, blocks, strict=True)]
            bulk.insert_rows(session, SampleBlock, rows)
    fill_s = time.perf_counter() - t
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
        total = int(conn.execute(text("SELECT coalesce(sum(n), 0) FROM sample_blocks")).scalar_one())
        db_bytes = int(conn.execute(text("SELECT pg_database_size(current_database())")).scalar_one())
        table_bytes = int(conn.execute(text("SELECT pg_total_relation_size('sample_blocks')")).scalar_one())
    engine.dispose()
    return {"samples_added": results * per_result, "filler_results": results, "fill_s": fill_s,
            "fill_and_vacuum_s": time.perf_counter() - t, "samples_total": total,
            "db_gib": db_bytes / 2**30, "sample_blocks_gib": table_bytes / 2**30}  # fmt: skip


def download_samples(base: str, job: int) -> dict[str, Any]:
    """The raw samples of ``job`` through ``GET /api/v1/jobs/{id}/samples``: the whole JSON and the
    whole CSV download (seconds, MiB, rows) and one 10,000-row page from the middle (ms)."""
    out: dict[str, Any] = {}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=600) as http:
        for fmt in ("json", "csv"):
            t = time.perf_counter()
            r = http.get(f"/api/v1/jobs/{job}/samples", params={"format": fmt})
            r.raise_for_status()
            out[f"{fmt}_s"] = time.perf_counter() - t
            out[f"{fmt}_mib"] = len(r.content) / 2**20
            out["rows"] = int(r.headers["X-Total-Count"])
        t = time.perf_counter()
        r = http.get(f"/api/v1/jobs/{job}/samples", params={"offset": out["rows"] // 2, "limit": 10_000})
        r.raise_for_status()
        out["page_10000_ms"] = (time.perf_counter() - t) * 1e3
        assert len(r.json()) == min(10_000, out["rows"] - out["rows"] // 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--runners", type=int, default=200)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=90.0, help="claim load, protocol mode, s")
    ap.add_argument(
        "--saturation-s", type=float, default=30.0, help="claim load, saturation mode, s; 0: none"
    )
    ap.add_argument("--jobs", type=int, default=400, help="saturation mode: jobs kept queued")
    ap.add_argument("--claim-args", default="", help="more benchmarks/claim_client.py arguments, one string")
    ap.add_argument(
        "--request-cost",
        type=int,
        default=0,
        metavar="N",
        help="only the sequential cost of N heartbeats and N submit/claim/fail cycles (1 worker)",
    )
    ap.add_argument("--claims-only", action="store_true", help="only the claim load (part 1)")
    ap.add_argument("--big-samples", type=int, default=10_000_000)
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.request_cost:
        request_cost_only(args)
        return
    if args.claims_only:
        claims_only(args)
        return
    report: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "cpus": os.cpu_count()}
    with fresh_database(args.pg_url) as pg:
        server = Server(pg, args.workers, args.out_dir / "server-pg.log")
        try:
            report["claims"] = claims_both_modes(server.base, args, server.proc.pid)
            report["pg_sweep"] = ingest_and_page(server.base)
            if args.big_samples:
                report["pg_big"] = fill_samples(pg, args.big_samples)
                with httpx.Client(base_url=server.base, timeout=60) as http:
                    report["pg_big"].update(_page(http, report["pg_sweep"]["job_id"], 20))
                report["pg_big"]["download"] = download_samples(server.base, report["pg_sweep"]["job_id"])
        finally:
            server.stop()
        sqlite = f"sqlite:///{args.out_dir / 'load.db'}"
        server = Server(sqlite, 1, args.out_dir / "server-sqlite.log")
        try:
            report["sqlite_sweep"] = ingest_and_page(server.base)
        finally:
            server.stop()
    (args.out_dir / "server_load.json").write_text(json.dumps(report, indent=2))
    c, ps, ss = report["claims"], report["pg_sweep"], report["sqlite_sweep"]
    rows = [
        *_claim_rows(c),
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
        (
            "job page right after the ingest (comparison pending), PostgreSQL / SQLite (ms)",
            f"{ps['pending_ms']:.0f} / {ss['pending_ms']:.0f}",
        ),
        (
            "comparison stored, s after the ingest answered, PostgreSQL / SQLite",
            f"{ps['comparison_wait_s'][-1]:.1f} / {ss['comparison_wait_s'][-1]:.1f}",
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
