"""Render time of the dashboard job page of a 1,000-cell sweep (CPU only, loopback).

    python benchmarks/page_speed.py [--db sqlite|postgres|both] [--renders 20] [--cells 1000]
        [--workers 1] [--profile 25] [--json OUT] [--pg-url postgresql+psycopg://postgres@127.0.0.1:5432/test]

For each database (a SQLite file in a temp folder; a fresh PostgreSQL database, dropped after):

1. ``kernelab serve`` (``benchmarks.server_load.Server``: Alembic to head, uvicorn with
   ``--workers``) on that database.
2. One sweep result of ``--cells`` cells (``benchmarks.server_load.sweep_result``: 2 variants x 3
   rounds x 100 samples per cell) posted through ``POST /api/v1/jobs/{id}/results`` by a runner
   token that claimed the job (wall time of the POST).
3. The job page (``GET /jobs/{id}``) once right after the POST, while the background comparison
   may still run ("first render"; whether it said "comparison being computed"); then a poll of
   ``results.comparison`` until it is stored (seconds).
4. ``--renders`` renders of the job page over real HTTP (``server_load._page``): the first (the
   server's first with the stored comparison: nothing of it cached), p50/p95 over all (ms), the
   page size (KiB); then the same for ``?cell=`` of another cell (a timeline not drawn before).
5. ``--browser N``: the job page loaded ``N`` times in headless Chromium (Playwright, the Debian
   ``chromium``; a fresh page each time, 1400 x 900 viewport): from navigation start, when the HTML
   is parsed (``DOMContentLoaded``: the table is there), when every figure in the first screen is
   drawn ("first screen"), and when every figure of the page is drawn (ms); medians printed.
6. ``--profile N``: one render in-process (``kernelab.web.routes.job_page`` called with a session of its
   own, no HTTP) with an empty page cache under cProfile, the top ``N`` functions by cumulative
   time printed; then one cached render, timed.

Prints one line of numbers per database; ``--json`` writes every number to a file.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from pydantic import SecretStr
from sqlalchemy import select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.server_load import TOKEN, Server, _page, fresh_database, sweep_result, sweep_spec  # noqa: E402
from kernelab.service.contract.schemas import JobSpec  # noqa: E402
from kernelab.service.server import models  # noqa: E402
from kernelab.service.server.core.config import Settings  # noqa: E402
from kernelab.service.server.core.db import make_engine, make_session_factory  # noqa: E402

COMPARISON_WAIT_S = 600.0  # give up waiting for the background comparison after 10 min


@contextmanager
def database(kind: str, pg_url: str, folder: Path) -> Iterator[str]:
    """URL of an empty database: a SQLite file under ``folder``, or a fresh PostgreSQL database
    on the server of ``pg_url`` (dropped on exit)."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / 'page-speed.db'}"
        return
    with fresh_database(pg_url) as url:
        yield url


def ingest(http: httpx.Client, cells: int, sweep: str = "plain") -> tuple[int, float]:
    """Submit, claim and post one sweep result; ``(job_id, POST wall s)``. ``sweep``: ``plain``
    (``server_load.sweep_result`` of ``cells`` cells) or ``glance`` (``tests/web/glance_factory``'s
    25 x 40 sweep: declared work, probed peaks, an incorrect and a failed cell: the forest, heat-map
    and roofline all drawn)."""
    if sweep == "glance":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "web"))
        import glance_factory

        spec_json: Any = glance_factory.sweep_spec().model_dump(mode="json")
        hostname = glance_factory.HOSTNAME
    else:
        spec_json, hostname = sweep_spec(cells), "load-node"
    job = http.post("/api/v1/jobs", json=spec_json).json()["id"]
    node = {"hostname": hostname, "device_type": "cpu"}  # the result's node: a runner posts its own
    registered = http.post("/api/v1/runners/register", json={"name": "speed", "node": node})
    registered.raise_for_status()
    runner = {"Authorization": f"Bearer {registered.json()['token']}", "content-type": "application/json"}
    claim = http.post("/api/v1/runners/claim", json={"wait_s": 0, "lease_s": 600}, headers=runner)
    claim.raise_for_status()
    assert claim.json()["job_id"] == job, claim.text
    claimed = JobSpec.model_validate(claim.json()["spec"])
    result = (
        glance_factory.sweep_result(job, claimed)
        if sweep == "glance"
        else sweep_result(job, claimed, cells=cells)
    )
    body = result.model_dump_json()
    started = time.perf_counter()
    http.post(f"/api/v1/jobs/{job}/results", content=body, headers=runner).raise_for_status()
    return job, time.perf_counter() - started


