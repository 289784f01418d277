"""Runners advertise the benchmarks they offer; the server checks specs against the advertised
schemas and routes claims by them, and never imports benchmark code (``kernelab.service.server.offers``).

The benchmark module of these tests writes a mark file when it is imported (``KL_MARK``): the
advertisement is built by ``python -m kernelab.runners.adverts --print`` in a child process
without ``KL_MARK``, so a mark means the server process imported it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import spec_dict

from kernelab.runners.local import free_port, wait_healthy
from kernelab.service.contract.schemas import RunnerAdverts

pytestmark = pytest.mark.timeout(180)

REF = "kl_advertised:Bench"
FIRST = ["body", "benchmarks", "benchmarks", 0]  # the first advertised benchmark in a claim body
MODULE = textwrap.dedent("""\
    import os
    from pathlib import Path

    from pydantic import Field

    from kernelab.kernels import Benchmark, Params

    if os.environ.get("KL_MARK"):
        Path(os.environ["KL_MARK"]).write_text("imported by pid %d" % os.getpid())


    class XParams(Params):
        N: int = Field(gt=0, le=4096)
        dtype: str = "float32"


    class Bench(Benchmark[XParams]):
        name, Params, variants = "kl_advertised", XParams, ("slow", "fast")

        def make_inputs(self, params, device, seed): return {}
        def prepare(self, variant, params, inputs): return lambda: None
        def reference(self, params, inputs): return None
        def work(self, params, variant): return None
    """)


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("adverts")
    (folder / "kl_advertised.py").write_text(MODULE, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def advert(module_dir: Path) -> dict[str, Any]:
    """The advertisement a runner configured with ``--benchmark kl_advertised:Bench`` sends,
    built as the daemon builds it (a child process); JSON."""
    env = {k: v for k, v in os.environ.items() if k != "KL_MARK"}
    env["PYTHONPATH"] = os.pathsep.join([str(module_dir), *sys.path])
    done = subprocess.run([sys.executable, "-P", "-m", "kernelab.runners.adverts", "--print", REF],
                          env=env, capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    body: dict[str, Any] = json.loads(done.stdout)
    return body


@pytest.fixture
def mark(module_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The module is importable by this process, and would leave ``mark`` if imported."""
    path = tmp_path / "imported.mark"
    monkeypatch.setenv("KL_MARK", str(path))
    monkeypatch.syspath_prepend(str(module_dir))
    yield path
    sys.modules.pop("kl_advertised", None)


def _claim(api: Any, headers: dict[str, str], **body: Any) -> httpx.Response:
    return api.client.post("/api/v1/runners/claim", json={"lease_s": 30, **body}, headers=headers)  # type: ignore[no-any-return]


def _builtins_only(advert: dict[str, Any]) -> dict[str, Any]:
    return {"benchmarks": [b for b in advert["benchmarks"] if REF not in b["names"]]}


def test_the_server_never_imports_a_benchmark_named_in_a_spec(api, mark: Path, advert) -> None:  # type: ignore[no-untyped-def]
    spec = spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"},
                     sweep={"N": [64, 128]})  # fmt: skip
    waiting = api.client.post("/api/v1/jobs", json=spec, headers=api.admin)  # nobody offers it yet
    assert waiting.status_code == 201, waiting.text
    a = api.runner("node-a")
    claim = _claim(api, a, benchmarks=advert)
    assert claim.status_code == 200 and claim.json()["job_id"] == waiting.json()["id"]
    bad = api.client.post("/api/v1/jobs", json={**spec, "sweep": {"N": [8192]}}, headers=api.admin)
    assert bad.status_code == 422  # checked against the advertised schema
    assert not mark.exists(), mark.read_text()
    assert "kl_advertised" not in sys.modules


def test_a_real_server_process_never_imports_it(module_dir: Path, advert, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    port, token, mark = free_port(), "adverts-admin-token-0123456789", tmp_path / "server.mark"
    env = {**os.environ, "KERNELAB_DATABASE_URL": f"sqlite:///{tmp_path / 'k.db'}",
           "KERNELAB_ADMIN_TOKEN": token, "KL_MARK": str(mark),
           "PYTHONPATH": os.pathsep.join([str(module_dir), *sys.path])}  # fmt: skip
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kernelab.runners.cli", "serve", "--port", str(port)],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, proc, timeout_s=60, log_path=log_path)
        admin = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, timeout=30) as http:
            spec = spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"},
                             sweep={"N": [64]})  # fmt: skip
            assert http.post("/api/v1/jobs", json=spec, headers=admin).status_code == 201
            runner = http.post("/api/v1/runners/register", headers=admin, json={"name": "r1"}).json()["token"]
            got = http.post("/api/v1/runners/claim", json={"benchmarks": advert},
                            headers={"Authorization": f"Bearer {runner}"})  # fmt: skip
            assert got.status_code == 200, got.text
            wrong = http.post("/api/v1/jobs", json={**spec, "params": {"M": 1}}, headers=admin)
            assert wrong.status_code == 422 and ["body", "params", "M"] in [
                e["loc"] for e in wrong.json()["detail"]
            ]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert not mark.exists(), f"the server imported the benchmark: {mark.read_text()}"


