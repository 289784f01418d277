"""Every field of every operation of the OpenAPI document, with hostile values, on a SQLite file and
on PostgreSQL: no answer is a 5xx, every refusal is a 4xx that can be read (JSON) and, for a body,
query or path field, a 422 whose ``loc`` names the field; what is accepted reads back everywhere.

Generated from the app's own OpenAPI document (``hostile.slots``): a field added to a request model
is walked without a change here. The kinds (``hostile.hostile``): a lone surrogate and bytes that
are not UTF-8 in a string and in a mapping's key, one character past ``maxLength``, integers past
``maximum``/``minimum`` and past int64, one item past ``maxItems``/``maxProperties``, NaN and
Infinity. A component's fields are walked once, through the first operation that reaches them
(its top-level fields through every operation: each has its own body door); every field must
be reached, i.e. refused for its own bound rather than as an unknown field of another union branch.

Then each operation that stores something is posted once with every string of its body at its
``maxLength`` and once with every integer at its ``maximum`` (values that must name existing
things, such as the benchmark or the job's spec, keep theirs): each must be accepted (a column
shorter than the schema's bound, or an integer wider than its column, fails here), and the pages
and API reads of all of it must answer 200 after the compare worker has run. Not posted at the
maxima: a workload result and a gang seat (they need a running multi-node workload job; their
fields are walked with the hostile kinds all the same).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import pytest
from factories import job_result, probe_report, spec_dict
from fastapi.routing import APIRoute, iter_route_contexts
from hostile import INT64, Slot, Value, encode, hostile, missing_bound, naming_errors, put, slots

from kernelab.service.contract.schemas import (
    BatchInvarianceCheck,
    BitwiseComparison,
    CorrectnessResult,
    DeterminismCheck,
    RepeatCheck,
)
from kernelab.service.server.api.door import DoorRoute

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

NODE = "hostile-node"
NULLABLE_METRICS = {
    (cls.__name__, name)
    for cls in (CorrectnessResult, RepeatCheck, DeterminismCheck, BatchInvarianceCheck, BitwiseComparison)
    for name in cls._NULLABLE
}
"""Correctness metrics stored as null when posted as NaN or Infinity (the one documented exception)."""
ORDER = [
    ("post", "/api/v1/runners/register"), ("post", "/api/v1/nodes/{name}/probes"), ("post", "/api/v1/tokens"),
    ("post", "/api/v1/bisects"), ("post", "/api/v1/bisects/{bisect_id}/steps"),
    ("post", "/api/v1/bisects/{bisect_id}/finish"), ("post", "/api/v1/runners/claim"),
    ("post", "/api/v1/runners/jobs/{job_id}/heartbeat"), ("post", "/api/v1/runners/jobs/{job_id}/fail"),
    ("post", "/api/v1/runners/jobs/{job_id}/gang"), ("post", "/api/v1/runners/jobs/{job_id}/workload-result"),
    ("post", "/api/v1/jobs"), ("post", "/api/v1/jobs/{job_id}/results"),
]  # fmt: skip
"""Operations with a body, cheapest first: a component's fields are walked through the first."""
STORING = [
    ("post", "/api/v1/runners/register"), ("post", "/api/v1/nodes/{name}/probes"), ("post", "/api/v1/tokens"),
    ("post", "/api/v1/jobs"), ("post", "/api/v1/runners/claim"),
]  # fmt: skip
"""Operations posted at the maxima as they are (the others below need a fresh bisect or job each)."""


@dataclass
class Base:
    """A valid request of one operation: path parameters, query, body, who sends it, and the body
    paths that keep their values in the posts at the maxima (they must name existing things)."""

    path: dict[str, Any] = field(default_factory=dict)
    query: dict[str, Any] = field(default_factory=dict)
    body: Any = None
    role: str = "admin"
    pinned: tuple[tuple[Any, ...], ...] = ()


