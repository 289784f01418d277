"""Simulated runners for ``benchmarks/server_load.py``: one process, asyncio + httpx, one HTTP
connection per runner (200 threads would take the CPU the server is being measured on).

    python benchmarks/claim_client.py --base URL --token ADMIN --out FILE.json
        [--mode protocol|saturation] [--runners 200] [--seconds 90] [--poll-s 20] [--lease-s 15]
        [--job-s 2 20] [--fed-s 40] [--quiet-s 35] [--depth 40]

``protocol`` (default): the runner daemon's protocol (``runners/daemon.py``) on a shorter clock.
An idle runner long-polls ``POST /runners/claim {"wait_s": poll_s, "lease_s": lease_s}``; holding
a job it heartbeats every ``lease_s / 3`` seconds (the daemon's rule; 15 s leases give 5 s
heartbeats, so most requests are heartbeats as in a real fleet, where the daemon's default 120 s
lease gives 40 s heartbeats during jobs of minutes); the job "runs" ``uniform(job_s)``
seconds, then ``POST /runners/jobs/{id}/fail {"retry": false}`` ends it (a small body, no result
ingest) and the runner claims again. Runners start spread over ``lease_s / 3`` seconds. A
submitter alternates *fed* phases (``fed_s``: keeps ``depth`` jobs queued, 4 submits in flight)
and *quiet* phases (``quiet_s``: submits nothing, so runners go idle and long polls end empty).

``saturation``: the old closed loop, zero think time: claim (``wait_s`` 0), two heartbeats, fail,
repeat; the queue is pre-filled and kept fed. It measures throughput (requests/s), not latency.

Every request is classified by what happened:

* ``claim_ready``: a claim answered with a job that was already queued when the claim was sent;
* ``claim_woken``: a long poll answered with a job submitted while it waited; ``dispatch_ms`` is
  the time from that job's submit answer to the claim answer. With a notified wake-up the claim's
  answer can arrive before the submit's own answer (the job is claimable once its transaction
  commits, the submit's answer is sent after that): such a claim is woken with ``dispatch_ms`` 0
  and counted in ``woken_before_submit_answer``;
* ``claim_empty``: a long poll that ended with 204; ``overshoot_ms`` = its time minus ``wait_s``;
* ``heartbeat``, ``fail`` (ends a job), ``submit``.

Errors: transport errors and any status other than the expected one (200/204 claim, 200
heartbeat and fail, 201 submit). ``claimed_twice``: jobs handed to more than one claim (must be
0: no job is failed with retry and heartbeats keep every lease alive).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import random
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np

SPEC = {
    "name": "load",
    "benchmark": "softmax",
    "baseline": {"variant": "torch"},
    "candidate": {"variant": "triton"},
    "sweep": {"M": [8], "N": [16]},
    "device": "cpu",
    "probes": {"copy_bandwidth": False, "all_reduce": False, "nvml": False},
}
SUBMITTERS = 4  # concurrent submit requests of the feeder
FEED_TICK_S = 0.05  # how often the feeder looks at the queue depth


class Load:
    """Shared state of one run: latencies per kind, errors, claims, submit times."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = defaultdict(list)
        self.samples: list[tuple[float, str, float]] = []  # (monotonic time answered, kind, ms)
        self.errors: Counter[str] = Counter()
        self.retried: Counter[str] = Counter()  # transport errors of idempotent calls, sent again
        self.claimed: Counter[int] = Counter()
        self.submitted_at: dict[int, float] = {}  # job id -> monotonic time its submit was answered
        # job id -> (claim sent, claim answered, claim ms) of a claim answered before its job's submit
        self.claimed_early: dict[int, tuple[float, float, float]] = {}
        self.woken_early = 0  # of them, claims sent before the submit: woken, dispatch_ms 0
        self.queued = 0  # submitted, not yet claimed (the client's view of the queue)
        self.requests = 0

    def record(self, kind: str, ms: float) -> None:
        self.ms[kind].append(ms)
        self.samples.append((time.monotonic(), kind, ms))

    def error(self, what: str) -> None:
        self.errors[what] += 1


