"""The dashboard as a person sees it: a real server process, a real result, real Chromium.

One module-scoped server (uvicorn on a free loopback port, a temp SQLite file migrated by
``kernelab.service.server.core.db.upgrade``) is seeded through the REST API with a job whose name is an XSS
attempt; a runner token claims it and posts the ``JobResult`` that ``kernelab.runners.job.run_job`` measured
on this machine's CPU (a tiny softmax sweep). A second job stays queued. Each test then opens pages
in headless Chromium and asserts what is on screen.

Set ``KERNELAB_UPDATE_SCREENSHOTS=1`` to write ``docs/screenshots/job-page.png`` as well.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

# The dev extra installs playwright; a GPU node running only `-m gpu` tests may lack it.
pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
import compare_wait  # noqa: E402
from browser_signin import sign_in  # noqa: E402
from dashboard_server import ADMIN_TOKEN, REPO, Dashboard, signed_in_page  # noqa: E402
from playwright.sync_api import Browser, Page  # noqa: E402

from kernelab.service.contract.schemas import Comparison, JobResult, JobSpec
from kernelab.service.judge.report import cell_speedup

pytestmark = [pytest.mark.browser, pytest.mark.slow]

XSS_NAME = "<script>alert(1)</script> softmax"


@dataclass
class Site:
    base_url: str
    job_id: int
    queued_job_id: int
    result: JobResult
    comparison: Comparison


def _tiny_spec() -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": XSS_NAME,
            "benchmark": "softmax",
            "device": "cpu",
            "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"},
            "sweep": {"M": [4, 16], "N": [64]},
            "measurement": {"warmup_ms": 2, "budget_ms": 150, "min_rounds": 6, "max_rounds": 40},
        }
    )


def _seed(base_url: str) -> Site:
    from kernelab.runners.job import run_job
    from kernelab.runners.probes import node_info

    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=f"{base_url}/api/v1", timeout=30.0) as api:
        spec = _tiny_spec()
        job = api.post("/jobs", json=spec.model_dump(mode="json"), headers=admin)
        assert job.status_code == 201, job.text
        registered = api.post(
            "/runners/register",
            headers=admin,
            json={"name": "browser-runner", "node": node_info().model_dump(mode="json")},
        )
        assert registered.status_code == 200, registered.text
        runner = {"Authorization": f"Bearer {registered.json()['token']}"}
        claim = api.post("/runners/claim", json={}, headers=runner)
        assert claim.status_code == 200, claim.text
        job_id = claim.json()["job_id"]
        assert job_id == job.json()["id"]
        result = run_job(JobSpec.model_validate(claim.json()["spec"]), job_id=job_id, device="cpu")
        posted = api.post(f"/jobs/{job_id}/results", json=result.model_dump(mode="json"), headers=runner)
        assert posted.status_code == 201, posted.text
        compare_wait.until_compared(api, [job_id], admin)
        waiting = {**spec.model_dump(mode="json"), "name": "still waiting"}
        queued = api.post("/jobs", json=waiting, headers=admin)
        assert queued.status_code == 201, queued.text
        comparison = api.get(f"/jobs/{job_id}/comparison", headers=admin)
        assert comparison.status_code == 200, comparison.text
    return Site(base_url, job_id, queued.json()["id"], result, Comparison.model_validate(comparison.json()))


@pytest.fixture(scope="module")
def site(dashboard: Dashboard) -> Site:
    return _seed(dashboard.url)


@pytest.fixture
def page(site: Site, browser: Browser) -> Iterator[Page]:
    """A signed-in page (the ``/login`` form sets the cookie) that fails the test on any dialog."""
    with signed_in_page(browser, site.base_url) as page:
        yield page


def test_pages_need_a_token(site: Site, browser: Browser) -> None:
    context = browser.new_context()
    response = context.new_page().goto(f"{site.base_url}/jobs/{site.job_id}")
    assert response is not None and response.status == 401
    context.close()


def test_sign_in_and_sign_out_with_the_form(site: Site, browser: Browser) -> None:
    """Sign-in is a POST from the form, sign-out a POST from the top bar's button."""
    context = browser.new_context()
    page = context.new_page()
    sign_in(page, site.base_url, ADMIN_TOKEN)
    cookies = {c["name"]: c for c in context.cookies()}
    assert cookies["kernelab_token"]["httpOnly"] and cookies["kernelab_token"]["sameSite"] == "Lax"
    assert page.locator("table.jobs tbody tr").count() == 2
    with page.expect_navigation():
        page.click("form.signout button")
    assert page.url == f"{site.base_url}/login" and context.cookies() == []
    response = page.goto(f"{site.base_url}/jobs/{site.job_id}")
    assert response is not None and response.status == 401
    page.goto(f"{site.base_url}/login")
    page.fill("#token", "not-a-token")
    page.click("form.login button[type=submit]")
    assert page.locator(".login-message").inner_text() == "Invalid or revoked token."
    assert context.cookies() == []
    context.close()


