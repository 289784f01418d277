"""The ``Link: rel="next"`` of a page never carries the request's ``Host`` header."""

from __future__ import annotations

import pytest

from kernelab.app import create_app
from kernelab.service.server.core.config import Settings

pytestmark = pytest.mark.timeout(60)


def test_next_link_is_relative_whatever_the_host_header(api) -> None:  # type: ignore[no-untyped-def]
    api.submit()
    api.submit()
    r = api.client.get("/api/v1/jobs?limit=1", headers={**api.admin, "Host": "evil.example:666"})
    assert r.status_code == 200, r.text
    link = r.headers["link"]
    assert "evil" not in link and link.startswith("</api/v1/jobs?") and link.endswith('>; rel="next"'), link
    assert "offset=1" in link and "limit=1" in link


def test_next_link_starts_with_the_configured_public_url(settings: Settings, client_class) -> None:  # type: ignore[no-untyped-def]
    configured = settings.model_copy(update={"public_url": "https://kernelab.example.org/base"})
    with client_class(create_app(configured)) as client:
        auth = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"}  # type: ignore[union-attr]
        r = client.get("/api/v1/tokens?limit=0", headers=auth)
        assert r.status_code == 422  # limit >= 1
        for _ in range(2):
            assert (
                client.post(
                    "/api/v1/tokens", json={"name": "t", "scopes": ["read"]}, headers=auth
                ).status_code
                == 201
            )
        r = client.get("/api/v1/tokens?limit=1", headers={**auth, "Host": "evil.example"})
        assert r.headers["link"].startswith("<https://kernelab.example.org/base/api/v1/tokens?"), r.headers[
            "link"
        ]


def test_a_public_url_that_is_not_an_http_url_is_refused() -> None:
    with pytest.raises(ValueError, match="public_url"):
        Settings(public_url="javascript:alert(1)")


@pytest.mark.parametrize("path", ["/?offset=9223372036854775808", "/jobs/1?offset=2147483648"])
def test_the_dashboard_pages_its_lists_within_the_apis_bounds(api, path: str) -> None:  # type: ignore[no-untyped-def]
    # the dashboard's ?offset= is the API's Offset: past the database's integers, a 422 naming it
    api.submit()
    r = api.client.get(path, headers=api.admin)
    assert r.status_code == 422, r.text[:300]
    assert "offset" in r.text