async def _post(
    load: Load,
    http: httpx.AsyncClient,
    kind: str,
    url: str,
    body: dict[str, Any],
    ok: tuple[int, ...],
    *,
    idempotent: bool = False,
) -> tuple[httpx.Response | None, float, float]:
    """POST; returns (response or None on error, latency ms, monotonic time it was sent).

    Like ``kernelab.runners.client.KernelabClient``, an ``idempotent`` call (heartbeat, fail) is sent again
    once after a transport error (counted in ``retried``, the latency is the two tries')."""
    sent = time.monotonic()
    t = time.perf_counter()
    for attempt in (0, 1):
        try:
            r = await http.post(url, json=body)
            break
        except httpx.HTTPError as exc:
            if idempotent and attempt == 0:
                load.retried[f"{kind}: {type(exc).__name__}"] += 1
                continue
            load.error(f"{kind}: {type(exc).__name__}")
            return None, (time.perf_counter() - t) * 1e3, sent
    ms = (time.perf_counter() - t) * 1e3
    load.requests += 1
    if r.status_code not in ok:
        load.error(f"{kind}: HTTP {r.status_code}")
        return None, ms, sent
    return r, ms, sent


async def _claim(load: Load, http: httpx.AsyncClient, wait_s: float, lease_s: float) -> int | None:
    r, ms, sent = await _post(
        load, http, "claim", "/api/v1/runners/claim", {"wait_s": wait_s, "lease_s": lease_s}, (200, 204)
    )
    if r is None:
        return None
    if r.status_code == 204:
        load.record("claim_empty", ms)
        load.record("claim_empty_overshoot", ms - wait_s * 1e3)
        return None
    job_id = int(r.json()["job_id"])
    load.claimed[job_id] += 1
    load.queued -= 1
    submitted = load.submitted_at.get(job_id)
    if submitted is None:  # the claim beat its job's submit answer: classified when that comes
        load.claimed_early[job_id] = (sent, time.monotonic(), ms)
    elif submitted > sent:
        load.record("claim_woken", ms)
        load.record("claim_woken_dispatch", (time.monotonic() - submitted) * 1e3)
    else:
        load.record("claim_ready", ms)
    return job_id


async def _heartbeat(load: Load, http: httpx.AsyncClient, job_id: int, lease_s: float) -> None:
    r, ms, _ = await _post(
        load,
        http,
        "heartbeat",
        f"/api/v1/runners/jobs/{job_id}/heartbeat",
        {"lease_s": lease_s},
        (200,),
        idempotent=True,
    )
    if r is not None:
        load.record("heartbeat", ms)


async def _end(load: Load, http: httpx.AsyncClient, job_id: int) -> None:
    body = {"error": "simulated job", "retry": False}
    r, ms, _ = await _post(
        load, http, "fail", f"/api/v1/runners/jobs/{job_id}/fail", body, (200,), idempotent=True
    )
    if r is not None:
        load.record("fail", ms)


async def protocol_runner(
    load: Load, http: httpx.AsyncClient, args: argparse.Namespace, stop_at: float, rng: random.Random
) -> None:
    """One runner daemon: long-poll, then heartbeat every lease_s/3 while the job runs, then end it."""
    await asyncio.sleep(rng.uniform(0, args.lease_s / 3))
    beat_s = args.lease_s / 3
    while time.monotonic() < stop_at:
        wait_s = min(args.poll_s, max(stop_at - time.monotonic(), 0.0))
        job_id = await _claim(load, http, wait_s, args.lease_s)
        if job_id is None:
            if load.errors:
                await asyncio.sleep(1.0)  # the daemon backs off after an error
            continue
        ends = time.monotonic() + rng.uniform(*args.job_s)
        while (left := ends - time.monotonic()) > 0:
            await asyncio.sleep(min(beat_s, left))
            if time.monotonic() < ends:
                await _heartbeat(load, http, job_id, args.lease_s)
        await _end(load, http, job_id)


