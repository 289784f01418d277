"""Shared test configuration: markers skip cleanly when their resource is absent; the one shared
real server process (``live_server``, ``server_for_module``, ``server_for_test``). A drill that
needs a server configured or limited its own way starts one with ``tests/servers.py``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kernelab.runners.local import ServerProcess, admin_token, free_port
from tests.leftovers import start_guard

PG_URL = os.environ.get("KERNELAB_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
LIVE_SERVER_START_S = 300.0


def _has_cuda() -> bool:
    """Whether torch sees a CUDA GPU, without importing torch where its build settles it
    (``torch_sees_cuda``: a CPU build, or no driver), so an xdist controller, which runs no test,
    does not import it (1.3-1.9 CPU-s)."""
    from kernelab.runners.devices import torch_sees_cuda

    try:
        return torch_sees_cuda()
    except ImportError:
        return False


# Triton's interpreter mode is fixed by the first ``import triton`` in a process
# (kernels/_device.py): pick it before any test module imports triton.
if not _has_cuda():
    from kernelab.kernels.triton_mode import configure_triton_env

    configure_triton_env("cpu")


def pytest_configure(config: pytest.Config) -> None:
    # Whatever this process starts dies with it, however it ends (tests/leftovers.py).
    start_guard()
    # pytest-xdist's --dist loadfile hands out files largest test count first (its
    # --loadscope-reorder default), which leaves the files of few long tests (end-to-end, drills)
    # for last, run alone by one process while the others idle. The order of the collection
    # (``_costliest_files_first``) is the schedule instead.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


# Seconds each file took on the 2-core CI machine (a clean-clone run, --dist loadfile; files of
# under 3 s left out): the schedule's estimate of a file's cost. Stale figures cost only time (a file
# handed out later than it should be), never a result; refresh them from a run's per-file totals.
DURATIONS_FILE = Path(__file__).with_name("durations.json")
UNMEASURED_SLOW_S = 30.0  # the estimate of a file with `slow` tests that durations.json lacks


def _costliest_files_first(items: list[pytest.Item], rootdir: Path) -> None:
    """Reorder ``items`` in place, file by file, longest first by ``durations.json`` (a file it
    lacks counts ``UNMEASURED_SLOW_S`` if it has tests marked ``slow``, else 0), ties by the number
    of ``slow`` tests, then of tests; each file's tests keep their order. With ``--dist loadfile``
    the long files (subprocesses, servers, drills: minutes each) start first, beside each other and
    while there is other work to run beside them (longest-processing-time-first), and the last files
    handed out are short, so the processes finish together."""
    measured: dict[str, float] = json.loads(DURATIONS_FILE.read_text()) if DURATIONS_FILE.exists() else {}
    counts: dict[Path, list[int]] = {}
    for item in items:
        slow_and_all = counts.setdefault(item.path, [0, 0])
        slow_and_all[0] += "slow" in item.keywords
        slow_and_all[1] += 1
    first = {path: i for i, path in reversed(list(enumerate(item.path for item in items)))}

    def estimate_s(path: Path, slow: int) -> float:
        try:
            name = path.relative_to(rootdir).as_posix()
        except ValueError:
            name = path.as_posix()
        return measured.get(name, UNMEASURED_SLOW_S if slow else 0.0)

    rank = {
        path: (-estimate_s(path, slow), -slow, -total, first[path]) for path, (slow, total) in counts.items()
    }
    items.sort(key=lambda item: rank[item.path])  # stable: a file's tests keep their order


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine")
    has_cuda = _has_cuda()
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
    _costliest_files_first(items, config.rootpath)


@dataclass(frozen=True)
class LiveServer:
    """A running ``kernelab serve``: its base URL, its admin token and the process."""

    url: str
    token: str
    process: ServerProcess


@pytest.fixture(autouse=True)
def runner_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry of the host's runners (``kernelab.runners.daemon.host``) of this test's own: the
    daemons of one test see each other, never those of tests running beside it (a daemon whose
    work dir is new waits for the older jobs of every runner it sees)."""
    root = tmp_path_factory.mktemp("runner-registry")
    monkeypatch.setenv("KERNELAB_RUNNER_REGISTRY", str(root))
    return root


@pytest.fixture(scope="session")
def live_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """The one real server process of this test process (an xdist worker has its own): ``kernelab
    serve`` on a temp SQLite file, started once (a start is a Python process, the imports and the
    migrations: seconds on a 2-core CI box). Use it through ``server_for_module``."""
    tmp = tmp_path_factory.mktemp("live-server")
    token = admin_token(tmp)
    proc = ServerProcess(f"sqlite:///{tmp / 'kernelab.db'}", port=free_port(), admin_token=token,
                         log_path=tmp / "server.log")  # fmt: skip
    # Every test of this process that needs a server waits on this one start, and a start is only
    # slow, not wrong, on a loaded machine (146 s measured at load average 28 on 2 cores): the
    # start may take up to LIVE_SERVER_START_S; a server that exits says so at once.
    proc.start(timeout_s=LIVE_SERVER_START_S)
    try:
        yield LiveServer(proc.url, token, proc)
    finally:
        proc.stop()


def empty_queue(server: LiveServer) -> None:
    """Cancel the jobs ``server`` holds queued or running (pages of 100; a job that ended meanwhile
    answers 409 and is left), so the next ``runner --once`` claims only what its test submits.
    Tokens, runners and finished jobs stay (tests look theirs up by name or id)."""
    import httpx

    admin = {"Authorization": f"Bearer {server.token}"}
    with httpx.Client(base_url=server.url, headers=admin, timeout=60) as http:
        for status in ("queued", "running"):
            for _ in range(100):
                jobs = http.get("/api/v1/jobs", params={"status": status, "limit": 100}).json()["data"]
                if not jobs:
                    break
                for job in jobs:
                    http.post(f"/api/v1/jobs/{job['id']}/cancel")


@pytest.fixture(scope="module")
def server_for_module(live_server: LiveServer) -> LiveServer:
    """``live_server`` with an empty queue: the jobs an earlier module left queued or running are
    cancelled, so a ``runner --once`` of this module claims this module's job. Tokens, runners and
    finished jobs of earlier modules stay (tests look theirs up by name or id)."""
    empty_queue(live_server)
    return live_server


@pytest.fixture
def server_for_test(live_server: LiveServer) -> LiveServer:
    """``live_server`` with an empty queue before this test (``empty_queue``): for modules whose
    tests each run a ``runner --once`` or leave a job queued, on the one server process instead of a
    server start per test. A test that stops, restarts or reconfigures its server keeps its own."""
    empty_queue(live_server)
    return live_server
