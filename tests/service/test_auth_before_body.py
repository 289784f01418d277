"""A request with a body is authenticated before its body is read, and a 422 never
echoes a large input (a 20 MB body with a garbage token came back as a 41 MB 422).

The routes are generated from ``app.routes`` (every ``/api/v1`` route that takes a body), so a new
one is covered without an entry here."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from factories import spec_dict
from fastapi.routing import APIRoute, iter_route_contexts

from kernelab.app import create_app
from kernelab.runners.local import ServerProcess, free_port
from kernelab.service.server.core.config import Settings

pytestmark = pytest.mark.timeout(120)

BIG_BYTES = 20 * 1024 * 1024  # the attack's body: 20 MB
SMALL_ANSWER_BYTES = 1024  # a refusal is a short JSON detail


def body_routes(settings: Settings) -> list[tuple[str, str]]:
    """(method, concrete path) of every ``/api/v1`` route with a body parameter."""
    out = []
    app = create_app(settings)
    try:
        for context in iter_route_contexts(app.routes):
            route, path = context.original_route, context.path or ""
            if isinstance(route, APIRoute) and path.startswith("/api/v1") and route.body_field is not None:
                out += [(method, re.sub(r"\{[^}]+\}", "1", path)) for method in sorted(route.methods)]
    finally:
        app.state.engine.dispose()
    return out


def test_a_big_body_with_a_garbage_token_is_a_small_401_on_every_body_route(api, settings: Settings) -> None:  # type: ignore[no-untyped-def]
    big = b'{"error": "' + b"x" * (2 * 1024 * 1024) + b'", "junk": [' + b"1," * 1000 + b"1]}"
    routes = body_routes(settings)
    for expected in [("POST", "/api/v1/jobs"), ("POST", "/api/v1/runners/jobs/1/fail"),
                     ("POST", "/api/v1/jobs/1/results"), ("POST", "/api/v1/nodes/1/probes"),
                     ("POST", "/api/v1/runners/claim"), ("POST", "/api/v1/tokens")]:  # fmt: skip
        assert expected in routes  # the generated list is not empty or partial
    for method, path in routes:
        for headers in ({"Authorization": "Bearer garbage"}, {}):
            t0 = time.monotonic()
            r = api.client.request(
                method, path, content=big, headers={**headers, "content-type": "application/json"}
            )
            assert r.status_code == 401, (method, path, r.status_code, r.text[:300])
            assert len(r.content) < SMALL_ANSWER_BYTES and r.headers["www-authenticate"] == "Bearer"
            assert time.monotonic() - t0 < 5


def test_a_token_without_the_scope_is_a_403_before_the_body(api) -> None:  # type: ignore[no-untyped-def]
    read = api.token("read")
    r = api.client.post("/api/v1/runners/jobs/1/fail", content=b"[" * 10_000, headers=read)
    assert r.status_code == 403 and "runner" in r.json()["detail"], r.text
    # a token with the scope still reaches the route
    runner = api.runner()
    r = api.client.post("/api/v1/runners/jobs/1/fail", json={"error": "x"}, headers=runner)
    assert r.status_code == 404, r.text  # the route ran: no such job
    assert api.client.post("/api/v1/jobs", json=spec_dict(), headers=api.admin).status_code == 201


@pytest.fixture
def server(migrated_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(
        migrated_url, port=free_port(), admin_token="a" * 32, log_path=tmp_path / "server.log"
    ) as s:
        yield s


def test_the_token_is_refused_before_the_body_arrives(server: ServerProcess, settings: Settings) -> None:
    """Real HTTP: the client declares 20 MB and sends 1 KiB; the 401 must come without the rest
    (a server that waited for the body to parse it first answers nothing within the timeout)."""
    for method, path in body_routes(settings):
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer garbage\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {BIG_BYTES}\r\n\r\n")  # fmt: skip
            sock.sendall(head.encode() + b'{"error": "' + b"x" * 1024)
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                pytest.fail(f"{method} {path}: no answer before the body was sent")
            assert answer.startswith(b"HTTP/1.1 401 "), (method, path, answer[:200])


def test_a_422_echoes_no_large_input(api) -> None:  # type: ignore[no-untyped-def]
    from kernelab.service.server.api.errors import MAX_ECHO_CHARS

    spec = spec_dict(name="n" * 600_000)  # within KERNELAB_MAX_SPEC_BYTES (1 MiB)
    del spec["benchmark"]  # a missing field's error echoes the whole containing object
    # 60 keys (the sweep's bound is 64, checked before its values): more errors than a 422 lists
    spec["sweep"] = {f"k{i}": "not a list" for i in range(60)}
    r = api.client.post("/api/v1/jobs", json=spec, headers=api.admin)
    assert r.status_code == 422, r.text[:300]
    assert len(r.content) < 64 * 1024, len(r.content)
    detail = r.json()["detail"]
    assert ["body", "benchmark"] in [e["loc"] for e in detail]
    assert all(len(str(e.get("input", ""))) < MAX_ECHO_CHARS + 64 for e in detail)
    assert detail[-1]["type"] == "too_many_errors"


def test_bounded_keeps_small_values_and_summarises_large_ones() -> None:
    from kernelab.service.server.api.errors import MAX_ECHO_CHARS, bounded, bounded_errors

    assert bounded({"a": [1, 2, "x"]}) == {"a": [1, 2, "x"]}
    assert bounded("y" * 10_000).startswith("y" * MAX_ECHO_CHARS) and "10000 characters" in bounded(
        "y" * 10_000
    )
    assert bounded(list(range(100_000))) == "<list of 100000 items, not echoed>"
    errors = bounded_errors(
        [{"loc": ("body", "k" * 1000), "msg": "m", "type": "t", "input": {"z": "z" * 999}}]
    )
    assert len(errors[0]["loc"][1]) < 200 and errors[0]["input"] == "<dict of 1 items, not echoed>"
