"""Sweep at a glance, roofline position and the trial's fixes, as a person sees them in Chromium.

One server of its own (uvicorn, temp SQLite file, JSON logs) and a compare worker; through the
REST API it receives a 1,000-cell M x N softmax sweep (``glance_factory``: declared work, probed
copy and matmul peaks, a 4,618x slower cell, incorrect and failed cells), a small job without
declared work, and a job that failed as a whole. Every number the page shows is read back from
the stored comparison (``GET /api/v1/jobs/{id}/comparison``) and compared with what is on screen.

``KERNELAB_UPDATE_SCREENSHOTS=1`` also writes the screenshots under ``docs/screenshots/``.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
import compare_wait  # noqa: E402
import glance_factory as gf  # noqa: E402
from dashboard_server import ADMIN_TOKEN, REPO, Dashboard, DashboardConfig, signed_in_page  # noqa: E402
from playwright.sync_api import Browser, Page  # noqa: E402

from kernelab.service.contract.units import format_sig3  # noqa: E402
from kernelab.service.judge.report import format_speedup  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

COMPARISON_WAIT_MS = 180_000
PAGE_TIMEOUT_MS = 120_000  # a 1,000-cell page's first render and drawing, on a loaded 2-core machine
PAGE_RENDERS = 20  # renders of the 1,000-cell page whose server time makes the p95
PAGE_P95_MS = 300.0  # the job page's budget (docs/results/2026-12-01-server-load.md)
JOB_ERROR = "revision abc123 does not build: ModuleNotFoundError: No module named 'triton_kernels'"
SHOTS = REPO / "docs" / "screenshots"


@dataclass
class Site:
    base_url: str
    log_path: Path
    sweep_id: int
    plain_id: int
    failed_id: int
    comparison: dict[str, Any]  # the sweep's stored comparison, as the API answers it


def _api(base_url: str) -> httpx.Client:
    return httpx.Client(base_url=f"{base_url}/api/v1", timeout=120.0,
                        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})  # fmt: skip


def _submit_claim_post(api: httpx.Client, runner: dict[str, str], spec: Any, build: Any) -> int:
    job_id = api.post("/jobs", json=spec.model_dump(mode="json")).json()["id"]
    claim = api.post("/runners/claim", json={}, headers=runner)
    assert claim.status_code == 200 and claim.json()["job_id"] == job_id, claim.text
    posted = api.post(f"/jobs/{job_id}/results", content=build(job_id).model_dump_json(),
                      headers={**runner, "content-type": "application/json"})  # fmt: skip
    assert posted.status_code == 201, posted.text
    return job_id


def _seed(base_url: str, log_path: Path) -> Site:
    with _api(base_url) as api:
        registered = api.post("/runners/register", json={"name": "glance-runner", "node": {
            "hostname": gf.HOSTNAME, "device_type": "cpu"}})  # fmt: skip
        runner = {"Authorization": f"Bearer {registered.json()['token']}"}
        spec = gf.sweep_spec()
        sweep_id = _submit_claim_post(api, runner, spec, lambda j: gf.sweep_result(j, spec))
        small = gf.sweep_spec("no declared work", m=[4, 8], n=[64])
        plain_id = _submit_claim_post(api, runner, small, lambda j: gf.sweep_result(j, small, work=False))
        broken = gf.sweep_spec("does not build", m=[4], n=[64, 128])
        failed_id = _submit_claim_post(api, runner, broken, lambda j: gf.failed_result(j, broken, JOB_ERROR))
        compare_wait.until_compared(api, [sweep_id, plain_id, failed_id], {})
        comparison = api.get(f"/jobs/{sweep_id}/comparison").json()
    return Site(base_url, log_path, sweep_id, plain_id, failed_id, comparison)


@pytest.fixture(scope="module")
def dashboard_config() -> DashboardConfig:
    """JSON logs at INFO (the tests read the server's render times from its log), no access log."""
    return DashboardConfig(env={"KERNELAB_LOG_FORMAT": "json", "KERNELAB_LOG_LEVEL": "INFO"},
                           uvicorn_args=("--no-access-log",))  # fmt: skip


@pytest.fixture(scope="module")
def site(dashboard: Dashboard) -> Site:
    return _seed(dashboard.url, dashboard.log_path)


@pytest.fixture
def page(site: Site, browser: Browser) -> Iterator[Page]:
    with signed_in_page(browser, site.base_url, timeout_ms=PAGE_TIMEOUT_MS) as page:
        yield page


def _shot(page: Page, selector: str, name: str) -> None:
    if os.environ.get("KERNELAB_UPDATE_SCREENSHOTS") == "1":
        SHOTS.mkdir(parents=True, exist_ok=True)
        _drawn(page)
        page.locator(selector).screenshot(path=str(SHOTS / name))


def _cell(site: Site, m: int, n: int) -> dict[str, Any]:
    return next(c for c in site.comparison["cells"] if c["params"]["M"] == m and c["params"]["N"] == n)


def _drawn(page: Page) -> None:
    """Wait until every figure of the page is drawn (the first screen's at once, the others after:
    ``web/templates/base.html``)."""
    page.wait_for_function(
        "() => !document.querySelector('script[data-figure-for]')"
        " || document.documentElement.dataset.figures === 'drawn'"
    )


def _layout(page: Page, fig: str) -> Any:
    _drawn(page)
    return page.evaluate(f"() => document.getElementById('{fig}').layout")


def _traces(page: Page, fig: str) -> Any:
    _drawn(page)
    return page.evaluate(f"() => document.getElementById('{fig}').data.map(t => ({{name: t.name, n: "
                         "(t.x || []).length, symbol: t.marker && t.marker.symbol}))")  # fmt: skip


def test_table_shows_fixed_parameters_once_and_speedup_beside_delta(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}?order=slowest")
    page.wait_for_selector("#comparison-table", timeout=COMPARISON_WAIT_MS)
    assert page.locator("#fixed-params").inner_text() == "every cell: dtype=float32"
    first = page.locator("#comparison-table tbody tr.cell-row").nth(0)
    huge = _cell(site, *gf.HUGE_CELL)
    assert first.locator("td").nth(0).inner_text() == "M=1, N=64"  # no dtype in the label
    assert huge["ratio"] > 1000  # planted at 4618x; the stored median ratio is what the page shows
    assert first.locator("td.speedup").inner_text() == format_speedup(huge["ratio"])
    three_figures = float(f"{huge['ratio']:.3g}")  # 4,618.4 reads 4,620
    assert format_speedup(huge["ratio"]) == f"{three_figures:,.0f}× slower"
    delta = first.locator("td").nth(4).inner_text()  # three significant figures, as the CLI writes it
    assert delta.startswith(f"{format_sig3(huge['delta_pct'], sign=True)} % [") and delta.startswith(
        "+462,000 %"
    )
    assert "dtype" not in page.locator("#comparison-table tbody").inner_text()
    faster = next(c for c in site.comparison["cells"] if c["verdict"] == "faster")
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}?order=index&offset={faster['index'] // 100 * 100}")
    row = page.locator(f'#comparison-table tr.cell-row[data-cell="{faster["index"]}"]')
    assert row.locator("td.speedup").inner_text() == format_speedup(faster["ratio"])
    assert row.locator("td.speedup").inner_text().endswith("× faster")
    wrong = _cell(site, 3, 128)  # incorrect: its timing is no speed-up, a bare ratio
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}?order=flagged")
    row = page.locator(f'#comparison-table tr.cell-row[data-cell="{wrong["index"]}"]')
    assert "faster" not in row.locator("td.speedup").inner_text()
    _shot(page, "#comparison-table", "sweep-table-speedup.png")


