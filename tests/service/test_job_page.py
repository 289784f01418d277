"""The dashboard job page of a large sweep through the real app and database (SQLite and
PostgreSQL): summary figure of every cell, the before/after table in pages and orders, one cell's
timeline, "comparison being computed" while the background task runs, computing on a miss for old
results, node-health flags applied on read although the page data is cached, 422 on bad input.

The thresholds that make a sweep "large" (``RAW_FIGURE_SAMPLES``) and the page size are lowered
with ``monkeypatch`` so that a 10-cell result exercises the paths a 1,000-cell sweep takes.
"""

from __future__ import annotations

import html
import json
import re
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from factories import job_result, samples, spec_dict
from health_fixtures import h200x2_report
from sqlalchemy import null, select, update

from kernelab.service.contract.schemas import (
    CorrectnessResult,
    JobResult,
    ProbeReport,
    Reason,
    RepeatCheck,
    SampleColumns,
    TimedCheck,
)
from kernelab.service.judge import stats
from kernelab.service.server import compare_queue, crud, models
from kernelab.web import job_view, routes

CELLS = 10
ROUNDS = 4  # x 4 samples per round (factories.samples): 16 per cell
XSS = "</script><script>alert(1)</script>"
# Candidate / baseline time per cell, in an order that is not the sweep order.
RATIOS = [0.8, 1.3, 0.7, 1.1, 0.9, 1.5, 0.6, 1.0, 1.2, 0.75]
FAILED_CELL = 4  # flagged "incorrect"
THROTTLED_CELL = 7  # flagged "throttled"