async def saturation_runner(
    load: Load, http: httpx.AsyncClient, args: argparse.Namespace, stop_at: float
) -> None:
    """Closed loop, zero think time: claim (no wait), two heartbeats, end; repeat."""
    while time.monotonic() < stop_at:
        job_id = await _claim(load, http, 0.0, args.lease_s)
        if job_id is None:
            await asyncio.sleep(0.5)  # an empty queue: poll again soon
            continue
        for _ in range(2):
            await _heartbeat(load, http, job_id, args.lease_s)
        await _end(load, http, job_id)


async def _submit(load: Load, http: httpx.AsyncClient) -> None:
    r, ms, sent = await _post(load, http, "submit", "/api/v1/jobs", SPEC, (201,))
    if r is not None:
        load.record("submit", ms)
        job_id = int(r.json()["id"])
        load.submitted_at[job_id] = time.monotonic()
        early = load.claimed_early.pop(job_id, None)
        if early is not None:  # its claim was answered first: it waited when the job came
            claim_sent, _answered, claim_ms = early
            load.record("claim_woken" if claim_sent < sent else "claim_ready", claim_ms)
            if claim_sent < sent:
                load.record("claim_woken_dispatch", 0.0)
                load.woken_early += 1


def _fed(args: argparse.Namespace, elapsed_s: float) -> bool:
    if args.mode == "saturation":
        return True
    return elapsed_s % (args.fed_s + args.quiet_s) < args.fed_s


async def feeder(
    load: Load, http: httpx.AsyncClient, args: argparse.Namespace, t0: float, stop_at: float
) -> None:
    """Keep ``depth`` jobs queued during fed phases; submit nothing in quiet phases."""
    inflight: set[asyncio.Task[None]] = set()
    while time.monotonic() < stop_at:
        if _fed(args, time.monotonic() - t0):
            while len(inflight) < SUBMITTERS and load.queued + len(inflight) < args.depth:
                task = asyncio.create_task(_submit_counted(load, http))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
        await asyncio.sleep(FEED_TICK_S)
    if inflight:
        await asyncio.wait(inflight)


async def _submit_counted(load: Load, http: httpx.AsyncClient) -> None:
    await _submit(load, http)
    load.queued += 1


