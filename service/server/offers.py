"""Which runner offers which benchmark: advertisements stored per runner, specs checked and jobs
routed by them. The server never imports benchmark code (``kernelab.service.contract.adverts``).

* **Claim** (``record``): a runner's claim carries its advertisement (whole, or its digest once the
  server holds it). It is stored in ``runner_benchmarks`` only when its digest changed; otherwise
  the claim only marks the runner seen (at most every ``_SEEN_EVERY_S``). The queue then hands the
  runner only jobs whose ``needs_benchmark`` it advertises (``kernelab.service.server.queue.claim``).
* **Submit** (``check_spec``): the spec is checked against the advertised schemas of its benchmark
  (every runner's that advertised it, most recently seen first; a built-in's shipped one first):
  accepted when one fits, else a 422 naming the field with the first schema's errors. A
  ``module:object`` nobody advertised is accepted and waits (``JobPublic.waiting_for``), or is a
  422 on ``benchmark`` when the server runs with ``KERNELAB_REQUIRE_OFFERED_BENCHMARK=true``; a
  registry name that is no built-in and that no runner advertised is a 422 on ``benchmark``.
* **Waiting** (``waiting_for``): a queued job whose benchmark no live runner (seen within
  ``KERNELAB_RUNNER_ALIVE_S``) advertises says so; a live runner that never advertised (older
  than advertisements) can take any job, as before.

Jobs whose code comes from git revisions name a benchmark that lives in the revisions: any runner
may claim them (``needs_benchmark`` NULL) and the runner checks them, as before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import bindparam, delete, insert, or_, select, update
from sqlalchemy.orm import Session

from kernelab.service.contract.adverts import builtin_adverts, spec_errors
from kernelab.service.contract.schemas import (
    BENCHMARK_OBJECT_REF,
    STORED,
    BenchmarkAdvert,
    ClaimRequest,
    JobSpec,
    RunnerAdverts,
)
from kernelab.service.server import models
from kernelab.service.server.core.clock import db_now

_SEEN_EVERY_S = 10.0  # a claim with an unchanged advertisement writes last_seen_at at most this often
_CACHED_OFFERS = 1024  # advertisements (by digest) kept parsed per process

_runners, _offers = models.Base.metadata.tables["runners"], models.Base.metadata.tables["runner_benchmarks"]
_TOUCH = (
    update(_runners)
    .where(_runners.c.id == bindparam("p_runner_id"),
           or_(_runners.c.last_seen_at.is_(None), _runners.c.last_seen_at < db_now(-_SEEN_EVERY_S)))
    .values(last_seen_at=db_now())
)  # fmt: skip


class AdvertRequiredError(Exception):
    """A claim named an advertisement digest the server does not hold (HTTP 409
    ``advert_required`` naming ``benchmarks``): the runner sends its advertisement whole."""


@dataclass(frozen=True)
class Offers:
    """What one runner advertised: ``adverts`` by ``benchmark`` string."""

    sha256: str
    adverts: dict[str, BenchmarkAdvert]

    def pairs(self) -> list[tuple[str, str]]:
        """``(benchmark, schema_sha256)`` of every advertised name: the claim's routing keys."""
        return [(name, advert.schema_sha256) for name, advert in self.adverts.items()]


_cache: OrderedDict[str, Offers] = OrderedDict()


def _remember(offers: Offers) -> Offers:
    _cache[offers.sha256] = offers
    _cache.move_to_end(offers.sha256)
    while len(_cache) > _CACHED_OFFERS:
        _cache.popitem(last=False)
    return offers


def record(
    session: Session, *, runner_id: int, stored_sha256: str | None, body: ClaimRequest
) -> Offers | None:
    """The offers of the runner making claim ``body``, stored when they changed; None for a claim
    without advertisement (a runner that routes as before: any job).

    Raises ``AdvertRequiredError`` when the claim names only a digest and it is not the runner's
    stored one. Does not commit."""
    if body.benchmarks is not None:
        sha = body.benchmarks.sha256
        offers = _remember(Offers(sha, body.benchmarks.by_name()))
        if sha != stored_sha256:
            _store(session, runner_id, body.benchmarks, sha)
        else:
            session.execute(_TOUCH, {"p_runner_id": runner_id})
        return offers
    if body.benchmarks_sha256 is None:
        return None
    if body.benchmarks_sha256 != stored_sha256:
        raise AdvertRequiredError(
            f"the server holds no advertisement {body.benchmarks_sha256[:12]} of this runner: send "
            "'benchmarks' whole"
        )
    session.execute(_TOUCH, {"p_runner_id": runner_id})
    cached = _cache.get(stored_sha256)
    return cached if cached is not None else _remember(Offers(stored_sha256, _load(session, runner_id)))


