"""History compares like with like, excludes what the notes say it excludes, covers ordinary jobs,
and each result is judged once (a re-judgement is explicit and dated): through the real app on
SQLite and PostgreSQL, results posted as a runner posts them."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from factories import T0, job_result, probe_report, spec_dict, wrong_candidate
from health_fixtures import h200x2_report

from kernelab.service.contract.schemas import JobResult, NodeInfo, ProbeReport
from kernelab.service.judge import stats

H200 = "NVIDIA H200"
A100 = "NVIDIA A100-SXM4-80GB"
CELL = "M=4, N=64"


def _post_job(api, *, hostname: str, model: str, base_ns: float, days: float, driver: str = "570.86",  # type: ignore[no-untyped-def]
              spec: dict[str, Any] | None = None, probes: list[ProbeReport] | None = None,
              mutate: Any = None) -> int:  # fmt: skip
    """Submit, claim and post one ordinary torch-vs-triton job measured on ``hostname`` (a GPU of
    ``model``), ``days`` after T0; the baseline at ``base_ns``, the candidate 20% faster."""
    spec = spec or spec_dict()
    job_id = api.submit(spec)
    runner = api.runner(hostname)
    claim = api.client.post("/api/v1/runners/claim", json={}, headers=runner)
    assert claim.status_code == 200 and claim.json()["job_id"] == job_id, claim.text
    result = job_result(job_id, key=f"history-{job_id:05d}", spec=spec, hostname=hostname)
    shift = timedelta(days=days)
    cells = []
    for cell in result.cells:
        scale = base_ns / 1000.0 / (cell.index + 1)
        durations = cell.samples.duration_ns * scale
        samples = cell.samples.model_copy(update={"duration_ns": durations})
        cells.append(cell.model_copy(update={"samples": samples}))
    node = NodeInfo(hostname=hostname, device_type="cpu", device_name=model, driver_version=driver)
    moved = [p.model_copy(update={"taken_at": p.taken_at + shift}) for p in (probes or result.probes)]
    result = result.model_copy(update={
        "cells": cells, "node": node, "started_at": result.started_at + shift,
        "finished_at": result.finished_at + shift, "probes": moved,
    })  # fmt: skip
    if mutate is not None:
        result = mutate(result)
    r = api.post_result(job_id, result, runner)
    assert r.status_code == 201, r.text
    return job_id


def _history(api, **params: Any) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = api.client.get("/api/v1/history", params={"benchmark": "softmax", **params}, headers=api.admin)
    assert r.status_code == 200, r.text
    page = api.client.get("/history", params={"benchmark": "softmax", **params}, headers=api.admin)
    assert page.status_code == 200, page.text
    return r.json() | {"html": page.text}


def _line(history: dict[str, Any], *, code: str, model: str, state: str = "cold") -> list[dict[str, Any]]:
    (line,) = [s for s in history["series"] if (s["code"], s["cell"], s["gpu_model"], s["state"])
               == (code, CELL, model, state)]  # fmt: skip
    return line["points"]


def test_lines_are_per_gpu_model_driver_timer_and_state(api) -> None:  # type: ignore[no-untyped-def]
    """H200 at ~100 us, then an A100 at 51 us: two lines, the A100 point is the first of its own
    line (never a 2x improvement); a driver change computes no change; a second H200 job with the
    same driver does; a warm (no L2 flush) job is a line of its own. Ordinary jobs, no revisions."""
    first = _post_job(api, hostname="h200-a", model=H200, base_ns=100_000.0, days=0)
    _post_job(api, hostname="a100-a", model=A100, base_ns=51_000.0, days=1)
    _post_job(api, hostname="h200-a", model=H200, base_ns=90_000.0, days=2, driver="575.51")
    _post_job(api, hostname="h200-b", model=H200, base_ns=81_000.0, days=3, driver="575.51")
    warm = spec_dict(measurement={"min_rounds": 4, "max_rounds": 8, "l2_flush": False})
    _post_job(api, hostname="h200-b", model=H200, base_ns=80_000.0, days=4, driver="575.51", spec=warm)
    history = _history(api)
    assert history["results"] == 5 and history["excluded"] == {}
    models = {(s["gpu_model"], s["state"]) for s in history["series"]}
    assert models == {(H200, "cold"), (A100, "cold"), (H200, "warm")}
    for series in history["series"]:
        assert len({p["gpu_model"] for p in series["points"]}) == 1
        assert len({(p["timer"], p["state"]) for p in series["points"]}) == 1
    h200 = _line(history, code="torch", model=H200)
    assert [p["job_id"] for p in h200][0] == first
    assert [p["change_reason"] for p in h200] == ["first-point", "fingerprint-changed", None]
    assert abs(h200[2]["change_pct"] - (81 / 90 - 1) * 100) < 0.5
    (a100,) = _line(history, code="torch", model=A100)
    assert a100["change_pct"] is None and a100["change_reason"] == "first-point"
    (warm_point,) = _line(history, code="torch", model=H200, state="warm")
    assert warm_point["change_reason"] == "first-point"
    html = history["html"]
    assert 'id="fig-history"' in html and A100 in html and "fingerprint-changed" in html
    assert "perf_counter/cold" in html and "perf_counter/warm" in html


def _healthy_band(api, node: str) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner(node)
    for minutes in (30, 20, 10, 5):
        report = probe_report("adhoc", taken_at=T0 - timedelta(minutes=minutes), gbps=20.0 + 0.01 * minutes)
        r = api.client.post(f"/api/v1/nodes/{node}/probes", content=report.model_dump_json(),
                            headers={**runner, "content-type": "application/json"})  # fmt: skip
        assert r.status_code == 201, r.text


def _slow_probes() -> list[ProbeReport]:
    """Before/after probes of a job at half the copy bandwidth of ``_healthy_band``."""
    after = T0 + timedelta(seconds=13)
    return [probe_report("before", gbps=10.0), probe_report("after", taken_at=after, gbps=10.0)]


def test_a_result_on_a_flagged_node_is_excluded_from_history_as_its_note_says(api) -> None:  # type: ignore[no-untyped-def]
    _healthy_band(api, "cpu-a")
    _post_job(api, hostname="cpu-a", model="test-cpu", base_ns=1000.0, days=0)
    slow = _slow_probes()
    flagged = _post_job(api, hostname="cpu-a", model="test-cpu", base_ns=900.0, days=0, probes=slow)
    comparison = api.client.get(f"/api/v1/jobs/{flagged}/comparison", headers=api.admin).json()
    assert "degraded-node" in comparison["flags"]
    (note,) = comparison["notes"]
    assert "History views and the changes they compute exclude this result by default" in note
    history = _history(api)
    assert history["excluded"] == {"node-flagged": 4}  # two cells x two sides
    shown = {p["job_id"] for s in history["series"] for p in s["points"]}
    assert flagged not in shown
    assert "Left out by default: 4 points" in history["html"] and "include_excluded=true" in history["html"]
    everything = _history(api, include_excluded="true")
    points = [p for s in everything["series"] for p in s["points"] if p["job_id"] == flagged]
    assert len(points) == 4 and {p["excluded"] for p in points} == {"node-flagged"}
    assert {p["change_reason"] for p in points} == {"excluded"}  # never a baseline of a change
    assert f"#{flagged}" in everything["html"]


def test_a_wrong_side_is_left_out_of_history(api) -> None:  # type: ignore[no-untyped-def]
    job_id = _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0, mutate=wrong_candidate)
    history = _history(api)
    assert history["excluded"] == {"problem-verdict": 2}
    sides = {p["side"] for s in history["series"] for p in s["points"] if p["job_id"] == job_id}
    assert sides == {"baseline"}


def test_a_result_is_judged_once_and_rejudged_explicitly(api) -> None:  # type: ignore[no-untyped-def]
    """The note a degraded result got at ingest ("... 4 healthy probes") stays the same when more
    healthy reports of the job's day arrive later; an explicit re-judgement is dated and says so."""
    _healthy_band(api, "cpu-a")
    slow = _slow_probes()
    job_id = _post_job(api, hostname="cpu-a", model="test-cpu", base_ns=1000.0, days=0, probes=slow)
    first = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()["notes"]
    assert "4 healthy probes" in first[0]
    judged = api.client.get(f"/api/v1/jobs/{job_id}/health", headers=api.admin).json()
    assert [j["trigger"] for j in judged["data"]] == ["ingest"]
    assert judged["current"]["as_of"] == (T0 + timedelta(seconds=13)).isoformat().replace("+00:00", "Z")
    runner = api.runner("cpu-a")
    late = probe_report("adhoc", taken_at=T0 - timedelta(minutes=1), gbps=20.3)  # the job's day, posted later
    api.client.post("/api/v1/nodes/cpu-a/probes", content=late.model_dump_json(),
                    headers={**runner, "content-type": "application/json"})  # fmt: skip
    _post_job(api, hostname="cpu-b", model="test-cpu", base_ns=1000.0, days=0)  # the fleet grows too
    for _ in range(2):
        again = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()["notes"]
        assert again == first
        report = api.client.get(f"/api/v1/jobs/{job_id}/report.md", headers=api.admin).text
        assert "4 healthy probes" in report and "5 healthy probes" not in report
    assert api.client.post(f"/api/v1/jobs/{job_id}/health", headers=api.token("read")).status_code == 403
    r = api.client.post(f"/api/v1/jobs/{job_id}/health", headers=api.admin)
    assert r.status_code == 200, r.text
    body = r.json()
    assert [j["trigger"] for j in body["data"]] == ["ingest", "rejudge"]
    at = datetime.fromisoformat  # instants, not text: RFC 3339 leaves out a zero fraction
    assert at(body["current"]["judged_at"]) > at(body["data"][0]["judged_at"])
    notes = api.client.get(f"/api/v1/jobs/{job_id}/comparison", headers=api.admin).json()["notes"]
    assert "5 healthy probes" in notes[0] and "re-judged on" in notes[-1] and "first judged" in notes[-1]
    page = api.client.get(f"/jobs/{job_id}", headers=api.admin).text
    assert "re-judged on" in page


