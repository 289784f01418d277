"""Resolving a spec's ``benchmark`` imports the module it names: ``venv.__main__:X`` ran venv's
``main()``, whose ``SystemExit`` was a 500; ``kernelab validate`` with it created a virtualenv.

A ``__main__`` module or one of the standard library is refused by form (nothing imported: a 422
naming ``benchmark`` on the server too). The server imports no benchmark at all: a reference no
runner advertises is queued and waits (``kernelab.service.server.offers``), never imported. Where
benchmarks are imported (``kernelab validate``, the runner), any ``BaseException`` but
``KeyboardInterrupt`` of an import or a constructor is an error naming ``benchmark`` / a
``FILE:LINE`` message with exit status 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import spec_dict

from kernelab.kernels import BenchmarkError, load_object

pytestmark = pytest.mark.timeout(120)

MODULES = ("kl_exits", "kl_prog", "kl_prog.__main__", "kl_ctor_exits")


@pytest.fixture
def programs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Importable modules that exit or leave a mark when imported; yields the mark's path."""
    mark = tmp_path / "imported.mark"
    (tmp_path / "kl_exits.py").write_text("raise SystemExit(3)\n", encoding="utf-8")
    (tmp_path / "kl_prog").mkdir()
    (tmp_path / "kl_prog" / "__init__.py").write_text("", encoding="utf-8")
    (tmp_path / "kl_prog" / "__main__.py").write_text(
        f"open({str(mark)!r}, 'w').close()\nraise SystemExit(0)\n", encoding="utf-8"
    )
    (tmp_path / "kl_ctor_exits.py").write_text(
        textwrap.dedent("""\
        import sys
        from kernelab.kernels import Benchmark

        class Bench(Benchmark):
            name, variants = "exits", ("a", "b")
            def __init__(self):
                sys.exit("constructed")
            def make_inputs(self, params, device, seed): return {}
            def prepare(self, variant, params, inputs): return lambda: None
            def reference(self, params, inputs): return None
            def work(self, params, variant): return None
        """),
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield mark
    for name in MODULES:
        sys.modules.pop(name, None)


def _benchmark_error(api: Any, ref: str) -> str:
    r = api.client.post("/api/v1/jobs", json=spec_dict(benchmark=ref), headers=api.admin)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert [e["loc"] for e in detail] == [["body", "benchmark"]], detail
    return str(detail[0]["msg"])


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("kl_prog.__main__:X", "'__main__' module"),
        ("venv.__main__:X", "'__main__' module"),
        ("kl_prog.__main__.x:X", "'__main__' module"),
        ("venv:main", "standard library ('venv')"),
        ("antigravity:x", "standard library ('antigravity')"),
    ],
)
def test_a_benchmark_that_is_a_program_is_a_422_on_benchmark(
    api,
    programs: Path,
    ref: str,
    fragment: str,  # type: ignore[no-untyped-def]
) -> None:
    assert fragment in _benchmark_error(api, ref)
    assert not programs.exists()  # the __main__ module never ran
    assert api.client.get("/healthz").status_code == 200  # the server is still there


@pytest.mark.parametrize("ref", ["kl_exits:Bench", "kl_ctor_exits:Bench"])
def test_the_server_queues_a_benchmark_that_exits_without_importing_it(api, programs: Path, ref: str) -> None:  # type: ignore[no-untyped-def]
    r = api.client.post("/api/v1/jobs", json=spec_dict(benchmark=ref), headers=api.admin)
    assert r.status_code == 201 and "no live runner advertises it" in r.json()["waiting_for"]
    assert ref.partition(":")[0] not in sys.modules
    assert api.client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("kl_exits:Bench", "cannot import module 'kl_exits': SystemExit: 3"),
        ("kl_ctor_exits:Bench", "cannot be constructed: SystemExit: constructed"),
    ],
)
def test_where_benchmarks_are_imported_one_that_exits_is_an_error_on_benchmark(
    programs: Path, ref: str, fragment: str
) -> None:
    from kernelab.kernels import validate_spec
    from kernelab.service.contract.schemas import JobSpec

    errors = validate_spec(JobSpec.model_validate(spec_dict(benchmark=ref, baseline={"variant": "a"},
                                                            candidate={"variant": "b"})))  # fmt: skip
    assert [e["loc"] for e in errors] == [("benchmark",)] and fragment in errors[0]["msg"]


def test_load_object_refuses_programs_without_importing_them(programs: Path) -> None:
    for ref in ("kl_prog.__main__:X", "venv.__main__:X", "this:s"):
        with pytest.raises(BenchmarkError):
            load_object(ref)
    assert not programs.exists() and "kl_prog.__main__" not in sys.modules and "this" not in sys.modules


def test_load_object_lets_keyboard_interrupt_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kl_interrupts.py").write_text("raise KeyboardInterrupt\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(KeyboardInterrupt):
            load_object("kl_interrupts:X")
    finally:
        sys.modules.pop("kl_interrupts", None)


@pytest.mark.parametrize(
    ("ref", "fragment"),
    [
        ("kl_exits:Bench", "benchmark: cannot import module 'kl_exits': SystemExit: 3"),
        ("kl_prog.__main__:X", "'__main__' module"),
    ],
)
def test_kernelab_validate_reports_them_as_file_line_exit_2(
    programs: Path, tmp_path: Path, ref: str, fragment: str
) -> None:
    spec = tmp_path / "spec.yaml"
    text = f'benchmark: "{ref}"\nbaseline: {{variant: a}}\ncandidate: {{variant: b}}\n'
    spec.write_text(text, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(programs.parent), *sys.path])}
    done = subprocess.run([sys.executable, "-m", "kernelab.runners.cli", "validate", str(spec)], env=env,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert f"{spec}:1: " in done.stderr + done.stdout and fragment in done.stderr + done.stdout
    assert "Traceback" not in done.stderr
    assert not programs.exists()
