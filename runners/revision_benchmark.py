"""A source revision's benchmark loaded in this process, after the revision's checkout went first
on ``sys.path``: ``revision_reference`` (what to import for a reference on that revision: a
built-in benchmark on a revision of kernelab itself is that revision's) and ``load_benchmark``.

Used by the revision worker (``kernelab.runners.revision_worker``) and the ahead-of-time compile
child (``kernelab.runners.static_metrics.aot``), which load a revision's benchmark alike. Importing
this module imports neither torch nor any benchmark: ``load_benchmark`` imports the one it names.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from kernelab.kernels.base import builtin_reference

__all__ = ["WorkerError", "load_benchmark", "purge_shadowed", "revision_reference"]

_BENCHMARK_METHODS = ("variants", "make_inputs", "prepare", "reference", "work", "parse_params", "tolerances")


class WorkerError(Exception):
    """A request a revision's worker cannot serve (here: a benchmark it cannot load); its message is
    the answer's ``error`` (``kernelab.runners.revision_worker``), or the compile item's
    (``kernelab.runners.static_metrics.aot``)."""


def purge_shadowed(top: str, path: Path) -> None:
    """Forget imported modules of package ``top`` when the revision at ``path`` has its own."""
    if top == "kernelab" or not ((path / top).is_dir() or (path / f"{top}.py").is_file()):
        return  # the installed kernelab (the measurement framework) is never replaced
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]
    importlib.invalidate_caches()


_LIBRARY = "kernelab.kernels"


def revision_reference(ref: str, path: Path | None) -> str:
    """The ``module:object`` to load for ``ref`` when the revision's checkout is at ``path``.

    A benchmark of kernelab's own library (a built-in name or ``kernelab.kernels.*``) measured on a
    revision of kernelab itself comes from that revision: a checkout of today's layout (a
    ``kernelab/`` package beside ``kernels/``) gets its ``kernels/`` folder mounted as
    ``kernelab.kernels`` (the installed one is forgotten first; the framework keeps what it
    imported); an older checkout (a top-level ``kernels`` package) is loaded under its own name.
    Any other reference, or a revision that is not a kernelab checkout, is returned unchanged.
    """
    target = ref if ":" in ref else builtin_reference(ref)
    if target is None or path is None or not target.startswith(_LIBRARY + "."):
        return ref
    library = path / "kernels"
    if not (library / "__init__.py").is_file():
        return target
    if (path / "kernelab" / "__init__.py").is_file():
        for name in [n for n in sys.modules if n == _LIBRARY or n.startswith(_LIBRARY + ".")]:
            del sys.modules[name]
        spec = importlib.util.spec_from_file_location(
            _LIBRARY, library / "__init__.py", submodule_search_locations=[str(library)]
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[_LIBRARY] = module
        sys.modules["kernelab"].kernels = module  # type: ignore[attr-defined]
        spec.loader.exec_module(module)
        return target
    purge_shadowed("kernels", path)
    return target.removeprefix("kernelab.")


def load_benchmark(ref: str) -> Any:
    """The benchmark object named by ``ref`` (``module:object`` or a built-in name), instantiated.

    Checked by its methods, not by ``isinstance``: a benchmark from a kernelab revision subclasses
    that revision's ``Benchmark`` class. Raises ``WorkerError`` naming the reference.
    """
    target = ref if ":" in ref else builtin_reference(ref)
    if target is None:
        raise WorkerError(f"benchmark {ref!r}: name it as 'module:object'")
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except ImportError as exc:
        raise WorkerError(f"cannot import benchmark module {module_name!r}: {exc}") from exc
    except AttributeError:
        raise WorkerError(f"module {module_name!r} has no attribute {attr!r}") from None
    if isinstance(obj, type):
        obj = obj()
    missing = [m for m in _BENCHMARK_METHODS if not hasattr(obj, m)]
    if missing:
        raise WorkerError(f"{target!r} is not a kernelab benchmark (missing {', '.join(missing)})")
    return obj