def wait_for_comparison(url: str, job: int) -> float:
    """Seconds until ``results.comparison`` of ``job`` is stored (polled every 0.2 s)."""
    engine = make_engine(url)
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < COMPARISON_WAIT_S:
            with engine.connect() as conn:
                stored = conn.scalar(
                    select(models.Result.comparison.is_not(None)).where(models.Result.job_id == job)
                )
            if stored:
                return time.perf_counter() - started
            time.sleep(0.2)
    finally:
        engine.dispose()
    raise TimeoutError(f"the comparison of job {job} was not stored within {COMPARISON_WAIT_S:.0f} s")


def profile_render(url: str, job: int, top: int) -> tuple[float, float, str]:
    """One in-process render of the job page under cProfile with an empty page cache (a fresh app,
    as a worker's first render of the result), then one more with the cache filled;
    ``(cold wall ms, warm wall ms, top functions of the cold render)``."""
    from starlette.requests import Request

    from kernelab.app import create_app
    from kernelab.web.routes import job_page

    settings = Settings(database_url=url, admin_token=SecretStr(TOKEN), public_dashboard=True)
    factory = make_session_factory(make_engine(url))

    def render(app: Any) -> float:
        scope = {"type": "http", "method": "GET", "path": f"/jobs/{job}", "query_string": b"", "headers": [],
                 "app": app}  # fmt: skip
        with factory() as session:
            started = time.perf_counter()
            job_page(Request(scope), job, session, settings, cell=None)
            return (time.perf_counter() - started) * 1e3

    render(create_app(settings))  # imports, template compilation, connection pool
    app = create_app(settings)  # an empty page cache
    profiler = cProfile.Profile()
    profiler.enable()
    cold_ms = render(app)
    profiler.disable()
    warm_ms = render(app)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return cold_ms, warm_ms, out.getvalue()


_DRAWN = "(divs) => divs.every(d => d.querySelector('svg.main-svg'))"
_IN_VIEW = "(d) => d.getBoundingClientRect().top < window.innerHeight"


