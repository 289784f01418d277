"""kernelab's adversarial suite: candidates that cheat, each in one published way.

``ScaleBenchmark`` computes ``out = 2 * x + y`` on (M, N) inputs. Its baseline ``honest`` does it
correctly and slowly (``work`` extra passes over the data, so any cheat that skips the work reads
faster); every other variant cheats. Kernel-evaluation services have published these tricks
(KernelBench, Ouyang et al. 2025, "KernelBench: Can LLMs Write Efficient GPU Kernels?"; GPU MODE's
leaderboard reviews of reward hacks): each must end in a named reason and a verdict that is not
``faster``. Variants (``CHEATS`` maps each to the reason codes that must catch it):

CPU and GPU:

* ``wrong`` fast but wrong (forgets ``+ y``); ``nan`` one NaN element; ``partial`` writes half;
* ``cache_ptr`` / ``cache_shape`` / ``cache_id``: computes once, then returns a copy of the cached
  answer keyed on the input's data pointer, shape or ``id``;
* ``constant``: the answer for the cell's own inputs, computed in ``prepare``, every call;
* ``deferred``: each call computes from the previous call's inputs (an output one call late);
* ``lazy``: returns a ``torch.Tensor`` subclass that computes when read;
* ``thread``: returns at once and writes the output from a background thread;
* ``scribble``: rounds its input in place to bfloat16 before computing;
* ``less_accurate``: computes in bfloat16 for a float32 output (passes a loose tolerance);
* ``patch_timer`` / ``patch_kernelab``: replaces ``time.perf_counter_ns`` / kernelab's CPU timer
  in the measuring process (only there: the replacement happens in ``prepare``).

GPU only (``GPU_CHEATS``):

* ``graph_wrong``: right when launched directly, half the work while a CUDA graph is captured;
* ``graph_stale``: right when launched directly; captured in a CUDA graph it copies three quarters
  of its output from what the last direct call computed (a memcpy node: the auto timer times it by
  events, directly, where it is right), so replays return stale rows;
* ``side_stream``: launches the work on a side stream and returns without joining it;
* ``host_cache``: launches device work only on every eighth call, returns the cached output else;
* ``noop_after_first``: launches device work on its first call only (a CUDA graph of its calls is
  empty);
* ``patch_events``: replaces ``torch.cuda.Event.elapsed_time`` (times read 100x short; the
  in-process copy canary reads 100x too: ``node-changed`` as well as ``timer-tampered``).

Parameters: ``M``, ``N`` (int), ``work`` (the honest baseline's extra passes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from pydantic import Field

from kernelab.kernels import Benchmark, BenchmarkError, Params
from kernelab.service.contract.schemas import Work

CHEATS: dict[str, set[str]] = {
    "wrong": {"wrong-output"},
    "nan": {"wrong-output"},
    "partial": {"wrong-output"},
    "cache_ptr": {"wrong-under-timing"},
    "cache_shape": {"wrong-under-timing"},
    "cache_id": {"wrong-under-timing"},
    "constant": {"wrong-under-timing"},
    "deferred": {"wrong-under-timing"},
    "lazy": {"not-a-tensor"},
    "thread": {"background-work"},
    "scribble": {"inputs-modified"},
    "less_accurate": {"less-accurate"},
    "patch_timer": {"timer-tampered"},
    "patch_kernelab": {"timer-tampered"},
}
GPU_CHEATS: dict[str, set[str]] = {
    "graph_wrong": {"wrong-under-timing"},
    "graph_stale": {"wrong-under-graph-replay"},
    "side_stream": {"wrong-under-timing", "output-after-window", "work-after-window"},
    "host_cache": {"no-device-work"},
    "noop_after_first": {"no-device-work", "wrong-under-timing"},
    "patch_events": {"timer-tampered"},
}
"""For each GPU cheat, the reason codes that may catch it (at least one must)."""
GPU_OVERRIDES: dict[str, set[str]] = {
    # A CUDA graph replays device work only: the thread is never started by a replay (the capture
    # holds no node) and the one-call-late output shows on one eager call after fresh inputs.
    "thread": {"background-work", "no-device-work", "wrong-under-timing"},
    "deferred": {"wrong-output", "wrong-under-timing"},
}


class ScaleParams(Params):
    M: int = Field(default=256, ge=1)
    N: int = Field(default=256, ge=1)
    work: int = Field(default=8, ge=1, description="extra passes of the honest baseline")


def _compute(x: torch.Tensor, y: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    return torch.add(y, x, alpha=2.0, out=out)


class _LazyTensor(torch.Tensor):
    """A tensor that computes its value when first read (a "lazy output")."""

    _thunk: Callable[[], None] | None = None

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        for a in args:
            if isinstance(a, _LazyTensor) and a._thunk is not None:
                thunk, a._thunk = a._thunk, None
                thunk()
        return super().__torch_function__(func, types, args, kwargs or {})


class ScaleBenchmark(Benchmark[ScaleParams]):
    """``out = 2 * x + y``: an honest baseline and candidates that cheat (module docstring)."""

    name = "scale"
    Params = ScaleParams
    variants = ("honest", *CHEATS, *GPU_CHEATS)

    def make_inputs(self, params: ScaleParams, device: Any, seed: int) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        shape = (params.M, params.N)
        return {
            "x": torch.randn(shape, generator=gen, device=device),
            "y": torch.randn(shape, generator=gen, device=device),
        }

    def reference(self, params: ScaleParams, inputs: dict[str, Any]) -> torch.Tensor:
        return 2 * inputs["x"].double() + inputs["y"].double()

    def work(self, params: ScaleParams, variant: str) -> Work:
        n = params.M * params.N
        return Work(flops=2 * n, bytes_read=8 * n, bytes_written=4 * n)

    def prepare(self, variant: str, params: ScaleParams, inputs: dict[str, Any]) -> Callable[[], Any]:
        x, y = inputs["x"], inputs["y"]
        out = torch.empty_like(x)
        make = getattr(self, f"_{variant}", None)
        if make is None:
            raise BenchmarkError(f"unknown variant {variant!r}")
        fn: Callable[[], Any] = make(x, y, out, params)
        return fn

    # -- honest ------------------------------------------------------------------------------------

    def _honest(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        scratch = torch.empty_like(x)

        def run() -> torch.Tensor:
            for _ in range(p.work):  # the honest kernel is slow: it reads the data work+1 times
                torch.add(y, x, alpha=2.0, out=scratch)
            return _compute(x, y, out)

        return run

    # -- wrong results -----------------------------------------------------------------------------

    def _wrong(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        return lambda: torch.mul(x, 2.0, out=out)

    def _nan(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            _compute(x, y, out)
            out[0, 0] = float("nan")
            return out

        return run

    def _partial(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        half = x.shape[0] // 2 or 1
        return lambda: (_compute(x[:half], y[:half], out[:half]), out)[1]

    # -- cached results ----------------------------------------------------------------------------

    def _cached(
        self, key: Callable[[torch.Tensor], Any], x: torch.Tensor, y: torch.Tensor, out: torch.Tensor
    ) -> Callable[[], Any]:
        cache: dict[Any, torch.Tensor] = {}

        def run() -> torch.Tensor:
            k = key(x)
            if k not in cache:
                cache[k] = _compute(x, y, torch.empty_like(x))
            return cache[k].clone()  # a fresh copy each call: poisoning the last one does not show

        return run

    def _cache_ptr(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        return self._cached(lambda t: t.data_ptr(), x, y, out)

    def _cache_shape(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        return self._cached(lambda t: tuple(t.shape), x, y, out)

    def _cache_id(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        return self._cached(id, x, y, out)

    def _constant(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        answer = _compute(x, y, torch.empty_like(x))  # right for the cell's own inputs only
        return lambda: out.copy_(answer)

    def _deferred(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        last = [x.clone(), y.clone()]

        def run() -> torch.Tensor:
            _compute(last[0], last[1], out)  # the previous call's inputs: one call late
            last[0].copy_(x)
            last[1].copy_(y)
            return out

        return run

    def _lazy(self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            lazy = out.as_subclass(_LazyTensor)
            lazy._thunk = lambda: _compute(x, y, out)
            return lazy

        return run

    def _thread(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            def later() -> None:
                time.sleep(0.02)
                _compute(x, y, out)

            threading.Thread(target=later, name="cheat-writer", daemon=True).start()
            return out

        return run

    def _scribble(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            x.copy_(x.to(torch.bfloat16))  # "quantise the input for speed", in place
            return _compute(x, y, out)

        return run

    def _less_accurate(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        def run() -> torch.Tensor:
            low = torch.add(y.to(torch.bfloat16), x.to(torch.bfloat16), alpha=2.0)
            return out.copy_(low)

        return run

    # -- the timer ---------------------------------------------------------------------------------

    def _patch_timer(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        real = time.perf_counter_ns
        start = real()
        time.perf_counter_ns = lambda: start + (real() - start) // 100  # time runs 100x slower
        return lambda: _compute(x, y, out)

    def _patch_kernelab(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        import kernelab.runners.timing

        real = kernelab.runners.timing.CpuTimer.time_ns

        def fast(timer: Any, fn: Callable[[], Any], launches: int) -> float:
            return float(real(timer, fn, launches)) / 100

        kernelab.runners.timing.CpuTimer.time_ns = fast  # type: ignore[method-assign]
        return lambda: _compute(x, y, out)

    # -- GPU only ----------------------------------------------------------------------------------

    def _graph_wrong(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        half = x.shape[0] // 2 or 1

        def run() -> torch.Tensor:
            if torch.cuda.is_current_stream_capturing():  # replays do half the work
                _compute(x[:half], y[:half], out[:half])
                return out
            return _compute(x, y, out)

        return run

    def _graph_stale(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        staged = torch.empty_like(out)
        quarter = 3 * x.shape[0] // 4 or 1

        def run() -> torch.Tensor:
            if torch.cuda.is_current_stream_capturing():
                out[:quarter].copy_(staged[:quarter])  # a memcpy node: the last direct call's rows
                _compute(x[quarter:], y[quarter:], out[quarter:])
                return out
            _compute(x, y, out)
            staged.copy_(out)
            return out

        return run

    def _side_stream(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        side = torch.cuda.Stream(device=x.device)
        scratch = torch.empty_like(x)

        def run() -> torch.Tensor:
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):  # the timed stream never waits for this
                for _ in range(p.work):
                    torch.add(y, x, alpha=2.0, out=scratch)
                _compute(x, y, out)
            return out

        return run

    def _host_cache(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        calls = [0]

        def run() -> torch.Tensor:
            calls[0] += 1
            if calls[0] % 8 == 1:
                _compute(x, y, out)
            return out

        return run

    def _noop_after_first(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        done = [False]

        def run() -> torch.Tensor:
            if not done[0]:
                _compute(x, y, out)
                done[0] = True
            return out

        return run

    def _patch_events(
        self, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, p: ScaleParams
    ) -> Callable[[], Any]:
        real = torch.cuda.Event.elapsed_time

        def short(event: Any, end: Any) -> float:
            return float(real(event, end)) / 100

        torch.cuda.Event.elapsed_time = short  # type: ignore[method-assign]
        return lambda: _compute(x, y, out)