class Target:
    """One app on one database, seeded: a runner on ``NODE`` leasing a job, a bisect, a token."""

    def __init__(self, api: Any):
        self.api = api
        self.client = api.client
        self.admin = api.admin
        self.runner = api.runner(NODE)
        self.job = self.claimed_job()
        r = self.client.post("/api/v1/bisects", json=self.bisect_body(), headers=self.admin)
        assert r.status_code == 201, r.text
        self.bisect = r.json()["id"]
        r = self.client.post("/api/v1/tokens", json={"name": "spare", "scopes": ["read"]}, headers=self.admin)
        self.token_id = r.json()["id"]

    def claimed_job(self) -> int:
        """A new job of ``spec_dict()``, leased by this target's runner (the queue's older jobs, which
        the posts at the maxima submitted, are claimed on the way and left leased)."""
        job = self.api.submit()
        for _ in range(20):
            r = self.client.post("/api/v1/runners/claim", json={"wait_s": 0}, headers=self.runner)
            assert r.status_code == 200, r.text
            if r.json()["job_id"] == job:
                return job
        raise AssertionError(f"job {job} was never claimed")

    def bisect_body(self) -> dict[str, Any]:
        return {"repo": "/r", "good": "aaaa", "bad": "bbbb", "good_ref": "v1", "bad_ref": "main",
                "commits": [{"sha": "bbbb", "subject": "one"}], "spec": spec_dict()}  # fmt: skip

    def headers(self, role: str) -> dict[str, str]:
        return self.runner if role == "runner" else self.admin

    def base(self, method: str, route: str) -> Base:
        """A valid request of ``method route`` on this target's state."""
        ids = {"job_id": self.job, "bisect_id": self.bisect, "token_id": self.token_id, "name": NODE}
        base = self._bodies().get((method, route), Base())
        base.path = {k: v for k, v in ids.items() if "{" + k + "}" in route}
        runner = route.startswith(("/api/v1/runners/jobs/", "/api/v1/runners/claim", "/api/v1/runners/me"))
        base.role = "runner" if runner or route.endswith(("/results", "/probes")) else "admin"
        base.query = {"/api/v1/compare": {"a": self.job, "b": self.job},
                      "/api/v1/history": {"benchmark": "softmax"}}.get(route, {})  # fmt: skip
        return base

    def _bodies(self) -> dict[tuple[str, str], Base]:
        node = {"hostname": "hostile-second", "device_type": "cpu", "device_name": "cpu", "device_count": 1,
                "l2_bytes": 1, "driver_version": "1", "cuda_version": "1", "torch_version": "1",
                "triton_version": "1", "python_version": "3"}  # fmt: skip
        step = {"job_id": self.job, "commit": "bbbb", "outcome": "bad", "reason": "r", "cell": "c",
                "verdict": "slower", "ratio": 1.1, "ci_low": 1.0, "ci_high": 1.2, "attempt": 1,
                "summary": {"slower": 1}}  # fmt: skip
        advert = {"names": ["hostile-bench"], "variants": ["a"], "params_schema": {"type": "object"},
                  "code_version": "1", "description": "d"}  # fmt: skip
        progress = {"cell": 0, "cells": 2, "cells_done": 0, "phase": "measuring", "message": "m",
                    "elapsed_s": 1.0, "eta_s": 2.0}  # fmt: skip
        cells = [("cells", i, k) for i in (0, 1) for k in ("index", "params", "samples")]
        result_pins = (("job_id",), ("spec",), ("node", "hostname"), ("node", "device_type"),
                       ("schema_version",), *cells)  # fmt: skip
        runners = "/api/v1/runners"
        return {
            ("post", f"{runners}/register"): Base(body={"name": "hostile-runner", "node": node}),
            ("post", "/api/v1/nodes/{name}/probes"): Base(body=_probe()),
            ("post", "/api/v1/tokens"): Base(body={"name": "hostile", "scopes": ["read"]}),
            ("post", "/api/v1/bisects"): Base(
                body=self.bisect_body(), pinned=(("good",), ("bad",), ("commits", 0, "sha"), ("spec",))
            ),
            ("post", "/api/v1/bisects/{bisect_id}/steps"): Base(body=step, pinned=(("commit",),)),
            ("post", "/api/v1/bisects/{bisect_id}/finish"): Base(
                body={"status": "found", "first_bad": "bbbb", "message": "m"}, pinned=(("first_bad",),)
            ),
            ("post", f"{runners}/claim"): Base(
                body={"wait_s": 0, "benchmarks": {"benchmarks": [advert]}},
                pinned=(("benchmarks", "benchmarks", 0, "params_schema"),),
            ),
            ("post", f"{runners}/jobs/{{job_id}}/heartbeat"): Base(
                body={"lease_s": 60, "progress": progress}
            ),
            ("post", f"{runners}/jobs/{{job_id}}/fail"): Base(body={"error": "e", "retry": False}),
            ("post", f"{runners}/jobs/{{job_id}}/gang"): Base(body={"lease_s": 60}),
            ("post", f"{runners}/jobs/{{job_id}}/workload-result"): Base(body=_workload_result()),
            ("post", "/api/v1/jobs"): Base(
                body=spec_dict(),
                pinned=(
                    ("benchmark",),
                    ("baseline", "variant"),
                    ("candidate", "variant"),
                    ("sweep",),
                    ("device",),
                ),
            ),  # fmt: skip
            ("post", "/api/v1/jobs/{job_id}/results"): Base(body=_result(self.job), pinned=result_pins),
        }

    def send(self, method: str, route: str, base: Base, *, path: dict[str, str] | None = None,
             query: str | None = None, body: bytes | None = None,
             headers: dict[str, Any] | None = None) -> Any:  # fmt: skip
        url = route
        for name, value in {
            **{k: quote(str(v), safe="") for k, v in base.path.items()},
            **(path or {}),
        }.items():
            url = url.replace("{" + name + "}", value)
        q = "&".join(f"{k}={quote(str(v), safe='')}" for k, v in base.query.items())
        if query is not None:
            q = "&".join(p for p in (q, query) if p)
        if q:
            url += "?" + q
        content = body if body is not None else (None if base.body is None else encode(base.body))
        sent = {**self.headers(base.role), **({"content-type": "application/json"} if content else {})}
        return self.client.request(method.upper(), url, content=content, headers={**sent, **(headers or {})})