def test_a_sign_in_link_sets_no_cookie(site: Site, browser: Browser) -> None:
    """Login CSRF: a ``GET /login?token=`` from any link sets no cookie."""
    context = browser.new_context()
    page = context.new_page()
    response = page.goto(f"{site.base_url}/login?token={ADMIN_TOKEN}")
    assert response is not None and response.status == 200
    assert context.cookies() == [] and page.locator("form.login").count() == 1
    response = page.goto(f"{site.base_url}/jobs/{site.job_id}")
    assert response is not None and response.status == 401
    context.close()


def test_a_sign_in_form_on_another_origin_is_refused(site: Site, browser: Browser) -> None:
    """A page of another origin (here http://localhost:PORT, the same server under another name)
    posting a valid token to the server's /login is refused, and no cookie is set."""
    other = site.base_url.replace("127.0.0.1", "localhost")
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{other}/login")
    page.evaluate("url => { document.querySelector('form.login').action = url }", f"{site.base_url}/login")
    page.fill("#token", ADMIN_TOKEN)
    with page.expect_navigation():
        page.click("form.login button[type=submit]")
    assert "another site" in page.locator(".login-message").inner_text()
    assert [c for c in context.cookies() if c["name"] == "kernelab_token"] == []
    context.close()


def test_jobs_list_shows_both_jobs_with_escaped_name(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/")
    rows = page.locator("table.jobs tbody tr")
    assert rows.count() == 2
    done = rows.filter(has=page.locator(f'a[href="/jobs/{site.job_id}"]'))
    assert done.locator("td").nth(1).inner_text() == XSS_NAME
    assert done.locator("td").nth(3).inner_text() == "succeeded"
    node = done.locator("td").nth(5)  # the node (a link to its page), then the runner that ran it
    assert node.locator("a").get_attribute("href") == f"/nodes/{site.comparison.node.hostname}"
    assert node.inner_text() == f"{site.comparison.node.hostname} (browser-runner)"
    badges = done.locator("td").nth(6).inner_text()
    for verdict, count in site.comparison.summary.items():
        assert f"{count} {verdict}" in badges
    queued = rows.filter(has=page.locator(f'a[href="/jobs/{site.queued_job_id}"]'))
    assert queued.locator("td").nth(3).inner_text() == "queued"
    assert page.locator("script", has_text="alert(1)").count() == 0


def test_job_page_shows_table_figures_and_probes(site: Site, page: Page) -> None:
    response = page.goto(f"{site.base_url}/jobs/{site.job_id}")
    assert response is not None and response.status == 200
    assert XSS_NAME in page.locator("h1").inner_text()

    rows = page.locator("#comparison-table tbody tr.cell-row")
    assert rows.count() == len(site.comparison.cells) == 2
    for i, cell in enumerate(site.comparison.cells):
        cells = rows.nth(i).locator("td")
        assert cells.nth(0).inner_text() == f"M={cell.params['M']}"  # N=64 is in every cell: said once
        assert cells.nth(5).inner_text() == (cell_speedup(cell) if cell.ratio is not None else "—")
        assert cells.nth(6).inner_text() == (
            f"{cell.p_value:.2g} [{cell.p_adjusted:.2g}]" if cell.p_value is not None else "n/a"
        )  # raw and Benjamini-Hochberg adjusted
        assert cells.nth(7).inner_text() == cell.verdict
        flags = cells.nth(8).inner_text()
        assert [w for w in flags.split() if w.isalpha() or "-" in w][: len(cell.flags)] == cell.flags
        if "throttled" in cell.flags:
            dropped = f"{cell.baseline.dropped_throttled}+{cell.candidate.dropped_throttled} dropped"
            assert dropped in flags
        assert cells.nth(-3).inner_text() == ("pass" if cell.correctness["baseline"].passed else "fail")
        assert cells.nth(-1).inner_text() == ("pass" if cell.correctness["candidate"].passed else "fail")

    page.wait_for_selector("#fig-samples[data-drawn]")
    assert page.locator("#fig-samples g.trace.boxes").count() == 2
    page.wait_for_selector("#fig-timeline[data-drawn]")
    assert page.locator("#fig-timeline g.trace.scatter").count() >= 2

    before = next(p for p in site.result.probes if p.phase == "before")
    copy_text = page.locator("#probe-copy tbody").inner_text()
    assert f"{before.copy_bandwidth[0].bandwidth_gbps:.1f}" in copy_text
    reduce_rows = page.locator("#probe-allreduce tbody tr")
    assert reduce_rows.count() == len({a.size_bytes for a in before.all_reduce})
    assert "absent" in page.locator("#probe-nvml").inner_text()

    if os.environ.get("KERNELAB_UPDATE_SCREENSHOTS") == "1":
        target = REPO / "docs" / "screenshots" / "job-page.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(target), full_page=True)


def test_job_page_export_links_download(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.job_id}")
    report = page.get_by_role("link", name="Markdown report")
    answer = page.request.get(site.base_url + report.get_attribute("href"))
    assert answer.status == 200, answer.text()
    assert site.comparison.cells[0].label in answer.text()
    csv_link = page.get_by_role("link", name="raw samples (CSV)")
    answer = page.request.get(site.base_url + csv_link.get_attribute("href"))
    assert answer.status == 200
    lines = answer.text().strip().splitlines()
    assert len(lines) == 1 + sum(len(c.samples) for c in site.result.cells)


def test_timeline_follows_the_chosen_cell(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.job_id}")
    second = site.comparison.cells[1]
    page.locator("#comparison-table tbody tr.cell-row").nth(1).locator("td a").click()
    page.wait_for_selector("#fig-timeline[data-drawn]")
    assert page.url.endswith(f"?cell={second.index}#timeline")
    assert f"cell {second.index}" in (page.locator("#fig-timeline .gtitle").text_content() or "")


def test_queued_job_shows_status_and_no_table(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.queued_job_id}")
    assert "queued" in page.locator("#no-result").inner_text()
    assert page.locator("#comparison-table").count() == 0
    assert page.locator(".js-plotly-plot").count() == 0


def test_unknown_job_is_a_404_page(site: Site, page: Page) -> None:
    response = page.goto(f"{site.base_url}/jobs/987654")
    assert response is not None and response.status == 404
    assert page.locator("h1").inner_text() == "Not found"
    assert "#987654" in page.locator("main").inner_text()


def test_node_page_shows_probe_history(site: Site, page: Page) -> None:
    page.goto(f"{site.base_url}/jobs/{site.job_id}")
    page.locator(".facts a", has_text=site.result.node.hostname).click()
    page.wait_for_selector("#fig-probes[data-drawn]")
    rows = page.locator("#node-readings tbody tr")
    assert rows.count() == len(site.result.probes)
    assert [rows.nth(i).locator("td").nth(1).inner_text() for i in range(rows.count())] == ["after", "before"]
    assert page.locator("#fig-probes g.trace.scatter").count() >= 2
    response = page.goto(f"{site.base_url}/nodes/no-such-node")
    assert response is not None and response.status == 404
