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
and ``migrations/`` (this folder links them in); a wheel holds them under ``kernelab/``.

The public API is what this module exports (``kernelab.__all__``). The names load on first use
(PEP 562 module ``__getattr__``), so ``import kernelab`` imports neither torch nor the server.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

try:
    __version__ = version("kernelab")
except PackageNotFoundError:  # a checkout on sys.path without an install
    __version__ = "0+unknown"

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
