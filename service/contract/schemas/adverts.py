"""Benchmark advertisements (what a runner can run; ``kernelab.service.contract.adverts`` checks specs
against them) and the runner's claim payloads."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    field_validator,
    model_validator,
)

from kernelab.service.contract.schemas.spec import JobSpec
from kernelab.service.contract.schemas.types import (
    AtDoor,
    Finite,
    JsonObject,
    Message,
    Name,
    Text,
    UtcDatetime,
    _Strict,
)
from kernelab.service.contract.schemas.workload import Endpoint, GangSeat, WorkloadSpec

# Benchmark advertisements (what a runner can run; kernelab.service.contract.adverts checks specs against
# them)
# --------------------------------------------------------------------------------------------------

MAX_ADVERTS = 64  # benchmarks one runner may advertise
MAX_NAMES = 8  # spec strings one advertised benchmark answers to (name, module:object, ...)
MAX_VARIANTS = 64
MAX_SCHEMA_BYTES = 64_000  # one Params schema as compact JSON (the built-ins' are under 2 kB)
MAX_ADVERTS_BYTES = 512_000  # a whole advertisement as compact JSON

AdvertName = Annotated[Text, Field(min_length=1), AtDoor(max_length=500)]


def canonical_json(value: Any) -> str:
    """Compact, key-sorted JSON of ``value`` (what advertisement digests hash)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@lru_cache(maxsize=1024)
def _schema_problem(schema_json: str) -> str | None:
    """Why a schema (compact JSON) is no valid Draft 2020-12 JSON Schema, or None. Cached: a
    fleet's runners advertise the same schemas, and checking one against the metaschema costs
    ~30 ms. ``jsonschema`` is imported here, where an advert is checked (40 ms of every
    ``import kernelab.service.contract.schemas`` otherwise: the runner's children and
    ``kernelab.compare``)."""
    import jsonschema  # noqa: PLC0415

    try:
        jsonschema.Draft202012Validator.check_schema(json.loads(schema_json))
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "(root)"
        return f"not a valid JSON Schema at {where}: {exc.message[:300]}"
    return None


class BenchmarkAdvert(_Strict):
    """One benchmark a runner can run.

    ``names``: every ``JobSpec.benchmark`` string that resolves to it on that runner (a built-in's
    name and its ``module:object``; an entry point's name and its object reference; a configured
    ``module:object``). ``params_schema``: the JSON Schema (Draft 2020-12) of one cell's
    parameters. ``code_version``: the distribution's version and a hash of the module's source
    (None in the advertisements that ship with the server). Raises ``pydantic.ValidationError``
    naming the field for a schema that is not a valid JSON Schema or is over
    ``MAX_SCHEMA_BYTES``."""

    names: list[AdvertName] = Field(min_length=1, max_length=MAX_NAMES)
    variants: list[Annotated[Text, Field(min_length=1), AtDoor(max_length=200)]] = Field(
        min_length=1, max_length=MAX_VARIANTS
    )
    params_schema: JsonObject
    code_version: Name | None = None
    description: Message = ""

    @field_validator("params_schema")
    @classmethod
    def _valid_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        size = len(canonical_json(schema).encode())
        if size > MAX_SCHEMA_BYTES:
            raise ValueError(f"the schema is {size} bytes as JSON; at most {MAX_SCHEMA_BYTES}")
        problem = _schema_problem(canonical_json(schema))
        if problem is not None:
            raise ValueError(problem)
        return schema

    @property
    def schema_sha256(self) -> str:
        """SHA-256 hex of the schema as compact, key-sorted JSON: two adverts with the same digest
        accept the same specs."""
        return hashlib.sha256(canonical_json(self.params_schema).encode()).hexdigest()


class RunnerAdverts(_Strict):
    """A runner's whole advertisement (``ClaimRequest.benchmarks``): at most ``MAX_ADVERTS``
    benchmarks, ``MAX_ADVERTS_BYTES`` in all, no ``benchmark`` name advertised twice."""

    benchmarks: list[BenchmarkAdvert] = Field(max_length=MAX_ADVERTS)

    @model_validator(mode="after")
    def _bounded(self) -> RunnerAdverts:
        size = len(self.canonical().encode())
        if size > MAX_ADVERTS_BYTES:
            raise ValueError(f"the advertisement is {size} bytes as JSON; at most {MAX_ADVERTS_BYTES}")
        seen: set[str] = set()
        for i, advert in enumerate(self.benchmarks):
            for name in advert.names:
                if name in seen:
                    raise ValueError(f"benchmarks[{i}]: {name!r} is advertised twice")
                seen.add(name)
        return self

    def canonical(self) -> str:
        """Compact, key-sorted JSON of the advertisement (what ``sha256`` hashes)."""
        return canonical_json(self.model_dump(mode="json"))

    @property
    def sha256(self) -> str:
        """SHA-256 hex of ``canonical()``: the server rewrites its stored copy only on a change."""
        return hashlib.sha256(self.canonical().encode()).hexdigest()

    def by_name(self) -> dict[str, BenchmarkAdvert]:
        """Every advertised ``benchmark`` string -> its advert."""
        return {name: advert for advert in self.benchmarks for name in advert.names}


