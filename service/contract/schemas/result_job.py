"""A job's whole result: node, revisions, cells, probes (``JobResult``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    Field,
    Strict,
)
from pydantic_core import PydanticCustomError

from kernelab.service.contract.schemas.probes import MAX_DEVICES, ProbeReport
from kernelab.service.contract.schemas.result import CellResult
from kernelab.service.contract.schemas.spec import MAX_CELLS, JobSpec
from kernelab.service.contract.schemas.types import (
    MAX_LIST_ITEMS,
    AtDoor,
    DeviceType,
    ErrorText,
    Hostname,
    Message,
    Name,
    RowId,
    ShortText,
    Size64,
    Text,
    UtcDatetime,
    _Posted,
)


class RevisionInfo(_Posted):
    """One side's code as measured: the revision it came from and the software it ran with.

    ``repo``/``ref``/``branch``/``subdir`` echo the ``SourceSpec`` (all empty when the side used
    the installed code); ``sha`` is the full commit id checked out; ``versions`` maps ``torch``,
    ``triton``, ``cuda``, ``driver``, ``python`` to what the side's worker process saw (None:
    absent).
    """

    repo: Annotated[Text, AtDoor(max_length=1000)] = ""
    ref: Annotated[Text, AtDoor(max_length=250)] = ""
    branch: Annotated[Text, AtDoor(max_length=250)] = ""
    subdir: Annotated[Text, AtDoor(max_length=500)] = ""
    sha: Annotated[Text, AtDoor(max_length=64)] = Field(
        default="", description="history_points.sha: 64 characters"
    )
    versions: Annotated[dict[ShortText, Name | None], AtDoor(max_length=MAX_LIST_ITEMS)] = Field(
        default_factory=dict
    )


class RevisionsInfo(_Posted):
    """Both sides' revisions of an A/B job across source revisions (``NodeInfo.revisions``).

    ``diff_stat`` is ``git diff --stat`` from the baseline's commit to the candidate's (empty when
    the sides come from different repositories or one uses the installed code); ``diff_shortstat``
    its one-line summary ("2 files changed, 5 insertions(+), 1 deletion(-)").
    """

    baseline: RevisionInfo
    candidate: RevisionInfo
    diff_stat: Text = ""
    diff_shortstat: Message = ""


class NodeInfo(_Posted):
    """What the node is: hardware and software fingerprint of a result."""

    hostname: Hostname = Field(description="the node's name (results.node_name)")
    device_type: DeviceType
    device_name: Annotated[Text, AtDoor(max_length=255)] = Field(
        default="", description="the GPU model (history_points.gpu_model: 255 characters)"
    )
    device_count: Annotated[int, Field(ge=0), AtDoor(le=MAX_DEVICES)] = 0
    l2_bytes: Size64 | None = None
    driver_version: Name | None = None
    cuda_version: Name | None = None
    torch_version: Name | None = None
    triton_version: Name | None = None
    python_version: Name = ""
    triton_interpret: bool = False
    revisions: RevisionsInfo | None = Field(
        default=None, description="set for a job whose sides came from git revisions"
    )


RESULT_SCHEMA_VERSION = 2
"""Version of a ``JobResult`` document (a POST body, a runner's spool file, ``kernelab run
--result``), written as its first key ``schema_version`` by every writer (versioned result files
as nvbench's ``nvbench_json/version.py``). 1: no ``schema_version`` key, samples as JSON-list
columns or rows. 2: samples as base64 columns (``kernelab.service.contract.samples``). A reader takes
every version up to its own (an older document is read into the current model: upgraded) and
refuses a newer one (``schema_version_newer``, a 422 naming ``schema_version`` on the server)."""


def _known_schema_version(value: int) -> int:
    if value > RESULT_SCHEMA_VERSION:
        raise PydanticCustomError(
            "schema_version_newer",
            "schema_version {version} is newer than this reader knows (at most {known}): upgrade it",
            {"version": value, "known": RESULT_SCHEMA_VERSION},
        )
    return value


SchemaVersion = Annotated[
    int, Strict(), Field(ge=1), AfterValidator(_known_schema_version), AtDoor(le=RESULT_SCHEMA_VERSION)
]
"""A result document's version: 1 .. ``RESULT_SCHEMA_VERSION`` (a newer one: ``schema_version_newer``)."""
MAX_RESULT_PROBES = 16
"""Most probe reports of one result: a job probes before and after (``kernelab.runners.job``)."""
IdempotencyKey = Annotated[Text, Field(min_length=8), AtDoor(max_length=200)]
"""A result's idempotency key: 8 to 200 characters (``results.idempotency_key``)."""


class ResultHeader(BaseModel):
    """The keys of a ``JobResult`` document a runner reads before it posts the document's bytes
    unchanged (``kernelab.runners.spool``): other keys are ignored, not validated. A document
    without ``schema_version`` is of version 1. Raises ``ValidationError`` for a document that
    is not a JSON object, or (``schema_version_newer``) of a version newer than
    ``RESULT_SCHEMA_VERSION``."""

    schema_version: SchemaVersion = 1
    job_id: int | None = None


class JobResult(_Posted):
    """Everything a runner measured for one job: posted whole, stored whole or not at all.

    ``idempotency_key`` makes a retried post harmless: the server stores the first and answers
    later posts with the same key by pointing at it. ``schema_version``: ``RESULT_SCHEMA_VERSION``
    (a document without it is of version 1 and is read as this version).
    """

    schema_version: SchemaVersion = Field(
        default=RESULT_SCHEMA_VERSION, description="version of this document (1 when left out)"
    )
    idempotency_key: IdempotencyKey
    job_id: RowId | None = None
    spec: JobSpec
    node: NodeInfo
    timer: ShortText = Field(description="'cuda-event' or 'perf_counter'")
    started_at: UtcDatetime
    finished_at: UtcDatetime
    cells: Annotated[list[CellResult], AtDoor(max_length=MAX_CELLS)]
    probes: Annotated[list[ProbeReport], AtDoor(max_length=MAX_RESULT_PROBES)] = Field(default_factory=list)
    error: ErrorText | None = None


# --------------------------------------------------------------------------------------------------
