"""kernelab: honest A/B benchmarks of GPU kernels.

Everything kernelab installs lives under this one package, so a user's own ``kernels`` or
``service`` package never collides with it:

* ``kernelab.compare`` / ``kernelab.measure`` (``kernelab.runners.api``): the engine of ``kernelab
  run`` from Python; ``kernelab.benchmark`` (``kernelab.kernels.define``): a benchmark defined with
  decorators instead of a ``Benchmark`` subclass.
* ``kernelab.workload``: the reporting API of a workload run whole under ``torchrun`` (``phase``,
  ``metric``, ``digest``; ``docs/workloads.md``).
* ``kernelab.kernels``: the benchmark library (``Benchmark``, the built-in benchmarks).
* ``kernelab.runners``: the measurement engine, probes, checks, the runner daemon and the CLI.
* ``kernelab.service``: three rooms, ``contract`` (what runner and server exchange), ``judge``
  (statistics, verdicts, health rules, reports) and ``server`` (API, database, queue, workers).
* ``kernelab.app``: the server's FastAPI app factory (the API and the dashboard's pages).
* ``kernelab.web``: the dashboard; ``kernelab.migrations``: the Alembic scripts.

In a checkout those are the top-level folders ``kernels/``, ``runners/``, ``service/``, ``web/``
and ``migrations/``, mapped to these names by ``[tool.setuptools.package-dir]`` in pyproject.toml
(an editable install imports them through setuptools' import hook); a wheel holds them under
``kernelab/``. A checkout is imported as installed (``pip install -e``), not from ``sys.path``
alone: this folder holds only this package's own modules.

The public API is what this module exports (``kernelab.__all__``). The names load on first use
(PEP 562 module ``__getattr__``), so ``import kernelab`` imports neither torch nor the server.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("kernelab")
except PackageNotFoundError:  # a checkout on sys.path without an install
    __version__ = "0+unknown"


def _check_one_tree() -> None:
    """``ImportError`` when this ``kernelab/`` and the subpackages come from two places: one
    checkout first on ``sys.path`` (``PYTHONPATH``, the current folder) while the environment's
    editable install maps ``kernelab.service`` and the others to another checkout's folders. Python
    would run this folder's modules with the other tree's subpackages. ``kernelab.service`` is
    located (``importlib.util.find_spec``: not imported) in this folder (a wheel) or beside it (a
    checkout); not found at all is left to the import of a subpackage to say."""
    spec = importlib.util.find_spec("kernelab.service")
    if spec is None or spec.origin is None:
        return
    here = os.path.dirname(os.path.realpath(__file__))
    found = os.path.dirname(os.path.realpath(spec.origin))
    if found not in (os.path.join(here, "service"), os.path.join(os.path.dirname(here), "service")):
        raise ImportError(
            f"kernelab is imported from {here} but kernelab.service from {found}: two kernelab trees "
            f"mixed (a checkout on sys.path, another one installed). Install the one you run "
            f"(pip install -e {os.path.dirname(here)}) or take it off sys.path."
        )


_check_one_tree()

# public name -> module that defines it
_EXPORTS = {
    "Benchmark": "kernelab.kernels.base",
    "BenchmarkError": "kernelab.kernels.base",
    "Params": "kernelab.kernels.base",
    "PowerOfTwo": "kernelab.kernels.base",
    "Reduction": "kernelab.kernels.tolerances",
    "available_benchmarks": "kernelab.kernels.base",
    "get_benchmark": "kernelab.kernels.base",
    "JobSpec": "kernelab.service.contract.schemas",
    "Work": "kernelab.service.contract.schemas",
    "KernelabClient": "kernelab.runners.client",
    "benchmark": "kernelab.kernels.define",
    "DefinedBenchmark": "kernelab.kernels.define",
    "compare": "kernelab.runners.api",
    "measure": "kernelab.runners.api",
    "Result": "kernelab.runners.api",
    "Comparison": "kernelab.service.contract.schemas",
}

__all__ = [
    "Benchmark",
    "BenchmarkError",
    "Comparison",
    "DefinedBenchmark",
    "JobSpec",
    "KernelabClient",
    "Params",
    "PowerOfTwo",
    "Reduction",
    "Result",
    "Work",
    "__version__",
    "available_benchmarks",
    "benchmark",
    "compare",
    "get_benchmark",
    "measure",
]

if TYPE_CHECKING:
    from kernelab.kernels.base import (
        Benchmark,
        BenchmarkError,
        Params,
        PowerOfTwo,
        available_benchmarks,
        get_benchmark,
    )
    from kernelab.kernels.define import DefinedBenchmark, benchmark
    from kernelab.kernels.tolerances import Reduction
    from kernelab.runners.api import Result, compare, measure
    from kernelab.runners.client import KernelabClient
    from kernelab.service.contract.schemas import Comparison, JobSpec, Work


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kernelab' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
