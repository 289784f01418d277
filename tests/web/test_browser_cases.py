"""Every case of "stored results mean the same on every database" as a person sees it in Chromium.

A server of its own (uvicorn) on a temp SQLite file and on a fresh PostgreSQL database receives,
through the REST API as a runner posts them, the cases that used to answer 500 or 422 or read
wrong: probes with a +05:00 offset, NVML placeholder masks, a slow GPU pair, a cold all-reduce
series, NaN correctness metrics, two rounds, an all-zero baseline, a 0 ns candidate, samples
throttled by their clock-event reasons, a result on a degraded node, H200 and A100 results of one
benchmark; plus 9e307 ns samples stored as an older server stored them. The jobs list, every job
page, the node pages and the history page then render in Chromium without a script error, and
show what the API says.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
import compare_wait  # noqa: E402
from dashboard_server import ADMIN_TOKEN, Dashboard, DashboardConfig, signed_in_page  # noqa: E402
from playwright.sync_api import Browser, Page  # noqa: E402
from sqlalchemy import create_engine, select, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from sqlalchemy.exc import OperationalError  # noqa: E402
from web_factory import T0, make_probe, make_result, make_spec  # noqa: E402

from kernelab.service.contract.schemas import (  # noqa: E402
    AllReduceReading,
    JobResult,
    NodeInfo,
    PeerCopyReading,
    ProbeReport,
    Sample,
    SampleColumns,
    Work,
)
from kernelab.service.server import crud  # noqa: E402
from kernelab.service.server.core.db import make_engine, make_session_factory  # noqa: E402
from kernelab.service.server.models import Runner  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PG_URL = os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BLANK = 0x7FFFFFFFFFFFFFF0  # DCGM_INT64_BLANK
H200, A100 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB"
BENCHMARK = "softmax"


@dataclass
class Site:
    base_url: str
    db_url: str
    jobs: dict[str, int] = field(default_factory=dict)  # case -> job id


# --------------------------------------------------------------------------------------------------
# The server, on either database
# --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def dashboard_config(request: pytest.FixtureRequest) -> Iterator[DashboardConfig]:
    """The module's server on a temp SQLite file, then on a fresh PostgreSQL database of its own
    (created here, dropped after)."""
    if request.param == "sqlite":
        yield DashboardConfig()
        return
    admin = create_engine(PG_URL, isolation_level="AUTOCOMMIT")
    name = f"kl_browser_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL at {PG_URL} is not reachable: {exc.orig}")
        pytest.skip(f"PostgreSQL at {PG_URL} is not reachable: {exc.orig}")
    try:
        yield DashboardConfig(
            database_url=make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
        )
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(scope="module")
def site(dashboard: Dashboard) -> Site:
    site = Site(dashboard.url, dashboard.database_url)
    _seed(site)
    return site


# --------------------------------------------------------------------------------------------------
# The cases, posted as a runner posts them
# --------------------------------------------------------------------------------------------------


def _runner(api: httpx.Client, node: str, model: str = "test-cpu") -> dict[str, str]:
    body = {"name": node, "node": {"hostname": node, "device_type": "cpu", "device_name": model}}
    r = api.post("/runners/register", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    return {"Authorization": f"Bearer {r.json()['token']}"}


def _probe(api: httpx.Client, runner: dict[str, str], node: str, body: dict[str, Any]) -> None:
    r = api.post(f"/nodes/{node}/probes", json=body, headers=runner)
    assert r.status_code == 201, r.text


def _samples(rounds: int, base: Callable[[int], float], cand: Callable[[int], float],
             **context: Any) -> SampleColumns:  # fmt: skip
    """ABBA rounds; ``model_construct``: 9e307 ns is refused at the door now, stored as before."""
    defaults = {"launches": 1, "sm_clock_mhz": None, "clock_event_reasons": None, "temperature_c": None,
                "power_w": None, "throttled": False}  # fmt: skip
    rows = []
    for r in range(rounds):
        for pos, variant in enumerate(("baseline", "candidate", "candidate", "baseline")):
            ns = base(r * 4 + pos) if variant == "baseline" else cand(r * 4 + pos)
            rows.append(Sample.model_construct(variant=variant, round=r, position=pos, duration_ns=ns,
                                               **{**defaults, **context}))  # fmt: skip
    return SampleColumns.from_rows(rows)


def _job(site: Site, api: httpx.Client, case: str, *, node: str = "cpu-a", model: str = "test-cpu",
         days: float = 0.0, change: Callable[[JobResult], JobResult] | None = None,
         raw: Callable[[dict[str, Any]], str] | None = None, bypass: bool = False) -> None:  # fmt: skip
    """Submit a job, claim it as ``node`` and post its result (``change`` edits the JobResult,
    ``raw`` turns its JSON into the posted text; ``bypass`` stores it through ``crud`` as an older
    server took it)."""
    spec = make_spec(f"case {case}", rows=(4, 8))
    job_id = api.post("/jobs", json=spec.model_dump(mode="json"), headers=ADMIN).json()["id"]
    runner = _runner(api, node, model)
    assert api.post("/runners/claim", json={}, headers=runner).json()["job_id"] == job_id
    result = make_result(spec, job_id=job_id)
    shift = timedelta(days=days)
    result = result.model_copy(update={
        "idempotency_key": f"case-{case}-{job_id:04d}", "started_at": result.started_at + shift,
        "finished_at": result.finished_at + shift,
        "node": NodeInfo(hostname=node, device_type="cpu", device_name=model, python_version="3.11"),
        "probes": [p.model_copy(update={"taken_at": p.taken_at + shift}) for p in result.probes],
    })  # fmt: skip
    if change is not None:
        result = change(result)
    site.jobs[case] = job_id
    if bypass:
        engine = make_engine(site.db_url)
        try:
            with make_session_factory(engine).begin() as session:
                runner_id = session.scalar(select(Runner.id).where(Runner.name == node))
                crud.store_result(session=session, job_id=job_id, result=result, runner_id=runner_id)
        finally:
            engine.dispose()
        return
    body = raw(result.model_dump(mode="json")) if raw else result.model_dump_json()
    headers = {**runner, "content-type": "application/json"}
    r = api.post(f"/jobs/{job_id}/results", content=body, headers=headers)
    assert r.status_code == 201, r.text


def _every_cell(samples: SampleColumns, **more: Any) -> Callable[[JobResult], JobResult]:
    """A change of a result: every cell gets ``samples`` (and the other fields of ``more``)."""

    def change(result: JobResult) -> JobResult:
        cells = [c.model_copy(update={"samples": samples, **more}) for c in result.cells]
        return result.model_copy(update={"cells": cells})

    return change


def _nan_metrics(body: dict[str, Any]) -> str:
    import json

    ok = {"passed": True, "rel_error": 1e-7, "rtol": 1e-5, "atol": 1e-6, "dtype": "float32"}
    for cell in body["cells"]:
        bad = {**ok, "passed": False, "rel_error": float("nan"), "max_abs_error": float("inf")}
        cell["correctness"] = {"baseline": ok, "candidate": bad}
    return json.dumps(body)  # NaN and Infinity as Python's json writes them


def _seed_nodes(api: httpx.Client) -> None:
    runner = _runner(api, "tz-node")
    for taken in ("2026-11-30T07:00:00+05:00", "2026-11-30T03:00:00Z"):
        _probe(api, runner, "tz-node", make_probe("adhoc", T0).model_dump(mode="json") | {"taken_at": taken})
    naive = make_probe("adhoc", T0).model_dump(mode="json") | {"taken_at": "2026-11-30T08:00:00"}
    assert api.post("/nodes/tz-node/probes", json=naive, headers=runner).status_code == 422
    runner = _runner(api, "blank-node")
    blank = make_probe("adhoc", T0).model_dump(mode="json")
    blank["telemetry"][0].update(clock_event_reasons=BLANK, clock_event_reason_names=["hw_thermal"])
    _probe(api, runner, "blank-node", blank)
    runner = _runner(api, "pair-node")
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j][:7]
    peers = [PeerCopyReading(src_device=i, dst_device=j, peer_access=True, size_bytes=1 << 28,
                             time_us=(1 << 28) / (g * 1e3), bandwidth_gbps=g)
             for (i, j), g in zip(pairs, [78, 80, 82, 79, 81, 80, 40], strict=True)]  # fmt: skip
    report = make_probe("adhoc", T0).model_copy(update={"peer_copy": peers})
    _probe(api, runner, "pair-node", report.model_dump(mode="json"))
    runner = _runner(api, "cold-node")
    for i, times in enumerate([[4.0], [4.1], [4.0], [4.1], [214_477.0, 4.1, 4.0, 3.9, 4.2]]):
        series = [AllReduceReading(backend="nccl", world_size=2, ranks=[0, 1], size_bytes=8, time_us=t,
                                   algbw_gbps=8 / t / 1e3, busbw_gbps=8 / t / 1e3, timed_by="cuda-events")
                  for t in times]  # fmt: skip
        cold = ProbeReport(taken_at=T0 + timedelta(minutes=i), all_reduce=series)
        _probe(api, runner, "cold-node", cold.model_dump(mode="json"))
    runner = _runner(api, "sick-node")
    for minutes in (40, 30, 20, 10):  # the healthy band of the flagged job's node
        healthy = make_probe("adhoc", T0 - timedelta(minutes=minutes))
        _probe(api, runner, "sick-node", healthy.model_dump(mode="json"))


def _seed(site: Site) -> None:
    with httpx.Client(base_url=f"{site.base_url}/api/v1", timeout=60.0) as api:
        _seed_nodes(api)
        work = Work(flops=1e9, bytes_read=4e6, bytes_written=4e6)
        slow = [make_probe(phase, T0 + timedelta(seconds=seconds), copy_gbps=20.0)
                for phase, seconds in (("before", 0), ("after", 5))]  # fmt: skip
        _job(site, api, "nan-metrics", raw=_nan_metrics)
        _job(site, api, "two-rounds", change=_every_cell(_samples(2, lambda i: 2e3, lambda i: 1e3)))
        _job(site, api, "zero-baseline", change=_every_cell(_samples(6, lambda i: 0.0, lambda i: 1e3 + i)))
        _job(
            site,
            api,
            "zero-candidate",
            change=_every_cell(
                _samples(6, lambda i: 5e4 + i, lambda i: 0.0), work={"baseline": work, "candidate": work}
            ),
        )
        _job(
            site,
            api,
            "thermal",
            change=_every_cell(
                _samples(
                    6, lambda i: 2e3 + i, lambda i: 1e3 + i, sm_clock_mhz=1980.0, clock_event_reasons=0x40
                )
            ),
        )
        huge = _samples(6, lambda i: 9e307, lambda i: 9e307)
        _job(site, api, "huge", bypass=True, change=_every_cell(huge))
        _job(site, api, "flagged", node="sick-node", change=lambda r: r.model_copy(update={"probes": slow}))
        _job(
            site,
            api,
            "h200",
            node="h200-a",
            model=H200,
            days=1,
            change=_every_cell(_samples(6, lambda i: 100_000.0 + i, lambda i: 80_000.0 + i)),
        )
        _job(
            site,
            api,
            "a100",
            node="a100-a",
            model=A100,
            days=2,
            change=_every_cell(_samples(6, lambda i: 51_000.0 + i, lambda i: 41_000.0 + i)),
        )
        compare_wait.until_compared(api, site.jobs.values(), ADMIN)
        for case, job_id in site.jobs.items():  # every read answers 200, on either database
            for path in ("comparison", "report.md", "health"):
                r = api.get(f"/jobs/{job_id}/{path}", headers=ADMIN)
                assert r.status_code == 200, (case, path, r.text)


# --------------------------------------------------------------------------------------------------
# The pages
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def page(site: Site, browser: Browser) -> Iterator[Page]:
    """A signed-in page that fails the test on a dialog or a script error."""
    with signed_in_page(browser, site.base_url, watch=("dialog", "pageerror")) as page:
        yield page


def _api(site: Site, path: str) -> Any:
    r = httpx.get(f"{site.base_url}/api/v1{path}", headers=ADMIN, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_jobs_list_shows_every_case(site: Site, page: Page) -> None:
    response = page.goto(f"{site.base_url}/")
    assert response is not None and response.status == 200
    rows = page.locator("table.jobs tbody tr")
    assert rows.count() == len(site.jobs)
    for case, job_id in site.jobs.items():
        row = rows.filter(has=page.locator(f'a[href="/jobs/{job_id}"]'))
        assert row.locator("td").nth(1).inner_text() == f"case {case}"
        summary = _api(site, f"/jobs/{job_id}")["summary"]
        for verdict, count in summary.items():
            assert f"{count} {verdict}" in row.locator("td").nth(6).inner_text()


EXPECTED = {
    "nan-metrics": "incorrect", "two-rounds": "inconclusive", "zero-baseline": "implausible",
    "zero-candidate": "implausible", "huge": "implausible", "h200": "faster", "a100": "faster",
}  # fmt: skip


def test_every_job_page_renders_its_verdicts(site: Site, page: Page) -> None:
    for case, job_id in site.jobs.items():
        response = page.goto(f"{site.base_url}/jobs/{job_id}")
        assert response is not None and response.status == 200, case
        comparison = _api(site, f"/jobs/{job_id}/comparison")
        rows = page.locator("#comparison-table tbody tr.cell-row")
        assert rows.count() == len(comparison["cells"]), case
        for i, cell in enumerate(comparison["cells"]):
            assert rows.nth(i).locator("td.verdict").inner_text() == cell["verdict"], case
            if case in EXPECTED:
                assert cell["verdict"] == EXPECTED[case], (case, cell["reasons"])
        page.wait_for_selector("#fig-samples[data-drawn]")
        html = page.content()
        assert "nan" not in page.locator("#comparison-table").inner_text().lower(), case
        if case == "thermal":
            assert "throttled" in rows.nth(0).locator("td.flags").inner_text()
        if case == "flagged":
            assert "History views" in page.locator(".node-health-note").first.inner_text()
        assert "Infinity" not in html


def test_node_pages_render_each_health_case(site: Site, page: Page) -> None:
    expected = {"tz-node": "healthy", "blank-node": "healthy", "pair-node": "degraded",
                "cold-node": "healthy", "sick-node": "degraded"}  # fmt: skip
    for node, status in expected.items():
        response = page.goto(f"{site.base_url}/nodes/{node}")
        assert response is not None and response.status == 200, node
        assert page.locator("#node-health .badge").first.inner_text() == status, node
        assert _api(site, f"/nodes/{node}")["health"]["status"] == status
        page.wait_for_selector("#fig-probes[data-drawn]")
    page.goto(f"{site.base_url}/nodes/tz-node")
    readings = page.locator("#node-readings tbody").inner_text()
    assert "2026-11-30 03:00:00 UTC" in readings and "2026-11-30 02:00:00 UTC" in readings
    assert "07:00:00" not in readings
    page.goto(f"{site.base_url}/nodes/pair-node")
    assert "far below its peers" in page.locator(".health-reasons").inner_text()


def test_history_draws_a_line_per_gpu_model_and_leaves_the_flagged_result_out(site: Site, page: Page) -> None:
    response = page.goto(f"{site.base_url}/history?benchmark={BENCHMARK}")
    assert response is not None and response.status == 200
    page.wait_for_selector("#fig-history[data-drawn]")
    legend = page.locator("#fig-history .legend").text_content() or ""
    assert H200 in legend and A100 in legend
    history = _api(site, f"/history?benchmark={BENCHMARK}")
    for series in history["series"]:
        assert len({p["gpu_model"] for p in series["points"]}) == 1
    assert page.locator("#fig-history g.trace.scatter").count() == len(history["series"])
    table = page.locator("#history-table tbody").inner_text()
    assert f"#{site.jobs['flagged']}" not in table
    assert history["excluded"]["node-flagged"] == 4
    assert "Left out by default" in page.locator("#history-excluded").inner_text()
    page.locator("#include-excluded").click()
    page.wait_for_url("**include_excluded=true")
    assert f"#{site.jobs['flagged']}" in page.locator("#history-table tbody").inner_text()
    page.wait_for_selector("#fig-history[data-drawn]")