def _store(session: Session, runner_id: int, adverts: RunnerAdverts, sha: str) -> None:
    session.execute(delete(_offers).where(_offers.c.runner_id == runner_id))
    rows = [
        {"runner_id": runner_id, "benchmark": name, "variants": advert.variants,
         "params_schema": advert.params_schema, "schema_sha256": advert.schema_sha256,
         "code_version": advert.code_version}
        for advert in adverts.benchmarks for name in advert.names
    ]  # fmt: skip
    if rows:
        session.execute(insert(_offers), rows)
    session.execute(
        update(_runners)
        .where(_runners.c.id == runner_id)
        .values(benchmarks_sha256=sha, last_seen_at=db_now())
    )


def _advert(row: Any) -> BenchmarkAdvert:
    return BenchmarkAdvert.model_construct(
        names=[row.benchmark], variants=list(row.variants), params_schema=row.params_schema,
        code_version=row.code_version, description="",
    )  # fmt: skip


def _load(session: Session, runner_id: int) -> dict[str, BenchmarkAdvert]:
    rows = session.execute(select(_offers).where(_offers.c.runner_id == runner_id)).all()
    return {row.benchmark: _advert(row) for row in rows}


@dataclass(frozen=True)
class Accepted:
    """What ``check_spec`` decided: ``errors`` (pydantic-style dicts; empty: accepted), the
    benchmark a claiming runner must advertise (None: any runner) and the digest of the schema
    that accepted the spec (None: no schema known yet)."""

    errors: list[dict[str, Any]]
    needs_benchmark: str | None = None
    schema_sha256: str | None = None


def _builtin(name: str) -> BenchmarkAdvert | None:
    return builtin_adverts().by_name().get(name)


def known_adverts(session: Session, benchmark: str) -> list[BenchmarkAdvert]:
    """The distinct schemas advertised for ``benchmark``: the shipped built-in one first, then
    every runner's, most recently seen runner first."""
    found: list[BenchmarkAdvert] = []
    shipped = _builtin(benchmark)
    if shipped is not None:
        found.append(shipped)
    rows = session.execute(
        select(_offers.c.benchmark, _offers.c.variants, _offers.c.params_schema, _offers.c.code_version,
               _offers.c.schema_sha256)
        .join(_runners, _runners.c.id == _offers.c.runner_id)
        .where(_offers.c.benchmark == benchmark)
        .order_by(_runners.c.last_seen_at.desc(), _offers.c.id)
    ).all()  # fmt: skip
    digests = {a.schema_sha256 for a in found}
    for row in rows:
        if row.schema_sha256 not in digests:
            digests.add(row.schema_sha256)
            found.append(_advert(row))
    return found


def known_names(session: Session) -> list[str]:
    """Every registry name (no ``:``) a built-in has or a runner ever advertised, sorted."""
    names = {n for a in builtin_adverts().benchmarks for n in a.names if ":" not in n}
    rows = session.scalars(select(_offers.c.benchmark).distinct().where(_offers.c.benchmark.not_like("%:%")))
    return sorted(names | set(rows))


def check_spec(session: Session, spec: JobSpec, *, require_offered: bool) -> Accepted:
    """Check ``spec`` against the advertised schemas of its benchmark (``known_adverts``).

    Accepted with the first schema that fits; otherwise the errors of the first schema (a 422
    naming the field). A registry name that is no built-in and that no runner ever advertised is
    an error on ``benchmark`` (a typo: names resolve through the runners' registries, which they
    advertise). A ``module:object`` nobody advertised: accepted, waiting for a runner that offers
    it, or with ``require_offered`` an error on ``benchmark``. A spec whose sides come from git
    revisions is checked for form only: its benchmark must be a ``module:object`` or a built-in
    name (an entry point belongs to an installed distribution, not to a revision)."""
    if spec.baseline.source is not None or spec.candidate.source is not None:
        return Accepted(_sourced_errors(spec.benchmark))
    adverts = known_adverts(session, spec.benchmark)
    if not adverts and ":" not in spec.benchmark:  # a registry name: built-ins and what runners advertised
        known = ", ".join(known_names(session))
        msg = f"unknown benchmark {spec.benchmark!r}; known: {known} (built-ins and names runners advertise)"
        return Accepted([{"loc": ("benchmark",), "msg": msg, "type": "value_error"}])
    if not adverts:
        if require_offered:
            msg = (f"no runner offers benchmark {spec.benchmark!r} (this server requires one: "
                   "KERNELAB_REQUIRE_OFFERED_BENCHMARK)")  # fmt: skip
            return Accepted([{"loc": ("benchmark",), "msg": msg, "type": "benchmark_not_offered"}])
        return Accepted([], needs_benchmark=spec.benchmark)
    first: list[dict[str, Any]] | None = None
    for advert in adverts:
        errors = spec_errors(spec, advert)
        if not errors:
            return Accepted([], needs_benchmark=spec.benchmark, schema_sha256=advert.schema_sha256)
        first = errors if first is None else first
    return Accepted(_with_variant_hint(session, spec.benchmark, first or []))


MAX_HINTED_RUNNERS = 5  # runners named in an unknown variant's hint (most recently seen first)