def test_the_job_page_fits_1400_px_or_its_table_scrolls_in_its_box(site: Site, page: Page) -> None:
    """At 1400 px the page itself never runs past the window (nothing cut off at the right); a
    table wider than its column scrolls inside its own box, so its last column can be reached."""
    page.set_viewport_size({"width": 1400, "height": 900})
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}")
    page.wait_for_selector("#comparison-table", timeout=COMPARISON_WAIT_MS)
    fits = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert fits, page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    box = page.evaluate(
        "(() => { const w = document.querySelector('#comparison-table').closest('.table-wrap');"
        " const r = w.getBoundingClientRect();"
        " return {overflow: getComputedStyle(w).overflowX, right: r.right, scroll: w.scrollWidth,"
        " client: w.clientWidth}; })()"
    )
    assert box["right"] <= 1400
    assert box["scroll"] <= box["client"] or box["overflow"] in ("auto", "scroll"), box
    last = page.locator("#comparison-table thead th").last
    last.scroll_into_view_if_needed()
    assert last.is_visible()


def test_failure_details_are_on_the_page(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}?order=flagged")
    table = page.locator("#comparison-table")
    for (m, n), message in {**gf.INCORRECT, **gf.FAILED}.items():
        cell = _cell(site, m, n)
        reason = table.locator(f'tr.reason-row[data-cell="{cell["index"]}"]')
        assert reason.is_visible()
        assert message in reason.inner_text(), (message, reason.inner_text())
        assert reason.inner_text().count(message) == 1


