"""Fixtures of the dashboard tests (``tests/web/dashboard_server.py`` has the parts).

``dashboard``: one server per module (uvicorn + a compare worker on a temp SQLite file), set up
by the module's ``dashboard_config``: a module whose server differs overrides that fixture (same
name, module scope) with its own ``DashboardConfig``, or yields one per database it is
parametrized over. ``browser``: one headless Chromium for every run of consecutive tests that ask
for it (modules and all), closed when the next test does not ask for it (``SharedChromium``: the
sync API of Playwright would otherwise break an ``asyncio.run()`` of a later test)."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING

import pytest
from dashboard_server import Dashboard, DashboardConfig, SharedChromium, serve_dashboard

if TYPE_CHECKING:
    from playwright.sync_api import Browser

_CHROMIUM = SharedChromium()


@pytest.fixture(scope="module")
def dashboard_config() -> DashboardConfig:
    """The server configuration of this module: the default (override it in a module)."""
    return DashboardConfig()


@pytest.fixture(scope="module")
def dashboard(
    dashboard_config: DashboardConfig,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[Dashboard]:
    """This module's running server (``serve_dashboard`` of ``dashboard_config``), its database and
    log in a temp folder named after the module; stopped after the module's last test."""
    folder = tmp_path_factory.mktemp(request.module.__name__.rpartition(".")[2])
    with serve_dashboard(dashboard_config, folder) as server:
        yield server


@pytest.fixture
def browser() -> Browser:
    """The shared headless Chromium: launched by the first test of a run that asks for it, the
    same for the next tests that ask; each test opens contexts of its own in it."""
    return _CHROMIUM.get()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """After ``item``'s fixtures are torn down: close the shared Chromium unless the next test of
    this process asks for a browser too (``nextitem`` is None at the end and while xdist waits for
    more work)."""
    try:
        yield
    finally:
        if _CHROMIUM.running and "browser" not in getattr(nextitem, "fixturenames", ()):
            _CHROMIUM.close()
