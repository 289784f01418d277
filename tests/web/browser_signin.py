"""Signing a browser page in the way a person does: the ``/login`` form (a POST from the
server's own page; ``GET /login?token=`` signs nobody in)."""

from __future__ import annotations

from typing import Any


def sign_in(page: Any, base_url: str, token: str) -> None:
    """Open ``/login``, type ``token``, submit, and wait for the jobs page it redirects to.
    ``page``: a ``playwright.sync_api.Page``."""
    page.goto(f"{base_url}/login")
    page.fill("#token", token)
    with page.expect_navigation():
        page.click("form.login button[type=submit]")
    assert page.url.rstrip("/") == base_url.rstrip("/"), page.url
