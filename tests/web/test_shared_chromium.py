"""The browser tests' one Chromium (``dashboard_server.SharedChromium``, the ``browser`` fixture of
``tests/web/conftest.py``): one browser for consecutive tests, and a thread free for
``asyncio.run()`` again once it is closed, which ``conftest.py`` does before any test that does not
ask for a browser."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")
from dashboard_server import SharedChromium  # noqa: E402
from playwright.sync_api import Browser  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.slow]


async def _answer() -> int:
    return 42


def _asyncio_run_answers() -> bool:
    """Whether ``asyncio.run()`` can run in this thread now (False: a loop is set as running)."""
    coro = _answer()
    try:
        return asyncio.run(coro) == 42
    except RuntimeError as exc:
        assert "running event loop" in str(exc), exc
        return False
    finally:
        coro.close()


def test_one_browser_until_closed_and_asyncio_run_works_after() -> None:
    shared = SharedChromium()
    first = shared.get()
    try:
        assert shared.get() is first and first.is_connected() and shared.running
        context = first.new_context()
        assert context.new_page().evaluate("1 + 1") == 2
        context.close()
        # why it is closed before other tests: between calls the sync API leaves its loop running
        assert not _asyncio_run_answers()
    finally:
        shared.close()
    assert not shared.running and not first.is_connected()
    assert _asyncio_run_answers()
    second = shared.get()  # a new one on the next use
    try:
        assert second is not first and second.is_connected()
    finally:
        shared.close()


def test_a_test_with_the_browser_fixture(browser: Browser) -> None:
    context = browser.new_context()
    assert context.new_page().evaluate("'ok'") == "ok"
    context.close()


def test_the_next_test_without_it_finds_the_shared_browser_closed() -> None:
    """Runs after the test above (a module's tests run in order, on one process): the
    ``conftest.py`` teardown closed the shared Chromium, so this thread has no running loop."""
    assert _asyncio_run_answers()
