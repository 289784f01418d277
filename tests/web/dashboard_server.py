"""The browser tests' server and Chromium, one place for the seven ``test_browser*`` modules.

``serve_dashboard`` runs ``kernelab.app:create_app`` under uvicorn (as a fleet runs it,
not ``kernelab serve``) on a free loopback port and a migrated database, with a compare worker
beside it (``compare_wait``); ``DashboardConfig`` is what a module may set its own way (extra
environment, uvicorn's logging options, no compare worker, another database). ``SharedChromium``
is the one headless Chromium of a test process, and ``signed_in_page`` a signed-in page of it.
The fixtures over them are in ``tests/web/conftest.py``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import compare_wait
from browser_signin import sign_in

from kernelab.runners.local import free_port, wait_healthy
from kernelab.service.server.core.db import upgrade

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

ADMIN_TOKEN = "browser-test-admin-token-0123456789"
"""The admin token of every dashboard test server (``KERNELAB_ADMIN_TOKEN``)."""
CHROMIUM = os.environ.get("KERNELAB_CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
"""The Chromium executable Playwright drives (``KERNELAB_CHROMIUM``, else ``chromium`` on PATH)."""
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SERVER_START_S = 300.0
"""Seconds a server may take to answer ``/healthz``: a start is only slow, not wrong, on a loaded
2-core machine (146 s measured at load average 28: ``tests/conftest.py``); one that exits fails at
once with its log."""
STOP_GRACE_S = 10.0  # SIGTERM, then SIGKILL after this many seconds
REPO = Path(__file__).resolve().parents[2]

Watch = Literal["dialog", "pageerror"]


@dataclass(frozen=True)
class DashboardConfig:
    """How a module's dashboard server differs from the default one.

    ``env``: more environment for the server and its compare worker (a benchmark's folder on
    ``PYTHONPATH``, JSON logs). ``uvicorn_args``: uvicorn's logging options (default: warnings
    only). ``compare_worker``: start a compare worker beside the server. ``database_url``: a
    database to use (created by the module; it is migrated here), else a temp SQLite file."""

    env: Mapping[str, str] = field(default_factory=dict)
    uvicorn_args: tuple[str, ...] = ("--log-level", "warning")
    compare_worker: bool = True
    database_url: str | None = None


@dataclass(frozen=True)
class Dashboard:
    """A running dashboard server: its base URL (``http://127.0.0.1:PORT``), the admin token, the
    database URL and the log the server (and its compare worker) write."""

    url: str
    admin_token: str
    database_url: str
    log_path: Path


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def serve_dashboard(config: DashboardConfig, folder: Path) -> Iterator[Dashboard]:
    """The dashboard of ``config``, its database and log (``server.log``) in ``folder``, a private
    dashboard (``KERNELAB_PUBLIC_DASHBOARD=false``) with the admin token ``ADMIN_TOKEN``. The
    database is migrated first (``kernelab.service.server.core.db.upgrade``). Yields once ``/healthz``
    answers; the server and its compare worker are stopped after (SIGTERM, SIGKILL after
    ``STOP_GRACE_S``). Raises ``kernelab.runners.local.ServerStartError`` with the log's tail when
    the server exits or does not answer within ``SERVER_START_S``."""
    db_url = config.database_url or f"sqlite:///{folder / 'kernelab.db'}"
    upgrade(db_url)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "KERNELAB_DATABASE_URL": db_url, "KERNELAB_ADMIN_TOKEN": ADMIN_TOKEN,
           "KERNELAB_PUBLIC_DASHBOARD": "false", **config.env}  # fmt: skip
    command = [sys.executable, "-m", "uvicorn", "--factory", "kernelab.app:create_app",
               "--host", "127.0.0.1", "--port", str(port), *config.uvicorn_args]  # fmt: skip
    log_path = folder / "server.log"
    with log_path.open("wb") as log:  # the server's output; a failing test's log points here
        proc = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        worker = compare_wait.start(env, log) if config.compare_worker else None
        try:
            wait_healthy(url, proc, timeout_s=SERVER_START_S, log_path=log_path)
            yield Dashboard(url, ADMIN_TOKEN, db_url, log_path)
        finally:
            if worker is not None:
                compare_wait.stop(worker)
            _stop(proc)


class SharedChromium:
    """One headless Chromium (``CHROMIUM``, ``CHROMIUM_ARGS``) for a run of browser tests.

    ``get()`` launches it on first use and hands out the same browser after; ``close()`` closes it
    and stops Playwright. Each test opens its own context (cookies, storage) in it. It must be
    closed before a test that does not use it: between calls, Playwright's sync API leaves its
    event loop set as the thread's running loop, so an ``asyncio.run()`` in such a test would
    raise "cannot be called from a running event loop" (``tests/web/conftest.py`` closes it when
    the next test does not ask for a browser)."""

    def __init__(self) -> None:
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None

    def get(self) -> Browser:
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        self.close()  # a browser that crashed: its Playwright goes too
        from playwright.sync_api import sync_playwright

        self._playwright = sync_playwright().start()
        try:
            self._browser = self._playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        except BaseException:
            self.close()
            raise
        return self._browser

    @property
    def running(self) -> bool:
        return self._playwright is not None

    def close(self) -> None:
        browser, playwright = self._browser, self._playwright
        self._browser = self._playwright = None
        try:
            if browser is not None and browser.is_connected():
                browser.close()
        finally:
            if playwright is not None:
                playwright.stop()


@contextmanager
def signed_in_page(
    browser: Browser,
    base_url: str,
    *,
    token: str = ADMIN_TOKEN,
    watch: tuple[Watch, ...] = ("dialog",),
    timeout_ms: float | None = None,
) -> Iterator[Page]:
    """A page of a new context of ``browser`` (a 1400 x 900 viewport) signed in to ``base_url``
    with ``token`` through the ``/login`` form. ``watch``: what fails the test once the page is
    closed: ``"dialog"`` (an ``alert``/``confirm``, dismissed) and ``"pageerror"`` (an uncaught
    script error); ``timeout_ms``: the context's default timeout (Playwright's 30 s otherwise).
    Raises ``AssertionError`` naming what fired."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    if timeout_ms is not None:
        context.set_default_timeout(timeout_ms)
    page = context.new_page()
    fired: list[str] = []
    if "dialog" in watch:
        page.on("dialog", lambda d: (fired.append(f"dialog: {d.message}"), d.dismiss()))
    if "pageerror" in watch:
        page.on("pageerror", lambda e: fired.append(f"script error: {e}"))
    try:
        sign_in(page, base_url, token)
        yield page
    finally:
        context.close()
    assert fired == [], f"the page fired: {fired}"