def test_forest_plot_per_cell_with_band_and_void_cells(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}")
    page.wait_for_selector("#fig-forest[data-drawn]")
    traces = {t["name"]: t for t in _traces(page, "fig-forest")}
    cells = site.comparison["cells"]
    void = [c for c in cells if c["verdict"] in ("failed", "incorrect", "nondeterministic", "implausible")]
    assert traces["timing void: failed / incorrect / implausible"]["n"] == len(void) >= 3
    assert sum(t["n"] for t in traces.values()) == len(cells) == 1000
    for verdict in {c["verdict"] for c in cells} - {c["verdict"] for c in void}:
        assert traces[verdict]["n"] == sum(1 for c in cells if c["verdict"] == verdict)
    layout = _layout(page, "fig-forest")
    band = layout["shapes"][0]
    assert band["type"] == "rect" and band["x1"] == pytest.approx(1 + site.comparison["threshold_pct"] / 100)
    assert layout["xaxis"]["type"] == "log"
    assert 10 ** layout["xaxis"]["range"][1] > _cell(site, *gf.HUGE_CELL)["ratio"]  # the 4618x cell is on it
    assert "0 %" in layout["xaxis"]["ticktext"]
    assert page.locator("#fig-forest .legendtext", has_text="timing void").count() == 1
    page.set_viewport_size({"width": 1400, "height": 900})
    _shot(page, "#sweep-glance", "sweep-forest-heatmap.png")


def test_heatmap_over_two_chosen_axes(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}")
    page.wait_for_selector("#fig-heatmap[data-drawn]")
    title = page.locator("#fig-heatmap .gtitle").text_content() or ""
    assert "M × N" in title and "Δ %" in title  # the axis with most values (N) as columns
    _drawn(page)
    data = page.evaluate("() => document.getElementById('fig-heatmap').data[0]")
    assert len(data["x"]) == len(gf.N_VALUES) and len(data["y"]) == len(gf.M_VALUES)
    huge = _cell(site, *gf.HUGE_CELL)
    j, i = data["x"].index(str(gf.HUGE_CELL[1])), data["y"].index(str(gf.HUGE_CELL[0]))
    assert data["z"][i][j] == pytest.approx(np.log10(huge["ratio"]))
    wrong = next(iter(gf.INCORRECT))
    assert (
        data["z"][data["y"].index(str(wrong[0]))][data["x"].index(str(wrong[1]))] is None
    )  # void: no colour

    page.select_option("#heat-x", "M")
    page.select_option("#heat-y", "N")
    page.select_option("#heat-value", "verdict")
    with page.expect_navigation():
        page.click("#heat-picker button[type=submit]")
    assert "heat_value=verdict" in page.url
    page.wait_for_selector("#fig-heatmap[data-drawn]")
    assert "verdict: N × M" in (page.locator("#fig-heatmap .gtitle").text_content() or "")
    _drawn(page)
    data = page.evaluate("() => document.getElementById('fig-heatmap').data[0]")
    assert len(data["x"]) == len(gf.M_VALUES)
    colourbar = page.evaluate("() => document.getElementById('fig-heatmap').data[0].colorbar.ticktext")
    assert "incorrect" in colourbar and "failed" in colourbar
    _shot(page, "#sweep-glance", "sweep-heatmap-verdict.png")


def test_roofline_rates_in_the_table_and_the_plot(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}")
    peaks = page.locator("#roofline-peaks").inner_text()
    assert f"{gf.COPY_GBPS:.3g} GB/s" in peaks and f"{gf.MATMUL_TFLOPS:.3g} TFLOP/s" in peaks
    first = site.comparison["cells"][0]
    row = page.locator(f'#comparison-table tr.cell-row[data-cell="{first["index"]}"]')
    gbps = first["throughput"]["baseline_gbps"]
    text = row.locator("td.rates-baseline").inner_text()
    assert f"{gbps:.3g} GB/s ({100 * gbps / gf.COPY_GBPS:.3g} %)" in text
    tflops = first["throughput"]["candidate_tflops"]
    assert f"{tflops:.3g} TFLOP/s ({100 * tflops / gf.MATMUL_TFLOPS:.3g} %)" in row.locator(
        "td.rates-candidate").inner_text()  # fmt: skip
    page.wait_for_selector("#fig-roofline[data-drawn]")
    traces = {t["name"]: t for t in _traces(page, "fig-roofline")}
    roof = next(name for name in traces if name.startswith("roof:"))
    assert "40 GB/s" in roof and "2.0 TFLOP/s" in roof
    timed = sum(1 for c in site.comparison["cells"] if "baseline_tflops" in c["throughput"])
    assert sum(t["n"] for name, t in traces.items() if name.startswith("baseline")) == timed
    layout = _layout(page, "fig-roofline")
    assert layout["xaxis"]["type"] == "log" and layout["yaxis"]["type"] == "log"
    for axis in ("x", "y"):  # every drawn tick is a written-out value (no bare minor digits "2 3 … 9")
        drawn = page.locator(f"#fig-roofline g.{axis}tick text").all_text_contents()
        assert drawn == layout[f"{axis}axis"]["ticktext"] and len(drawn) >= 3
    _shot(page, "#roofline", "roofline.png")


