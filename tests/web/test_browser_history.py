"""History, regressions and job vs job as a person sees them, in real Chromium against a real
server process (uvicorn + a compare worker on a temp SQLite file).

Seeded through the REST API as runners post results: eight softmax jobs on node ``browser-hist-a``
whose medians step up 50% from the fifth on (the planted change point), and one job on another
node and GPU model. The tests open the pages and assert what is on screen: the history chart with
its CI bars and the change point's marker, the change point listed with the jobs on both sides,
the fleet's regression list, the job-vs-job table with both nodes' health side by side, and the
nav's links to History and Nodes on every page.

Set ``KERNELAB_UPDATE_SCREENSHOTS=1`` to write ``docs/screenshots/history.png``,
``regressions.png`` and ``job-vs-job.png`` as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
import history_seed  # noqa: E402
from dashboard_server import ADMIN_TOKEN, REPO, Dashboard, signed_in_page  # noqa: E402
from playwright.sync_api import Browser, Page  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

GPU = "Browser-GPU"
OTHER_GPU = "Browser-GPU-B"
SHOTS = os.environ.get("KERNELAB_UPDATE_SCREENSHOTS") == "1"


@dataclass
class Site:
    base_url: str
    jobs: list[int]
    other: int


@pytest.fixture(scope="module")
def site(dashboard: Dashboard) -> Site:
    base_url = dashboard.url
    steps = [1000.0] * 4 + [1500.0] * 4
    # the candidate's own step against the baseline every job ran (at 1000 ns)
    jobs = history_seed.seed(base_url, ADMIN_TOKEN, steps, node="browser-hist-a", gpu_model=GPU,
                             baseline_ns=1000.0)  # fmt: skip
    (other,) = history_seed.seed(
        base_url,
        ADMIN_TOKEN,
        [900.0],
        node="browser-hist-b",
        gpu_model=OTHER_GPU,
        name="other node",
        baseline_ns=1000.0,
    )
    history_seed.wait_compared(base_url, ADMIN_TOKEN, [*jobs, other])
    return Site(base_url, jobs, other)


@pytest.fixture
def page(site: Site, browser: Browser) -> Iterator[Page]:
    with signed_in_page(browser, site.base_url, watch=("pageerror",)) as page:
        yield page


def _shot(page: Page, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(REPO / "docs" / "screenshots" / name), full_page=True)


def test_the_history_chart_shows_the_planted_change_point_and_lists_it(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/history?benchmark=softmax")
    page.wait_for_selector("#fig-history[data-drawn]")
    # one line per side on each GPU model, each with CI bars; one change-point marker on the stepped line
    lines = page.locator("#fig-history g.trace.scatter")
    assert lines.count() >= 5
    assert page.locator("#fig-history g.errorbar").count() > 0
    method = page.locator("#history-method").inner_text()
    assert "PELT" in method and "ruptures" in method and "95 % CI" in method
    rows = page.locator("#change-points tbody tr")
    assert rows.count() == 1  # triton on the stepped GPU; torch stayed, the other GPU's one point has none
    for i in range(rows.count()):
        text = rows.nth(i).inner_text()
        assert "slower" in text and GPU in text and f"#{site.jobs[3]}" in text and f"#{site.jobs[4]}" in text
        assert "+50" in text or "+49" in text or "+51" in text
    ci = page.locator("#history-table tbody tr").first.locator("td").nth(9).inner_text()
    assert "–" in ci and "µs" in ci or "ns" in ci
    _shot(page, "history.png")
    page.locator("#change-points tbody tr").first.locator(f"a[href='/jobs/{site.jobs[4]}']").click()
    assert page.url.endswith(f"/jobs/{site.jobs[4]}")


def test_the_regression_list_links_both_jobs_and_their_comparison(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/")
    page.click("header nav a:text-is('Regressions')")
    assert page.url.endswith("/history/regressions")
    rows = page.locator("#regressions tbody tr")
    assert rows.count() == 1  # the candidate's line; the baseline's did not move
    text = rows.first.inner_text()
    assert "softmax" in text and GPU in text and f"#{site.jobs[3]} → #{site.jobs[4]}" in text
    assert "PELT" in page.locator("#regressions-method").inner_text()
    _shot(page, "regressions.png")
    rows.first.locator("a:text-is('compare')").click()
    assert page.url.endswith(f"/compare?a={site.jobs[3]}&b={site.jobs[4]}")
    assert page.locator("#compare-table tbody tr .badge").first.inner_text() == "slower"


def test_job_vs_job_from_the_job_page_shows_both_nodes_side_by_side(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.jobs[0]}")
    page.fill("form.compare-with input[name=b]", str(site.other))
    with page.expect_navigation():
        page.click("form.compare-with button")
    assert page.url.endswith(f"/compare?a={site.jobs[0]}&b={site.other}")
    health = page.locator("#compare-health").inner_text()
    assert "browser-hist-a" in health and "browser-hist-b" in health
    assert GPU in health and OTHER_GPU in health and "healthy" in health
    assert "different GPU models" in page.locator("main").inner_text()
    row = page.locator("#compare-table tbody tr")
    assert row.count() == 1
    cells = row.first.locator("td")
    assert cells.nth(0).inner_text() == "M=4, N=64"
    # B's candidate (720 ns) is 10 % faster than A's (800 ns) against the baseline both ran (1000 ns)
    assert cells.nth(4).inner_text().startswith("\u2212")
    assert cells.nth(6).inner_text().startswith("control")
    assert cells.nth(9).inner_text().startswith("faster")
    assert "×" in cells.nth(7).inner_text()
    _shot(page, "job-vs-job.png")
    missing = page.goto(f"{site.base_url}/compare?a={site.jobs[0]}&b=999999")
    assert missing is not None and missing.status == 404
    assert "no job #999999" in page.locator("main").inner_text()


def test_every_page_links_history_and_nodes(site: Site, page: Page) -> None:
    for path in (
        "/",
        f"/jobs/{site.jobs[0]}",
        "/history?benchmark=softmax",
        "/history/regressions",
        "/nodes",
    ):
        page.goto(f"{site.base_url}{path}")
        nav = page.locator("header nav")
        assert nav.locator("a[href='/history']").inner_text() == "History"
        assert nav.locator("a[href='/nodes']").inner_text() == "Nodes"
    page.click("header nav a:text-is('Nodes')")
    names = page.locator("#nodes tbody tr td:first-child").all_inner_texts()
    assert names == ["browser-hist-a", "browser-hist-b"]
    page.click("#nodes a:text-is('browser-hist-b')")
    assert page.url.endswith("/nodes/browser-hist-b")
