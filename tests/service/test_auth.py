"""Tokens: hashing, scope implication, bootstrap admin token, runner re-registration, and the
dashboard sign-in cookie."""

from __future__ import annotations

import pytest
from fastapi import APIRouter
from sqlalchemy import select

from kernelab.app import create_app
from kernelab.service.server.api.deps import DashboardAccess
from kernelab.service.server.auth import (
    authenticate,
    create_token,
    effective_scopes,
    hash_token,
    revoke_token,
)
from kernelab.service.server.core.config import Settings
from kernelab.service.server.models import Token


def test_scopes_imply() -> None:
    assert effective_scopes(["admin"]) == {"admin", "submit", "read"}
    assert effective_scopes(["submit"]) == {"submit", "read"}
    assert effective_scopes(["runner"]) == {"runner"}
    with pytest.raises(ValueError, match="unknown scope"):
        effective_scopes(["root"])


def test_tokens_are_stored_hashed_and_revocable(api, admin_token) -> None:  # type: ignore[no-untyped-def]
    with api.factory.begin() as session:
        token = create_token(session, "ci", ["read"])
    with api.factory.begin() as session:
        rows = session.scalars(select(Token.token_sha256)).all()
        assert hash_token(token) in rows and token not in rows
        assert hash_token(admin_token) in rows  # the bootstrap token of the settings
        principal = authenticate(session, token)
        assert principal is not None and principal.scopes == {"read"}
        assert revoke_token(session, principal.token_id)
    assert api.client.get("/api/v1/jobs", headers={"Authorization": f"Bearer {token}"}).status_code == 401


def test_reregistering_a_runner_revokes_its_old_token(api) -> None:  # type: ignore[no-untyped-def]
    old = api.runner("node-x")
    new = api.runner("node-x")
    assert api.client.post("/api/v1/runners/claim", json={}, headers=old).status_code == 401
    assert api.client.post("/api/v1/runners/claim", json={}, headers=new).status_code == 204


def test_a_revoked_bootstrap_admin_token_stays_revoked_after_a_restart(  # type: ignore[no-untyped-def]
    settings: Settings, client_class, admin_token, caplog
) -> None:
    bootstrap = {"Authorization": f"Bearer {admin_token}"}
    with client_class(create_app(settings)) as client:
        body = {"name": "admin2", "scopes": ["admin"]}
        second = client.post("/api/v1/tokens", json=body, headers=bootstrap)
        assert second.status_code == 201, second.text
        other = {"Authorization": f"Bearer {second.json()['token']}"}
        first_id = next(t["id"] for t in client.get("/api/v1/tokens", headers=other).json()["data"]
                        if t["name"].startswith("admin (KERNELAB_ADMIN_TOKEN)"))  # fmt: skip
        assert client.post(f"/api/v1/tokens/{first_id}/revoke", headers=other).status_code == 200
        assert client.get("/api/v1/tokens", headers=bootstrap).status_code == 401
    with (
        caplog.at_level("WARNING", logger="kernelab.app"),
        client_class(create_app(settings)) as client,
    ):
        # the restart did not revive it
        assert client.get("/api/v1/tokens", headers=bootstrap).status_code == 401
        assert client.get("/api/v1/tokens", headers=other).status_code == 200
    assert any("stays revoked" in r.getMessage() for r in caplog.records)
    assert admin_token not in caplog.text


def test_runners_me_names_the_runner_of_a_runner_token_only(api) -> None:  # type: ignore[no-untyped-def]
    runner = api.runner("node-me")
    me = api.client.get("/api/v1/runners/me", headers=runner)
    assert me.status_code == 200 and me.json()["name"] == "node-me" and me.json()["runner_id"] >= 1
    assert api.client.get("/api/v1/runners/me", headers=api.admin).status_code == 403
    assert api.client.get("/api/v1/runners/me", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert api.client.get("/api/v1/runners/me").status_code == 401


def _dashboard_app(settings: Settings):  # type: ignore[no-untyped-def]
    app = create_app(settings)
    probe = APIRouter()

    @probe.get("/dashboard-probe")
    def page(principal: DashboardAccess) -> dict[str, str | None]:
        return {"who": None if principal is None else principal.name}

    app.include_router(probe)
    return app


def test_login_cookie_grants_dashboard_access(settings: Settings, client_class, admin_token) -> None:  # type: ignore[no-untyped-def]
    with client_class(_dashboard_app(settings)) as client:
        assert client.get("/dashboard-probe").status_code == 401
        assert client.post("/login", data={"token": "wrong"}).status_code == 401
        r = client.post("/login", data={"token": admin_token}, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"
        assert "httponly" in r.headers["set-cookie"].lower()
        assert client.get("/dashboard-probe").json() == {"who": "admin (KERNELAB_ADMIN_TOKEN)"}
        assert client.get("/api/v1/jobs").status_code == 200  # export links: reads take the cookie
        assert client.post("/api/v1/jobs/1/cancel").status_code == 401  # writes never do
        r = client.post("/logout", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/login"
        assert client.get("/dashboard-probe").status_code == 401


def test_a_sign_in_link_signs_nobody_in(settings: Settings, client_class, admin_token) -> None:  # type: ignore[no-untyped-def]
    """Login CSRF: a ``GET /login?token=`` from any link sets no cookie."""
    with client_class(_dashboard_app(settings)) as client:
        r = client.get("/login", params={"token": admin_token}, follow_redirects=False)
        assert r.status_code == 200 and "set-cookie" not in r.headers
        assert '<form class="login" method="post" action="/login">' in r.text
        assert client.get("/dashboard-probe").status_code == 401
        assert client.get("/logout").status_code == 405  # signing out is a POST too


@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "http://testserver.evil.example"}, {"Sec-Fetch-Site": "same-site"},
])  # fmt: skip
def test_a_sign_in_from_another_site_is_refused(settings, client_class, admin_token, headers) -> None:  # type: ignore[no-untyped-def]
    with client_class(_dashboard_app(settings)) as client:
        r = client.post("/login", data={"token": admin_token}, headers=headers, follow_redirects=False)
        assert r.status_code == 403 and "set-cookie" not in r.headers and "another site" in r.text
        own = {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"}
        signed_in = client.post("/login", data={"token": admin_token}, headers=own, follow_redirects=False)
        assert signed_in.status_code == 303
        assert client.post("/logout", headers=headers, follow_redirects=False).status_code == 403
        assert client.get("/dashboard-probe").status_code == 200  # still signed in


def test_public_dashboard_needs_no_token(settings: Settings, client_class) -> None:  # type: ignore[no-untyped-def]
    public = settings.model_copy(update={"public_dashboard": True})
    with client_class(_dashboard_app(public)) as client:
        assert client.get("/dashboard-probe").json() == {"who": None}
        assert client.get("/api/v1/jobs").status_code == 401  # the API stays private


def test_runner_token_cannot_sign_in(api) -> None:  # type: ignore[no-untyped-def]
    token = api.runner()["Authorization"].removeprefix("Bearer ")
    assert api.client.post("/login", data={"token": token}, follow_redirects=False).status_code == 403


def test_settings_from_environment(monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KERNELAB_DATABASE_URL", f"sqlite:///{tmp_path / 'k.db'}")
    monkeypatch.setenv("KERNELAB_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("KERNELAB_PUBLIC_DASHBOARD", "true")
    settings = Settings()
    assert (settings.max_attempts, settings.public_dashboard) == (5, True)
    assert settings.database_url.endswith("k.db")
