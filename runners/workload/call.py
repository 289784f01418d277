"""A ``module:function`` workload side under torchrun: ``python -m kernelab.runners.workload.call
module:function ARGS...`` imports ``module`` and calls ``function(ARGS)`` (a list of strings) in
this rank; a non-zero int it returns is the exit status."""

from __future__ import annotations

import importlib
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Run the function named by ``argv[0]`` with ``argv[1:]``; the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or ":" not in argv[0]:
        print("usage: python -m kernelab.runners.workload.call module:function [ARGS...]", file=sys.stderr)
        return 2
    module_name, _, attr = argv[0].partition(":")
    sys.path.insert(0, os.getcwd())
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        print(f"{argv[0]} is not callable", file=sys.stderr)
        return 2
    status = obj(list(argv[1:]))
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
