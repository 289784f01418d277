"""The one-command local stack behind ``kernelab up``: server on SQLite + one local runner.

Everything lives in ``data_dir`` (default ``./kernelab-data``)::

    kernelab.db      SQLite database, upgraded to the current schema with Alembic
    admin-token      the admin token (mode 0600), created once and reused by the next ``up``
    server.log       uvicorn's output
    runner.log       the runner daemon's log (progress lines of running jobs)
    runner/          the runner's work dir (its token, spool, job scratch folders)

The server gets the token through ``KERNELAB_ADMIN_TOKEN`` (stored hashed at start-up, see
``kernelab.service.server.core.config.Settings.admin_token``) and the runner through ``KERNELAB_TOKEN``, so no
token
appears on a command line (``ps`` shows command lines to every user). ``ServerProcess`` is also
what the end-to-end tests start.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path
from typing import IO

import httpx

SERVER_START_TIMEOUT_S = 60.0
STOP_GRACE_S = 15.0  # SIGTERM -> SIGKILL for the server
RUNNER_POLL_S = 2.0  # claim long-poll: also the longest a stopping runner waits for its last claim
RUNNER_GRACE_S = 30.0  # the local runner's grace for a running job after SIGTERM
# s: the local runner imports and describes its benchmarks first (daemon.loop.ADVERT_TIMEOUT_S)
RUNNER_START_TIMEOUT_S = 300.0
EXAMPLES = ("softmax", "matmul", "softmax_cpu")
CPU_DEMO_NOTE = (
    "what this shows: both sides ran natively on this CPU, so the ratio is real. The unfused softmax "
    "makes four passes over memory and two (M, N) temporaries per call, torch.softmax one fused pass: "
    "that is the candidate's negative Δ% ('N× faster'), with its 95% confidence interval. A cell this "
    "machine's noise leaves undecided reads 'inconclusive' and says why under 'why:'."
)
TRITON_CHECK_NOTE = (
    "the Triton kernel, checked on this CPU: Triton runs it in its interpreter here (no GPU), so its "
    "output is checked against the reference but its time is Python's, not the kernel's; those cells "
    "read 'inconclusive' (reason 'interpreted'), never faster or slower. On a GPU `kernelab up` times it."
)


class ServerStartError(RuntimeError):
    """The server process exited or never answered ``/healthz``; the message holds its log's tail."""


def example_spec_path(name: str) -> Path:
    """Path of a bundled example spec (``softmax``, ``matmul`` or ``softmax_cpu``), shipped as
    package data.

    Raises ``ValueError`` for an unknown name.
    """
    if name not in EXAMPLES:
        raise ValueError(f"unknown example {name!r}; bundled: {list(EXAMPLES)}")
    return Path(str(files("kernelab.runners") / "examples" / f"{name}.yaml"))


def demo_specs(has_cuda: bool) -> list[tuple[Path, str]]:
    """The demo jobs of ``kernelab up``, in order, each with the note printed after its table.

    With a CUDA GPU: ``softmax`` (eager PyTorch vs the fused Triton kernel, real GPU shapes), no
    note. Without one: ``softmax_cpu`` (the unfused formula vs ``torch.softmax``, both native on a
    CPU: a true ratio, ``CPU_DEMO_NOTE``), then ``softmax`` on its small CPU cells, where the Triton
    kernel runs in Triton's interpreter: its output is checked, its time is not compared (the
    judge's ``interpreted`` rule, ``kernelab.service.judge.verdicts.interpreted_reasons``;
    ``TRITON_CHECK_NOTE``). ``kernelab up`` runs the CPU demos without probes (a shared CPU's
    copy bandwidth would flag the node, which the demo is not about)."""
    if has_cuda:
        return [(example_spec_path("softmax"), "")]
    return [
        (example_spec_path("softmax_cpu"), CPU_DEMO_NOTE),
        (example_spec_path("softmax"), TRITON_CHECK_NOTE),
    ]


def admin_token(data_dir: Path) -> str:
    """The admin token kept in ``data_dir/admin-token``; created (256 random bits) if absent."""
    path = Path(data_dir) / "admin-token"
    if path.exists():
        token = path.read_text(encoding="utf-8").strip()
        if token:
            return token
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token