@pytest.fixture
def small_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every result counts as large; 4 table rows per page; previous/next timeline links."""
    monkeypatch.setattr(routes, "RAW_FIGURE_SAMPLES", 10)
    monkeypatch.setattr(job_view, "CELLS_PER_PAGE", 4)
    monkeypatch.setattr(routes, "TIMELINE_LINKS", 5)


def _sweep_result(
    job_id: int, *, hostname: str = "node-a", probes: list[ProbeReport] | None = None
) -> JobResult:
    spec = spec_dict(sweep={"M": [4], "N": [64 * (i + 1) for i in range(CELLS)]})
    result = job_result(job_id, spec=spec, rounds=ROUNDS, hostname=hostname, key=f"page-key-{job_id}")
    cells = []
    for cell, ratio in zip(result.cells, RATIOS, strict=True):
        base_ns = 1000.0 * (cell.index + 1)
        cols = SampleColumns.model_validate(samples(ROUNDS, base_ns, ratio * base_ns))
        if cell.index != THROTTLED_CELL:  # factories throttle one sample per cell: keep one cell's
            cols = cols.model_copy(update={"throttled": np.zeros(len(cols), dtype=bool)})
        update_: dict = {"samples": cols}
        if cell.index == FAILED_CELL:
            bad = CorrectnessResult(passed=False, rel_error=0.5, max_abs_error=1.0, cosine_similarity=0.1,
                                    rtol=1e-5, atol=1e-6, message="wrong")  # fmt: skip
            update_["correctness"] = {**cell.correctness, "candidate": bad}
        cells.append(cell.model_copy(update=update_))
    return result.model_copy(update={"cells": cells, **({"probes": probes} if probes is not None else {})})


def _post_sweep(api, **kwargs) -> int:  # type: ignore[no-untyped-def]
    runner = api.runner(kwargs.get("hostname", "node-a"))
    job_id = api.submit(spec_dict(sweep={"M": [4], "N": [64 * (i + 1) for i in range(CELLS)]}))
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    assert api.post_result(job_id, _sweep_result(job_id, **kwargs), runner).status_code == 201
    # A parameter that is text (a plug-in benchmark's str parameter) shows in labels: cell 1's
    # becomes an XSS probe. The API only stores a sweep's own params, so it is set in the database
    # and the comparison computed again.
    with api.factory.begin() as session:
        result_id = session.scalar(select(models.Result.id).where(models.Result.job_id == job_id))
        cell = session.scalars(select(models.Cell).where(models.Cell.result_id == result_id,
                                                         models.Cell.cell_index == 1)).one()  # fmt: skip
        cell.params = {**cell.params, "N": XSS}
        session.execute(update(models.Result).where(models.Result.id == result_id).values(comparison=null()))
        compare_queue.enqueue(session, result_id=result_id, job_id=job_id, max_attempts=3)
    api.compare()
    return job_id


def _rows(page: str) -> list[str]:
    """The cell labels of the before/after table (each link's title: the stored label; its text
    names only the parameters that vary), unescaped, in page order."""
    table = page.split('id="comparison-table"', 1)[1].split("</table>", 1)[0]
    return [html.unescape(m) for m in re.findall(r'title="timeline of cell \d+: ([^"]*)">[^<]*</a>', table)]


def _figure(page: str, fig_id: str) -> dict:
    m = re.search(rf'<script type="application/json" data-figure-for="{fig_id}">(.*?)</script>', page, re.S)
    assert m is not None, fig_id
    return json.loads(m.group(1))


def test_large_sweep_pages_cells_and_draws_every_cell(api, small_pages) -> None:  # type: ignore[no-untyped-def]
    job_id = _post_sweep(api)
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()
    labels = [c["label"] for c in comparison["cells"]]
    assert XSS in labels[1]

    page = api.client.get(f"/jobs/{job_id}", headers=api.admin)
    assert page.status_code == 200
    # the default order: worst first (problem verdicts in catalogue order, slower, undecided, the rest;
    # then by Δ % descending)
    group = {"failed": (0, 0), "incorrect": (0, 1), "nondeterministic": (0, 2), "implausible": (0, 3),
             "slower": (1, 0), "inconclusive": (2, 0), "same": (3, 0), "faster": (3, 0)}  # fmt: skip
    worst = sorted(comparison["cells"], key=lambda c: (group[c["verdict"]], -(c["delta_pct"] or 0.0)))
    assert worst[0]["index"] == FAILED_CELL and group[worst[0]["verdict"]][0] == 0  # a problem verdict
    assert _rows(page.text) == [c["label"] for c in worst[:4]] != labels[:4]
    assert "cells 1–4 of 10 (2 flagged)" in page.text
    page = api.client.get(f"/jobs/{job_id}?order=index", headers=api.admin)
    assert _rows(page.text) == labels[:4]
    assert f"offset={4}" in page.text and 'id="cells-previous"' not in page.text
    assert XSS not in page.text and "<script>alert" not in page.text  # escaped in HTML and in JSON
    summary = _figure(page.text, "fig-samples")
    assert [t["type"] for t in summary["data"]] == ["scatter", "scatter"]
    assert [t["x"] for t in summary["data"]] == [labels, labels]  # every cell, not one page
    medians = [c["baseline"]["median_ns"] for c in comparison["cells"]]
    scale = 1e3  # medians from 1 to 10 µs: drawn in µs
    assert summary["data"][0]["y"] == pytest.approx([m / scale for m in medians])

    last = api.client.get(f"/jobs/{job_id}?order=index&offset=8", headers=api.admin).text
    assert _rows(last) == labels[8:] and 'id="cells-next"' not in last
    assert (
        _rows(api.client.get(f"/jobs/{job_id}?order=index&offset=500", headers=api.admin).text) == labels[8:]
    )

    by_delta = sorted(comparison["cells"], key=lambda c: -c["delta_pct"])
    slowest = api.client.get(f"/jobs/{job_id}?order=slowest", headers=api.admin).text
    assert _rows(slowest) == [c["label"] for c in by_delta[:4]]
    fastest = api.client.get(f"/jobs/{job_id}?order=fastest&offset=4", headers=api.admin).text
    assert _rows(fastest) == [c["label"] for c in by_delta[::-1][4:8]]
    flagged = api.client.get(f"/jobs/{job_id}?order=flagged", headers=api.admin).text
    assert _rows(flagged)[:3] == [labels[FAILED_CELL], labels[THROTTLED_CELL], labels[0]]
    assert 'href="?order=flagged&amp;offset=4"' in flagged  # paging keeps the order

    # nvbench's layout: one column per sweep axis (N; M is fixed, said once above the table)
    axes = api.client.get(f"/jobs/{job_id}?order=index&table=axes", headers=api.admin).text
    table = axes.split('id="comparison-table"', 1)[1].split("</table>", 1)[0]
    assert re.findall(r'<th rowspan="2" class="axis">([^<]*)</th>', table) == ["N"]
    values = re.findall(r'<td class="axis"><a [^>]*>([^<]*)</a></td>', table)
    assert [html.unescape(v) for v in values] == [str(c["params"]["N"]) for c in comparison["cells"][:4]]
    assert XSS not in axes and _rows(axes) == labels[:4]  # each row still links its timeline
    assert 'href="?order=slowest&amp;table=axes"' in axes and 'id="table-layout"' in axes
    assert 'class="axis"' not in api.client.get(f"/jobs/{job_id}", headers=api.admin).text


def test_timeline_of_the_chosen_cell_only(api, small_pages) -> None:  # type: ignore[no-untyped-def]
    job_id = _post_sweep(api)
    posted = _sweep_result(job_id)
    first = _figure(api.client.get(f"/jobs/{job_id}", headers=api.admin).text, "fig-timeline")
    assert "cell 0" in first["layout"]["title"]["text"]
    page = api.client.get(f"/jobs/{job_id}?cell=7&order=slowest", headers=api.admin).text
    timeline = _figure(page, "fig-timeline")
    assert "cell 7" in timeline["layout"]["title"]["text"]
    cell = posted.cells[7].samples
    want = sorted((s.round, s.position, s.duration_ns) for s in cell.rows() if s.variant == "baseline")
    assert timeline["data"][0]["y"] == pytest.approx([d / 1e3 for _, _, d in want])  # µs, execution order
    assert "throttled" in [t["name"] for t in timeline["data"]]  # factories throttle one sample per cell
    # more cells than TIMELINE_LINKS: previous/next links that keep the table's order
    assert 'id="timeline-previous" href="?order=slowest&amp;cell=6#timeline"' in page
    assert 'id="timeline-next" href="?order=slowest&amp;cell=8#timeline"' in page


def test_comparison_pending_until_a_compare_worker_stores_it(api, small_pages, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A result whose comparison is queued reads "comparing…" (the page never computes it, however
    old the result), then the table once a compare worker stored it."""
    job_id = _post_sweep(api)
    with api.factory.begin() as session:  # as right after the ingest: the task queued, nothing stored
        result_id = session.scalar(select(models.Result.id).where(models.Result.job_id == job_id))
        old = datetime.now(UTC) - timedelta(days=1)
        session.execute(update(models.Result).where(models.Result.job_id == job_id)
                        .values(comparison=null(), received_at=old))  # fmt: skip
        compare_queue.enqueue(session, result_id=result_id, job_id=job_id, max_attempts=3)
    calls = []
    real = stats.compare
    monkeypatch.setattr(stats, "compare", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(2):
        pending = api.client.get(f"/jobs/{job_id}", headers=api.admin)
        assert pending.status_code == 200
        assert 'id="comparison-pending"' in pending.text and 'http-equiv="refresh"' in pending.text
        assert "comparing…" in pending.text
        assert 'id="comparison-table"' not in pending.text and "raw samples (CSV)" in pending.text
    assert calls == []
    assert api.compare().done == 1
    assert calls == [1]  # the worker's
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin)
    assert page.status_code == 200 and 'id="comparison-pending"' not in page.text
    assert len(_rows(page.text)) == 4
    assert calls == [1]


