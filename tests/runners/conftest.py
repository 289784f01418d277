"""Fixtures of the runner tests that talk to a real server."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def server(server_for_module: Any) -> tuple[str, str]:
    """(URL, admin token) of the shared real server (``tests/conftest.py``), its queue empty."""
    return server_for_module.url, server_for_module.token
