"""A bisect: the commits between a good and a bad revision, one revision A/B job per step
(``kernelab bisect``, ``kernelab.runners.bisect``; stored by ``kernelab.service.server.bisects``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from kernelab.service.contract.schemas.spec import JobSpec
from kernelab.service.contract.schemas.types import (
    AtDoor,
    Count32,
    Finite,
    Message,
    Name,
    RowId,
    StepOutcome,
    Text,
    UtcDatetime,
    Verdict,
    _Strict,
)

BisectStatus = Literal["running", "found", "stopped"]
StepRole = Literal["ends", "midpoint"]
Sha = Annotated[Text, Field(min_length=4, pattern=r"^[0-9a-f]+$"), AtDoor(max_length=64)]
MAX_BISECT_COMMITS = 100_000  # commits between the ends: 17 steps
MAX_BISECT_STEPS = 200  # every step retried once: 2 x (17 + 1), with room


class BisectCommit(_Strict):
    """One commit of the range: its sha and subject line."""

    sha: Sha
    subject: Annotated[Text, AtDoor(max_length=500)] = ""


class BisectCreate(_Strict):
    """What ``kernelab bisect`` records before its first step: the ends as given and as resolved,
    the commits after ``good`` up to and including ``bad`` (oldest first; ``bad`` last), and the
    spec every step runs (its sides' sources set per step)."""

    name: Name = ""
    repo: Annotated[Text, Field(min_length=1), AtDoor(max_length=4096)]
    good: Sha
    bad: Sha
    good_ref: Annotated[Text, Field(min_length=1), AtDoor(max_length=500)]
    bad_ref: Annotated[Text, Field(min_length=1), AtDoor(max_length=500)]
    commits: list[BisectCommit] = Field(min_length=1, max_length=MAX_BISECT_COMMITS)
    spec: JobSpec


class BisectStep(_Strict):
    """One step: revision job ``job_id`` timed ``commit`` (candidate) against the good end
    (baseline). ``role``: ``ends`` (the bad end against the good end, first) or ``midpoint``;
    ``attempt`` 1, or 2 for the retry of an undecided step. ``outcome``: ``bad`` (a cell is
    ``slower``), ``good`` (every cell ``same`` or ``faster``), ``undecided`` (anything else: the
    job failed or a cell is failed/incorrect/nondeterministic/implausible/inconclusive);
    ``reason`` says why. The deciding cell's ``ratio`` (candidate/baseline median) and its 95 %
    CI (``ci_low``, ``ci_high``), ``verdict`` and ``cell`` label; ``summary``: cells per verdict."""

    job_id: RowId = Field(description="the step's revision job (an id of jobs: at most 2**31 - 1)")
    commit: Sha
    role: StepRole = "midpoint"
    attempt: int = Field(default=1, ge=1, le=2)
    outcome: StepOutcome
    reason: Message = ""
    verdict: Verdict | None = None
    cell: Annotated[Text, AtDoor(max_length=500)] = ""
    ratio: Finite | None = None
    ci_low: Finite | None = None
    ci_high: Finite | None = None
    summary: dict[Annotated[Text, AtDoor(max_length=32)], Count32] = Field(
        default_factory=dict, max_length=16
    )


class BisectFinish(_Strict):
    """How a bisect ended: ``found`` (``first_bad`` names the commit) or ``stopped`` (``message``
    says where and why it could not decide)."""

    status: Literal["found", "stopped"]
    first_bad: Sha | None = None
    message: Annotated[Text, AtDoor(max_length=4000)] = ""


class BisectPublic(BaseModel):
    id: int
    name: str
    benchmark: str
    repo: str
    good: str
    bad: str
    good_ref: str
    bad_ref: str
    commits: list[BisectCommit]
    spec: JobSpec
    steps: list[BisectStep]
    status: BisectStatus
    first_bad: str | None = None
    message: str | None = None
    created_at: UtcDatetime
    finished_at: UtcDatetime | None = None


class BisectsPage(BaseModel):
    data: list[BisectPublic]
    count: int
