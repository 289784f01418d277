"""Fixtures of the dashboard tests: one headless Chromium per module (a launch is seconds of a
2-core CI box; each test opens a context of its own in it)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (``dashboard_server.CHROMIUM``) for this module's tests; skipped where
    playwright is not installed (the dev extra)."""
    pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
    from dashboard_server import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
