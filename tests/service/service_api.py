"""The server tests' helpers that test modules import by name (``from service_api import Api``):
a module of its own, since ``conftest`` names whichever conftest.py pytest imported last."""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kernelab.service.server.auth import Scope, create_token

with warnings.catch_warnings():
    # starlette asks for the `httpx2` fork; the plain httpx it falls back to works the same.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

ADMIN_TOKEN = "test-admin-token-0123456789abcdef0123456789"


@dataclass
class Api:
    """A TestClient on a real app and database, with helpers to make tokens and runners."""

    client: TestClient

    @property
    def factory(self):  # type: ignore[no-untyped-def]
        return self.client.app.state.session_factory  # type: ignore[attr-defined]

    def token(self, *scopes: Scope) -> dict[str, str]:
        """Authorization header of a new token with ``scopes``."""
        with self.factory.begin() as session:
            return {"Authorization": f"Bearer {create_token(session, 'test', scopes)}"}

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}

    def runner(self, name: str = "node-a", device_type: str = "cpu") -> dict[str, str]:
        """Register a runner through the API; its Authorization header. Its node's hostname is
        ``name``, so its token reports for that node only (``factories.job_result``'s default
        hostname is ``node-a``)."""
        node = {"hostname": name, "device_type": device_type}
        body = {"name": name, "node": node}
        r = self.client.post("/api/v1/runners/register", json=body, headers=self.admin)
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['token']}"}

    def post_result(self, job_id: int, result, headers: dict[str, str], *, compare: bool = True):  # type: ignore[no-untyped-def]
        """POST a ``JobResult`` as its JSON (datetimes as ISO 8601, as a runner sends it); then,
        with ``compare``, compute the queued comparison as a compare worker does (``compare()``)."""
        r = self.client.post(
            f"/api/v1/jobs/{job_id}/results",
            content=result.model_dump_json(),
            headers={**headers, "content-type": "application/json"},
        )
        if compare and r.status_code in (200, 201):
            self.compare()
        return r

    def compare(self):  # type: ignore[no-untyped-def]
        """Run a compare worker in burst mode in this process (``compare_worker.drain``): every
        queued comparison is computed and stored; returns the worker."""
        from kernelab.service.server.compare_worker import drain

        return drain(self.factory, self.client.app.state.settings)  # type: ignore[attr-defined]

    def waiting_claims(self) -> int:
        """How many long-polling claims wait in this app's ``QueueWatch`` now (0 before the first)."""
        watch = getattr(self.client.app.state, "queue_watch", None)  # type: ignore[attr-defined]
        return 0 if watch is None else int(watch.waiting)

    def when_claims_wait(
        self, n: int, action: Callable[[], object], timeout_s: float = 60.0
    ) -> threading.Thread:
        """Run ``action`` in a new (started) thread as soon as ``n`` claims wait in the app's
        ``QueueWatch``: synchronised on the server's state, not on a sleep. The caller joins it;
        it raises (in its thread, so the caller's assertion fails) if they never all wait."""

        def run() -> None:
            deadline = time.monotonic() + timeout_s
            while self.waiting_claims() < n:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{n} claims never waited (waiting: {self.waiting_claims()})")
                time.sleep(0.005)
            action()

        thread = threading.Thread(target=run, name="when-claims-wait")
        thread.start()
        return thread

    def submit(self, spec: dict | None = None) -> int:
        from factories import spec_dict

        r = self.client.post("/api/v1/jobs", json=spec or spec_dict(), headers=self.admin)
        assert r.status_code == 201, r.text
        return r.json()["id"]


FLEET_TOKEN = "fleet-admin-token-0123456789abcdef0123456789"


@dataclass(frozen=True)
class Fleet:
    """``kernelab serve --workers 2`` on a PostgreSQL database of its own: base URL, admin token,
    the server's log (both workers write to it)."""

    url: str
    token: str
    log_path: Path

    @property
    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}
