"""The daemon's all-reduce probe pool: ranks kept alive between jobs so a job's probes need not
start their own (``kernelab.runners.probes.all_reduce.AllReducePool``), handed to each job's
worker in its environment."""

from __future__ import annotations

import json
import logging
from typing import Any

from kernelab.service.contract.schemas import JobSpec

log = logging.getLogger(__name__)

PROBE_POOL_MODES = ("auto", "on", "off")


class ProbePoolManager:
    """When runner ``name`` keeps an all-reduce pool, and the pool itself.

    ``mode``: ``"auto"`` keeps a pool on a node with 2+ CUDA GPUs none of which is in an exclusive
    compute mode (NVML), ``"on"`` also there and on a CPU-only node (gloo), ``"off"`` never.
    Raises ``ValueError`` for another mode. ``pool``: the running pool, or None.
    """

    def __init__(self, mode: str, name: str) -> None:
        if mode not in PROBE_POOL_MODES:
            raise ValueError(f"probe_pool must be one of {list(PROBE_POOL_MODES)}, got {mode!r}")
        self.mode = mode
        self.name = name
        self.pool: Any = None  # kernelab.runners.probes.all_reduce.AllReducePool, started by the first job

    def env_for(self, spec: JobSpec) -> dict[str, str]:
        """The worker's environment entry for the pool of a job of ``spec`` (``{}`` without one).

        The pool starts with the first job that probes the all-reduce and is restarted when it has
        lost a rank or the job's device type differs; a pool that cannot start is logged and the
        job's probes start their own ranks.
        """
        if self.mode == "off" or not spec.probes.all_reduce:
            return {}
        try:
            import torch

            from kernelab.runners.probes.all_reduce import AllReducePool
            from kernelab.runners.probes.telemetry import POOL_ENV

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
            device_type = spec.device if spec.device != "auto" else ("cuda" if gpus else "cpu")
            if device_type == "cuda" and gpus < 2:
                return {}
            if device_type == "cuda" and self.mode == "auto":
                from kernelab.runners.probes.telemetry import exclusive_gpus

                if exclusive := exclusive_gpus(gpus):
                    log.info("runner %s: no probe pool: GPUs %s are in an exclusive compute mode",
                             self.name, exclusive)  # fmt: skip
                    return {}
            if device_type == "cpu" and self.mode != "on":
                return {}
            if self.pool is not None and (not self.pool.alive() or self.pool.device_type != device_type):
                self.close()
            if self.pool is None:
                self.pool = AllReducePool(device_type)
                log.info("runner %s: all-reduce probe pool started (%s x%d, pids %s)",
                         self.name, device_type, self.pool.world_size, self.pool.pids)  # fmt: skip
            return {POOL_ENV: json.dumps(self.pool.handover())}
        except (RuntimeError, ValueError, OSError) as exc:  # the probes fall back to their own ranks
            log.warning("runner %s: no all-reduce probe pool: %s", self.name, exc)
            return {}

    def close(self) -> None:
        """Stop the pool's ranks, if a pool runs."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None
