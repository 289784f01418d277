"""The runner's modules import each other in one direction: the import graph of ``runners/`` has no
cycle (read with ``ast``, nothing imported, as ``tests/test_house.py`` reads the house's rules).

The job path runs from the daemon down to the timer: ``daemon`` -> ``worker`` -> ``job`` /
``revision_job`` -> ``children`` (the job's child processes, seen from the parent) ->
``forkserver`` -> ``measure`` (the measuring child) -> ``cells`` -> ``pipeline`` -> ``engine``,
``sides``, ``static_metrics`` -> ``timing``. A cycle held apart only by an import inside a function
still counts, so every import is read: at module level, inside functions and methods, under ``if``
and ``try``. Imports under ``if TYPE_CHECKING:`` are left out: they never run (annotations only), so
they can neither form an import cycle nor dodge one (a name they bring cannot be used at run time).

An edge goes from a module to each module of ``runners/`` it imports: ``import a.b`` and ``from a
import b`` name ``a.b`` where that is a module, else ``a``; importing ``p.m`` also runs the package
``p``'s ``__init__``, so it is an edge to ``p`` as well, unless the importer is inside ``p`` (then
``p`` is imported already). No cycle is known today (``KNOWN_CYCLES`` is empty): a new one is either
broken or added there with the reason it must stay.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "kernelab.runners"

KNOWN_CYCLES: dict[frozenset[str], str] = {}
"""Cycles allowed for now (their modules, short names such as ``daemon.loop``) -> why they stay."""


def module_name(path: Path, root: Path, package: str) -> str:
    """The dotted name of ``path``, a file under ``root`` that is the package ``package``."""
    parts = [*package.split("."), *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """``id`` of every node inside an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``) body."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def imported_names(path: Path, name: str, is_package: bool) -> list[str]:
    """Every module name the file ``path`` (module ``name``) may import when it runs, wherever the
    import statement is (``TYPE_CHECKING`` blocks left out): ``import a.b`` gives ``a.b``; ``from a
    import b`` gives ``a.b`` (which may be a module, or a name in ``a``); relative imports are
    made absolute."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = _type_checking_nodes(tree)
    names: list[str] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            names += [f"{base}.{a.name}" for a in node.names]
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """The modules of the package at ``root`` -> the modules of it they import (module docstring)."""
    files = {
        module_name(p, root, package): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts
    }
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges = graph.setdefault(name, set())
        for imported in imported_names(path, name, path.name == "__init__.py"):
            target = imported
            while target and target not in files:  # ``from a import b`` where ``b`` is no module
                target = target.rpartition(".")[0]
            while target:
                if target != name and not name.startswith(target + "."):
                    edges.add(target)
                target = target.rpartition(".")[0]
                target = target if target in files else ""
    return graph


def find_cycle(graph: dict[str, set[str]], known: dict[frozenset[str], str]) -> list[str] | None:
    """One import cycle of ``graph`` (``[a, b, ..., a]``), or None; the edges of each ``known``
    cycle (between its modules) are left out first."""
    kept = {m: {t for t in ts if not any(m in c and t in c for c in known)} for m, ts in graph.items()}
    try:
        tuple(graphlib.TopologicalSorter(kept).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def _short(name: str) -> str:
    return name.removeprefix(PACKAGE + ".")


def test_the_runner_imports_in_one_direction() -> None:
    graph = import_graph(ROOT / "runners", PACKAGE)
    known = {frozenset(f"{PACKAGE}.{m}" for m in c): why for c, why in KNOWN_CYCLES.items()}
    cycle = find_cycle(graph, known)
    assert cycle is None, "import cycle in runners/: " + " -> ".join(_short(m) for m in cycle or [])


def test_the_job_path_runs_from_the_daemon_down_to_the_timer() -> None:
    """The job path's modules, each above the next (module docstring): nothing one of them imports,
    directly or through others, leads back to it or to a module above it."""
    graph = import_graph(ROOT / "runners", PACKAGE)
    order = ["daemon.loop", "worker", "job", "children", "forkserver", "measure", "cells", "pipeline",
             "engine", "timing"]  # fmt: skip

    def reach(start: str) -> set[str]:
        seen, todo = set(), [f"{PACKAGE}.{start}"]
        while todo:
            for nxt in graph.get(todo.pop(), set()) - seen:
                seen.add(nxt)
                todo.append(nxt)
        return {_short(m) for m in seen}

    for i, upper in enumerate(order):
        below = reach(upper)
        assert not set(order[: i + 1]) & below, f"{upper} reaches {set(order[: i + 1]) & below}"
    assert "revision_worker" not in reach("static_metrics.aot")  # the compile child loads alike, below


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / "pkg" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "pkg"


def test_an_import_inside_a_function_still_closes_a_cycle(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "__init__.py": "",
        "a.py": "from pkg.b import g\n",
        "b.py": "def g():\n    from pkg import a\n    return a\n",
    })  # fmt: skip
    graph = import_graph(root, "pkg")
    assert graph == {"pkg": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}}
    assert find_cycle(graph, {}) in (["pkg.a", "pkg.b", "pkg.a"], ["pkg.b", "pkg.a", "pkg.b"])
    assert find_cycle(graph, {frozenset({"pkg.a", "pkg.b"}): "a reason"}) is None


def test_the_reader_counts_packages_and_relative_imports_and_skips_type_checking(tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "from . import leaf\n",
        "sub/leaf.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import top\n"
                       "def f():\n    from ..other import name\n",
        "top.py": "import pkg.sub.leaf\ntry:\n    from . import other\nexcept ImportError:\n    pass\n",
        "other.py": "import json\n",
    })  # fmt: skip
    graph = import_graph(root, "pkg")
    assert graph["pkg.sub"] == {"pkg.sub.leaf"}  # a package's own submodule
    assert graph["pkg.sub.leaf"] == {"pkg.other"}  # the TYPE_CHECKING import left out
    assert graph["pkg.top"] == {"pkg.sub.leaf", "pkg.sub", "pkg.other"}  # pkg.sub's __init__ runs too
    assert graph["pkg.other"] == set()
    assert find_cycle(graph, {}) is None
    graph["pkg.sub"].add("pkg.top")  # a cycle through a package's __init__: top -> sub -> top
    assert find_cycle(graph, {}) is not None
