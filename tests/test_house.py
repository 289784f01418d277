"""The house's rules, held against every import of the tree (read with ``ast``, nothing imported;
imports inside functions count too).

The package ``kernelab`` is made of rooms, one folder each (``docs/architecture.md``, "Rooms"):

* ``service/contract/``: the wire contract, what runner and server exchange. It imports itself only;
* ``service/judge/``: pure judgement (statistics, verdicts, health rules, reports). It imports the
  contract and itself: no ORM, database or route;
* ``service/server/``: the API, database, queue and workers. It imports the contract and the judge,
  never the pages, the runner or benchmark code (specs are checked against what runners advertise);
* ``web/``: every page. It imports the server's crud and queries (never a route module), the judge
  and the contract;
* ``kernels/``: benchmarks. Of kernelab they import the contract and themselves: no database, no
  engine;
* ``runners/``: engine, probes, daemon, CLI. They talk to the server over HTTP; only the CLI's
  server commands (``runners/cli/server.py``: ``serve``, ``compare-worker``, token admin) import
  the server, inside those commands;
* ``migrations/``: the database's history, over the server's models;
* the root package ``kernelab/``: the public names (loaded on first use), ``python -m kernelab``
  and the app factory (``kernelab/app.py``, the API and the pages put together), above every room;
  ``kernelab/workload.py`` (what a workload process imports) is a leaf that imports no room.

No cycle runs between the rooms.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Room of a file, by the longest matching path prefix; of a module, by its dotted name.
ROOMS = {
    "service/contract/": "contract",
    "service/judge/": "judge",
    "service/server/": "server",
    "web/": "web",
    "kernels/": "kernels",
    "runners/": "runners",
    "migrations/": "migrations",
    "kernelab/workload.py": "workload",
    "kernelab/": "root",
}
MODULE_ROOMS = {
    "kernelab.service.contract": "contract",
    "kernelab.service.judge": "judge",
    "kernelab.service.server": "server",
    "kernelab.web": "web",
    "kernelab.kernels": "kernels",
    "kernelab.runners": "runners",
    "kernelab.migrations": "migrations",
    "kernelab.workload": "workload",
}
# What each room may import (besides itself).
ALLOWED = {
    "contract": set(),
    "judge": {"contract"},
    "server": {"contract", "judge"},
    "web": {"contract", "judge", "server"},
    "kernels": {"contract"},
    "runners": {"contract", "judge", "kernels", "workload"},
    "migrations": {"server"},
    "workload": set(),
    "root": {"contract", "judge", "server", "web", "kernels", "runners", "migrations", "workload"},
}
# The one door from the runner's CLI into the server: the commands that run it.
RUNNER_SERVER_DOOR = "runners/cli/server.py"
# Packages whose ``__init__`` imports nothing of kernelab when run (checked below): importing a
# module of them runs only that ``__init__``, so they are no edge of the house.
BARE_PACKAGES = ("kernelab", "kernelab.service")


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


def room_of_file(path: Path) -> str | None:
    rel = path.relative_to(ROOT).as_posix()
    for prefix in sorted(ROOMS, key=len, reverse=True):
        if rel == prefix or rel.startswith(prefix):
            return ROOMS[prefix]
    return None


def room_of_module(name: str) -> str | None:
    if name in BARE_PACKAGES or not name.startswith("kernelab"):
        return None
    for prefix in sorted(MODULE_ROOMS, key=len, reverse=True):
        if name == prefix or name.startswith(prefix + "."):
            return MODULE_ROOMS[prefix]
    module = name.split(".")[1]
    if (ROOT / "kernelab" / f"{module}.py").exists():
        return "root"
    return None  # a name of the bare package itself (``from kernelab import __version__``)


def _house_files() -> list[Path]:
    files: list[Path] = []
    for folder in ("service", "web", "kernels", "runners", "migrations"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return files + sorted((ROOT / "kernelab").glob("*.py"))


def edges() -> list[tuple[Path, str, str, str]]:
    """``(file, its room, imported module, that module's room)`` for every kernelab import between
    two rooms."""
    out = []
    for path in _house_files():
        here = room_of_file(path)
        for name in imports(path):
            there = room_of_module(name)
            if here and there and there != here:
                out.append((path, here, name, there))
    return out


def test_every_file_has_a_room() -> None:
    service_top = [p.name for p in (ROOT / "service").glob("*.py") if p.name != "__init__.py"]
    assert service_top == [], "a module of service/ belongs in contract/, judge/ or server/"
    bare = [ROOT / "service" / "__init__.py"]
    assert [p for p in _house_files() if room_of_file(p) is None and p not in bare] == []


def test_each_room_imports_only_what_it_may() -> None:
    bad = [
        f"{path.relative_to(ROOT)} ({here}) imports {name} ({there})"
        for path, here, name, there in edges()
        if there not in ALLOWED[here]
        and not (there == "server" and path.relative_to(ROOT).as_posix() == RUNNER_SERVER_DOOR)
    ]
    assert bad == []


def test_the_runner_reaches_the_server_only_inside_its_server_commands() -> None:
    door = ROOT / RUNNER_SERVER_DOOR
    top_level = [
        n.module
        for n in ast.parse(door.read_text(encoding="utf-8")).body
        if isinstance(n, ast.ImportFrom) and n.module
    ]
    assert [m for m in top_level if room_of_module(m) == "server"] == []


def test_pages_read_through_crud_not_routes() -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path, here, name, _ in edges()
        if here == "web" and name.startswith("kernelab.service.server.api.routes")
    ]
    assert bad == []


def test_no_cycle_between_rooms() -> None:
    graph: dict[str, set[str]] = {room: set() for room in ALLOWED}
    for _, here, _, there in edges():
        graph[here].add(there)
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"rooms import each other in a circle: {' -> '.join(cycle.args[1])}")
    assert order[0] in {"contract", "workload"} and order[-1] == "root"


@pytest.mark.parametrize("room", ["judge", "contract"])
def test_judgement_and_contract_are_pure(room: str) -> None:
    """No ORM, database, web framework or HTTP client: these rooms are data and functions."""
    server_libs = ("sqlalchemy", "fastapi", "starlette", "alembic", "psycopg", "uvicorn", "httpx", "torch")
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _house_files()
        if room_of_file(path) == room
        for name in imports(path)
        if name.split(".")[0] in server_libs
    ]
    assert bad == []


def test_the_bare_packages_import_nothing_of_kernelab_when_run() -> None:
    """``service/__init__.py`` and ``kernelab/__init__.py`` run no import of kernelab (the public
    names of ``kernelab`` load on first use; its ``TYPE_CHECKING`` block never runs)."""
    for path in (ROOT / "service" / "__init__.py", ROOT / "kernelab" / "__init__.py"):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        run = [n for n in body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = [a.name for n in run if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in run if isinstance(n, ast.ImportFrom) and n.module]
        assert [n for n in names if n.startswith("kernelab")] == [], path


def test_the_rules_catch_a_wrong_import(tmp_path: Path) -> None:
    """The rule table is not vacuous: a judge module importing the server, and the contract
    importing the judge, are both refused by ``ALLOWED``."""
    assert "server" not in ALLOWED["judge"] and "judge" not in ALLOWED["contract"]
    assert room_of_module("kernelab.service.server.models") == "server"
    assert room_of_module("kernelab.service.judge.verdicts") == "judge"
    assert room_of_module("kernelab.app") == "root"
    assert room_of_file(ROOT / "kernelab" / "workload.py") == "workload"


def test_imports_reads_every_form(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import a.b\nfrom c import d\nfrom . import e\ndef f():\n    import g\n")
    assert imports(probe) == ["a.b", "c", "c.d", "g"]


def room_graph() -> dict[tuple[str, str], int]:
    """How many imports run from each room to each other room, as the tree stands."""
    counts: dict[tuple[str, str], int] = {}
    for _, here, _, there in edges():
        counts[here, there] = counts.get((here, there), 0) + 1
    return counts


if __name__ == "__main__":  # python tests/test_house.py [--dot]: the rooms' imports as they stand
    import sys

    graph = room_graph()
    if "--dot" in sys.argv[1:]:
        print("digraph house {")
        for (here, there), n in sorted(graph.items()):
            print(f'  "{here}" -> "{there}" [label="{n}"];')
        print("}")
    else:
        for (here, there), n in sorted(graph.items()):
            print(f"{here:>10} -> {there:<10} {n:4d} imports")
