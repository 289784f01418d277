"""Job vs job through the real app (SQLite and PostgreSQL): cells matched by parameters, the
unpaired statistics on stored samples, a wrong side outranking speed, both nodes' health, and the
4xx answers (unknown job, no comparison yet, other benchmark, bad field); a pair above the
inline bound computed by a compare worker (202 until then)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from factories import wrong_candidate
from test_history import H200, _post_job

from kernelab.service.contract.schemas import JobResult
from kernelab.service.server import job_vs_job


def _compare(api, a: int, b: int, **params: Any) -> Any:  # type: ignore[no-untyped-def]
    return api.client.get("/api/v1/compare", params={"a": a, "b": b, **params}, headers=api.admin)


def _scaled(side: str, factor: float) -> Any:
    """A ``mutate`` for ``_post_job``: ``side``'s samples ``factor`` times as long."""

    def mutate(result: JobResult) -> JobResult:
        cells = []
        for c in result.cells:
            times = np.where(c.samples.variant == (side == "candidate"), c.samples.duration_ns * factor,
                             c.samples.duration_ns)  # fmt: skip
            cells.append(
                c.model_copy(update={"samples": c.samples.model_copy(update={"duration_ns": times})})
            )
        return result.model_copy(update={"cells": cells})

    return mutate


def test_a_slower_candidate_is_slower_against_the_baseline_both_jobs_ran(api) -> None:  # type: ignore[no-untyped-def]
    """Both jobs ran the same baseline (torch): job B's candidate 30% slower relative to it reads
    ``slower`` (basis ``control``: the ratio of the jobs' own ratios), on two nodes."""
    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b = _post_job(
        api, hostname="h200-b", model=H200, base_ns=1000.0, days=1, mutate=_scaled("candidate", 1.3)
    )
    r = _compare(api, a, b)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["side"] == "candidate" and "control" in body["method"]
    assert (body["a"]["node_name"], body["b"]["node_name"]) == ("h200-a", "h200-b")
    assert body["a"]["health"] is not None and body["b"]["health"] is not None
    assert len(body["cells"]) == 2 and body["only_in_a"] == body["only_in_b"] == []
    for cell in body["cells"]:
        assert cell["verdict"] == "slower" and cell["basis"] == "control", cell
        assert 25 < cell["delta_pct"] < 35 and cell["ci_low"] > 1.0
        assert cell["medians_ratio"] == pytest.approx(1.3, rel=0.01)
        assert cell["hl_shift_ns"] > 0 and cell["p_adjusted"] is not None
    same = _compare(api, a, a).json()
    assert {c["verdict"] for c in same["cells"]} == {"same"}
    page = api.client.get("/compare", params={"a": a, "b": b}, headers=api.admin)
    assert page.status_code == 200 and "h200-b" in page.text and 'id="compare-table"' in page.text
    # the page says a slower cell the way every other view does ("1.30× slower"), not "0.769×"
    assert "× slower" in page.text and "× speedup" not in page.text


def test_a_whole_job_that_drifted_is_no_change_of_its_candidate(api) -> None:  # type: ignore[no-untyped-def]
    """Job B ran 30% slower on both sides (a loaded node, a lower clock): its candidate's median is
    30% above job A's, but against the baseline both ran it did not change: ``same``, where the
    unpaired statistics alone read ``slower``."""
    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b = _post_job(api, hostname="h200-a", model=H200, base_ns=1300.0, days=1)
    cells = _compare(api, a, b).json()["cells"]
    assert {(c["verdict"], c["basis"]) for c in cells} == {("same", "control")}, cells
    assert all(c["medians_ratio"] == pytest.approx(1.3, rel=0.01) for c in cells)
    assert all(c["p_value"] < 0.01 for c in cells)  # the within-run test sees the drift as a change