def test_claims_route_only_to_runners_that_offer_the_benchmark(api, advert) -> None:  # type: ignore[no-untyped-def]
    a, b = api.runner("node-a"), api.runner("node-b")
    assert _claim(api, a, benchmarks=advert).status_code == 204  # A advertises before anything is queued
    job = api.submit(spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"},
                               sweep={"N": [64]}))  # fmt: skip
    builtin = api.submit()  # softmax: both offer it
    assert _claim(api, b, benchmarks=_builtins_only(advert)).json()["job_id"] == builtin
    assert _claim(api, b, benchmarks=_builtins_only(advert)).status_code == 204  # never X's job
    taken = _claim(api, a, benchmarks_sha256=RunnerAdverts.model_validate(advert).sha256)
    assert taken.status_code == 200 and taken.json()["job_id"] == job


def test_a_claim_only_fits_the_schema_its_runner_advertises(api, advert) -> None:  # type: ignore[no-untyped-def]
    # runner B runs an older kl_advertised whose N stops at 100: the job of N=2000 is A's only
    older = json.loads(json.dumps(advert))
    mine = next(b for b in older["benchmarks"] if REF in b["names"])
    mine["params_schema"]["properties"]["N"]["maximum"] = 100
    a, b = api.runner("node-a"), api.runner("node-b")
    assert _claim(api, b, benchmarks=older).status_code == 204
    assert _claim(api, a, benchmarks=advert).status_code == 204
    job = api.submit(spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"},
                               sweep={"N": [2000]}))  # fmt: skip
    assert _claim(api, b, benchmarks=older).status_code == 204
    assert _claim(api, a, benchmarks=advert).json()["job_id"] == job
    small = api.submit(spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"},
                                 sweep={"N": [50]}))  # accepted against A's schema, fits B's too  # fmt: skip
    assert _claim(api, b, benchmarks=older).json()["job_id"] == small


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"sweep": {"N": [64, 10_000]}}, ["body", "sweep", "N"]),
        ({"params": {"N": 64, "M": 3}}, ["body", "params", "M"]),
        ({"params": {"N": "wide"}}, ["body", "params", "N"]),
        ({"baseline": {"variant": "medium"}}, ["body", "baseline", "variant"]),
        (
            {"candidate": {"variant": "fast", "params": {"N": 0}}, "params": {"N": 4}},
            ["body", "candidate", "params", "N"],
        ),
    ],
)
def test_a_spec_that_breaks_the_advertised_schema_is_a_422_naming_the_field(api, advert, change, loc) -> None:  # type: ignore[no-untyped-def]
    assert _claim(api, api.runner("node-a"), benchmarks=advert).status_code == 204
    spec = spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"}, sweep={})
    spec.update(change)
    r = api.client.post("/api/v1/jobs", json=spec, headers=api.admin)
    assert r.status_code == 422, r.text
    assert loc in [e["loc"] for e in r.json()["detail"]], r.json()


def test_an_unknown_variant_names_the_runners_that_offer_the_benchmark_and_the_fix(api, advert) -> None:  # type: ignore[no-untyped-def]
    """A variant the runners did not advertise (added to the code after they started): the 422
    names the runner and the variants it offers, and says to restart it."""
    assert _claim(api, api.runner("node-a"), benchmarks=advert).status_code == 204
    spec = spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "mixed"}, sweep={})
    r = api.client.post("/api/v1/jobs", json=spec, headers=api.admin)
    assert r.status_code == 422, r.text
    (error,) = [e for e in r.json()["detail"] if e["loc"] == ["body", "candidate", "variant"]]
    assert "unknown variant 'mixed'" in error["msg"]
    assert "runner 'node-a' offers slow, fast" in error["msg"], error["msg"]
    assert "restart the runner that offers this benchmark" in error["msg"]


