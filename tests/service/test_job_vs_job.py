"""Job vs job through the real app (SQLite and PostgreSQL): cells matched by parameters, the
unpaired statistics on stored samples, a wrong side outranking speed, both nodes' health, and the
4xx answers (unknown job, no comparison yet, other benchmark, bad field); a pair above the
inline bound computed by a compare worker (202 until then)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from test_history import H200, _post_job

from kernelab.service import job_vs_job
from kernelab.service.schemas import JobResult


def _compare(api, a: int, b: int, **params: Any) -> Any:  # type: ignore[no-untyped-def]
    return api.client.get("/api/v1/compare", params={"a": a, "b": b, **params}, headers=api.admin)


def test_a_slower_job_is_slower_cell_by_cell_with_both_nodes(api) -> None:  # type: ignore[no-untyped-def]
    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b = _post_job(api, hostname="h200-b", model=H200, base_ns=1300.0, days=1)
    r = _compare(api, a, b)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["side"] == "candidate" and "unpaired" in body["method"]
    assert (body["a"]["node_name"], body["b"]["node_name"]) == ("h200-a", "h200-b")
    assert body["a"]["health"] is not None and body["b"]["health"] is not None
    assert len(body["cells"]) == 2 and body["only_in_a"] == body["only_in_b"] == []
    for cell in body["cells"]:
        assert cell["verdict"] == "slower", cell
        assert 25 < cell["delta_pct"] < 35 and cell["ci_low"] > 1.0
        assert cell["hl_shift_ns"] > 0 and cell["p_adjusted"] is not None
    same = _compare(api, a, a).json()
    assert {c["verdict"] for c in same["cells"]} == {"same"}
    page = api.client.get("/compare", params={"a": a, "b": b}, headers=api.admin)
    assert page.status_code == 200 and "h200-b" in page.text and 'id="compare-table"' in page.text


def test_a_wrong_side_in_either_job_outranks_its_speed(api) -> None:  # type: ignore[no-untyped-def]
    def wrong_candidate(result: JobResult) -> JobResult:
        cells = []
        for c in result.cells:
            bad = c.correctness["candidate"].model_copy(update={"passed": False, "message": "FAIL: rows 0-3"})
            cells.append(c.model_copy(update={"correctness": {**c.correctness, "candidate": bad}}))
        return result.model_copy(update={"cells": cells})

    a = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0)
    b = _post_job(api, hostname="h200-a", model=H200, base_ns=500.0, days=1, mutate=wrong_candidate)
    cells = _compare(api, a, b).json()["cells"]
    assert {c["verdict"] for c in cells} == {"incorrect"}
    assert all(c["timing_verdict"] == "faster" and "job B" in c["reasons"][0]["message"] for c in cells)
    baselines = _compare(api, a, b, side="baseline").json()["cells"]  # the baseline side was right
    assert {c["verdict"] for c in baselines} == {"faster"}


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

    from kernelab.service import verdicts
    from kernelab.service.models import CompareTask

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
