"""The job page of a sweep too large to draw sample by sample, as a person sees it in Chromium.

A server of its own (uvicorn, temp SQLite file) receives through the REST API a 120-cell result
with 200 samples per cell (24,000 samples: above ``kernelab.web.routes.RAW_FIGURE_SAMPLES``). The page may
first say "comparison being computed" and reload itself; then it shows the per-cell summary
figure, the before/after table 100 rows at a time with its orders, and one cell's timeline with
previous/next links.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
from dashboard_server import ADMIN_TOKEN, Dashboard, signed_in_page  # noqa: E402
from playwright.sync_api import Browser, Page  # noqa: E402
from web_factory import make_result, make_spec  # noqa: E402

from kernelab.web import job_view, routes  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CELLS = 120
ROUNDS = 100  # x 2 samples per round (web_factory.make_samples)
COMPARISON_WAIT_MS = 120_000


@pytest.fixture(scope="module")
def sweep(dashboard: Dashboard) -> tuple[str, int]:
    """``(base_url, job_id)`` of a server holding one large sweep result."""
    return dashboard.url, _post_sweep(dashboard.url)


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
def page(sweep: tuple[str, int], browser: Browser) -> Iterator[Page]:
    with signed_in_page(browser, sweep[0]) as page:
        yield page


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
    # the default order: the worst first (a problem verdict, then slower by Δ %, undecided, the rest)
    group = {"failed": 0, "incorrect": 0, "nondeterministic": 0, "implausible": 0, "slower": 1,
             "inconclusive": 2, "same": 3, "faster": 3}  # fmt: skip
    worst = min(comparison["cells"], key=lambda c: (group[c["verdict"]], -(c["delta_pct"] or 0.0)))
    assert rows.nth(0).locator("td").nth(0).inner_text() == worst["label"]
    page.get_by_role("link", name="sweep order").click()
    page.wait_for_url("**/jobs/*?order=index")
    assert rows.nth(0).locator("td").nth(0).inner_text() == labels[0]
    assert f"cells 1–{job_view.CELLS_PER_PAGE} of {CELLS}" in page.locator("#cell-pager").inner_text()
    page.wait_for_selector("#fig-samples[data-drawn]")
    assert page.locator("#fig-samples g.trace.scatter").count() == 2  # medians, every cell
    page.wait_for_selector("#fig-timeline[data-drawn]")
    assert "cell 0" in (page.locator("#fig-timeline .gtitle").text_content() or "")

    page.locator("#cells-next").click()
    page.wait_for_url(f"**/jobs/{job_id}?order=index&offset={job_view.CELLS_PER_PAGE}")
    assert rows.count() == CELLS - job_view.CELLS_PER_PAGE
    assert rows.nth(0).locator("td").nth(0).inner_text() == labels[job_view.CELLS_PER_PAGE]

    page.get_by_role("link", name="slowest first").click()
    page.wait_for_url("**/jobs/*?order=slowest")
    slowest = max(comparison["cells"], key=lambda c: c["delta_pct"])
    assert rows.nth(0).locator("td").nth(0).inner_text() == slowest["label"]

    page.locator("#timeline-next").click()
    page.wait_for_url("**?order=slowest&cell=1#timeline")
    page.wait_for_selector("#fig-timeline[data-drawn]")
    assert "cell 1" in (page.locator("#fig-timeline .gtitle").text_content() or "")