def _probe() -> dict[str, Any]:
    report = probe_report().model_dump(mode="json")
    report["peer_copy"] = [{"src_device": 0, "dst_device": 1, "peer_access": True, "size_bytes": 1,
                            "time_us": 1.0, "bandwidth_gbps": 1.0}]  # fmt: skip
    report["matmul_peak"] = [{"device_index": 0, "dtype": "bfloat16", "m": 1, "n": 1, "k": 1, "launches": 1,
                              "time_us": 1.0, "tflops": 1.0}]  # fmt: skip
    report["telemetry"] = [{"device_index": 0, "name": "gpu", "uuid": "u", "clock_event_reasons": 0,
                            "memory_used_bytes": 1, "ecc_volatile_uncorrected": 0,
                            "other_processes": [{"pid": 1}]}]  # fmt: skip
    report["notes"], report["errors"] = ["n"], {"copy": "e"}
    return report


def _result(job_id: int) -> dict[str, Any]:
    body = json.loads(job_result(job_id, key=f"hostile-result-{job_id:06d}", hostname=NODE).model_dump_json())
    body["probes"] = [_probe()]
    return body


def _workload_result() -> dict[str, Any]:
    run = {
        "index": 0,
        "side": "baseline",
        "started_at": "2026-01-01T00:00:00Z",
        "wall_s": 1.0,
        "outcome": "ok",
        "exit_code": 0,
        "error": "",
        "log": "",
        "records": [
            {"type": "phase", "name": "p", "rank": 0, "seconds": 1.0},
            {"type": "metric", "name": "m", "rank": 0, "value": 1.0, "unit": "u"},
            {"type": "digest", "name": "d", "rank": 0, "dtype": "f4", "shape": [1], "sha256": "0" * 64},
        ],
    }
    spec = {
        "kind": "workload",
        "baseline": {"command": ["a.py"], "env": {"A": "1"}},
        "candidate": {"function": "m:f", "args": ["x"]},
    }
    return {"idempotency_key": "hostile-workload", "runs": [run], "spec": spec, "probe_before": _probe(),
            "node": {"hostname": NODE, "device_type": "cpu"}}  # fmt: skip


def _nullable(slot: Slot) -> bool:
    return len(slot.owner) == 2 and tuple(slot.owner) in NULLABLE_METRICS