def test_history_of_revision_jobs_is_per_branch(api) -> None:  # type: ignore[no-untyped-def]
    from kernelab.service.contract.schemas import RevisionInfo, RevisionsInfo

    def revisions(result: JobResult) -> JobResult:
        revs = RevisionsInfo(baseline=RevisionInfo(branch="main", sha="a" * 40),
                             candidate=RevisionInfo(branch="fast", sha="b" * 40))  # fmt: skip
        return result.model_copy(update={"node": result.node.model_copy(update={"revisions": revs})})

    _post_job(api, hostname="h200-a", model=H200, base_ns=1000.0, days=0, mutate=revisions)
    _post_job(api, hostname="h200-a", model=H200, base_ns=990.0, days=1, mutate=revisions)
    history = _history(api)
    assert {s["code"] for s in history["series"]} == {"main", "fast"}
    main = _line(history, code="main", model=H200)
    assert [p["sha"] for p in main] == ["a" * 40] * 2 and main[1]["change_pct"] is not None
    assert "<code>aaaaaaaaaaaa</code>" in history["html"]


def test_history_points_match_the_comparison(api) -> None:  # type: ignore[no-untyped-def]
    job_id = _post_job(api, hostname="h200-a", model=H200, base_ns=2000.0, days=0)
    with api.factory() as session:
        from kernelab.service.server import crud

        result = crud.load_result(session=session, job_id=job_id)
    assert result is not None
    expected = {(c.label, side): getattr(c, side).median_ns
                for c in stats.compare(result).cells for side in ("baseline", "candidate")}  # fmt: skip
    history = _history(api)
    got = {(p["cell"], p["side"]): p["median_ns"] for s in history["series"] for p in s["points"]}
    assert got == expected


def test_an_empty_history_renders(api) -> None:  # type: ignore[no-untyped-def]
    history = _history(api)
    assert history["series"] == [] and 'id="no-history"' in history["html"]
    assert h200x2_report is not None