def test_cached_page_follows_an_explicit_rejudgement(api, small_pages) -> None:  # type: ignore[no-untyped-def]
    """A result is judged once: readings that arrive later do not change its page; an explicit,
    dated re-judgement does, and the cached page follows it at once."""
    node = "h200-node-1"
    sick = [h200x2_report(10 + i, copy_scale=(1.0, 0.7)).model_copy(update={"phase": phase})
            for i, phase in enumerate(("before", "after"))]  # fmt: skip
    job_id = _post_sweep(api, hostname=node, probes=sick)
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin).text
    assert "node-health-note" not in page  # no band yet: nothing to judge the probes by
    runner = api.runner(node)  # the node's own runner: a token reports for its node only
    for minute in range(4):  # earlier healthy readings, posted late, make the band of the job's day
        report = h200x2_report(minute)
        r = api.client.post(f"/api/v1/nodes/{node}/probes", content=report.model_dump_json(),
                            headers={**runner, "content-type": "application/json"})  # fmt: skip
        assert r.status_code == 201, r.text
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin).text
    assert "node-health-note" not in page  # judged once: what arrived later changes nothing
    r = api.client.post(f"/api/v1/jobs/{job_id}/health", headers=api.admin)
    assert r.status_code == 200, r.text
    assert [j["trigger"] for j in r.json()["data"]] == ["ingest", "rejudge"]
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin).text
    assert "node-health-note" in page and "copy GPU 1" in page and "re-judged on" in page
    assert "cells 1–4 of 10 (10 flagged)" in page  # the flag reaches every cell


