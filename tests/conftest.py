"""Shared test configuration: markers skip cleanly when their resource is absent."""

from __future__ import annotations

import os
import shutil

import pytest

PG_URL = os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
CHROMIUM = os.environ.get("KERNELAB_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


# Triton's interpreter mode is fixed by the first ``import triton`` in a process
# (kernels/_device.py): pick it before any test module imports triton.
if not _has_cuda():
    from kernelab.kernels._device import configure_triton_env

    configure_triton_env("cpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine")
    has_cuda = _has_cuda()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