def test_a_job_no_live_runner_can_take_says_so(api, advert) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from kernelab.service.server.models import Runner, utcnow

    spec = spec_dict(
        benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"}, sweep={"N": [8]}
    )
    a = api.runner("node-a")
    assert _claim(api, a, benchmarks=_builtins_only(advert)).status_code == 204  # offers built-ins only
    job = api.submit(spec)
    one = api.client.get(f"/api/v1/jobs/{job}", headers=api.admin).json()
    assert one["status"] == "queued" and REF in one["waiting_for"] and "no live runner" in one["waiting_for"]
    listed = api.client.get("/api/v1/jobs", headers=api.admin).json()["data"]
    assert [j["waiting_for"] is not None for j in listed] == [True]
    page = api.client.get(f"/jobs/{job}", headers=api.admin)
    assert (
        page.status_code == 200
        and 'id="job-waiting"' in page.text
        and "no live runner advertises" in page.text
    )
    assert _claim(api, a, benchmarks=advert).status_code == 200  # now it offers it: taken
    assert api.client.get(f"/api/v1/jobs/{job}", headers=api.admin).json()["waiting_for"] is None
    # the one runner that offers it stops being seen: the next such job waits again
    later = api.submit(spec)
    with api.factory.begin() as session:
        session.query(Runner).update({Runner.last_seen_at: utcnow() - timedelta(days=1)})
    assert REF in api.client.get(f"/api/v1/jobs/{later}", headers=api.admin).json()["waiting_for"]


def test_an_unknown_name_is_still_a_422_and_a_server_may_require_an_offer(api, settings) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=spec_dict(benchmark="softmaxx"), headers=api.admin)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "benchmark"]
    assert "unknown benchmark 'softmaxx'" in r.json()["detail"][0]["msg"]
    settings.require_offered_benchmark = True
    r = api.client.post("/api/v1/jobs", json=spec_dict(benchmark="nobody.offers:This"), headers=api.admin)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "benchmark_not_offered"


@pytest.mark.parametrize(
    ("mutate", "loc"),
    [
        (lambda b: b["benchmarks"][0].update(params_schema={"type": 3}), [*FIRST, "params_schema"]),
        (lambda b: b["benchmarks"][0].update(variants=[]), [*FIRST, "variants"]),
        (lambda b: b["benchmarks"][0].update(extra=1), [*FIRST, "extra"]),
        (lambda b: b["benchmarks"][0]["params_schema"].update(title="a\x00b"), [*FIRST, "params_schema"]),
        (lambda b: b["benchmarks"].append(b["benchmarks"][0]), ["body", "benchmarks"]),
        (lambda b: b["benchmarks"][0].update(params_schema={"description": "x" * 70_000}),
         [*FIRST, "params_schema"]),
    ],
)  # fmt: skip
def test_a_bad_advertisement_is_a_422_naming_the_field_and_stores_nothing(api, advert, mutate, loc) -> None:  # type: ignore[no-untyped-def]
    body = json.loads(json.dumps(advert))
    mutate(body)
    a = api.runner("node-a")
    r = _claim(api, a, benchmarks=body)
    assert r.status_code == 422, r.text
    assert loc in [e["loc"][: len(loc)] for e in r.json()["detail"]], r.json()
    with api.factory() as session:
        from kernelab.service.server.models import RunnerBenchmark

        assert session.query(RunnerBenchmark).count() == 0


def test_a_digest_the_server_does_not_hold_is_a_409_asking_for_the_advertisement(api, advert) -> None:  # type: ignore[no-untyped-def]
    a = api.runner("node-a")
    r = _claim(api, a, benchmarks_sha256="0" * 64)
    assert r.status_code == 409 and r.json()["detail"][0]["type"] == "advert_required"
    assert _claim(api, a, benchmarks=advert).status_code == 204
    assert _claim(api, a, benchmarks_sha256=RunnerAdverts.model_validate(advert).sha256).status_code == 204


def test_an_advertised_schema_never_makes_the_server_fetch_a_ref(api, advert) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as listener:  # a $ref to here: the server must not connect
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(0.0)
        body = json.loads(json.dumps(advert))
        mine = next(b for b in body["benchmarks"] if REF in b["names"])
        mine["params_schema"] = {"$ref": f"http://127.0.0.1:{listener.getsockname()[1]}/schema.json"}
        assert _claim(api, api.runner("node-a"), benchmarks=body).status_code == 204
        spec = spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"}, sweep={})
        r = api.client.post("/api/v1/jobs", json=spec, headers=api.admin)
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "advert_unusable", r.text
        with pytest.raises(BlockingIOError):
            listener.accept()