def test_without_a_control_the_stored_runs_decide_or_nothing_does(api) -> None:  # type: ignore[no-untyped-def]
    """The baseline side compared, the candidates differ (triton in A, torch in B): no control. With
    no stored runs of unchanged code the cell is ``inconclusive`` (``no-run-noise``, saying to run
    the baseline again); after four more runs of job A's spec on the node (their medians within
    +-0.15%), the between-run noise decides: an equal baseline reads ``same``, one twice as slow
    ``slower``. A run of the same code that moved a lot widens the noise for every later
    comparison of the cell (it is one of the stored runs)."""
    from factories import spec_dict

    aa, same_sides = spec_dict(candidate={"variant": "torch"}), _scaled("candidate", 1.25)  # an A/A job
    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b_same = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=1, spec=aa, mutate=same_sides)
    cells = _compare(api, a, b_same, side="baseline").json()["cells"]
    assert {(c["verdict"], c["basis"]) for c in cells} == {("inconclusive", "none")}, cells
    (why,) = {c["reasons"][0]["code"] for c in cells}
    assert why == "no-run-noise" and "run the candidate of job A again" in cells[0]["reasons"][0]["message"]
    for k, drift in enumerate([0.9985, 1.001, 1.0015, 0.999]):
        _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0 * drift, days=2 + k)
    cells = _compare(api, a, b_same, side="baseline").json()["cells"]
    assert {(c["verdict"], c["basis"]) for c in cells} == {("same", "run-noise")}, cells
    noise = cells[0]["noise"]
    assert noise["scope"] == "node" and noise["df"] == 6 and noise["runs"] == 8 and noise["sigma_pct"] < 0.3
    b = _post_job(api, hostname="h200-a", model=H200, base_ns=2000.0, days=7, spec=aa, mutate=same_sides)
    cells = _compare(api, a, b, side="baseline").json()["cells"]
    assert {(c["verdict"], c["basis"]) for c in cells} == {("slower", "run-noise")}, cells
    # four runs of triton and five of torch (the repeats and job b_same, whose two sides are one run)
    assert cells[0]["noise"]["df"] == 7 and cells[0]["noise"]["runs"] == 9
    cells = _compare(api, a, b_same, side="baseline").json()["cells"]  # job b is a stored run now
    assert cells[0]["noise"]["sigma_pct"] > 10 and {c["verdict"] for c in cells} == {"inconclusive"}


def test_a_wrong_side_in_either_job_outranks_its_speed(api) -> None:  # type: ignore[no-untyped-def]
    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=1,
                  mutate=lambda r: wrong_candidate(_scaled("candidate", 0.5)(r)))  # fmt: skip
    cells = _compare(api, a, b).json()["cells"]
    assert {c["verdict"] for c in cells} == {"incorrect"}
    assert all(c["timing_verdict"] == "faster" and "job B" in c["reasons"][0]["message"] for c in cells)
    # the baseline side was right, but its control (the candidate) was wrong in job B: no footing
    baselines = _compare(api, a, b, side="baseline").json()["cells"]
    assert {(c["verdict"], c["basis"]) for c in baselines} == {("inconclusive", "none")}


def test_cells_match_by_parameters(api) -> None:  # type: ignore[no-untyped-def]
    from factories import spec_dict

    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=1,
                  spec=spec_dict(sweep={"M": [4], "N": [128, 256]}))  # fmt: skip
    body = _compare(api, a, b).json()
    assert [c["params"]["N"] for c in body["cells"]] == [128]
    assert body["only_in_a"] == ["M=4, N=64"] and body["only_in_b"] == ["M=4, N=256"]


def test_refusals_name_the_field(api) -> None:  # type: ignore[no-untyped-def]
    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    queued = api.submit()
    r = _compare(api, a, 999_999)
    assert r.status_code == 404 and r.json()["detail"][0]["loc"] == ["query", "b"]
    r = _compare(api, queued, a)
    assert r.status_code == 409 and r.json()["detail"][0]["loc"] == ["query", "a"]
    assert _compare(api, a, 0).status_code == 422
    assert _compare(api, a, a, side="both").status_code == 422
    assert api.client.get("/api/v1/compare", params={"a": a, "b": a}).status_code == 401


