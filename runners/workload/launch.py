"""One run of one workload arm under ``torchrun`` (``python -m torch.distributed.run``): the command
line, the environment, and a process group killed at the run's timeout."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kernelab.runners.reaper import descendants  # torchrun's ranks are in sessions of their own
from kernelab.service.contract.schemas import LaunchSpec, RunOutcome, WorkloadSide, WorkloadSpec

MONITOR_INTERVAL_S = 0.2  # torchrun's check of its workers (its own default differs between releases)


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks of several nodes meet: torchrun's c10d rendezvous on ``endpoint``
    (``host:port`` of node rank 0's runner) under ``run_id``; this node is ``node_rank``."""

    endpoint: str
    run_id: str
    node_rank: int


def torchrun_command(side: WorkloadSide, launch: LaunchSpec, rdzv: Rendezvous | None = None) -> list[str]:
    """The argv that launches ``side`` with ``launch.nproc_per_node`` ranks: ``--standalone`` on one
    node, a c10d rendezvous (``rdzv``, required then) on several. A ``command`` whose first word
    ends in ``.py`` runs under this Python; another command runs as a program (``--no-python``); a
    ``function`` runs through ``kernelab.runners.workload.call``. Raises ValueError for
    ``nnodes > 1`` without ``rdzv``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(launch.nproc_per_node),
        "--max-restarts",
        "0",
        "--monitor-interval",
        str(MONITOR_INTERVAL_S),
    ]
    if launch.nnodes == 1:
        cmd.append("--standalone")
    else:
        if rdzv is None:
            raise ValueError(f"nnodes = {launch.nnodes} needs a rendezvous endpoint")
        cmd += [
            "--nnodes",
            str(launch.nnodes),
            "--node-rank",
            str(rdzv.node_rank),
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            rdzv.endpoint,
            "--rdzv-id",
            rdzv.run_id,
            "--rdzv-conf",
            f"join_timeout={launch.rdzv_timeout_s:g}",
        ]
    if side.function is not None:
        return [*cmd, "-m", "kernelab.runners.workload.call", side.function, *side.args]
    assert side.command is not None
    first, rest = side.command[0], [*side.command[1:], *side.args]
    if first.endswith(".py"):
        return [*cmd, first, *rest]
    return [*cmd, "--no-python", first, *rest]


def run_env(
    spec: WorkloadSpec, side: WorkloadSide, *, arm: str, records: Path, gpus: list[int] | None
) -> dict[str, str]:
    """A run's environment: the job environment (``kernelab.runners.jobenv.job_env``: allow-listed,
    no credentials, this process's ``sys.path`` as ``PYTHONPATH``), the side's ``env``, the record
    folder, the digest cap, the arm's name, and ``CUDA_VISIBLE_DEVICES`` = the GPUs handed over
    (the first ``nproc_per_node`` of ``gpus``; ``""`` on a CPU run, so a rank never picks a GPU)."""
    from kernelab.runners.children import _child_env
    from kernelab.workload import ENV_DIGEST_MAX_BYTES, ENV_RECORDS

    env = _child_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH", "")]))
    env.update(side.env)
    env[ENV_RECORDS] = str(records)
    env[ENV_DIGEST_MAX_BYTES] = str(spec.digest_max_bytes)
    env["KERNELAB_WORKLOAD_ARM"] = arm
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in (gpus or [])[: spec.launch.nproc_per_node])
    return env


@dataclass
class Launched:
    """What one run did: outcome, exit status (None after a kill at the timeout), wall seconds, output."""

    outcome: RunOutcome
    exit_code: int | None
    wall_s: float
    output: str
    error: str


def launch(
    cmd: list[str],
    env: dict[str, str],
    *,
    timeout_s: float,
    log_path: Path,
    cwd: Path | None = None,
    stop: threading.Event | None = None,
) -> Launched:
    """Run ``cmd`` in its own process group, its output (stdout and stderr together) in ``log_path``;
    the whole group is killed (SIGTERM, then SIGKILL after 5 s) at ``timeout_s`` or when ``stop`` is
    set. Never raises for the run's own failure: that is the outcome."""
    t0 = time.perf_counter()
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            start_new_session=True,
            text=True,
        )
        outcome: RunOutcome = "ok"
        error = ""
        deadline = t0 + timeout_s
        code: int | None = None
        while True:
            try:
                code = proc.wait(timeout=0.2)
                break
            except subprocess.TimeoutExpired:
                if time.perf_counter() > deadline:
                    outcome, error = (
                        "timeout",
                        f"the run outlasted run_timeout_s = {timeout_s:g} s and was killed",
                    )
                elif stop is not None and stop.is_set():
                    outcome, error = "crashed", "the run was stopped: the job's attempt ended (lease lost)"
                else:
                    continue
                kill_group(proc)
                code = None
                break
            except BaseException:
                kill_group(proc)
                raise
    wall = time.perf_counter() - t0
    output = log_path.read_text(encoding="utf-8", errors="replace")
    if outcome == "ok" and code != 0:
        outcome = "crashed"
        error = f"torchrun exited with status {code}" + (
            f" (signal {-code})" if code is not None and code < 0 else ""
        )
    return Launched(outcome, code, wall, output, error)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """End ``proc``'s process group and every process below it (the ranks, in sessions of their
    own, and their process groups): SIGTERM, so torchrun stops its ranks itself, then SIGKILL
    after 5 s; reap ``proc``."""
    below = descendants(proc.pid)
    groups = [proc.pid]
    for pid in below:
        with contextlib.suppress(OSError):
            groups.append(os.getpgid(pid))
    for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        for group in dict.fromkeys(groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        try:
            proc.wait(timeout=wait_s)
            if sig == signal.SIGKILL or not any(_alive(pid) for pid in below):
                return
        except subprocess.TimeoutExpired:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