def _ref_chain(depth: int) -> dict[str, Any]:
    """A schema of a few hundred bytes whose check costs 2**depth keywords: each level is an
    ``anyOf`` of two references to the next, and the last level fails everything."""
    defs: dict[str, Any] = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}] * 2} for i in range(depth)}
    defs[f"d{depth}"] = {"not": {}}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


_BACKTRACKS = "^" + "(.*)*" * 14 + "$X"  # Python's re takes hours on 'float32'; a linear engine none


@pytest.mark.timeout(60)  # before the bound, each of these claims never answered (SQLite locked for all)
@pytest.mark.parametrize(
    "schema",
    [
        pytest.param(_ref_chain(40), id="anyOf-ref-chain"),
        pytest.param({"properties": {"dtype": {"type": "string", "pattern": _BACKTRACKS}}}, id="pattern"),
        pytest.param({"propertyNames": {"pattern": _BACKTRACKS}}, id="propertyNames"),
        pytest.param({"patternProperties": {_BACKTRACKS: {}}, "additionalProperties": False},
                     id="patternProperties"),
    ],
)  # fmt: skip
def test_a_costly_advertised_schema_is_bounded_not_a_hung_server(api, schema) -> None:  # type: ignore[no-untyped-def]
    # a runner advertises the built-in name with a schema whose check would never end; a queued
    # softmax job (accepted against the shipped schema) is checked against it at the claim
    job = api.submit(spec_dict(sweep={"M": [4], "N": [64], "dtype": ["float32"]}))
    evil = {"benchmarks": [{"names": ["softmax"], "variants": ["torch", "triton"], "params_schema": schema}]}
    assert _claim(api, api.runner("node-evil"), benchmarks=evil).status_code == 204  # it fits not: not taken
    # a spec the shipped schema refuses is tried against the runner's too: still a 422, at once
    refused = spec_dict(sweep={"M": [4], "N": [64], "dtype": ["float32"]}, params={"Q": 1})
    r = api.client.post("/api/v1/jobs", json=refused, headers=api.admin)
    assert r.status_code == 422 and ["body", "params", "Q"] in [e["loc"] for e in r.json()["detail"]], r.text
    honest = _claim(api, api.runner("node-a"))  # a runner without advertisement takes the job
    assert honest.status_code == 200 and honest.json()["job_id"] == job


def test_a_schema_costlier_than_the_bound_is_unusable_and_a_pattern_still_applies() -> None:
    from kernelab.service.contract.adverts import MAX_STEPS_PER_CELL, spec_errors
    from kernelab.service.contract.schemas import BenchmarkAdvert, JobSpec

    spec = JobSpec.model_validate(spec_dict(sweep={"M": [4], "N": [64], "dtype": ["float32", "bf16"]}))

    def errors(schema: dict[str, Any]) -> list[dict[str, Any]]:
        advert = BenchmarkAdvert(names=["softmax"], variants=["torch", "triton"], params_schema=schema)
        return spec_errors(spec, advert)

    # 2**11 anyOf/$ref keywords: past the bound, whatever the machine's speed
    assert 2**11 > MAX_STEPS_PER_CELL
    assert [e["type"] for e in errors(_ref_chain(11))] == ["advert_unusable"]
    assert errors(_ref_chain(2))[0]["type"] == "anyOf"  # a cheap one is applied
    found = errors({"properties": {"dtype": {"pattern": "^(float|bfloat)[0-9]+$"}}})
    assert [(e["loc"], e["type"]) for e in found] == [(("sweep", "dtype"), "pattern")]
    lookahead = errors({"properties": {"dtype": {"pattern": "^(?=f)"}}})
    assert [e["type"] for e in lookahead] == ["advert_unusable"] and "backtracking" in lookahead[0]["msg"]


def test_jobs_that_fit_no_runner_never_hide_a_later_job_that_fits(api, advert) -> None:  # type: ignore[no-untyped-def]
    # queued while nobody advertised the benchmark: accepted unchecked, and N=8192 fits no runner
    # that comes later; they must not hide the job behind them that fits
    spec = spec_dict(benchmark=REF, baseline={"variant": "slow"}, candidate={"variant": "fast"},
                     sweep={"N": [8192]})  # fmt: skip
    unfit = [api.submit(spec) for _ in range(20)]
    fits = api.submit({**spec, "sweep": {"N": [64]}})
    claim = _claim(api, api.runner("node-a"), benchmarks=advert)
    assert claim.status_code == 200 and claim.json()["job_id"] == fits, (claim.status_code, claim.text[:200])
    statuses = {api.client.get(f"/api/v1/jobs/{j}", headers=api.admin).json()["status"] for j in unfit}
    assert statuses == {"queued"}
