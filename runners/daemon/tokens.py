"""The runner's own token: kept in ``work_dir/runner-<name>.json`` (mode 0600) per server, chosen
at start-up from the given token, the saved one or a registration.

Given an admin token the runner registers (``POST /runners/register``) and saves its per-runner
token so a restart reuses it; given a runner token (registration answers 403) it uses that token
directly. A runner token given while a different one is saved (e.g. after ``kernelab token
rotate``) replaces the saved one. Tokens are never logged.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from kernelab.runners.client import KernelabAPIError, KernelabClient, KernelabUnavailable
from kernelab.runners.spool import atomic_write_text
from kernelab.service.contract.schemas import NodeInfo

log = logging.getLogger(__name__)


class RunnerTokenMismatchError(Exception):
    """``--token`` is another runner's token: it would make this daemon work as that runner."""


class TokenChoice(NamedTuple):
    """The token a runner works with: ``token`` (None: keep the client's own), ``saved`` (it came
    from, or was put into, the token file: a 401 then means that file's token was revoked)."""

    token: str | None
    saved: bool


class TokenStore:
    """The JSON file ``path`` holding runner ``name``'s token for one server (``server``, ``name``,
    ``runner_id``, ``token``); written atomically with mode 0600."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name

    def record(self) -> dict[str, Any]:
        """The JSON object in the file, or ``{}`` when there is none or it cannot be read."""
        try:
            record = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}

    def runner_id(self) -> int | None:
        """``runner_id`` recorded in the file, or None."""
        runner_id = self.record().get("runner_id")
        return runner_id if isinstance(runner_id, int) else None

    def load(self, server: str) -> str | None:
        """The token saved for ``server`` (a base URL), or None."""
        record = self.record()
        if record.get("server") != server or not record.get("token"):
            return None
        return str(record["token"])

    def save(self, token: str, server: str, *, runner_id: int | None = None, name: str | None = None) -> None:
        """Write ``token`` for ``server``; a runner id and name not given are kept from the file (a
        rotated token keeps its runner). Raises ``OSError`` when the file cannot be written."""
        old = self.record()
        payload = {
            "server": server,
            "name": name or old.get("name") or self.name,
            "runner_id": runner_id if runner_id is not None else old.get("runner_id"),
            "token": token,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps(payload))
        os.chmod(self.path, 0o600)

    def hint(self) -> str:
        """``", runner N"`` from the file, or ``""``."""
        runner_id = self.runner_id()
        return f", runner {runner_id}" if runner_id else ""

    def choose(self, client: KernelabClient, node: Callable[[], NodeInfo | None]) -> TokenChoice:
        """The token this runner works with, given the caller's ``client``.

        Order: the client's token when a different token is saved for this server and the server
        takes the client's token as this runner's token (same name, and the runner id the file
        records): it then replaces the saved one in the file (how a rotated runner token is put in
        place); another runner's token raises ``RunnerTokenMismatchError`` and changes nothing;
        else the saved token; else register with the client's token (admin, sending ``node()``)
        and save the answer; else (registration answers 403) keep the client's token as a runner
        token. Raises ``KernelabAPIError`` for any other refusal (e.g. 401).
        """
        server = client.base_url
        saved = self.load(server)
        given = client.token  # the token the caller's client was made with (--token)
        if saved is not None and given and given != saved and self._takes_given(client, given):
            return TokenChoice(given, saved=True)
        if saved is not None:
            log.info("runner %s: using the token saved in %s", self.name, self.path)
            return TokenChoice(saved, saved=True)
        try:
            registered = client.register(self.name, node())
        except KernelabAPIError as exc:
            if exc.status_code == 403:
                log.info("runner %s: token is not an admin token; using it as a runner token", self.name)
                return TokenChoice(None, saved=False)
            raise
        self.save(registered.token, server, runner_id=registered.runner_id, name=registered.name)
        log.info(
            "runner %s: registered as runner %d; token saved in %s",
            self.name,
            registered.runner_id,
            self.path,
        )
        return TokenChoice(registered.token, saved=False)

    def _takes_given(self, client: KernelabClient, given: str) -> bool:
        """Save ``given`` (the client's token, not the saved one) if the server takes it as this
        runner's token (``GET /runners/me``: same name, and the runner id the file records): True.
        False when the server refuses it (401), it is no runner token (403, e.g. an admin one) or
        the server is unreachable: the saved token is used (the next start asks again). Raises
        ``RunnerTokenMismatchError`` for another runner's token, changing nothing."""
        try:
            identity = client.whoami()
        except KernelabAPIError as exc:
            if exc.status_code == 401:
                log.warning("runner %s: the given token was refused; trying the one saved in %s",
                            self.name, self.path)  # fmt: skip
            return False
        except KernelabUnavailable as exc:
            log.warning("runner %s: cannot check the given token (%s); using the one saved in %s",
                        self.name, exc, self.path)  # fmt: skip
            return False
        saved_id = self.runner_id()
        if identity.name != self.name or (saved_id is not None and identity.runner_id != saved_id):
            ours = f"{self.name!r}" + (f", id {saved_id}" if saved_id is not None else "")
            raise RunnerTokenMismatchError(
                f"runner {self.name}: the given --token belongs to runner {identity.name!r} (id "
                f"{identity.runner_id}), not to this runner ({ours}, saved in {self.path}); "
                "nothing was changed: give this runner's own (rotated) token, or an admin token"
            )
        self.save(given, client.base_url)
        log.info("runner %s: the given runner token replaces the one saved in %s", self.name, self.path)
        return True
