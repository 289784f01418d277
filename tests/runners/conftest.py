"""Fixtures of the runner tests that talk to a real server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kernelab.runners.local import ServerProcess, admin_token, free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """(URL, admin token) of a server on a temp SQLite file, shared by this module's tests."""
    tmp = tmp_path_factory.mktemp("server")
    token = admin_token(tmp)
    with ServerProcess(f"sqlite:///{tmp / 'kernelab.db'}", port=free_port(), admin_token=token,
                       log_path=tmp / "server.log") as proc:  # fmt: skip
        yield proc.url, token
