"""The last live admin token cannot be revoked or rotated away (the admin rotated its
own, only token and locked itself out); two admins revoking each other at once leave one."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select

from kernelab.service.server import models
from kernelab.service.server.admin_guard import is_last_admin
from kernelab.service.server.auth import create_token, revoke_token

pytestmark = pytest.mark.timeout(60)


def _token_id(api, name: str) -> int:  # type: ignore[no-untyped-def]
    rows = api.client.get("/api/v1/tokens?revoked=false", headers=api.admin).json()["data"]
    return next(r["id"] for r in rows if r["name"] == name)


def test_the_only_admin_token_cannot_rotate_itself_away(api) -> None:  # type: ignore[no-untyped-def]
    own = _token_id(api, "admin (KERNELAB_ADMIN_TOKEN)")
    r = api.client.post(f"/api/v1/tokens/{own}/rotate", headers=api.admin)
    assert r.status_code == 409, r.text
    assert "only live admin token" in r.json()["detail"] and "kernelab token create" in r.json()["detail"]
    assert api.client.get("/api/v1/tokens", headers=api.admin).status_code == 200  # still signed in
    made = api.client.post("/api/v1/tokens", json={"name": "reader", "scopes": ["read"]}, headers=api.admin)
    assert api.client.post(f"/api/v1/tokens/{made.json()['id']}/rotate", headers=api.admin).status_code == 201


def test_with_a_second_admin_the_first_can_be_rotated_and_revoked(api) -> None:  # type: ignore[no-untyped-def]
    own = _token_id(api, "admin (KERNELAB_ADMIN_TOKEN)")
    second = api.client.post(
        "/api/v1/tokens", json={"name": "admin 2", "scopes": ["admin"]}, headers=api.admin
    )
    assert second.status_code == 201
    rotated = api.client.post(f"/api/v1/tokens/{own}/rotate", headers=api.admin)
    assert rotated.status_code == 201, rotated.text
    new = {"Authorization": f"Bearer {rotated.json()['token']}"}
    # two live admins (the rotated one and "admin 2"): revoking "admin 2" leaves one, allowed
    assert api.client.post(f"/api/v1/tokens/{second.json()['id']}/revoke", headers=new).status_code == 200
    # now the rotated token is the last: rotating it is refused, and nobody else can revoke it
    r = api.client.post(f"/api/v1/tokens/{rotated.json()['id']}/rotate", headers=new)
    assert r.status_code == 409 and "only live admin token" in r.json()["detail"], r.text


@pytest.mark.postgres
def test_two_admins_revoking_each_other_at_once_leave_one(pg_url: str) -> None:
    _revoke_each_other(pg_url)


def test_two_admins_revoking_each_other_at_once_leave_one_on_sqlite(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Attack finding 7: on SQLite (no row locks; pysqlite begins at the first write) both
    revokes succeeded and no admin token was left."""
    _revoke_each_other(f"sqlite:///{tmp_path / 'race.db'}")


def _revoke_each_other(url: str) -> None:
    from kernelab.service.server.core.db import make_engine, make_session_factory, upgrade

    upgrade(url)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    try:
        with factory.begin() as s:
            create_token(s, "a", ["admin"])
            create_token(s, "b", ["admin"])
        with factory() as s:
            a, b = s.scalars(select(models.Token.id).order_by(models.Token.id)).all()
        outcomes: dict[str, bool] = {}
        first_locked = threading.Event()

        def revoke(name: str, target: int, hold_s: float) -> None:
            with factory.begin() as s:
                row = s.get(models.Token, target)
                assert row is not None
                last = is_last_admin(s, row)
                first_locked.set()
                if not last:
                    revoke_token(s, target)
                time.sleep(hold_s)  # the other transaction runs meanwhile
                outcomes[name] = not last

        t = threading.Thread(target=revoke, args=("a revokes b", b, 1.0))
        t.start()
        first_locked.wait(5)
        revoke("b revokes a", a, 0.0)  # waits for the first's commit, then counts again
        t.join()
        assert outcomes == {"a revokes b": True, "b revokes a": False}
        with factory() as s:
            live = s.scalars(select(models.Token.id).where(models.Token.revoked_at.is_(None))).all()
        assert live == [a]
    finally:
        engine.dispose()
