"""A wrong kernel and a broken one, as a person sees them in Chromium: ``incorrect`` and ``failed``
in red, the reason written on the page, the wrong cell's timing greyed, the jobs list's badges red.

A server of its own (uvicorn, temp SQLite file) gets through the REST API two jobs of the
``wrongbench`` benchmarks (``tests/wrong_kernels``): a row softmax that skips the normalisation
(fast and wrong in every element) and one whose kernel raises in every cell. Their results are
measured by ``kernelab.runners.job.run_job`` on this CPU and posted with a runner token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
import compare_wait  # noqa: E402
from dashboard_server import ADMIN_TOKEN, REPO, Dashboard, DashboardConfig, signed_in_page  # noqa: E402
from playwright.sync_api import Browser, Page  # noqa: E402

from kernelab.service.contract.schemas import Comparison, JobSpec  # noqa: E402
from tests.wrong_kernels.cases import FAST_WRONG, RAISES, SPEC, WRONG_DIR  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RED = "rgb(179, 38, 30)"  # the red of failed/incorrect (schemas.VERDICT_CATALOGUE), --red of kernelab.css
WHITE = "rgb(255, 255, 255)"
GREYED = "rgb(163, 171, 184)"  # td.void-timing


@dataclass
class Jobs:
    base_url: str
    wrong: int
    failed: int
    comparison: Comparison  # of the wrong job


def _seed(base_url: str) -> Jobs:
    import yaml

    from kernelab.runners.job import run_job
    from kernelab.runners.probes import node_info

    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ids = []
    with httpx.Client(base_url=f"{base_url}/api/v1", timeout=60.0) as api:
        registered = api.post(
            "/runners/register",
            headers=admin,
            json={"name": "verdict-runner", "node": node_info().model_dump(mode="json")},
        )
        assert registered.status_code == 200, registered.text
        runner = {"Authorization": f"Bearer {registered.json()['token']}"}
        for case in (FAST_WRONG, RAISES):
            spec = yaml.safe_load(SPEC.format(**case))
            created = api.post("/jobs", json=spec, headers=admin)
            assert created.status_code == 201, created.text
            claim = api.post("/runners/claim", json={}, headers=runner)
            assert claim.status_code == 200 and claim.json()["job_id"] == created.json()["id"], claim.text
            result = run_job(
                JobSpec.model_validate(claim.json()["spec"]), job_id=created.json()["id"], device="cpu"
            )
            posted = api.post(
                f"/jobs/{created.json()['id']}/results", json=result.model_dump(mode="json"), headers=runner
            )
            assert posted.status_code == 201, posted.text
            ids.append(created.json()["id"])
        compare_wait.until_compared(api, ids, admin)
        comparison = Comparison.model_validate(api.get(f"/jobs/{ids[0]}/comparison", headers=admin).json())
    return Jobs(base_url, ids[0], ids[1], comparison)


@pytest.fixture(scope="module")
def dashboard_config() -> DashboardConfig:
    path = os.pathsep.join([str(WRONG_DIR), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return DashboardConfig(env={"PYTHONPATH": path})  # the server imports wrongbench


@pytest.fixture(scope="module")
def jobs(dashboard: Dashboard) -> Iterator[Jobs]:
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(WRONG_DIR))  # run_job here imports it too
        yield _seed(dashboard.url)


@pytest.fixture
def page(jobs: Jobs, browser: Browser) -> Iterator[Page]:
    with signed_in_page(browser, jobs.base_url, watch=()) as page:
        yield page


def _style(locator, prop: str) -> str:  # type: ignore[no-untyped-def]
    return str(locator.evaluate(f"e => getComputedStyle(e).{prop}"))


def test_job_page_shows_incorrect_in_red_with_the_reason(jobs: Jobs, page: Page) -> None:
    page.goto(f"{jobs.base_url}/jobs/{jobs.wrong}")
    rows = page.locator("#comparison-table tbody tr.cell-row")
    assert rows.count() == len(jobs.comparison.cells) == 2
    for i, cell in enumerate(jobs.comparison.cells):
        assert cell.verdict == "incorrect"
        badge = rows.nth(i).locator("td.verdict .badge")
        assert badge.inner_text() == "incorrect" and badge.is_visible()
        assert _style(badge, "backgroundColor") == RED and _style(badge, "color") == WHITE
        # the reason is on the page itself, under the row, not in a tooltip
        reason = page.locator(f'#comparison-table tr.reason-row[data-cell="{cell.index}"] td.reason')
        assert reason.is_visible()
        text = reason.inner_text()
        assert text.startswith("incorrect: candidate: FAIL: ") and "elements (100%) outside" in text
        assert _style(reason.locator(".reason-verdict"), "color") == RED
        # the timing of a wrong result stays visible, greyed
        median = rows.nth(i).locator("td").nth(3)
        assert median.is_visible() and median.inner_text() != "—"
        assert _style(median, "color") == GREYED
    assert page.get_by_text("Greyed numbers: the timing of a failed, incorrect").is_visible()
    summary = page.locator("p.summary .badge.verdict-incorrect")
    assert summary.inner_text() == "2 incorrect" and _style(summary, "backgroundColor") == RED
    assert page.get_by_text("faster", exact=True).count() == 0
    if os.environ.get("KERNELAB_UPDATE_SCREENSHOTS") == "1":
        target = REPO / "docs" / "screenshots" / "job-page-incorrect.png"
        target.parent.mkdir(parents=True, exist_ok=True)
        page.locator("#comparison-table").screenshot(path=str(target))


def test_jobs_list_shows_red_incorrect_and_failed(jobs: Jobs, page: Page) -> None:
    page.goto(f"{jobs.base_url}/")
    wrong = page.locator("table.jobs tbody tr").filter(has=page.locator(f'a[href="/jobs/{jobs.wrong}"]'))
    badge = wrong.locator("td").nth(6).locator(".badge")
    assert badge.inner_text() == "2 incorrect" and badge.is_visible()
    assert _style(badge, "backgroundColor") == RED
    assert wrong.locator("td").nth(3).inner_text() == "succeeded"
    failed = page.locator("table.jobs tbody tr").filter(has=page.locator(f'a[href="/jobs/{jobs.failed}"]'))
    status = failed.locator("td").nth(3).locator(".badge")
    assert status.inner_text() == "failed" and _style(status, "backgroundColor") == RED
    assert failed.locator("td").nth(6).inner_text() == "2 failed"


def test_failed_job_shows_its_error_once_and_each_cells_reason(jobs: Jobs, page: Page) -> None:
    page.goto(f"{jobs.base_url}/jobs/{jobs.failed}")
    error = "RuntimeError: kernel launch failed: invalid configuration argument"
    alert = page.locator("#job-error")
    assert alert.is_visible()
    assert alert.inner_text().split() == f"Job failed: all 2 cells failed; first: {error}".split()
    assert page.locator("#runner-error").count() == 0 and page.locator(".job-reason").count() == 0
    reasons = page.locator("#comparison-table td.reason")
    assert reasons.count() == 2
    assert all(reasons.nth(i).inner_text() == f"failed: {error}" for i in range(2))