def test_no_roofline_without_declared_work(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.plain_id}")
    page.wait_for_selector("#comparison-table")
    assert page.locator("#roofline").count() == 0 and page.locator("#fig-roofline").count() == 0
    assert page.locator("#comparison-table td.rates").count() == 0
    assert page.locator("#fixed-params").inner_text() == "every cell: dtype=float32 N=64"


def test_per_cell_export_links(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}")
    csv_href = page.locator("#export-cells-csv").get_attribute("href")
    answer = page.request.get(site.base_url + (csv_href or ""))
    assert answer.status == 200 and answer.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.text())))
    assert len(rows) == 1000
    huge = _cell(site, *gf.HUGE_CELL)
    got = next(r for r in rows if r["index"] == str(huge["index"]))
    assert (got["param.M"], got["param.N"], got["param.dtype"]) == ("1", "64", "float32")
    assert float(got["ratio"]) == huge["ratio"] and got["speedup"] == format_speedup(huge["ratio"])
    assert float(got["baseline_pct_copy_peak"]) == pytest.approx(
        100 * huge["throughput"]["baseline_gbps"] / 40
    )
    json_href = page.locator("#export-cells-json").get_attribute("href")
    doc = json.loads(page.request.get(site.base_url + (json_href or "")).text())
    assert doc["peaks"] == {"copy_gbps": gf.COPY_GBPS, "matmul_tflops": gf.MATMUL_TFLOPS}
    assert doc["fixed"] == {"dtype": "float32"} and doc["axes"] == ["M", "N"]
    assert [c["verdict"] for c in doc["cells"]] == [c["verdict"] for c in site.comparison["cells"]]
    assert httpx.get(site.base_url + (json_href or ""), timeout=30).status_code == 401  # the read scope


def test_large_sweep_page_renders_every_view(site: Site, page: Page) -> None:
    """``PAGE_RENDERS`` renders of the 1,000-cell page, heat-maps of other axes and another order
    included, each with its forest plot, each logged once with its server time. The budget (p95 of
    the server's time <= ``PAGE_P95_MS``) is a speed target, checked on an idle machine by
    ``benchmarks/page_speed.py --sweep glance`` (``docs/results/2026-12-02-page-speed.md``), not
    here on a shared CI machine; ``KERNELAB_PAGE_BUDGET=1`` asserts it here too."""
    page_url = f"/jobs/{site.sweep_id}"
    urls = [page_url, f"{page_url}?heat_value=verdict", f"{page_url}?heat_x=M&heat_y=N",
            f"{page_url}?order=slowest&offset=300"]  # fmt: skip
    page.request.get(site.base_url + page_url)  # the first render parses the stored comparison: not timed
    for i in range(PAGE_RENDERS):
        answer = page.request.get(site.base_url + urls[i % len(urls)])
        assert answer.status == 200 and "fig-forest" in answer.text()
    durations = []
    for line in site.log_path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "request" and record.get("path") == f"/jobs/{site.sweep_id}":
            durations.append(record["duration_ms"])
    assert len(durations) >= PAGE_RENDERS
    p95 = float(np.percentile(durations[-PAGE_RENDERS:], 95))
    print(f"1,000-cell page: p95 {p95:.0f} ms of server time over {PAGE_RENDERS} renders")
    if os.environ.get("KERNELAB_PAGE_BUDGET") == "1":
        assert p95 <= PAGE_P95_MS, (
            f"p95 {p95:.0f} ms over {PAGE_RENDERS} renders: {durations[-PAGE_RENDERS:]}"
        )


def test_samples_plot_takes_a_log_axis_with_decades(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}")
    page.wait_for_selector("#fig-samples[data-drawn]")
    yaxis = _layout(page, "fig-samples")["yaxis"]
    assert yaxis["type"] == "log" and yaxis["dtick"] == 1  # a label at every power of ten
    page.goto(f"{site.base_url}/jobs/{site.plain_id}")
    page.wait_for_selector("#fig-samples[data-drawn]")
    assert _layout(page, "fig-samples")["yaxis"]["type"] == "linear"  # 0.7-1.3x apart: no log


