"""Fixtures of the kernels tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from kernelab.kernels._device import TRITON_INTERPRET_ENV, configure_triton_env

# The kernels tests launch Triton kernels on the CPU, so this process must import triton in
# interpreter mode: set the variable before any test module imports triton (kernelab.kernels._device doc).
# GPU tests run their kernels in a child process (test_gpu.py).
configure_triton_env("cpu")


@pytest.fixture(autouse=True)
def _restore_triton_interpret_env() -> Iterator[None]:
    """Benchmarks set TRITON_INTERPRET for the CPU; leave the variable as the test found it."""
    before = os.environ.get(TRITON_INTERPRET_ENV)
    yield
    if before is None:
        os.environ.pop(TRITON_INTERPRET_ENV, None)
    else:
        os.environ[TRITON_INTERPRET_ENV] = before