def browser_loads(base: str, job: int, loads: int) -> dict[str, dict[str, float]]:
    """Step 5: medians over ``loads`` loads of ``/jobs/{job}`` in headless Chromium (ms from
    navigation start), ``cold`` (a fresh browser context each time: nothing cached) and ``warm``
    (the same context loaded once before: plotly.js from the HTTP and code caches, as a returning
    user has it): ``paint_ms`` (first contentful paint: the page and its table are on screen),
    ``dom_ms`` (DOMContentLoaded), ``first_screen_ms`` (every figure whose top is inside the 1400 x
    900 viewport drawn, after DOMContentLoaded), ``all_figures_ms`` (every figure drawn),
    ``figures``."""
    from playwright.sync_api import Page, sync_playwright

    chromium = os.environ.get("KERNELAB_CHROMIUM", "/usr/bin/chromium")

    def one(page: Page) -> dict[str, float]:
        page.goto(f"{base}/jobs/{job}", wait_until="domcontentloaded")
        page.wait_for_function(
            f"() => [...document.querySelectorAll('div.figure')].filter({_IN_VIEW}).every("
            "d => d.querySelector('svg.main-svg'))",
            polling=10,
            timeout=120_000,
        )
        first = page.evaluate("() => performance.now()")
        page.wait_for_function(
            f"() => ({_DRAWN})([...document.querySelectorAll('div.figure')])", polling=10, timeout=120_000
        )
        every = page.evaluate("() => performance.now()")
        nav = page.evaluate("() => performance.getEntriesByType('navigation')[0].toJSON()")
        paint = page.evaluate(
            "() => (performance.getEntriesByName('first-contentful-paint')[0] || {startTime: NaN}).startTime"
        )
        figures = page.evaluate("() => document.querySelectorAll('div.figure').length")
        return {"paint_ms": paint, "dom_ms": nav["domContentLoadedEventEnd"], "first_screen_ms": first,
                "all_figures_ms": every, "figures": figures}  # fmt: skip

    rows: dict[str, list[dict[str, float]]] = {"cold": [], "warm": []}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox"])
        try:
            for _ in range(loads):
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                rows["cold"].append(one(page))
                page.close()
                page = context.new_page()
                rows["warm"].append(one(page))
                context.close()
        finally:
            browser.close()
    return {
        mode: {k: float(sorted(r[k] for r in got)[len(got) // 2]) for k in got[0]}
        for mode, got in rows.items()
    }


def measure(kind: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Steps 1-5 of the module docstring on one database."""
    with database(kind, args.pg_url, folder) as url:
        server = Server(url, args.workers, folder / f"server-{kind}.log")
        try:
            with httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=600) as http:  # fmt: skip
                job, ingest_s = ingest(http, args.cells, args.sweep)
                started = time.perf_counter()
                first = http.get(f"/jobs/{job}")
                first_ms = (time.perf_counter() - started) * 1e3
                first.raise_for_status()
                wait_s = wait_for_comparison(url, job)
                out: dict[str, Any] = {
                    "db": kind, "sweep": args.sweep, "job_id": job, "cells": args.cells, "ingest_s": ingest_s,
                    "first_render_ms": first_ms, "first_render_pending": "comparison-pending" in first.text,
                    "comparison_wait_s": wait_s,
                    **_page(http, job, args.renders),
                    "other_cell": _page(http, job, args.renders, query=f"?cell={args.cells // 2}"),
                }  # fmt: skip
                if args.browser:
                    out["browser"] = browser_loads(server.base, job, args.browser)
        finally:
            server.stop()
        if args.profile:
            out["profile_cold_ms"], out["inprocess_warm_ms"], report = profile_render(url, job, args.profile)
            print(
                f"--- cProfile of one in-process render, empty page cache ({kind}): "
                f"{out['profile_cold_ms']:.0f} ms under the profiler; "
                f"cached render {out['inprocess_warm_ms']:.0f} ms"
            )
            print(report)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    ap.add_argument("--renders", type=int, default=20)
    ap.add_argument("--cells", type=int, default=1000, help="cells of the plain sweep")
    ap.add_argument("--sweep", choices=("plain", "glance"), default="plain", help="ingest()'s two sweeps")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--browser", type=int, default=0, help="loads of the page in headless Chromium; 0: none")
    ap.add_argument("--profile", type=int, default=25, help="top N functions of a profiled render; 0: none")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--pg-url",
        default=os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"),
    )
    args = ap.parse_args()
    kinds = ("sqlite", "postgres") if args.db == "both" else (args.db,)
    results = []
    with tempfile.TemporaryDirectory(prefix="page-speed-") as tmp:
        for kind in kinds:
            results.append(measure(kind, args, Path(tmp)))
    for r in results:
        o = r["other_cell"]
        print(
            f"{r['db']}: {r['cells']} cells, ingest {r['ingest_s']:.1f} s;"
            f" first render {r['first_render_ms']:.0f} ms (pending note: {r['first_render_pending']});"
            f" comparison stored after {r['comparison_wait_s']:.1f} s; first render with it"
            f" {r['page_first_ms']:.0f} ms; {args.renders} renders p50/p95"
            f" {r['page_p50_ms']:.0f}/{r['page_p95_ms']:.0f} ms,"
            f" {r['page_kib']:.0f} KiB; ?cell= p50/p95 {o['page_p50_ms']:.0f}/{o['page_p95_ms']:.0f} ms"
        )
        for mode, b in r.get("browser", {}).items():
            print(
                f"{r['db']}: Chromium {mode}, median of {args.browser} loads: first paint"
                f" {b['paint_ms']:.0f} ms, DOMContentLoaded {b['dom_ms']:.0f} ms, first screen's figures"
                f" drawn {b['first_screen_ms']:.0f} ms, all {b['figures']:.0f} figures drawn"
                f" {b['all_figures_ms']:.0f} ms"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
