"""The house's rules, held against every import of the tree (read with ``ast``, nothing imported).

* the server (``service/``, ``web/``) never imports benchmark code (``kernelab.kernels``) nor the
  runner (``kernelab.runners``): specs are checked against what runners advertise;
* benchmarks (``kernels/``) know no database and no engine: of kernelab they import the wire
  contract only (``kernelab.service.schemas``, ``kernelab.service.samples``) and themselves;
* the wire contract knows no database: it imports pydantic, numpy and itself;
* judgement is pure: the statistics and verdict modules import no ORM, database or route;
* pages live in ``web/`` and read through the functions the API's routes call (``kernelab.service.crud``,
  ``history``, ``job_vs_job``, ...), never through a route module (``kernelab.service.api.routes``);
* of ``service/``, only the app factory (``service/app.py``) imports the dashboard (``kernelab.web``),
  to mount its pages: no service<->web import cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONTRACT = ("kernelab.service.schemas", "kernelab.service.samples", "kernelab.service.clock_events")
JUDGEMENT = (
    "service/stats.py",
    "service/estimators.py",
    "service/verdicts.py",
    "service/health.py",
    "service/report.py",
    "service/node_change.py",
    "service/units.py",
    "service/clock_events.py",
)
SERVER_ONLY = (
    "kernelab.service.models",
    "kernelab.service.crud",
    "kernelab.service.core",
    "kernelab.service.api",
)


def imports(path: Path) -> list[str]:
    """Every module ``path`` imports (absolute names; ``from x import y`` gives ``x`` and ``x.y``)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


# Packages whose ``__init__`` imports nothing of kernelab (checked below): importing a module from
# them runs only that ``__init__``.
BARE_PACKAGES = ("kernelab", "kernelab.service")


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _files(*folders: str) -> list[Path]:
    out = []
    for folder in folders:
        base = ROOT / folder
        out += sorted(base.rglob("*.py")) if base.is_dir() else [base]
    return out


def _broken(files: list[Path], forbidden) -> list[str]:
    return [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in imports(path)
        if name.startswith("kernelab") and name not in BARE_PACKAGES and forbidden(name)
    ]


def test_the_server_never_imports_benchmark_or_runner_code() -> None:
    bad = _broken(_files("service", "web"), lambda n: _within(n, ("kernelab.kernels", "kernelab.runners")))
    assert bad == []


def test_benchmarks_import_only_the_contract_and_themselves() -> None:
    bad = _broken(_files("kernels"), lambda n: not _within(n, ("kernelab.kernels", *CONTRACT)))
    assert bad == []


def test_the_contract_knows_no_database() -> None:
    contract = [p for p in _files("service") if p.name == "samples.py" and p.parent.name == "service"]
    schemas = ROOT / "service" / "schemas"
    contract += sorted(schemas.rglob("*.py")) if schemas.is_dir() else [ROOT / "service" / "schemas.py"]
    bad = _broken(contract, lambda n: not _within(n, CONTRACT))
    assert bad == []


@pytest.mark.parametrize("module", JUDGEMENT)
def test_judgement_is_pure(module: str) -> None:
    bad = _broken([ROOT / module], lambda n: _within(n, SERVER_ONLY))
    assert bad == []


ROUTES = ("kernelab.service.api.routes",)
WEB = ("kernelab.web",)
APP_FACTORY = ROOT / "service" / "app.py"


def test_pages_never_import_a_route_module() -> None:
    bad = _broken(_files("web"), lambda n: _within(n, ROUTES))
    assert bad == []


def test_only_the_app_factory_imports_the_dashboard() -> None:
    service = [p for p in _files("service") if p != APP_FACTORY]
    assert APP_FACTORY.is_file() and len(service) > 50
    bad = _broken(service, lambda n: _within(n, WEB))
    assert bad == []


def test_the_app_factory_mounts_the_pages_of_web() -> None:
    """The factory is the one door between the rooms: it imports the dashboard's routers, sign-in too."""
    assert {"kernelab.web.login", "kernelab.web.routes", "kernelab.web.manage"} <= set(imports(APP_FACTORY))


def test_the_page_rules_catch_what_they_forbid(tmp_path: Path) -> None:
    """A route import in any form ``imports`` reads is caught; the API's shared parts are not."""
    page = tmp_path / "page.py"
    page.write_text(
        "from kernelab.service.api import routes\n"
        "from kernelab.service.api.deps import SessionDep\n"
        "def f():\n    from kernelab.service.api.routes.login import same_origin\n"
    )
    assert [n for n in imports(page) if _within(n, ROUTES)] == [
        "kernelab.service.api.routes",
        "kernelab.service.api.routes.login",
        "kernelab.service.api.routes.login.same_origin",
    ]
    assert _within("kernelab.web.login", WEB) and not _within("kernelab.webhooks", WEB)


def test_the_bare_packages_import_nothing_of_kernelab_when_run() -> None:
    """``service/__init__.py`` and ``kernelab/__init__.py`` run no import of kernelab (the public
    names of ``kernelab`` load on first use; its ``TYPE_CHECKING`` block never runs)."""
    for path in (ROOT / "service" / "__init__.py", ROOT / "kernelab" / "__init__.py"):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        run = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = [a.name for n in run if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in run if isinstance(n, ast.ImportFrom) and n.module]
        assert [n for n in names if n.startswith("kernelab")] == [], path


def test_imports_reads_every_form(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import a.b\nfrom c import d\nfrom . import e\ndef f():\n    import g\n")
    assert imports(probe) == ["a.b", "c", "c.d", "g"]