def _with_variant_hint(
    session: Session, benchmark: str, errors: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``errors`` with the fix appended to each unknown-variant message (``loc`` ``(side,
    "variant")``): a runner advertises the variants it loaded when it started, so a variant added
    to the code since needs that runner restarted; the message names the runners that offer
    ``benchmark`` and their variants (at most ``MAX_HINTED_RUNNERS``, most recently seen first),
    or says that none does."""
    if not any(tuple(e["loc"])[1:] == ("variant",) for e in errors):
        return errors
    rows = session.execute(
        select(_runners.c.name, _offers.c.variants)
        .join(_runners, _runners.c.id == _offers.c.runner_id)
        .where(_offers.c.benchmark == benchmark)
        .order_by(_runners.c.last_seen_at.desc(), _runners.c.id)
        .limit(MAX_HINTED_RUNNERS)
    ).all()  # fmt: skip
    offered = "; ".join(f"runner {name!r} offers {', '.join(variants)}" for name, variants in rows)
    hint = (
        f" ({offered or 'no runner advertised it yet'}). A runner advertises the variants it loaded "
        "when it started: after adding a variant, restart the runner that offers this benchmark "
        "(`kernelab runner --benchmark REF ...`, docs/writing-benchmarks.md)"
    )
    return [{**e, "msg": e["msg"] + hint} if tuple(e["loc"])[1:] == ("variant",) else e for e in errors]


def _sourced_errors(ref: str) -> list[dict[str, Any]]:
    if ":" in ref and BENCHMARK_OBJECT_REF.match(ref):
        return []
    if ":" not in ref and _builtin(ref) is not None:
        return []
    names = sorted(n for a in builtin_adverts().benchmarks for n in a.names if ":" not in n)
    msg = (f"with a source revision, name the benchmark as 'module:object' (or a built-in: "
           f"{', '.join(names)}); {ref!r} is neither")  # fmt: skip
    return [{"loc": ("benchmark",), "msg": msg, "type": "value_error"}]


def waiting_for(session: Session, jobs: Sequence[models.Job], *, alive_s: float) -> dict[int, str]:
    """Why each queued job of ``jobs`` waits, when no live runner can take it: ``{job_id:
    message}`` for the jobs whose ``needs_benchmark`` no runner seen within ``alive_s`` seconds
    advertises (a live runner without advertisement takes any job). Two indexed reads, whatever
    the number of jobs."""
    wanted = {j.needs_benchmark for j in jobs if j.status == "queued" and j.needs_benchmark is not None}
    if not wanted:
        return {}
    live = _runners.c.last_seen_at >= db_now(-alive_s)
    legacy = session.scalar(
        select(_runners.c.id).where(live, _runners.c.benchmarks_sha256.is_(None)).limit(1)
    )
    if legacy is not None:
        return {}
    offered = set(
        session.scalars(
            select(_offers.c.benchmark).distinct()
            .join(_runners, _runners.c.id == _offers.c.runner_id)
            .where(live, _offers.c.benchmark.in_(sorted(wanted)))
        )
    )  # fmt: skip
    why = "waiting for a runner that offers benchmark {!r}: no live runner advertises it"
    return {
        j.id: why.format(j.needs_benchmark)
        for j in jobs
        if j.status == "queued" and j.needs_benchmark is not None and j.needs_benchmark not in offered
    }


JobKey = tuple[str, int, Any]  # (database URL, job id, created_at): one job of one database, for good
_fit_cache: OrderedDict[tuple[JobKey, str], bool] = OrderedDict()
_CACHED_FITS = 65_536  # (job, schema) answers kept per process: job specs never change


def cached_fit(offers: Offers, job: JobKey, benchmark: str) -> bool | None:
    """``fits_cached``'s answer for ``job`` when it is cached (False when ``offers`` does not
    advertise ``benchmark``), else None: the caller reads the job's spec only then. ``job`` names
    the database, the job id and its creation time, never the id alone: a process that serves
    another database, or a database whose ids were reused, must not get another job's answer."""
    advert = offers.adverts.get(benchmark)
    if advert is None:
        return False
    return _fit_cache.get((job, advert.schema_sha256))


def fits_cached(offers: Offers, job: JobKey, benchmark: str, spec: dict[str, Any]) -> bool:
    """Whether ``job``'s (``cached_fit``) stored spec (JSON) fits the schema ``offers`` advertises for
    ``benchmark``: a claim's check of a job accepted against another schema (or none). The answer
    is cached per job and schema digest (``_CACHED_FITS`` entries, least recently used first out)."""
    advert = offers.adverts.get(benchmark)
    if advert is None:
        return False
    key = (job, advert.schema_sha256)
    answer = _fit_cache.get(key)
    if answer is None:
        try:
            answer = not spec_errors(JobSpec.model_validate(spec, context=STORED), advert)
        except ValidationError:  # a stored spec this version cannot read: _try_claim fails it
            answer = True
        _fit_cache[key] = answer
        while len(_fit_cache) > _CACHED_FITS:
            _fit_cache.popitem(last=False)
    _fit_cache.move_to_end(key)
    return answer