@pytest.mark.parametrize(
    "query, field",
    [("order=bogus", "order"), ("offset=-1", "offset"), ("cell=-2", "cell"), ("table=wide", "table")],
)
def test_bad_query_is_a_422_naming_the_field(api, query: str, field: str) -> None:  # type: ignore[no-untyped-def]
    job_id = api.submit()
    r = api.client.get(f"/jobs/{job_id}?{query}", headers=api.admin)
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["query", field]


def test_load_cell_samples_reads_one_cell(api) -> None:  # type: ignore[no-untyped-def]
    job_id = _post_sweep(api)
    posted = _sweep_result(job_id)
    with api.factory() as session:
        got = crud.load_cell_samples(session=session, job_id=job_id, cell_index=3)
        assert got is not None and got.model_dump() == posted.cells[3].samples.model_dump()
        assert crud.load_cell_samples(session=session, job_id=job_id, cell_index=CELLS) is None
        assert crud.load_cell_samples(session=session, job_id=job_id + 1000, cell_index=0) is None


def test_wrong_under_timing_reads_incorrect_with_its_reason_and_timed_checks(api) -> None:  # type: ignore[no-untyped-def]
    """A candidate right when checked eagerly and wrong in the sample checked through the timer:
    ``incorrect`` on the page with the finding as the reason, the checked samples in their own
    table, the timing greyed; the jobs list counts it in red."""
    runner = api.runner("node-a")
    spec = spec_dict(sweep={"M": [4], "N": [64, 128]})
    job_id = api.submit(spec)
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    result = job_result(job_id, spec=spec, key=f"timed-checks-{job_id}")
    finding = Reason(
        code="wrong-under-timing",
        side="candidate",
        message="candidate: wrong under cuda-graph replay: 64/256 elements outside rtol=1e-05",
    )
    ok = TimedCheck(timer="cuda-graph", round=3, seed=11, launches=8, duration_ns=812.0, passed=True)
    bad = TimedCheck(
        timer="cuda-graph",
        round=3,
        seed=11,
        launches=8,
        duration_ns=790.0,
        passed=False,
        correctness=CorrectnessResult(passed=False, rel_error=0.25),
        findings=[finding],
    )
    cells = [
        result.cells[0].model_copy(update={"timed_checks": {"baseline": [ok], "candidate": [bad]}}),
        result.cells[1],
    ]
    posted = api.post_result(job_id, result.model_copy(update={"cells": cells}), runner)
    assert posted.status_code == 201, posted.text
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()
    assert [c["verdict"] for c in comparison["cells"]][0] == "incorrect"

    page = html.unescape(api.client.get(f"/jobs/{job_id}", headers=api.admin).text)
    assert page.count('<span class="badge verdict-incorrect">incorrect</span>') == 1
    assert f'<span class="reason-verdict">incorrect</span>: {finding.message}</td>' in page
    table = page.split('id="timed-checks-table"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)[1:]
    cols = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows]
    assert [c[:6] for c in cols] == [
        ["M=4, N=64", "baseline", "cuda-graph", "3", "11", "8"],
        ["M=4, N=64", "candidate", "cuda-graph", "3", "11", "8"],
    ]
    assert "pass" in cols[0][7] and "fail" in cols[1][7] and cols[1][8] == "2.50e-01"
    assert f"<code>wrong-under-timing</code> {finding.message}" in cols[1][9]
    # the checked samples are folded unless one failed: here one did, so they are open and say so
    assert '<details id="timed-checks-details" open>' in page
    assert '2 checked samples: <span class="badge fail">1 failed</span></summary>' in page
    job_ok = api.submit(spec)
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    all_pass = cells[0].model_copy(update={"timed_checks": {"baseline": [ok], "candidate": [ok]}})
    passing = result.model_copy(
        update={"cells": [all_pass, cells[1]], "idempotency_key": f"timed-ok-{job_id}", "job_id": job_ok}
    )
    assert api.post_result(job_ok, passing, runner).status_code == 201
    folded = html.unescape(api.client.get(f"/jobs/{job_ok}", headers=api.admin).text)
    assert '<details id="timed-checks-details">' in folded and "2 checked samples: all passed" in folded
    row = page.split('data-cell="0"', 1)[1].split("</tr>", 1)[0]
    assert row.count('class="num void-timing"') == 2 and 'class="num nowrap void-timing"' in row
    listing = api.client.get("/", headers=api.admin).text
    assert '<span class="badge verdict-incorrect" title="1 cell(s) incorrect">1 incorrect</span>' in listing


