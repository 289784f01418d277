"""kernelab's pytest plugin (entry point ``pytest11``: loaded by pytest wherever kernelab is
installed): measure baseline against candidate inside a test.

The fixture ``kernelab_bench`` has the Python API's two calls (``kernelab.runners.api``)::

    def test_softmax_not_slower(kernelab_bench):
        kernelab_bench.measure(bench, "torch", "triton", sweep={"M": [64], "N": [128]})

    def test_scale(kernelab_bench):
        x = torch.randn(4096)
        kernelab_bench.compare(lambda x: x * 2, lambda x: x + x, inputs={"x": x})

Each call runs the engine of ``kernelab run`` (interleaved rounds, correctness and timed checks),
writes the comparison JSON to ``--kernelab-json DIR/<test id>.json`` (default
``.kernelab/results`` under the root directory), and fails the test, with the table, when a
cell's verdict is in ``--kernelab-fail-on`` (default: kernelab's one default gate,
``kernelab.runners.cli.common.DEFAULT_FAIL_ON``, ``failed,incorrect,slower``, as ``kernelab run``;
``slower`` means beyond the spec's ``measurement.threshold_pct``, set with
``--kernelab-threshold-pct``) or the job failed; it returns the ``kernelab.Result`` otherwise. The
default is read from the verdict catalogue when the fixture first gates, not when pytest starts:
the plugin's import stays pytest's alone.

``@pytest.mark.kernelab(gpu=True)``, or ``--kernelab-gpu-only`` for every test using the fixture,
skips the test on a machine without a CUDA GPU. On a machine without an NVIDIA device
(``/dev/nvidiactl``) the plugin sets ``TRITON_INTERPRET=1`` when pytest starts, before any test
module imports triton (``kernelab.kernels._device``), unless the variable is already set.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

DEFAULT_FAIL_ON = "failed,incorrect,slower"
"""What ``--kernelab-fail-on``'s help names as its default: the verdict catalogue's default gate
(``kernelab.runners.cli.common.DEFAULT_FAIL_ON``, which the fixture uses; a test holds the two equal),
spelled out here so that pytest's start-up imports nothing of kernelab's schemas."""
DEFAULT_JSON_DIR = ".kernelab/results"
NVIDIA_CONTROL_DEVICE = "/dev/nvidiactl"  # present on a Linux machine with the NVIDIA driver loaded


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kernelab", "kernelab: baseline vs candidate inside tests")
    group.addoption(
        "--kernelab-fail-on",
        default=None,
        help="fail a test when a cell's verdict is in this comma list (default: kernelab's default "
        f"gate, as kernelab run --fail-on: {DEFAULT_FAIL_ON})",
    )
    group.addoption(
        "--kernelab-threshold-pct",
        type=float,
        default=None,
        help="smallest change that counts as faster/slower, percent (the spec's default otherwise)",
    )
    group.addoption(
        "--kernelab-json",
        default=DEFAULT_JSON_DIR,
        help=f"folder for each test's comparison JSON, relative to the root directory ({DEFAULT_JSON_DIR})",
    )
    group.addoption(
        "--kernelab-gpu-only",
        action="store_true",
        default=False,
        help="skip every test using kernelab_bench on a machine without a CUDA GPU",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kernelab(gpu=False): kernelab_bench options; gpu=True skips the test without a CUDA GPU"
    )
    _threshold(config.getoption("kernelab_threshold_pct"))  # a bad value stops the session at once
    if "TRITON_INTERPRET" not in os.environ and not os.path.exists(NVIDIA_CONTROL_DEVICE):
        os.environ["TRITON_INTERPRET"] = "1"


class KernelabBench:
    """What the ``kernelab_bench`` fixture gives a test (module docstring)."""

    def __init__(self, request: pytest.FixtureRequest):
        self._request = request
        config = request.config
        self.fail_on = _fail_on(config.getoption("kernelab_fail_on") or _default_fail_on())
        self.threshold_pct: float | None = _threshold(config.getoption("kernelab_threshold_pct"))
        self.json_dir = Path(config.rootpath) / config.getoption("kernelab_json")
        self.results: list[Any] = []

    def __repr__(self) -> str:
        return f"<KernelabBench test={self._request.node.nodeid!r} runs={len(self.results)}>"

    def compare(
        self,
        baseline: Callable[..., Any],
        candidate: Callable[..., Any],
        *,
        fail_on: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """``kernelab.compare(baseline, candidate, **kwargs)``, then the gate (module docstring);
        ``fail_on`` (a comma list) replaces ``--kernelab-fail-on`` for this call."""
        from kernelab.runners.api import compare

        with _benchmark_mistakes():
            result = compare(baseline, candidate, **self._measurement(kwargs))
        return self._gate(result, fail_on)

    def measure(
        self, bench: Any, baseline: Any, candidate: Any, *, fail_on: str | None = None, **kwargs: Any
    ) -> Any:
        """``kernelab.measure(bench, baseline, candidate, **kwargs)``, then the gate; ``fail_on``
        as in ``compare``."""
        from kernelab.runners.api import measure

        with _benchmark_mistakes():
            result = measure(bench, baseline, candidate, **self._measurement(kwargs))
        return self._gate(result, fail_on)

    def _measurement(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.threshold_pct is not None:
            kwargs["measurement"] = {**(kwargs.get("measurement") or {}), "threshold_pct": self.threshold_pct}
        return kwargs

    def _gate(self, result: Any, fail_on: str | None) -> Any:
        gate = self.fail_on if fail_on is None else _fail_on(fail_on)
        self.results.append(result)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self._request.node.nodeid).strip("_")
        suffix = f"-{len(self.results)}" if len(self.results) > 1 else ""
        self.json_dir.mkdir(parents=True, exist_ok=True)
        path = self.json_dir / f"{name}{suffix}.json"
        path.write_text(result.model_dump_json(indent=2), encoding="utf-8")
        failing = result.failing(gate)
        if failing:
            names = ",".join(sorted(gate))
            pytest.fail(
                f"kernelab: {_failing_text(result, gate, failing)} (fail on {names}); comparison in "
                f"{path}\n{result}",
                pytrace=False,
            )
        return result


def _failing_text(result: Any, gate: frozenset[str], failing: list[str]) -> str:
    """``"incorrect: n=4096"``: the verdicts that trip the gate first (precedence order, so the
    short summary's cut line names them), then the cells; each cell's verdict after it when
    several verdicts trip. ``"job"`` (every cell failed) counts as ``failed``."""
    from kernelab.service.judge.verdicts import VERDICT_ORDER

    by_label = {cell.label: cell.verdict for cell in result.cells if cell.verdict in gate}
    verdicts = {by_label.get(label, "failed") for label in failing}
    words = [v for v in VERDICT_ORDER if v in verdicts]
    cells = (
        failing if len(words) == 1 else [f"{label} ({by_label.get(label, 'failed')})" for label in failing]
    )
    return f"{', '.join(words)}: {', '.join(cells)}"


@contextlib.contextmanager
def _benchmark_mistakes() -> Iterator[None]:
    """A benchmark mistake (``kernelab.kernels.BenchmarkError``: a missing method, a signature
    that does not fit, a wrong return type, found before measuring) fails the test with its one
    line naming the file and the method, not a traceback through kernelab."""
    from kernelab.kernels.base import BenchmarkError

    try:
        yield
    except BenchmarkError as exc:
        pytest.fail(f"kernelab: {exc}", pytrace=False)


def _threshold(value: float | None) -> float | None:
    """``--kernelab-threshold-pct`` checked against ``MeasurementSpec.threshold_pct``'s bounds
    (0 < value <= 100); a ``pytest.UsageError`` naming the option otherwise."""
    if value is None:
        return None
    from pydantic import ValidationError

    from kernelab.service.contract.schemas import MeasurementSpec

    try:
        MeasurementSpec(threshold_pct=value)
    except ValidationError as exc:
        raise pytest.UsageError(
            f"--kernelab-threshold-pct: {value:g}: {exc.errors()[0]['msg']} (a percent in (0, 100])"
        ) from None
    return value


def _default_fail_on() -> str:
    """The one default gate of kernelab (``kernelab.runners.cli.common.DEFAULT_FAIL_ON``, derived
    from the verdict catalogue), imported when a test first uses the fixture."""
    from kernelab.runners.cli.common import DEFAULT_FAIL_ON as catalogue_default

    return catalogue_default


def _fail_on(text: str) -> frozenset[str]:
    """The verdicts of a fail-on comma list (``kernelab run --fail-on``'s rules); a
    ``pytest.UsageError`` naming the bad name."""
    from kernelab.runners.cli.common import GATE_VERDICTS

    names = {n.strip().lower() for n in text.split(",")}
    bad = sorted(n for n in names if n not in GATE_VERDICTS)
    if bad or not names:
        raise pytest.UsageError(
            f"--kernelab-fail-on: {', '.join(bad) or repr(text)} is no failing verdict; "
            f"choose from {', '.join(GATE_VERDICTS)}"
        )
    return frozenset(names)


def _has_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@pytest.fixture
def kernelab_bench(request: pytest.FixtureRequest) -> KernelabBench:
    """Measure baseline against candidate in a test and fail it on a verdict in
    ``--kernelab-fail-on`` (module docstring)."""
    marker = request.node.get_closest_marker("kernelab")
    wants_gpu = bool(marker.kwargs.get("gpu", False)) if marker is not None else False
    if (wants_gpu or request.config.getoption("kernelab_gpu_only")) and not _has_cuda():
        pytest.skip("kernelab: no CUDA GPU here (gpu=True / --kernelab-gpu-only)")
    return KernelabBench(request)