def test_a_pair_above_the_inline_bound_is_computed_by_a_compare_worker(api) -> None:  # type: ignore[no-untyped-def]
    """202 (REST and page) while queued, one task however often it is asked, the worker's answer
    stored and served (the same numbers as in the request), and queued again when the verdict
    rules' version it was judged by is older."""
    from sqlalchemy import func, select, update

    from kernelab.service.judge import verdicts
    from kernelab.service.server.models import CompareTask

    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b = _post_job(api, hostname="h200-b", model=H200, base_ns=1300.0, days=1)
    inline = _compare(api, a, b).json()  # within the default bound: computed in the request
    settings = api.client.app.state.settings
    api.client.app.state.settings = settings.model_copy(update={"job_vs_job_inline_samples": 10})

    def pair_tasks() -> list[tuple[str, int | None]]:
        with api.factory() as session:
            return list(session.execute(select(CompareTask.status, CompareTask.result_id)
                                        .where(CompareTask.kind == "pair")).all())  # fmt: skip

    for _ in range(2):
        r = _compare(api, a, b)
        assert r.status_code == 202 and r.headers["Retry-After"].isdigit(), r.text
        assert r.json()["status"] == "comparing" and f"job #{b} against job #{a}" in r.json()["detail"]
    page = api.client.get("/compare", params={"a": a, "b": b}, headers=api.admin)
    assert (
        page.status_code == 202
        and 'id="compare-pending"' in page.text
        and 'http-equiv="refresh"' in page.text
    )
    assert pair_tasks() == [("queued", None)]  # asked three times, queued once
    api.compare()  # a compare worker drains the queue
    assert pair_tasks() == [("done", None)]
    stored = _compare(api, a, b)
    assert stored.status_code == 200
    assert stored.json()["cells"] == inline["cells"] and stored.json()["a"]["job_id"] == a
    page = api.client.get("/compare", params={"a": a, "b": b}, headers=api.admin)
    assert page.status_code == 200 and 'id="compare-table"' in page.text
    assert _compare(api, a, b, side="baseline").status_code == 202  # another side: another task
    with api.factory() as session:
        old = {"method_version": verdicts.METHOD_VERSION - 1, "answer": stored.json()}
        session.execute(update(CompareTask).where(CompareTask.kind == "pair", CompareTask.side == "candidate")
                        .values(output=old))  # fmt: skip
        session.commit()
        assert _compare(api, a, b).status_code == 202  # judged by older rules: queued again
        n = session.scalar(select(func.count()).select_from(CompareTask).where(CompareTask.kind == "pair"))
        assert n == 2
    api.compare()
    assert _compare(api, a, b).json()["cells"] == inline["cells"]
    # the node of job A judged again: the stored answer's health is the old one, so it is computed again
    assert api.client.post(f"/api/v1/jobs/{a}/health", headers=api.admin).status_code == 200
    assert _compare(api, a, b).status_code == 202
    api.compare()
    again = _compare(api, a, b).json()
    assert again["a"]["health"]["trigger"] == "rejudge" and again["cells"] == inline["cells"]
    # a worker that failed on the pair: 409 naming it, queued again once PAIR_RETRY_S has passed
    with api.factory() as session:
        session.execute(update(CompareTask).where(CompareTask.kind == "pair", CompareTask.side == "candidate")
                        .values(status="failed", error="MemoryError: the worker ran out", output=None,
                                finished_at=datetime.now(UTC)))  # fmt: skip
        session.commit()
    failed = _compare(api, a, b)
    assert (
        failed.status_code == 409 and "MemoryError: the worker ran out" in failed.json()["detail"][0]["msg"]
    )
    with api.factory() as session:
        long_ago = datetime.now(UTC) - timedelta(seconds=job_vs_job.PAIR_RETRY_S + 60)
        session.execute(update(CompareTask).where(CompareTask.kind == "pair", CompareTask.side == "candidate")
                        .values(finished_at=long_ago))  # fmt: skip
        session.commit()
    assert _compare(api, a, b).status_code == 202
    # above the worker's bound: refused, naming the setting
    api.client.app.state.settings = settings.model_copy(
        update={"job_vs_job_inline_samples": 10, "job_vs_job_max_samples": 20}
    )
    too_large = _compare(api, a, b)
    assert (
        too_large.status_code == 413
        and "KERNELAB_JOB_VS_JOB_MAX_SAMPLES" in too_large.json()["detail"][0]["msg"]
    )
    api.client.app.state.settings = settings
