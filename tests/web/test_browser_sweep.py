"""The job page of a sweep too large to draw sample by sample, as a person sees it in Chromium.

A server of its own (uvicorn, temp SQLite file) receives through the REST API a 120-cell result
with 200 samples per cell (24,000 samples: above ``kernelab.web.routes.RAW_FIGURE_SAMPLES``). The page may
first say "comparison being computed" and reload itself; then it shows the per-cell summary
figure, the before/after table 100 rows at a time with its orders, and one cell's timeline with
previous/next links.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
import compare_wait  # noqa: E402
from browser_signin import sign_in  # noqa: E402
from playwright.sync_api import Page, sync_playwright  # noqa: E402
from test_browser import ADMIN_TOKEN, CHROMIUM, CHROMIUM_ARGS, _free_port, _wait_ready  # noqa: E402
from web_factory import make_result, make_spec  # noqa: E402

from kernelab.service.core.db import upgrade  # noqa: E402
from kernelab.web import job_view, routes  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELLS = 120
ROUNDS = 100  # x 2 samples per round (web_factory.make_samples)
COMPARISON_WAIT_MS = 120_000


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """``(base_url, job_id)`` of a server holding one large sweep result."""
    folder = tmp_path_factory.mktemp("sweep-server")
    db_url = f"sqlite:///{folder / 'kernelab.db'}"
    upgrade(db_url)
    base_url = f"http://127.0.0.1:{_free_port()}"
    env = {**os.environ, "KERNELAB_DATABASE_URL": db_url, "KERNELAB_ADMIN_TOKEN": ADMIN_TOKEN,
           "KERNELAB_PUBLIC_DASHBOARD": "false"}  # fmt: skip
    log_path = folder / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "kernelab.service.app:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                base_url.rsplit(":", 1)[1],
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        worker = compare_wait.start(env, log)
        try:
            _wait_ready(base_url, proc, log_path)
            yield base_url, _post_sweep(base_url)
        finally:
            compare_wait.stop(worker)
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _post_sweep(base_url: str) -> int:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    spec = make_spec("large sweep", rows=tuple(range(1, CELLS + 1)))
    with httpx.Client(base_url=f"{base_url}/api/v1", timeout=120.0, headers=admin) as api:
        job_id = api.post("/jobs", json=spec.model_dump(mode="json")).json()["id"]
        registered = api.post("/runners/register", json={"name": "sweeper", "node": {
            "hostname": "ci-node-1", "device_type": "cpu"}})  # fmt: skip
        runner = {"Authorization": f"Bearer {registered.json()['token']}"}
        assert api.post("/runners/claim", json={}, headers=runner).json()["job_id"] == job_id
        result = make_result(spec, rounds=ROUNDS, job_id=job_id, throttled_rounds=(3,))
        assert sum(len(c.samples) for c in result.cells) > routes.RAW_FIGURE_SAMPLES
        posted = api.post(f"/jobs/{job_id}/results", content=result.model_dump_json(),
                          headers={**runner, "content-type": "application/json"})  # fmt: skip
        assert posted.status_code == 201, posted.text
    return job_id


@pytest.fixture
def page(sweep: tuple[str, int]) -> Iterator[Page]:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        sign_in(page, sweep[0], ADMIN_TOKEN)
        yield page
        browser.close()
        assert dialogs == [], f"a dialog fired: {dialogs}"


def test_large_sweep_page_in_the_browser(sweep: tuple[str, int], page: Page) -> None:
    base_url, job_id = sweep
    page.goto(f"{base_url}/jobs/{job_id}")
    # "comparing…" reloads itself until the compare worker has stored it
    page.wait_for_selector("#comparison-table", timeout=COMPARISON_WAIT_MS)
    comparison = httpx.get(f"{base_url}/api/v1/jobs/{job_id}/comparison",
                           headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60).json()  # fmt: skip
    labels = [c["label"] for c in comparison["cells"]]

    rows = page.locator("#comparison-table tbody tr.cell-row")
    assert rows.count() == job_view.CELLS_PER_PAGE
    assert rows.nth(0).locator("td").nth(0).inner_text() == labels[0]
    assert f"cells 1–{job_view.CELLS_PER_PAGE} of {CELLS}" in page.locator("#cell-pager").inner_text()
    page.wait_for_selector("#fig-samples.js-plotly-plot svg.main-svg")
    assert page.locator("#fig-samples g.trace.scatter").count() == 2  # medians, every cell
    page.wait_for_selector("#fig-timeline.js-plotly-plot svg.main-svg")
    assert "cell 0" in (page.locator("#fig-timeline .gtitle").text_content() or "")

    page.locator("#cells-next").click()
    page.wait_for_url(f"**/jobs/{job_id}?offset={job_view.CELLS_PER_PAGE}")
    assert rows.count() == CELLS - job_view.CELLS_PER_PAGE
    assert rows.nth(0).locator("td").nth(0).inner_text() == labels[job_view.CELLS_PER_PAGE]

    page.get_by_role("link", name="slowest first").click()
    page.wait_for_url("**/jobs/*?order=slowest")
    slowest = max(comparison["cells"], key=lambda c: c["delta_pct"])
    assert rows.nth(0).locator("td").nth(0).inner_text() == slowest["label"]

    page.locator("#timeline-next").click()
    page.wait_for_url("**?order=slowest&cell=1#timeline")
    page.wait_for_selector("#fig-timeline.js-plotly-plot svg.main-svg")
    assert "cell 1" in (page.locator("#fig-timeline .gtitle").text_content() or "")