def _param_text(slot: Slot, value: Value) -> str:
    """``value`` as the percent-encoded text of a path or query parameter."""
    if value.kind in ("bytes", "surrogate"):  # a URL holds no lone surrogate: its UTF-8-like bytes
        return "%FF%FE" if value.kind == "bytes" else "%ED%A0%80"
    return quote(str(value.value), safe="")


def _up_to(slot: Slot, value: Value) -> int:
    """How many trailing parts of the slot's ``loc`` a refusal may leave out: a collection's size
    checked on the whole (the sweep's cell count names ``sweep``), a union's tag (named at its
    object), a mapping's key (named as the key, then ``[key]``)."""
    if value.kind == "too-many-items" or "const" in slot.schema:
        return 2
    return 1 if value.kind == "too-many-keys" else 0


def _refused(r: Any, slot: Slot, value: Value, where: str) -> tuple[str | None, bool]:
    """Why answer ``r`` to ``value`` in ``slot`` is wrong (None: right: a 4xx that reads, a 422 that
    names the slot), and whether the field itself was reached (refused for its own value, not as
    an unknown field of another union branch; or accepted where that is the rule)."""
    if r.status_code >= 500:
        return f"{where}: {r.status_code} {r.text[:300]}", False
    if value.kind in ("nan", "infinity") and _nullable(slot):
        r.json()  # stored as null (or refused for another field of the object): either reads
        return None, True
    if r.status_code < 400:
        return f"{where}: accepted ({r.status_code})", False
    try:
        detail = r.json()["detail"]
    except (ValueError, KeyError, TypeError):
        return f"{where}: {r.status_code} without a JSON detail: {r.text[:200]!r}", False
    if r.status_code == 413 and value.kind.startswith("too-"):
        return None, True  # the route's own size limit came first: still a refusal that says why
    errors = naming_errors(detail, slot, up_to=_up_to(slot, value)) if r.status_code == 422 else []
    if not errors:
        return f"{where}: {r.status_code} does not name {list(slot.loc)}: {json.dumps(detail)[:400]}", False
    return None, any(e.get("type") != "extra_forbidden" for e in errors)


def test_every_operation_is_in_the_order(api) -> None:  # type: ignore[no-untyped-def]
    """A new operation with a body needs a base request above (its fields are walked from it)."""
    openapi = api.client.app.openapi()
    with_body = {
        (m, p) for p, ops in openapi["paths"].items() for m, op in ops.items() if "requestBody" in op
    }
    assert with_body == set(ORDER), with_body ^ set(ORDER)


def test_every_request_field_is_bounded_in_the_openapi(api) -> None:  # type: ignore[no-untyped-def]
    """Every string, integer, list and mapping a request can carry shows its bound: the walk
    above tries one past it, and the bound is the one that applies."""
    openapi = api.client.app.openapi()
    unbounded = [
        f"{m.upper()} {p} {slot.where}:{'.'.join(map(str, slot.path))} lacks {missing}"
        for p, ops in openapi["paths"].items()
        for m in ops
        for slot in slots(openapi, m, p)
        if (missing := missing_bound(slot))
    ]
    assert not unbounded, "\n".join(unbounded)


def test_every_route_is_a_door_route(api) -> None:  # type: ignore[no-untyped-def]
    """Every route reads its body through the door (``DoorRoute``), pages and API alike."""
    routes = [c.original_route for c in iter_route_contexts(api.client.app.routes)]
    api_routes = [r for r in routes if isinstance(r, APIRoute)]
    assert len(api_routes) > 40
    assert [r.path for r in api_routes if not isinstance(r, DoorRoute)] == []


