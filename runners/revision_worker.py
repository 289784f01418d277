"""Worker process of one side of a revision A/B job: ``python -m kernelab.runners.revision_worker``.

``kernelab.runners.revision_job`` starts one per side. The channel is one JSON object per line: requests
on stdin, answers on the process's original stdout (``sys.stdout`` is redirected to stderr at
start, so whatever the benchmark prints cannot corrupt the channel). Every answer is ``{"ok":
true, ...}`` or ``{"ok": false, "error": "<one line>"}``; an error never ends the process.

Requests (in the order the parent sends them):

* ``{"op": "setup", "spec": JobSpec, "side": "baseline"|"candidate", "device": "cpu"|"cuda:0",
  "path": str|null, "site": str|null, "timer_kind": str}``: puts ``path`` then ``site`` first on
  ``sys.path`` (dropping already-imported modules of the benchmark's top-level package that the
  revision also has; a built-in benchmark on a revision of kernelab itself is that revision's:
  ``revision_reference``), loads the
  benchmark, checks this side's variant and every cell's parameters, makes the timer
  (``kernelab.runners.timing.make_timer``). Answer: ``versions`` (torch, triton, cuda, driver, python),
  ``timer`` (its label), ``static_target`` (``kernelab.runners.static_metrics.default_target``).
* ``{"op": "cell", "index": i}``: cell ``i`` of ``spec.cells(device type)`` merged with this
  side's ``params``: inputs (seeded with ``measurement.seed``, scaled by
  ``correctness.input_scale``), ``prepare``, the cell's ``kernelab.runners.sides.LocalSide``; under
  ``measurement.placement: rotate`` as many more input sets (inputs and ``prepare`` again) as
  ``measurement.input_sets`` asks and half the free memory holds
  (``kernelab.runners.cells.sets_that_fit``). Answer: ``sets``, the input sets prepared.
* One request per method of the cell pipeline's side protocol
  (``kernelab.runners.pipeline.CellSide``), served by that ``LocalSide`` (``_SIDE_OPS``):
  ``{"op": "time", "launches": n}`` → ``ns`` (per launch); ``{"op": "launches",
  "per_launch_ns": x}`` → ``launches``; ``kind`` → ``kind``; ``fallback`` → ``moved``;
  ``reference`` (the float64 reference of the cell's inputs, before either side runs);
  ``{"op": "check", "correctness": CorrectnessSpec, "seed": s}`` → ``correctness``
  (``CorrectnessResult``: repeats, determinism, batch invariance) and ``findings``;
  ``{"op": "output", "path": p}`` writes the kept output there (``torch.save``);
  ``{"op": "bitwise", "path": p}`` → ``comparison`` (``BitwiseComparison`` of this side's kept
  output against the one in ``p``, read with ``weights_only=True``); ``{"op": "verify", "seed": s,
  "rounds": r, "launches": n}`` → ``check`` (``TimedCheck``: a checked sample through the timer);
  ``device_work`` and ``integrity`` → ``findings``; ``work`` → ``work``; ``{"op": "use", "index":
  k}`` times input set k from then on (the engine's rotating placement).
* ``{"op": "static", "target": t, "cells": [i, ...]}``: this side's kernels of those cells compiled
  ahead of time for ``t`` from this revision (``kernelab.runners.static_metrics.compile_kernels``);
  answer ``cells``: per cell ``kernels`` (``kernel_code_json``) and ``error``.
* ``{"op": "label"}``: the timer's label after the cells (``Timer.label``: a fallback shows).
* ``{"op": "release"}``: drop the cell's inputs, callable and timer state, free device memory.
* ``{"op": "exit"}``: answer, then exit 0 (end of stdin does the same).

The measurement framework (timer, correctness check) is the runner's installed kernelab; only
the benchmark comes from the revision, so both sides are measured by the same code.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
from pydantic import ValidationError

# Everything of the installed kernelab is imported before a revision goes on sys.path: a kernelab
# revision's benchmark library then replaces the installed one for the benchmark only.
from kernelab.kernels._device import configure_triton_env
from kernelab.runners import integrity
from kernelab.runners.cells import allocated_bytes, cell_tolerance, free_bytes, set_bytes, sets_that_fit
from kernelab.runners.checks import scale_inputs
from kernelab.runners.pipeline import short_error
from kernelab.runners.probes import node_info
from kernelab.runners.revision_benchmark import (
    WorkerError,
    load_benchmark,
    purge_shadowed,
    revision_reference,
)
from kernelab.runners.sides import LocalSide
from kernelab.runners.static_metrics import compile_kernels, default_target, kernel_code_json, side_items
from kernelab.runners.timing import make_timer
from kernelab.service.contract.schemas import CorrectnessSpec, JobSpec, Reason, Side


class RevisionWorker:
    """State of one side between requests: spec, benchmark, timer, the prepared cell's side."""

    def __init__(self) -> None:
        self.spec: JobSpec | None = None
        self.side: Side = "baseline"
        self.bench: Any = None
        self.device: Any = None
        self.timer: Any = None
        self.revision: dict[str, str | None] = {}
        self.prepared: LocalSide | None = None

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """Serve one request; return the answer (without ``ok``). Raises ``WorkerError``."""
        op = request.get("op")
        if op == "setup":
            return self.setup(request)
        if op == "cell":
            return self.cell(int(request["index"]))
        if op == "static":
            return self.static(str(request["target"]), [int(i) for i in request["cells"]])
        if op == "release":
            self.release()
            return {}
        if op == "label":
            return {"label": self.timer.label if self.timer is not None else ""}
        serve = _SIDE_OPS.get(str(op))
        if serve is None:
            raise WorkerError(f"unknown op {op!r}")
        if self.prepared is None:
            raise WorkerError("no cell is prepared")
        return serve(self.prepared, request)

    def setup(self, request: dict[str, Any]) -> dict[str, Any]:
        self.spec = spec = JobSpec.model_validate(request["spec"])
        self.side = request["side"]
        integrity.take_snapshot()  # before the revision's benchmark is imported
        self.device = torch.device(request["device"])
        configure_triton_env(self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        else:
            torch.set_num_threads(1)  # as kernelab.runners.cells._cpu_threads: one intra-op thread on a CPU
        top = spec.benchmark.partition(":")[0].split(".")[0] if ":" in spec.benchmark else "kernelab"
        for entry in (request.get("site"), request.get("path")):  # path ends up first
            if entry:
                sys.path.insert(0, entry)
                purge_shadowed(top, Path(entry))
        path = request.get("path")
        self.revision = {"path": path, "site": request.get("site")}
        self.bench = load_benchmark(revision_reference(spec.benchmark, Path(path) if path else None))
        side_spec = getattr(spec, self.side)
        if side_spec.variant not in self.bench.variants:
            raise WorkerError(
                f"{self.side}.variant: unknown variant {side_spec.variant!r}; this "
                f"revision's benchmark has {list(self.bench.variants)}"
            )
        for cell in spec.cells(self.device.type):
            try:
                self.bench.parse_params({**cell, **side_spec.params})
            except ValidationError as exc:
                err = exc.errors()[0]
                field = ".".join(str(p) for p in err["loc"])
                raise WorkerError(f"{self.side}: parameter {field}: {err['msg']} (cell {cell})") from None
        self.timer = make_timer(self.device, spec.measurement, kind=request.get("timer_kind", "auto"))
        node = node_info(self.device)
        return {
            "versions": {
                "torch": node.torch_version,
                "triton": node.triton_version,
                "cuda": node.cuda_version,
                "driver": node.driver_version,
                "python": node.python_version,
            },
            "timer": self.timer.label,
            "static_target": default_target(self.device),
        }

    def _params(self, index: int) -> dict[str, Any]:
        """Cell ``index`` of the sweep (one cell, not the whole sweep per request) with this side's
        own parameters."""
        assert self.spec is not None
        cell = self.spec.cell(self.device.type, index)
        return {**cell, **getattr(self.spec, self.side).params}

    def cell(self, index: int) -> dict[str, Any]:
        """Prepare cell ``index``: inputs seeded with ``measurement.seed`` and scaled by
        ``correctness.input_scale``, the prepared callable, its ``LocalSide``."""
        if self.spec is None:
            raise WorkerError("setup first")
        self.release()
        spec, bench = self.spec, self.bench
        side_spec = getattr(spec, self.side)
        params = bench.parse_params(self._params(index))
        before = allocated_bytes(self.device)
        inputs = scale_inputs(
            bench.make_inputs(params, self.device, spec.measurement.seed), spec.correctness.input_scale
        )
        tolerance = cell_tolerance(bench, spec, params)
        self.prepared = side = LocalSide(
            side=self.side,
            bench=bench,
            variant=side_spec.variant,
            params=params,
            inputs=inputs,
            fn=bench.prepare(side_spec.variant, params, inputs),
            timer=self.timer,
            device=self.device,
            tolerance=tolerance,
            input_scale=spec.correctness.input_scale,
        )
        wanted = spec.measurement.input_sets if spec.measurement.placement == "rotate" else 1
        one_set = set_bytes(self.device, before, {self.side: side})
        seed, scale = spec.measurement.seed, spec.correctness.input_scale
        for _ in range(1, sets_that_fit(one_set, free_bytes(self.device), wanted)):
            try:
                more = scale_inputs(bench.make_inputs(params, self.device, seed), scale)
                side.add_input_set(more, bench.prepare(side_spec.variant, params, more))
            except torch.OutOfMemoryError:
                break
        return {"sets": side.input_sets}

    def static(self, target: str, indices: list[int]) -> dict[str, Any]:
        """This side's kernels of cells ``indices`` compiled ahead of time for ``target`` from this
        revision (``kernelab.runners.static_metrics.compile_kernels``)."""
        if self.spec is None:
            raise WorkerError("setup first")
        items = side_items(self.spec, self.side, [self._params(i) for i in indices])
        compiled = compile_kernels(items, target, revision=self.revision)
        return {
            "cells": [
                {"kernels": [kernel_code_json(k) for k in kernels], "error": error}
                for kernels, error in (compiled[item["key"]] for item in items)
            ]
        }

    def release(self) -> None:
        self.prepared = None
        if self.timer is not None:
            self.timer.reset()
        gc.collect()
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()


def _check(side: LocalSide, request: dict[str, Any]) -> dict[str, Any]:
    # Not heavy, no cycle: imported at call time as it always was, so after ``setup`` mounted a
    # kernelab revision's library as ``kernelab.kernels`` (``revision_reference``) this is that
    # revision's copy, and a revision older than ``triton_mode`` fails the check here. Importing the
    # installed copy at the top would change that behaviour; not done in a move of imports.
    from kernelab.kernels.triton_mode import interpreter_launches

    spec = CorrectnessSpec.model_validate(request["correctness"])
    launched = interpreter_launches()
    result, found = side.eager_check(spec, seed=int(request["seed"]))
    return {"correctness": result.model_dump(mode="json"), "findings": _dump(found),
            "interpreted": interpreter_launches() > launched}  # fmt: skip


def _output(side: LocalSide, request: dict[str, Any]) -> dict[str, Any]:
    torch.save(side.first_output(), request["path"])
    return {}


def _bitwise(side: LocalSide, request: dict[str, Any]) -> dict[str, Any]:
    return {"comparison": side.compare_bitwise(Path(request["path"])).model_dump(mode="json")}


def _verify(side: LocalSide, request: dict[str, Any]) -> dict[str, Any]:
    check = side.checked_sample(
        seed=int(request["seed"]), rounds=int(request["rounds"]), launches=int(request["launches"])
    )
    return {"check": check.model_dump(mode="json")}


def _reference(side: LocalSide, request: dict[str, Any]) -> dict[str, Any]:
    side.take_reference()
    return {}


_SIDE_OPS: dict[str, Callable[[LocalSide, dict[str, Any]], dict[str, Any]]] = {
    "time": lambda side, r: {"ns": side.time_ns(int(r["launches"]))},
    "launches": lambda side, r: {"launches": side.launches_for(float(r["per_launch_ns"]))},
    "kind": lambda side, r: {"kind": side.timer_kind},
    "fallback": lambda side, r: {"moved": side.use_fallback()},
    "reference": _reference,
    "check": _check,
    "output": _output,
    "bitwise": _bitwise,
    "verify": _verify,
    "device_work": lambda side, r: {"findings": _dump(side.device_work_findings())},
    "integrity": lambda side, r: {"findings": _dump(side.tamper_findings())},
    "work": lambda side, r: {"work": side.work().model_dump(mode="json")},
    "use": lambda side, r: _use(side, r),
}
"""The requests served by the prepared cell's ``LocalSide``: one per ``kernelab.runners.pipeline.CellSide``
method."""


def _use(side: LocalSide, request: dict[str, Any]) -> dict[str, Any]:
    side.use_inputs(int(request["index"]))
    return {}


def _dump(reasons: list[Reason]) -> list[dict[str, Any]]:
    return [r.model_dump(mode="json") for r in reasons]


def _answer(out: IO[str], payload: dict[str, Any]) -> None:
    out.write(json.dumps(payload) + "\n")
    out.flush()


def main() -> int:
    """Serve requests from stdin until ``exit`` or end of input; return the exit status (0)."""
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints of the benchmark go to stderr
    worker = RevisionWorker()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except ValueError as exc:
            _answer(channel, {"ok": False, "error": f"unreadable request: {exc}"})
            continue
        if request.get("op") == "exit":
            _answer(channel, {"ok": True})
            break
        try:
            answer = worker.handle(request)
        except WorkerError as exc:
            _answer(channel, {"ok": False, "error": str(exc)})
        except Exception as exc:  # the benchmark's own failure: report it, keep serving
            traceback.print_exc(file=sys.stderr)
            _answer(channel, {"ok": False, "error": short_error(exc)})
        else:
            _answer(channel, {"ok": True, **answer})
    return 0


if __name__ == "__main__":
    sys.exit(main())