def test_an_incorrect_cell_shows_the_tolerance_it_failed_and_old_results_their_numbers(api) -> None:  # type: ignore[no-untyped-def]
    """The rule a failing output was held to, with its sources, in the cell's reason and in the
    correctness table; a result stored before the rule was recorded shows its rtol and atol."""
    import torch

    from kernelab.kernels.check import check_output
    from kernelab.kernels.tolerances import Reduction, Tolerance

    runner = api.runner("node-a")
    spec = spec_dict(sweep={"M": [4], "N": [64]})
    job_id = api.submit(spec)
    assert api.client.post("/api/v1/runners/claim", json={}, headers=runner).status_code == 200
    result = job_result(job_id, spec=spec, key=f"tolerance-{job_id}")
    ref = torch.randn(64, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    rule = Tolerance(
        rtol=1.3e-6, atol=1e-5, source="float32 defaults of torch.testing", reduction=Reduction(length=512)
    )
    bad = check_output((ref + 0.5).float(), ref, rule)
    bad.repeats = RepeatCheck(runs=2, failures=2)
    old = CorrectnessResult.model_validate(
        {
            "passed": True,
            "rel_error": 1e-7,
            "rtol": 1e-5,
            "atol": 1e-6,
            "message": "ok",
            "repeats": {"runs": 2},
        }
    )
    assert old.tolerance == ""  # stored before it was recorded: still readable
    cells = [result.cells[0].model_copy(update={"correctness": {"baseline": old, "candidate": bad}})]
    posted = api.post_result(job_id, result.model_copy(update={"cells": cells}), runner)
    assert posted.status_code == 201, posted.text
    comparison = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()
    assert comparison["cells"][0]["verdict"] == "incorrect"

    page = html.unescape(api.client.get(f"/jobs/{job_id}", headers=api.admin).text)
    assert f"candidate: {bad.message}" in page and "[float32 sums of 512]" in bad.message
    table = page.split('id="correctness-table"', 1)[1].split("</table>", 1)[0]
    tolerances = re.findall(r'<td class="tolerance">(.*?)</td>', table, re.S)
    assert tolerances == ["rtol 1.00e-05, atol 1.00e-06", bad.tolerance]