def test_hostile_values_in_every_field(api) -> None:  # type: ignore[no-untyped-def]
    """Every field of every operation, each hostile kind: never a 5xx, a 4xx naming the field;
    every field reached. Then the posts at the maxima, and every read of what they stored."""
    target = Target(api)
    openapi = api.client.app.openapi()
    operations = list(ORDER) + sorted(
        (m, p) for p, ops in openapi["paths"].items() for m in ops if (m, p) not in ORDER
    )  # fmt: skip
    wrong: list[str] = []
    covered: set[tuple[Any, ...]] = set()
    owners: set[tuple[Any, ...]] = set()
    sent = 0
    for method, route in operations:
        base = target.base(method, route)
        for slot in slots(openapi, method, route):
            values = hostile(slot)
            if not values:
                continue
            owners.add(slot.owner)
            if slot.owner in covered and len(slot.path) > 1:
                continue  # a component's field, walked through an earlier operation
            for value in values:
                where = f"{method.upper()} {route} {slot.where}:{'.'.join(map(str, slot.path))} {value.kind}"
                if slot.where == "body":
                    body = base.body
                    for pin_path, pin in slot.pins:
                        body = put(body, pin_path, pin)
                    r = target.send(
                        method, route, base, body=encode(put(body, slot.path, value.value, key=value.key))
                    )
                elif slot.where == "path":
                    r = target.send(method, route, base, path={slot.path[0]: _param_text(slot, value)})
                else:
                    name = slot.path[0]
                    if value.kind == "too-many-items":
                        query = "&".join(f"{name}=x" for _ in value.value)
                    elif value.key:
                        continue
                    else:
                        query = f"{name}={_param_text(slot, value)}"
                    r = target.send(method, route, base, query=query)
                sent += 1
                problem, reached = _refused(r, slot, value, where)
                if problem:
                    wrong.append(problem)
                elif reached:
                    covered.add(slot.owner)
    assert not wrong, f"{len(wrong)} of {sent} hostile requests answered wrongly:\n" + "\n".join(wrong[:60])
    assert owners <= covered, f"fields never reached: {sorted(map(str, owners - covered))[:40]}"
    _headers_the_api_reads(target)
    _at_the_maxima(target, openapi)


def _headers_the_api_reads(target: Target) -> None:
    """An ``Authorization`` header or token cookie that is not ASCII: a 401, never a 5xx."""
    for path in ("/api/v1/jobs", "/api/v1/runners/claim"):
        for token in (b"Bearer \xff\xfe", b"Bearer \xed\xa0\x80", b"\xff"):
            r = target.client.request(
                "POST" if "claim" in path else "GET", path, headers={"authorization": token}
            )
            assert r.status_code == 401 and r.json()["detail"], (path, token, r.status_code, r.text)
    r = target.client.get("/", headers={"cookie": b"kernelab_token=\xff\xfe"})
    assert r.status_code < 500, r.text


def _max_string(schema: dict[str, Any], current: str) -> str | None:
    """A string of ``schema``'s ``maxLength`` that its pattern accepts, or None."""
    n = schema.get("maxLength")
    if n is None or n > 200_000:
        return None
    pattern = schema.get("pattern")
    for fill in (current[-1:] or "a", "a", "0", "x"):
        candidate = (current + fill * n)[:n]
        if pattern is None or re.search(pattern, candidate):
            return candidate
    return None


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(value, list):
        return [leaf for i, v in enumerate(value) for leaf in _leaves(v, (*path, i))]
    return [(path, value)]


def _schema_at(
    openapi: dict[str, Any], method: str, route: str, kind: str
) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Body path (indices as 0, mapping keys as "k") -> the schema of that field's ``kind`` branch."""
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for slot in slots(openapi, method, route):
        if slot.where == "body" and slot.schema.get("type") == kind:
            out.setdefault(slot.path, slot.schema)
    return out


def _lookup(schemas: dict[tuple[Any, ...], dict[str, Any]], path: tuple[Any, ...]) -> dict[str, Any] | None:
    """The schema of the body field at ``path`` (list indices as 0; a free mapping's key as ``k``)."""
    norm = tuple(0 if isinstance(p, int) else p for p in path)
    if norm in schemas:
        return schemas[norm]
    for i in range(len(norm) - 1, -1, -1):
        guess = (*norm[:i], "k", *norm[i + 1 :])
        if guess in schemas:
            return schemas[guess]
    return None


