"""Workload jobs on a runner: whole programs under ``torchrun``, two arms interleaved run by run
(``run_workload``), their records read back (``records``), the quick probe between runs (``probe``)."""

from kernelab.runners.workload.launch import Rendezvous, torchrun_command
from kernelab.runners.workload.run import run_order, run_workload

__all__ = ["Rendezvous", "run_order", "run_workload", "torchrun_command"]