async def _register(http: httpx.AsyncClient, i: int) -> str:
    node = {"hostname": f"load-{i}", "device_type": "cpu"}
    r = await http.post("/api/v1/runners/register", json={"name": f"load-{i}", "node": node})
    r.raise_for_status()
    return str(r.json()["token"])


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    a = np.asarray(values)
    return {"n": int(a.size), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
            "p99": float(np.percentile(a, 99)), "max": float(a.max())}  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Register the runners, run the load for ``args.seconds``, return the summary dict."""
    admin_headers = {"Authorization": f"Bearer {args.token}"}
    load = Load()
    timeout = httpx.Timeout(args.poll_s + 60.0)
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    # One TLS context for all clients: each AsyncClient would otherwise load the CA bundle itself
    # (~0.1 s of CPU each, 20 s for 200 runners), even for plain http.
    tls = httpx.create_ssl_context()
    async with httpx.AsyncClient(
        base_url=args.base, headers=admin_headers, timeout=timeout, verify=tls
    ) as admin:
        tokens = [await _register(admin, i) for i in range(args.runners)]
        if args.mode == "saturation":
            for _ in range(args.depth):
                await _submit_counted(load, admin)
            load.ms.clear()
            load.samples.clear()
        clients = [
            httpx.AsyncClient(
                base_url=args.base,
                headers={"Authorization": f"Bearer {t}"},
                timeout=timeout,
                limits=one,
                verify=tls,
            )  # fmt: skip
            for t in tokens
        ]
        feeders = [
            httpx.AsyncClient(
                base_url=args.base, headers=admin_headers, timeout=timeout, limits=one, verify=tls
            )
            for _ in range(SUBMITTERS)
        ]
        try:
            rng = random.Random(args.seed)
            t0 = time.monotonic()
            stop_at = t0 + args.seconds
            start_requests = load.requests
            if args.mode == "saturation":
                tasks = [saturation_runner(load, c, args, stop_at) for c in clients]
            else:
                tasks = [
                    protocol_runner(load, c, args, stop_at, random.Random(rng.random())) for c in clients
                ]
            pool = _RoundRobin(feeders)
            await asyncio.gather(feeder(load, pool, args, t0, stop_at), *tasks)  # type: ignore[arg-type]
            wall_s = time.monotonic() - t0
            if args.raw is not None:
                with args.raw.open("w") as fh:
                    fh.writelines(f"{t - t0:.3f} {kind} {ms:.2f}\n" for t, kind, ms in load.samples)
        finally:
            for c in clients + feeders:
                await c.aclose()
    twice = sum(1 for n in load.claimed.values() if n > 1)
    kinds = ("claim_ready", "claim_woken", "claim_woken_dispatch", "claim_empty", "claim_empty_overshoot",
             "heartbeat", "fail", "submit")  # fmt: skip
    return {
        "mode": args.mode,
        "runners": args.runners,
        "seconds": args.seconds,
        "wall_s": wall_s,
        "poll_s": args.poll_s,
        "lease_s": args.lease_s,
        "heartbeat_s": args.lease_s / 3,
        "job_s": list(args.job_s),
        "fed_s": args.fed_s,
        "quiet_s": args.quiet_s,
        "depth": args.depth,
        "requests": load.requests - start_requests,
        "throughput_rps": (load.requests - start_requests) / wall_s,
        "jobs_submitted": len(load.submitted_at),
        "jobs_claimed": len(load.claimed),
        "claimed_twice": twice,
        "woken_before_submit_answer": load.woken_early,
        "errors": sum(load.errors.values()),
        "error_kinds": dict(load.errors),
        "retried": dict(load.retried),
        "ms": {k: _summary(load.ms.get(k, [])) for k in kinds},
    }


class _RoundRobin:
    """Spreads the feeder's submits over its connections (one request per connection at a time)."""

    def __init__(self, clients: list[httpx.AsyncClient]):
        self.clients = clients
        self.next = 0

    async def post(self, url: str, json: Any, **kwargs: Any) -> httpx.Response:
        client = self.clients[self.next % len(self.clients)]
        self.next += 1
        return await client.post(url, json=json, **kwargs)


def main() -> None:
    if importlib.util.find_spec("sniffio") is None:
        # httpcore 1.0 tries `import sniffio` on every async request and anyio >= 4.11 no longer
        # installs it: the failed import scans sys.path each time (encode/httpcore#1103), which
        # made this client use more CPU than the server it measures.
        print("warning: sniffio is not installed (pip install sniffio): the client will cost more CPU",
              file=sys.stderr)  # fmt: skip
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="server root URL")
    ap.add_argument("--token", required=True, help="admin token (registers runners, submits jobs)")
    ap.add_argument("--out", type=Path, required=True, help="summary JSON")
    ap.add_argument("--mode", choices=("protocol", "saturation"), default="protocol")
    ap.add_argument("--runners", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=90.0)
    ap.add_argument("--poll-s", type=float, default=20.0, help="claim long-poll wait_s (daemon default)")
    ap.add_argument("--lease-s", type=float, default=15.0, help="lease; heartbeat every lease_s / 3")
    ap.add_argument("--job-s", type=float, nargs=2, default=(2.0, 20.0), help="job duration range, s")
    ap.add_argument("--fed-s", type=float, default=40.0, help="phase with the queue kept fed, s")
    ap.add_argument("--quiet-s", type=float, default=35.0, help="phase with no submits, s")
    ap.add_argument("--depth", type=int, default=40, help="jobs kept queued in fed phases")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--raw", type=Path, help="also write every sample: seconds since start, kind, ms")
    args = ap.parse_args()
    args.out.write_text(json.dumps(asyncio.run(run(args)), indent=2))


if __name__ == "__main__":
    main()