def _at_max(openapi: dict[str, Any], method: str, route: str, base: Base, kind: str) -> Any:
    """``base.body`` with every ``kind`` leaf (``string`` or ``integer``) at its bound, pinned
    paths kept."""
    schemas = _schema_at(openapi, method, route, kind)
    body = base.body
    for path, value in _leaves(base.body):
        if any(path[: len(p)] == p for p in base.pinned):
            continue
        schema = _lookup(schemas, path)
        if schema is None or "enum" in schema or "const" in schema:
            continue
        if kind == "string" and isinstance(value, str):
            filled = _max_string(schema, value)
            if filled is not None:
                body = put(body, path, filled)
        elif kind == "integer" and isinstance(value, int) and not isinstance(value, bool):
            body = put(body, path, min(int(schema["maximum"]), INT64))
    return body


def _at_the_maxima(target: Target, openapi: dict[str, Any]) -> None:
    """Each storing operation once with its strings at ``maxLength``, once with its integers at
    ``maximum``: accepted; then every read of what was stored answers 200."""
    client, admin = target.client, target.admin
    stored: list[str] = []
    for kind in ("string", "integer"):
        for method, route in STORING:
            base = target.base(method, route)
            if route == "/api/v1/runners/register" and kind == "integer":
                base.body["name"] = "hostile-runner-ints"
            r = target.send(method, route, base, body=encode(_at_max(openapi, method, route, base, kind)))
            assert r.status_code in (200, 201, 204), (route, kind, r.status_code, r.text[:500])
        r = client.post("/api/v1/bisects", json=target.bisect_body(), headers=admin)
        bisect = r.json()["id"]
        for route in ("/api/v1/bisects/{bisect_id}/steps", "/api/v1/bisects/{bisect_id}/finish"):
            base = target.base("post", route)
            base.path = {"bisect_id": bisect}
            r = target.send("post", route, base, body=encode(_at_max(openapi, "post", route, base, kind)))
            assert r.status_code == 200, (route, kind, r.status_code, r.text[:500])
        stored.append(f"/bisects/{bisect}")
        stored.append(f"/api/v1/bisects/{bisect}")
        for route in ("/api/v1/runners/jobs/{job_id}/heartbeat", "/api/v1/jobs/{job_id}/results"):
            job = target.claimed_job()
            base = target.base("post", route)
            base.path = {"job_id": job}
            if route.endswith("/results"):
                base.body = _result(job)
            r = target.send("post", route, base, body=encode(_at_max(openapi, "post", route, base, kind)))
            assert r.status_code in (200, 201), (route, kind, r.status_code, r.text[:500])
            stored += [f"/api/v1/jobs/{job}", f"/jobs/{job}"]
            if route.endswith("/results"):
                stored += [f"/api/v1/jobs/{job}/comparison", f"/api/v1/jobs/{job}/report.md",
                           f"/api/v1/jobs/{job}/samples", f"/api/v1/jobs/{job}/cells",
                           f"/api/v1/jobs/{job}/health", f"/api/v1/jobs/{job}/attempts"]  # fmt: skip
        job = target.claimed_job()
        base = target.base("post", "/api/v1/runners/jobs/{job_id}/fail")
        base.path = {"job_id": job}
        body = _at_max(openapi, "post", "/api/v1/runners/jobs/{job_id}/fail", base, kind)
        r = target.send("post", "/api/v1/runners/jobs/{job_id}/fail", base, body=encode(body))
        assert r.status_code == 200, (kind, r.status_code, r.text[:500])
        stored += [f"/api/v1/jobs/{job}", f"/api/v1/jobs/{job}/attempts", f"/jobs/{job}"]
    target.api.compare()
    first = target.job  # its result was stored with NaN metrics as null
    reads = [*stored, f"/api/v1/jobs/{first}/comparison", f"/api/v1/jobs/{first}/report.md", f"/jobs/{first}",
             "/api/v1/jobs", "/api/v1/nodes", f"/api/v1/nodes/{NODE}", "/api/v1/tokens",
             "/api/v1/bisects", f"/api/v1/bisects/{target.bisect}", "/api/v1/history?benchmark=softmax",
             "/api/v1/history/regressions", "/", f"/nodes/{NODE}", "/bisects", f"/bisects/{target.bisect}",
             "/history?benchmark=softmax"]  # fmt: skip
    bad = []
    for url in reads:
        r = client.get(url, headers=admin)
        if r.status_code != 200:
            bad.append(f"GET {url}: {r.status_code} {r.text[:300]}")
    assert not bad, "\n".join(bad)