class ClaimRequest(_Strict):
    """A claim: long-poll up to ``wait_s``; the job's lease lasts ``lease_s``.

    ``benchmarks``: the runner's advertisement (``kernelab.runners.adverts``); the server routes
    only jobs of advertised benchmarks whose spec fits the advertised schema to this runner.
    Sent whole on a runner's first claim; later claims send only ``benchmarks_sha256``
    (``RunnerAdverts.sha256``), and a server that does not hold that digest answers 409
    ``advert_required`` naming ``benchmarks``, so the runner sends it whole again. A claim
    with neither (a runner older than advertisements) is routed any job, as before."""

    wait_s: float = Field(default=0.0, ge=0, le=60, description="long-poll for up to this long")
    lease_s: float = Field(default=120.0, ge=5, le=3600)
    benchmarks: RunnerAdverts | None = None
    benchmarks_sha256: Annotated[Text, Field(pattern=r"^[0-9a-f]{64}$"), AtDoor(max_length=64)] | None = None
    workloads: bool = Field(default=False, description="this runner runs workload jobs (kind: workload)")
    rdzv_endpoint: Endpoint | None = Field(
        default=None,
        description="host:port this runner would host a c10d rendezvous on, as node rank 0 of a gang",
    )


AnySpec = Annotated[JobSpec | WorkloadSpec, Field(union_mode="left_to_right")]
"""A job's spec: a benchmark's ``JobSpec`` or a ``WorkloadSpec`` (``kind: workload``)."""


class JobClaim(BaseModel):
    """A claimed job: its spec and lease; a workload job's claim has its ``gang`` seat (a job of one
    node too: a gang of one, ready at once)."""

    job_id: int
    attempt: int
    spec: AnySpec
    lease_expires_at: UtcDatetime
    gang: GangSeat | None = None


class LeasePublic(BaseModel):
    """A heartbeat's answer: the job's lease now ends at ``lease_expires_at`` (UTC); ``attempt``
    is the attempt the lease belongs to (1-based)."""

    job_id: int
    attempt: int
    lease_expires_at: UtcDatetime


PROGRESS_PHASES = (
    "fetching", "probes-before", "starting", "preparing", "correctness", "warm-up", "measuring", "checks",
    "cell-done", "static-metrics", "probes-after",
)  # fmt: skip
ProgressPhase = Literal[
    "fetching", "probes-before", "starting", "preparing", "correctness", "warm-up", "measuring", "checks",
    "cell-done", "static-metrics", "probes-after",
]  # fmt: skip
"""Where a running job is (``kernelab.runners.progress``): a revision job's checkouts and builds
(``fetching``), node probes before the cells, then per
cell ``starting`` → ``preparing`` (inputs, compiling) → ``correctness`` (eager checks) → ``warm-up``
→ ``measuring`` (interleaved rounds) → ``checks`` (the timed checks after the first and last
round) → ``cell-done``; ``static-metrics`` after the last cell, then the probes after."""
MAX_PROGRESS_CELLS = 1 << 20  # far above the 4,096 cells per device type a spec may hold


class JobProgress(_Strict):
    """A running job's progress, sent with each lease heartbeat and shown on its page.

    ``cell``: 0-based index of the sweep cell being worked on, of ``cells``; ``cells_done``: how
    many have finished; ``elapsed_s``: seconds since the job's worker started (the runner's
    monotonic clock); ``eta_s``: seconds the rest should take, the mean time of the finished cells
    times the cells left (null until one cell has finished: nothing measured says how long a
    cell takes; the probes after are not counted)."""

    cell: int = Field(ge=0, le=MAX_PROGRESS_CELLS)
    cells: int = Field(ge=0, le=MAX_PROGRESS_CELLS)
    cells_done: int = Field(default=0, ge=0, le=MAX_PROGRESS_CELLS)
    phase: ProgressPhase
    message: Annotated[Text, AtDoor(max_length=500)] = ""
    elapsed_s: Finite = Field(default=0.0, ge=0)
    eta_s: Finite | None = Field(default=None, ge=0)


class Heartbeat(_Strict):
    lease_s: float = Field(default=120.0, ge=5, le=3600)
    progress: JobProgress | None = Field(
        default=None, description="where the job is now (stored; shown on its page): null keeps the last"
    )


class JobFailure(_Strict):
    error: Annotated[Text, Field(min_length=1), AtDoor(max_length=20_000)]
    retry: bool = False


class ResultAccepted(BaseModel):
    job_id: int
    result_id: int
    duplicate: bool = False


# --------------------------------------------------------------------------------------------------
