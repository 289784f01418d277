"""kernelab's benchmark library: what to run (inputs, reference, variants, declared work)."""

from kernelab.kernels.base import (
    Benchmark,
    BenchmarkError,
    Params,
    PowerOfTwo,
    available_benchmarks,
    get_benchmark,
    load_object,
    validate_spec,
)

__all__ = [
    "Benchmark",
    "BenchmarkError",
    "Params",
    "PowerOfTwo",
    "available_benchmarks",
    "get_benchmark",
    "load_object",
    "validate_spec",
]
