"""Triton kernels of the built-in benchmarks.

These modules import triton at top level. Import them only through
``kernelab.kernels._device.import_triton_kernels(module, device)``, lazily, from ``Benchmark.prepare``:
``triton.jit`` fixes interpreter vs compiled mode at import time (see ``kernelab.kernels._device``).
"""