def test_failed_job_shows_its_error_once_and_no_empty_chart(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.failed_id}")
    body = page.locator("main").inner_text()
    assert body.count(JOB_ERROR) == 1, body
    assert page.locator("#fig-samples").count() == 0 and page.locator("#fig-timeline").count() == 0
    assert page.locator("#no-samples").count() + page.locator("#no-result").count() >= 1
    _shot(page, "main", "failed-job.png")


def test_jobs_list_links_the_node_and_probes_say_cpu(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/")
    _shot(page, "main", "jobs.png")
    row = page.locator("table.jobs tbody tr").filter(has=page.locator(f'a[href="/jobs/{site.sweep_id}"]'))
    link = row.locator("td.job-node a")
    assert link.inner_text() == gf.HOSTNAME and "glance-runner" in row.locator("td.job-node").inner_text()
    with page.expect_navigation():
        link.click()
    assert page.url.endswith(f"/nodes/{gf.HOSTNAME}")
    assert page.locator("h1").count() == 1 and "There is no" not in page.locator("main").inner_text()
    page.wait_for_selector("html[data-figures=drawn]", state="attached")
    _drawn(page)
    traces = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')]"
                           ".flatMap(f => f.data.map(t => t.name))")  # fmt: skip
    assert "copy CPU 0" in traces and not any("GPU" in str(name) for name in traces)
    annotations = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')]"
                                ".flatMap(f => (f.layout.annotations || []).map(a => a.text))")  # fmt: skip
    assert not any("GPU" in str(text) for text in annotations)
    node_text = page.locator("main").inner_text()  # the band table, the reasons, the readings
    assert "GPU" not in node_text, node_text
    _shot(page, "main", "node-cpu.png")
    page.goto(f"{site.base_url}/nodes")
    assert gf.HOSTNAME in page.locator("main").inner_text()
    _shot(page, "main", "nodes.png")
    page.goto(f"{site.base_url}/jobs/{site.sweep_id}")
    assert page.locator("#probe-copy thead th").nth(0).inner_text() == "CPU"
    assert "GPU" not in page.locator("#probes").inner_text()


def test_bare_history_is_a_page_of_benchmarks(site: Site, page: Page) -> None:
    response = page.goto(f"{site.base_url}/history")
    assert response is not None and response.status == 200
    link = page.locator("#history-benchmarks a", has_text="softmax")
    assert link.count() == 1
    with page.expect_navigation():
        link.click()
    assert "benchmark=softmax" in page.url


def test_sign_in_page_for_every_refusal(site: Site, browser: Browser) -> None:
    context = browser.new_context()
    page = context.new_page()
    target = f"/jobs/{site.sweep_id}?order=slowest"
    response = page.goto(site.base_url + target)  # no cookie: the form, not JSON
    assert response is not None and response.status == 401
    assert page.locator(".login-message").inner_text() == "Sign in to see this page."
    assert (
        page.locator("form.login #token").count() == 1 and "detail" not in page.locator("body").inner_text()
    )
    _shot(page, "main", "sign-in.png")
    page.fill("#token", "not-a-token")
    with page.expect_navigation():
        page.click("form.login button[type=submit]")
    assert page.locator(".login-message").inner_text() == "Invalid or revoked token."
    page.evaluate("() => document.getElementById('token').removeAttribute('required')")
    with page.expect_navigation() as nav:
        page.click("form.login button[type=submit]")
    assert nav.value is not None and nav.value.status == 422
    assert "empty" in page.locator(".login-message").inner_text()
    page.fill("#token", "x" * 300)  # longer than any token
    page.evaluate("() => document.getElementById('token').removeAttribute('maxlength')")
    page.fill("#token", "x" * 300)
    with page.expect_navigation():
        page.click("form.login button[type=submit]")
    assert page.locator(".login-message").inner_text() == "Invalid or revoked token."
    page.fill("#token", ADMIN_TOKEN)  # the page asked for first, after signing in
    with page.expect_navigation():
        page.click("form.login button[type=submit]")
    assert page.url == site.base_url + target
    context.add_cookies([{"name": "kernelab_token", "value": "revoked-or-wrong", "url": site.base_url}])
    response = page.goto(site.base_url + "/")
    assert response is not None and response.status == 401
    assert "cannot open this page" in page.locator(".login-message").inner_text()
    context.close()
