"""A PostgreSQL cluster of a test's own (``initdb`` + ``pg_ctl`` in a temp folder, on a free
port), so an outage drill can stop and start it without touching the shared server.

PostgreSQL refuses to run as root: when the tests run as root, the cluster's commands run as the
``postgres`` user (``runuser``), in a folder of ``/tmp`` that user owns (pytest's own temp
folders are private to the user running the tests).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from kernelab.runners.local import free_port
from tests.leftovers import remove_at_exit


def _bin_dir() -> Path | None:
    for candidate in (shutil.which("pg_ctl"), *sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))):
        if candidate:
            return Path(candidate).resolve().parent
    return None


class PgCluster:
    """One cluster in a new temp folder, listening on 127.0.0.1:``port`` (trust auth, superuser
    ``postgres``). ``start()``/``stop()`` may be called again and again (an outage); ``close()``
    stops it and removes the folder."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        if bin_dir is None:
            raise FileNotFoundError("pg_ctl not found (PATH, /usr/lib/postgresql/*/bin)")
        self.bin_dir = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="kernelab-pg-"))
        remove_at_exit(self.root)  # a run killed before close(): its guard removes the folder
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        self.running = False
        if self._as_postgres:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "--no-sync")

    def __repr__(self) -> str:
        return f"<PgCluster 127.0.0.1:{self.port} {self.data}>"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [str(self.bin_dir / tool), *args]
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.root}"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options, "-w", "start")
        self.running = True

    def stop(self) -> None:
        """Stop the server now (``-m fast``: open connections are cut, as in an outage)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")
        self.running = False

    def close(self) -> None:
        """Stop the server if it runs; remove the cluster's folder."""
        try:
            if self.running:
                self.stop()
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create database ``name``; its SQLAlchemy URL."""
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return self.url(name)
