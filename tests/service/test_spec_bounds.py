"""Bad specs and specs that expand: a 422 naming the field, before anything is built.

A 712-byte spec of 10 keys x 10 values is 10**10 cells: its cell count must be computed, not
its cells; a benchmark reference that is malformed or names no concrete benchmark is a 422 on
``benchmark``, never a 500; integers that reach torch (seed, parameter values) are bounded here
rather than refused by every cell on a runner.
"""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import spec_dict
from pydantic import ValidationError

from kernelab.service.contract.schemas import MAX_CELLS, MAX_PARAM_KEYS, JobSpec

BOMB_SWEEP = {f"k{i}": list(range(10)) for i in range(10)}  # 10**10 cells
SOURCE = {"repo": "https://example.com/kernels.git", "ref": "0123abcd"}  # validated on the runner only


def _errors(response: Any) -> list[dict[str, Any]]:
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert isinstance(detail, list)
    return detail


def _post(api: Any, body: dict[str, Any]) -> Any:
    return api.client.post("/api/v1/jobs", json=body, headers=api.admin)


def test_ten_billion_cells_are_a_422_naming_the_sweep_and_the_count(api) -> None:  # type: ignore[no-untyped-def]
    body = spec_dict(sweep=BOMB_SWEEP)
    assert len(json.dumps(body)) < 1000
    detail = _errors(_post(api, body))
    assert [e["loc"] for e in detail] == [["body", "sweep"]]
    assert "10000000000 cells" in detail[0]["msg"] and str(MAX_CELLS) in detail[0]["msg"]
    assert api.client.get("/api/v1/jobs", headers=api.admin).json()["count"] == 0


def test_sweep_by_device_counts_its_merged_grid(api) -> None:  # type: ignore[no-untyped-def]
    cuda = {f"k{i}": list(range(10)) for i in range(4)}
    body = spec_dict(sweep={"M": [4, 8]}, sweep_by_device={"cuda": cuda})
    detail = _errors(_post(api, body))
    assert [e["loc"] for e in detail] == [["body", "sweep_by_device"]]
    assert "20000 cells on cuda" in detail[0]["msg"]
    empty = spec_dict(sweep_by_device={"cpu": {"N": []}})  # an empty list: no cell, not the base cell
    assert ["body", "sweep_by_device", "cpu", "N"] in [e["loc"] for e in _errors(_post(api, empty))]


