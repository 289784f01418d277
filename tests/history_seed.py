"""Results with a planted change, posted to a real server as runners post them: the history,
regression-list and job-vs-job tests of the CLI (``tests/runners``) and of the dashboard
(``tests/web``) read what these jobs stored.

``seed`` submits ``len(medians_ns)`` ordinary softmax jobs, claims each with a runner registered
on a node of ``gpu_model``, and posts a ``JobResult`` whose two sides are interleaved ABBA rounds
around ``medians_ns[i]`` (the candidate 20% faster), measured one day apart. The numbers are
seeded draws: the planted step is the data, not the outcome a test asserts."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import httpx
import numpy as np

from kernelab.service.contract.schemas import (
    CellResult,
    CorrectnessResult,
    JobResult,
    JobSpec,
    NodeInfo,
    Sample,
    Work,
)

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
ROUNDS = 12


def spec(name: str) -> dict[str, object]:
    return {"name": name, "benchmark": "softmax", "device": "cpu", "baseline": {"variant": "torch"},
            "candidate": {"variant": "triton"}, "sweep": {"M": [4], "N": [64]},
            "measurement": {"min_rounds": 4, "max_rounds": 40}}  # fmt: skip


def _samples(base_ns: float, seed: int, baseline_ns: float | None = None) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for r in range(ROUNDS):
        order = ("baseline", "candidate") if r % 2 == 0 else ("candidate", "baseline")
        for position, variant in enumerate(order):
            centre = base_ns * 0.8 if variant == "candidate" else (baseline_ns or base_ns)
            out.append(Sample(variant=variant, round=r, position=position,  # type: ignore[arg-type]
                              duration_ns=float(centre * rng.lognormal(0.0, 0.01))))  # fmt: skip
    return out


def result(
    job_id: int, job_spec: JobSpec, *, base_ns: float, day: int, node: str, gpu_model: str,
    baseline_ns: float | None = None,
) -> JobResult:  # fmt: skip
    """One job's result: every cell of ``job_spec`` at ``base_ns`` (the baseline's median, or
    ``baseline_ns`` where given; the candidate at 0.8 ``base_ns``), correct."""
    ok = CorrectnessResult(passed=True, rel_error=1e-7, max_abs_error=1e-8, cosine_similarity=1.0,
                           rtol=1e-5, atol=1e-6)  # fmt: skip
    work = Work(flops=1e3, bytes_read=1e3, bytes_written=1e3)
    cells = [CellResult(index=i, params=p, work={"baseline": work, "candidate": work},
                        samples=_samples(base_ns, seed=1000 * day + i, baseline_ns=baseline_ns),
                        correctness={"baseline": ok, "candidate": ok})
             for i, p in enumerate(job_spec.cells("cpu"))]  # fmt: skip
    start = T0 + timedelta(days=day)
    return JobResult(
        idempotency_key=f"history-seed-{node}-{job_id}", job_id=job_id, spec=job_spec, timer="perf_counter",
        node=NodeInfo(hostname=node, device_type="cpu", device_name=gpu_model, driver_version="570.86"),
        started_at=start, finished_at=start + timedelta(seconds=10), cells=cells,
    )  # fmt: skip


def seed(base_url: str, admin_token: str, medians_ns: list[float], *, node: str, gpu_model: str,
         name: str = "history seed", baseline_ns: float | None = None) -> list[int]:  # fmt: skip
    """Post one job per median (module docstring); returns the job ids, oldest first. Waits for
    nothing: the caller waits for the comparisons (``compare_wait`` or ``api.compare``).
    ``baseline_ns``: the baseline stays at this median in every job, so a step in ``medians_ns``
    is the candidate's own (a change of its code against the baseline every job ran); else both
    sides step together (the whole job moved: a node or platform change)."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    ids = []
    with httpx.Client(base_url=f"{base_url}/api/v1", timeout=60.0) as api:
        reg = api.post("/runners/register", headers=admin, json={"name": f"{node}-runner"})
        assert reg.status_code == 200, reg.text
        runner = {"Authorization": f"Bearer {reg.json()['token']}"}
        for day, base_ns in enumerate(medians_ns):
            job = api.post("/jobs", json=spec(f"{name} {day}"), headers=admin)
            assert job.status_code == 201, job.text
            claim = api.post("/runners/claim", json={}, headers=runner)
            assert claim.status_code == 200 and claim.json()["job_id"] == job.json()["id"], claim.text
            job_id = claim.json()["job_id"]
            posted = result(job_id, JobSpec.model_validate(claim.json()["spec"]), base_ns=base_ns, day=day,
                            node=node, gpu_model=gpu_model, baseline_ns=baseline_ns)  # fmt: skip
            r = api.post(f"/jobs/{job_id}/results", json=posted.model_dump(mode="json"), headers=runner)
            assert r.status_code == 201, r.text
            ids.append(job_id)
    return ids


def wait_compared(base_url: str, admin_token: str, job_ids: list[int], deadline_s: float = 300.0) -> None:
    """Poll each job's ``comparison_status`` (the protocol, not a duration) until it is not
    ``comparing``; fails after ``deadline_s``."""
    admin = {"Authorization": f"Bearer {admin_token}"}
    end = time.monotonic() + deadline_s
    with httpx.Client(base_url=f"{base_url}/api/v1", timeout=60.0, headers=admin) as api:
        for job_id in job_ids:
            while api.get(f"/jobs/{job_id}").json()["comparison_status"] == "comparing":
                assert time.monotonic() < end, f"job {job_id} still comparing"
                time.sleep(0.1)
