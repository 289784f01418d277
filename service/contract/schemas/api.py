"""REST payloads of ``/api/v1`` (jobs, attempts, runners, leases)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    Field,
)

from kernelab.service.contract.schemas.adverts import AnySpec, JobProgress
from kernelab.service.contract.schemas.result_job import NodeInfo
from kernelab.service.contract.schemas.types import AtDoor, JobStatus, Text, UtcDatetime, _Strict
from kernelab.service.contract.schemas.workload import GangPublic

# API payloads
# --------------------------------------------------------------------------------------------------


class JobPublic(BaseModel):
    id: int
    name: str
    benchmark: str
    status: JobStatus
    kind: Literal["benchmark", "workload"] = "benchmark"
    spec: AnySpec
    attempts: int
    max_attempts: int
    created_at: UtcDatetime
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    node: str | None = Field(default=None, description="the runner of the latest attempt (its name)")
    node_name: str | None = Field(
        default=None,
        description="the node (hostname) of the latest attempt: its result's, else the runner's bound node; "
        "the key of /api/v1/nodes/{name}",
    )
    error: str | None = None
    summary: dict[str, int] = Field(default_factory=dict)
    comparison_status: Literal["none", "comparing", "ready", "failed"] = Field(
        default="none",
        description="the comparison of the job's result: none (no result), comparing (queued for or "
        "being computed by a compare worker), ready (GET /jobs/{id}/comparison answers it), failed",
    )
    comparison_error: str | None = Field(default=None, description="why the comparison failed")
    waiting_for: str | None = Field(
        default=None,
        description="set while the job is queued and no live runner advertises its benchmark: why it waits",
    )
    progress: JobProgress | None = Field(
        default=None, description="a running job's progress from its runner's last heartbeat with one"
    )
    progress_at: UtcDatetime | None = Field(default=None, description="when that heartbeat arrived")
    rerun_of: int | None = Field(default=None, description="the job this one re-runs (POST /jobs/{id}/rerun)")
    gang: GangPublic | None = Field(
        default=None,
        description="a workload job's runners: the seats of its latest attempt (node rank -> runner)",
    )


class JobsPage(BaseModel):
    data: list[JobPublic]
    count: int


AttemptOutcome = Literal["running", "succeeded", "failed", "expired", "cancelled"]
"""How one claim of a job ended (``models.ATTEMPT_OUTCOMES``); ``running`` while it holds the lease."""


class AttemptPublic(BaseModel):
    """One claim of a job by a runner (a row of ``job_attempts``)."""

    attempt: int = Field(description="1 for the first claim, counting up")
    runner: str | None = Field(default=None, description="runner name; null if the runner was deleted")
    claimed_at: UtcDatetime
    ended_at: UtcDatetime | None = None
    outcome: AttemptOutcome
    error: str | None = None


class AttemptsPage(BaseModel):
    data: list[AttemptPublic]
    count: int


class RunnerRegister(_Strict):
    name: Annotated[Text, Field(min_length=1, pattern=r"^[A-Za-z0-9._:-]+$"), AtDoor(max_length=200)]
    node: NodeInfo | None = None


class RunnerRegistered(BaseModel):
    runner_id: int
    name: Text
    token: Text = Field(description="per-runner bearer token; shown once, stored hashed")


class RunnerIdentity(BaseModel):
    """``GET /runners/me``: the runner a runner token belongs to and the node it is bound to
    (None: not bound yet; ``kernelab.service.server.runner_identity``)."""

    runner_id: int
    name: Text
    node_name: Text | None = None


# --------------------------------------------------------------------------------------------------