def _refused_with_peak(body: dict[str, Any]) -> tuple[ValidationError, int]:
    """The ``ValidationError`` of ``JobSpec.model_validate(body)`` (the test fails if it validates)
    and the peak bytes Python allocated meanwhile (``tracemalloc``)."""
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError) as info:
            JobSpec.model_validate(body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value, peak


def test_the_cell_count_is_arithmetic_not_built() -> None:
    # 10**5 cells: building them (as the check did) allocates tens of MB; counting allocates nothing.
    body = spec_dict(sweep={f"k{i}": list(range(10)) for i in range(5)})
    error, peak = _refused_with_peak(body)
    assert "100000 cells" in str(error)
    assert peak < 1_000_000, f"validation allocated {peak} bytes"
    body = spec_dict(sweep={"M": [1, 2, 3], "N": [4, 5]}, sweep_by_device={"cuda": {"N": [6]}})
    spec = JobSpec.model_validate(body)
    for dev in ("cpu", "cuda"):
        assert spec.cell_count(dev) == len(spec.cells(dev))


def test_one_cell_is_built_alone_and_equals_the_sweeps() -> None:
    # a revision worker asks for cell i of up to MAX_CELLS: building them all per request was
    # MAX_CELLS**2 dicts per side
    body = spec_dict(
        params={"M": 0, "z": 1},
        sweep={"M": [1, 2, 3], "N": [4, 5], "dtype": ["a", "b"]},
        sweep_by_device={"cuda": {"N": [7]}},
    )
    spec = JobSpec.model_validate(body)
    for dev in ("cpu", "cuda"):
        cells = spec.cells(dev)
        alone = [spec.cell(dev, i) for i in range(spec.cell_count(dev))]
        assert [list(c.items()) for c in alone] == [list(c.items()) for c in cells]
        with pytest.raises(IndexError):
            spec.cell(dev, len(cells))
    assert JobSpec.model_validate(spec_dict(sweep={})).cell("cpu", 0) == {}
    big = JobSpec.model_validate(spec_dict(sweep={"M": list(range(64)), "N": list(range(64))}))
    tracemalloc.start()
    try:
        assert big.cell("cuda", 4095) == {"M": 63, "N": 63}
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 100_000, f"one cell allocated {peak} bytes"


def test_too_many_parameter_keys_name_the_mapping(api) -> None:  # type: ignore[no-untyped-def]
    many = {f"p{i}": 1 for i in range(MAX_PARAM_KEYS + 1)}
    for change, loc in [
        ({"params": many}, ["body", "params"]),
        ({"baseline": {"variant": "torch", "params": many}}, ["body", "baseline", "params"]),
        ({"sweep": {k: [v] for k, v in many.items()}}, ["body", "sweep"]),
    ]:
        assert loc in [e["loc"] for e in _errors(_post(api, spec_dict(**change)))]


@pytest.mark.parametrize(
    "ref",
    [
        ".x:y",
        "..:y",
        ":y",
        "x:",
        "kernelab.kernels.softmax:",
        "a..b:C",
        "kernelab.kernels.softmax:Softmax..x",
        "kernels softmax:X",
        "../etc:passwd",
        "soft max",
        "",
    ],
)
def test_malformed_benchmark_references_are_a_422_on_benchmark(api, ref: str) -> None:  # type: ignore[no-untyped-def]
    for body in (
        spec_dict(benchmark=ref),
        spec_dict(benchmark=ref, baseline={"variant": "a", "source": SOURCE}),
    ):
        assert [e["loc"] for e in _errors(_post(api, body))] == [["body", "benchmark"]]


@pytest.fixture
def user_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A package of benchmarks that fail in every way a user's can, importable as ``kl_user_*``."""
    (tmp_path / "kl_user_raises.py").write_text("raise RuntimeError('no GPU here')\n", encoding="utf-8")
    (tmp_path / "kl_user_syntax.py").write_text("def broken(:\n", encoding="utf-8")
    (tmp_path / "kl_user_benches.py").write_text(
        textwrap.dedent("""\
        from kernelab.kernels import Benchmark

        class Abstract(Benchmark):
            name = "abstract"

        class NeedsArgs(Benchmark):
            name, variants = "needs-args", ("a", "b")
            def __init__(self, size):
                self.size = size
            def make_inputs(self, params, device, seed): return {}
            def prepare(self, variant, params, inputs): return lambda: None
            def reference(self, params, inputs): return None
            def work(self, params, variant): return None

        class Undeclared(NeedsArgs):
            def __init__(self):
                pass
        Undeclared.variants = None

        not_a_class = 3
        """),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "kl_user_"
    for name in ("kl_user_raises", "kl_user_syntax", "kl_user_benches"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("kernelab.kernels.base:Benchmark", "abstract benchmark class"),
        ("kl_user_benches:Abstract", "abstract benchmark class"),
        ("kl_user_benches:NeedsArgs", "cannot be constructed: TypeError"),
        ("kl_user_benches:Undeclared", "declares no 'variants'"),
        ("kl_user_benches:not_a_class", "is not a kernelab.kernels.Benchmark subclass or instance"),
        ("kl_user_benches:Missing", "has no attribute 'Missing'"),
        ("kl_user_raises:Bench", "cannot import module 'kl_user_raises': RuntimeError: no GPU here"),
        ("kl_user_syntax:Bench", "cannot import module 'kl_user_syntax': SyntaxError"),
        ("kernelab.kernels.base:Params", "is not a kernelab.kernels.Benchmark subclass or instance"),
    ],
)
def test_references_to_no_concrete_benchmark_are_an_error_on_benchmark_where_they_are_imported(
    user_modules: str, ref: str, fragment: str
) -> None:
    # where benchmark code is imported (``kernelab validate``, the runner), never on the server:
    # there such a reference waits for a runner that advertises it (tests/service/test_adverts.py)
    from kernelab.kernels import validate_spec

    detail = validate_spec(JobSpec.model_validate(spec_dict(benchmark=ref)))
    assert [e["loc"] for e in detail] == [("benchmark",)]
    assert fragment in detail[0]["msg"]


@pytest.mark.parametrize(
    ("change", "loc"),
    [
        ({"measurement": {"seed": 10**29}}, ["body", "measurement", "seed"]),
        ({"measurement": {"seed": 2**62 + 1}}, ["body", "measurement", "seed"]),
        ({"measurement": {"seed": -1}}, ["body", "measurement", "seed"]),
        ({"sweep": {"M": [10**29]}}, ["body", "sweep", "M", 0]),
        ({"params": {"M": -(10**19)}}, ["body", "params", "M"]),
        ({"candidate": {"variant": "b", "params": {"B": 2**63}}}, ["body", "candidate", "params", "B"]),
    ],
)
def test_integers_beyond_what_torch_takes_are_refused_at_the_door(api, change, loc) -> None:  # type: ignore[no-untyped-def]
    # a spec with source revisions is checked against its benchmark only on the runner: the bounds
    # must hold in the schema itself, or every cell fails there
    body = spec_dict(
        baseline={"variant": "a", "source": SOURCE}, benchmark="kernelab.kernels.softmax:Softmax"
    )
    body.update(change)
    assert loc in [e["loc"] for e in _errors(_post(api, body))]


def test_the_largest_seed_is_accepted(api) -> None:  # type: ignore[no-untyped-def]
    r = _post(api, spec_dict(measurement={"seed": 2**62, "min_rounds": 4, "max_rounds": 8}))
    assert r.status_code == 201, r.text


def test_spec_validation_against_the_benchmark_runs_off_the_event_loop(
    api,
    monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
) -> None:
    from kernelab.service.server import (
        offers,  # POST /jobs checks the spec through crud.accept_spec -> offers
    )

    seen: list[bool] = []
    real = offers.check_spec

    def probe(session: Any, spec: JobSpec, **kwargs: Any) -> Any:
        try:
            asyncio.get_running_loop()
            seen.append(True)
        except RuntimeError:  # no loop in this thread: a worker thread of the pool
            seen.append(False)
        return real(session, spec, **kwargs)

    monkeypatch.setattr(offers, "check_spec", probe)
    assert _post(api, spec_dict()).status_code == 201
    assert seen == [False]


def test_an_oversized_sweep_is_refused_before_its_values_are_validated() -> None:
    # three grids of 64 x 4,096 values (4.5 MB of JSON, inside the body limit): counting first
    # refuses them without validating (copying) 786,432 values on the event loop
    grid = {f"k{i}": list(range(4096)) for i in range(64)}
    body = spec_dict(sweep=grid, sweep_by_device={"cpu": grid, "cuda": grid})
    error, peak = _refused_with_peak(body)
    assert [e["loc"] for e in error.errors()] == [("sweep",), ("sweep_by_device",)]
    assert "more than 10**18 cells" in str(error)
    assert peak < 1_000_000, f"validation allocated {peak} bytes"


@pytest.mark.parametrize(
    ("correctness", "loc"),
    [
        ({"input_scale": 1e308}, ["body", "correctness", "input_scale"]),
        ({"input_scale": 5e-324}, ["body", "correctness", "input_scale"]),
        ({"input_scale": 2.0**10 * 1.001}, ["body", "correctness", "input_scale"]),
        ({"rtol": 1e308}, ["body", "correctness", "rtol"]),
        ({"rtol": 1.5}, ["body", "correctness", "rtol"]),
        ({"atol": 1e308}, ["body", "correctness", "atol"]),
        ({"atol": 1e6 * 1.001}, ["body", "correctness", "atol"]),
    ],
)
def test_tolerances_and_input_scale_are_bounded_at_the_door(api, correctness, loc) -> None:  # type: ignore[no-untyped-def]
    """Attack finding 9: ``input_scale: 1e308`` (every input ``inf``), ``5e-324`` (every input 0)
    and ``rtol``/``atol: 1e308`` (nothing checked) were accepted with 201."""
    for body in (spec_dict(correctness=correctness),
                 spec_dict(correctness=correctness, baseline={"variant": "a", "source": SOURCE},
                           benchmark="kernelab.kernels.softmax:Softmax")):  # fmt: skip
        assert [e["loc"] for e in _errors(_post(api, body))] == [loc]


def test_the_bounds_of_tolerances_and_input_scale_are_accepted(api) -> None:  # type: ignore[no-untyped-def]
    from kernelab.service.contract.schemas import STORED, CorrectnessSpec

    bounds = ({"input_scale": 2.0**10, "rtol": 1.0, "atol": 1e6}, {"input_scale": 2.0**-10, "atol": 0})
    for correctness in bounds:
        r = _post(api, spec_dict(correctness=correctness))
        assert r.status_code == 201, r.text
    # a spec stored before the bounds still reads back (door-only bounds)
    assert CorrectnessSpec.model_validate({"input_scale": 1e308, "rtol": 1e308}, context=STORED).rtol == 1e308
