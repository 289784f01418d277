"""Job management, live progress and the bisect page as a person sees them: a real server process
on a temp SQLite file, jobs driven through the REST API as a runner would (claim, heartbeats with
progress), real headless Chromium.

Set ``KERNELAB_UPDATE_SCREENSHOTS=1`` to write ``docs/screenshots/job-progress.png`` and
``docs/screenshots/bisect-page.png`` as well."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
from browser_signin import sign_in  # noqa: E402
from dashboard_server import ADMIN_TOKEN, REPO, Dashboard, DashboardConfig  # noqa: E402
from playwright.sync_api import Browser, Page, expect  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SHOTS = REPO / "docs" / "screenshots"
SPEC = {
    "name": "softmax rows",
    "benchmark": "softmax",
    "device": "cpu",
    "baseline": {"variant": "torch"},
    "candidate": {"variant": "triton"},
    "sweep": {"M": [4, 8, 16, 32], "N": [64]},
}


@dataclass
class Site:
    url: str
    api: httpx.Client
    runner: dict[str, str]

    def submit(self, **changes: Any) -> int:
        r = self.api.post("/jobs", json={**SPEC, **changes})
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    def claim(self) -> int:
        r = self.api.post("/runners/claim", json={"lease_s": 300}, headers=self.runner)
        assert r.status_code == 200, r.text
        return int(r.json()["job_id"])

    def beat(self, job_id: int, **progress: Any) -> None:
        body = {"lease_s": 300, "progress": {"cells": 4, "elapsed_s": 3.0, **progress}}
        r = self.api.post(f"/runners/jobs/{job_id}/heartbeat", json=body, headers=self.runner)
        assert r.status_code == 200, r.text

    def token(self, scope: str) -> str:
        r = self.api.post("/tokens", json={"name": f"{scope}-person", "scopes": [scope]})
        assert r.status_code == 201, r.text
        return str(r.json()["token"])


@pytest.fixture(scope="module")
def dashboard_config() -> DashboardConfig:
    return DashboardConfig(compare_worker=False)  # no job here posts a result


@pytest.fixture(scope="module")
def site(dashboard: Dashboard) -> Iterator[Site]:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with httpx.Client(base_url=f"{dashboard.url}/api/v1", headers=admin, timeout=30) as api:
        reg = api.post("/runners/register", json={"name": "manage-runner"})
        assert reg.status_code == 200, reg.text
        yield Site(dashboard.url, api, {"Authorization": f"Bearer {reg.json()['token']}"})


def _page(site: Site, browser: Browser, token: str = ADMIN_TOKEN) -> Page:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.on("dialog", lambda d: pytest.fail(f"a dialog fired: {d.message}"))
    sign_in(page, site.url, token)
    return page


def _shot(page: Page, name: str) -> None:
    if os.environ.get("KERNELAB_UPDATE_SCREENSHOTS") == "1":
        page.screenshot(path=str(SHOTS / name), full_page=True)


def test_a_running_jobs_progress_updates_in_place_and_the_page_reloads_once_done(
    site: Site, browser: Browser
) -> None:
    job_id = site.submit(name="live progress")
    page = _page(site, browser)
    page.goto(f"{site.url}/jobs/{job_id}")
    expect(page.locator("#progress-none")).to_contain_text("Queued: waiting for a runner")
    page.evaluate("window.__kept = 42")  # survives only while the page is not reloaded
    assert site.claim() == job_id
    site.beat(job_id, cell=0, cells_done=0, phase="warm-up", message="warm-up")
    expect(page.locator("#progress-cell")).to_have_text("cell 1 of 4", timeout=15_000)
    expect(page.locator("#progress-phase")).to_have_text("warm-up")
    expect(page.locator("#progress-eta")).to_have_text("ETA after the first cell")
    expect(page.locator("h1 .badge")).to_have_text("running")  # the header followed the claim
    site.beat(
        job_id,
        cell=2,
        cells_done=2,
        phase="measuring",
        eta_s=75.0,
        message=(
            "round 8: ratio 1.0123 ±0.50%; launches per sample: baseline 1, candidate 1; "
            "timed 2 ms (may stop from 0 ms)"
        ),
    )
    expect(page.locator("#progress-cell")).to_have_text("cell 3 of 4", timeout=15_000)
    expect(page.locator("#progress-done")).to_have_text("2 of 4 done")
    expect(page.locator("#progress-eta")).to_have_text("ETA 1 min 15 s")
    expect(page.locator("#progress-message")).to_contain_text("round 8: ratio 1.0123")
    assert page.evaluate("window.__kept") == 42  # updated in place: no reload
    _shot(page, "job-progress.png")
    assert site.api.post(f"/jobs/{job_id}/cancel").status_code == 200
    expect(page.locator("h1 .badge")).to_have_text("cancelled", timeout=15_000)
    assert page.evaluate("window.__kept") is None  # it reloaded once, for the finished job
    expect(page.locator("#job-progress")).to_have_count(0)
    page.context.close()


def test_cancel_and_rerun_buttons(site: Site, browser: Browser) -> None:
    job_id = site.submit(name="button job")
    page = _page(site, browser)
    page.goto(f"{site.url}/jobs/{job_id}")
    with page.expect_navigation():
        page.click("#cancel-job")
    expect(page.locator("h1 .badge")).to_have_text("cancelled")
    expect(page.locator("#cancel-job")).to_have_count(0)  # a finished job has no cancel button
    with page.expect_navigation():
        page.click("#rerun-job")
    new_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    assert new_id != job_id
    expect(page.locator("h1")).to_contain_text("button job")
    expect(page.locator("h1 .badge")).to_have_text("queued")
    expect(page.locator("#rerun-of")).to_have_text(f"#{job_id}")
    page.context.close()

    reader = _page(site, browser, site.token("read"))  # a read token sees the page, cannot change it
    reader.goto(f"{site.url}/jobs/{new_id}")
    with reader.expect_navigation():
        reader.click("#cancel-job")
    expect(reader.locator("#message")).to_contain_text("need the 'submit' scope")
    assert site.api.get(f"/jobs/{new_id}").json()["status"] == "queued"
    reader.context.close()


def test_jobs_list_filters_by_status_and_benchmark(site: Site, browser: Browser) -> None:
    kept = site.submit(name="filter queued")
    gone = site.submit(name="filter cancelled")
    site.api.post(f"/jobs/{gone}/cancel")
    page = _page(site, browser)
    page.select_option("#filter-status", "cancelled")
    with page.expect_navigation():
        page.click("#apply-filters")
    names = page.locator("table.jobs tbody tr td:nth-child(2)").all_inner_texts()
    assert "filter cancelled" in names and "filter queued" not in names
    assert all(
        badge == "cancelled"
        for badge in page.locator("table.jobs tbody .badge[class*=status-]").all_inner_texts()
    )
    page.fill("#filter-benchmark", "no-such-benchmark")
    with page.expect_navigation():
        page.click("#apply-filters")
    expect(page.locator(".empty")).to_have_text("No job matches these filters.")
    page.click("#clear-filters")
    expect(page.locator(f"a[href='/jobs/{kept}']").first).to_be_visible()
    page.context.close()


def _bisect(site: Site, commits: list[str]) -> int:
    body = {
        "name": "softmax slowdown",
        "repo": "/src/kernels",
        "good": "a" * 40,
        "bad": commits[-1],
        "good_ref": "v1.0",
        "bad_ref": "main",
        "spec": SPEC,
        "commits": [{"sha": c, "subject": f"change {i}"} for i, c in enumerate(commits)],
    }
    r = site.api.post("/bisects", json=body)
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _step(site: Site, bid: int, job_id: int, step: tuple[str, str, str, str, float]) -> None:
    """Post one judged step ``(commit, role, outcome, verdict, ratio)`` of bisect ``bid`` for
    ``job_id`` (cell ``M=4, N=64``, a ±2% interval around ``ratio``)."""
    sha, role, outcome, verdict, ratio = step
    body = {"job_id": job_id, "commit": sha, "role": role, "outcome": outcome, "verdict": verdict,
            "cell": "M=4, N=64", "ratio": ratio, "ci_low": ratio * 0.98, "ci_high": ratio * 1.02,
            "summary": {verdict: 4}, "reason": f"M=4, N=64: {verdict}"}  # fmt: skip
    r = site.api.post(f"/bisects/{bid}/steps", json=body)
    assert r.status_code == 200, r.text


def test_bisect_page_shows_steps_as_they_come_and_the_first_bad_commit(site: Site, browser: Browser) -> None:
    commits = [f"{i:x}" * 40 for i in range(1, 8)]
    bid = _bisect(site, commits)
    page = _page(site, browser)
    page.goto(f"{site.url}/bisects/{bid}")
    expect(page.locator("#no-steps")).to_be_visible()
    expect(page.locator("#bisect-status")).to_have_text("running")
    page.evaluate("window.__kept = 7")
    job_ids = [site.submit(name=f"bisect step {i}") for i in range(4)]
    steps = [  # the ends, then 3 midpoints: 4 bad (first bad), 2 good, 3 bad ... as a real run goes
        (commits[6], "ends", "bad", "slower", 3.9),
        (commits[3], "midpoint", "bad", "slower", 3.8),
        (commits[1], "midpoint", "good", "same", 1.01),
        (commits[2], "midpoint", "good", "same", 0.99),
    ]
    for step, job_id in zip(steps[:1], job_ids, strict=False):
        _step(site, bid, job_id, step)
    expect(page.locator("#steps-table tbody tr")).to_have_count(1, timeout=15_000)
    assert page.evaluate("window.__kept") == 7  # the steps came in place
    for step, job_id in zip(steps[1:], job_ids[1:], strict=True):
        _step(site, bid, job_id, step)
    site.api.post(f"/bisects/{bid}/finish", json={"status": "found", "first_bad": commits[3]})
    expect(page.locator("#bisect-status")).to_have_text("found", timeout=15_000)
    expect(page.locator("#bisect-result")).to_contain_text(f"First bad commit: {commits[3]} change 3")
    rows = page.locator("#steps-table tbody tr")
    expect(rows).to_have_count(4)
    expect(rows.nth(0)).to_contain_text("3.900 [3.822, 3.978]")
    expect(rows.nth(0).locator(".badge.outcome-bad")).to_have_text("bad")
    expect(rows.nth(2).locator(".badge.outcome-good")).to_have_text("good")
    expect(page.locator(f"tr.commit-row[data-commit='{commits[3]}'] .badge")).to_have_text("first bad")
    expect(page.locator(f"tr.commit-row[data-commit='{commits[2]}'] .badge")).to_have_text("good")
    expect(page.locator(f"tr.commit-row[data-commit='{commits[5]}'] .badge")).to_have_count(0)  # untested
    _shot(page, "bisect-page.png")
    page.click("nav >> text=Bisects")
    expect(page.locator("#bisects-table")).to_contain_text("softmax slowdown")
    page.context.close()