def wait_healthy(url: str, proc: subprocess.Popen[bytes], *, timeout_s: float, log_path: Path) -> None:
    """Poll ``url/healthz`` until it answers 2xx. Raises ``ServerStartError`` (with the log's tail)
    when ``proc`` exits first or after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"the server exited with status {proc.returncode}:\n{_tail(log_path)}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2.0).is_success:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise ServerStartError(
        f"the server did not answer {url}/healthz within {timeout_s:.0f} s:\n{_tail(log_path)}"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago (the OS picks it; a race is possible)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _stop_process(proc: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ServerProcess:
    """``kernelab serve`` (Alembic upgrade, then uvicorn) as a child process on ``host:port``.

    ``database_url``: SQLAlchemy URL. ``admin_token``: bootstrap admin token, handed over in the
    environment. ``log_path``: where the server's stdout/stderr go. ``workers``: uvicorn worker
    processes (``--workers``). ``env``: more environment variables for the server. Use
    ``start()``/``stop()`` or ``with ServerProcess(...) as server:``.
    """

    def __init__(
        self,
        database_url: str,
        *,
        port: int,
        admin_token: str,
        log_path: Path,
        host: str = "127.0.0.1",
        workers: int = 1,
        env: dict[str, str] | None = None,
    ):
        self.workers = int(workers)
        self.env = dict(env or {})
        self.database_url = database_url
        self.host = host
        self.port = port
        self.url = f"http://{host}:{port}"
        self.log_path = Path(log_path)
        self._admin_token = admin_token
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.proc is not None and self.proc.poll() is None else "stopped"
        return f"<ServerProcess {self.url} {state}>"

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = SERVER_START_TIMEOUT_S) -> ServerProcess:
        """Start the server and wait for ``/healthz``. Raises ``ServerStartError`` if the port is
        taken (another server there would answer ``/healthz`` in this one's place) or if it never
        answers."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            if probe.connect_ex((self.host, self.port)) == 0:
                raise ServerStartError(
                    f"port {self.port} on {self.host} is already in use (another server?); "
                    "choose another with --port"
                )
        env = {
            **os.environ,
            **self.env,
            "KERNELAB_DATABASE_URL": self.database_url,
            "KERNELAB_ADMIN_TOKEN": self._admin_token,
        }
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelab.runners.cli",
                "serve",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        try:
            wait_healthy(self.url, self.proc, timeout_s=timeout_s, log_path=self.log_path)
        except ServerStartError:
            self.stop()
            raise
        return self

    def wait(self) -> None:
        """Block until the server exits."""
        if self.proc is not None:
            self.proc.wait()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM the server (SIGKILL after ``grace_s`` seconds) and close its log."""
        _stop_process(self.proc, grace_s)
        if self._log is not None:
            self._log.close()
            self._log = None


class LocalStack:
    """Server + runner subprocesses for ``kernelab up`` (see the module docstring)."""

    def __init__(self, data_dir: Path, port: int, *, runner_name: str | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.database_path = self.data_dir / "kernelab.db"
        self.database_url = f"sqlite:///{self.database_path}"
        self.token_path = self.data_dir / "admin-token"
        self.server_log = self.data_dir / "server.log"
        self.runner_log = self.data_dir / "runner.log"
        self.runner_name = runner_name or re.sub(r"[^A-Za-z0-9._:-]", "-", f"local-{socket.gethostname()}")
        self.server: ServerProcess | None = None
        self.runner: subprocess.Popen[bytes] | None = None
        self._runner_log: IO[bytes] | None = None
        self._runner_log_start = 0  # the runner log's size when this start began

    def __repr__(self) -> str:
        return f"<LocalStack {self.url} data_dir={self.data_dir}>"

    def start(self) -> str:
        """Start the server (which upgrades the database) and the runner; return the admin token.

        Raises ``ServerStartError`` when the server does not come up (the port is taken, ...).
        """
        token = admin_token(self.data_dir)
        self.server = ServerProcess(
            self.database_url, port=self.port, admin_token=token, log_path=self.server_log
        ).start()
        env = {**os.environ, "KERNELAB_TOKEN": token}
        env.pop("KERNELAB_ADMIN_TOKEN", None)
        self._runner_log_start = self.runner_log.stat().st_size if self.runner_log.exists() else 0
        self._runner_log = self.runner_log.open("ab")
        self.runner = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kernelab.runners.cli",
                "runner",
                "--server",
                self.url,
                "--name",
                self.runner_name,
                "--poll-s",
                str(RUNNER_POLL_S),
                "--grace-s",
                str(RUNNER_GRACE_S),
                "--work-dir",
                str(self.data_dir / "runner"),
                "--job-hide",
                str(self.data_dir),
            ],  # the database and the admin token beside the work dir
            env=env,
            stdout=self._runner_log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        return token

    def runner_exited(self) -> str | None:
        """None while the runner process runs (or was never started); else why it ended: its exit
        status and its log's tail."""
        if self.runner is None or self.runner.poll() is None:
            return None
        return f"the local runner exited with status {self.runner.returncode}:\n{_tail(self.runner_log)}"

    def runner_serving(self) -> bool:
        """True once the runner's log says it serves (``runner NAME: serving URL``: it has made its
        advertisement, which its first claim, right after, sends)."""
        try:
            with self.runner_log.open("rb") as fh:
                fh.seek(self._runner_log_start)  # this start's lines: the log is kept across starts
                return f"runner {self.runner_name}: serving ".encode() in fh.read()
        except OSError:
            return False

    def wait(self) -> None:
        """Block until the server exits (Ctrl-C raises ``KeyboardInterrupt`` here)."""
        if self.server is not None:
            self.server.wait()

    def stop(self) -> None:
        """SIGTERM the runner (it finishes its job within its grace), then the server."""
        _stop_process(self.runner, RUNNER_GRACE_S + STOP_GRACE_S)
        if self._runner_log is not None:
            self._runner_log.close()
            self._runner_log = None
        if self.server is not None:
            self.server.stop()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
