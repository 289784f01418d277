"""A running job's progress as the runner sends it: the phase of every message the pipeline writes,
the worker's progress lines, the tracker's cells-done count and ETA on a fake clock."""

from __future__ import annotations

import pytest

from kernelab.runners.progress import ProgressTracker, describe, parse_line, phase_of
from kernelab.service.contract.schemas.adverts import PROGRESS_PHASES


@pytest.mark.parametrize(
    ("message", "phase"),
    [
        ("fetching the baseline: /repo @ abc", "fetching"),
        ("probes before the cells", "probes-before"),
        ("cell 2/8 {'M': 4}", "starting"),
        ("preparing", "preparing"),
        ("correctness", "correctness"),
        ("warm-up", "warm-up"),
        ("measuring", "measuring"),
        (
            (
                "round 12: ratio 1.0123 ±0.50%; launches per sample: baseline 1, candidate 1; "
                "timed 3 ms (may stop from 0 ms)"
            ),
            "measuring",
        ),
        ("checks", "checks"),
        ("done: 120 samples", "cell-done"),
        ("static metrics of the compiled kernels", "static-metrics"),
        ("probes after the cells", "probes-after"),
        ("a note of a side's own", None),
    ],
)
def test_phase_of_each_pipeline_message(message: str, phase: str | None) -> None:
    assert phase_of(message) == phase
    assert phase is None or phase in PROGRESS_PHASES


def test_parse_line_reads_the_workers_progress_lines_only() -> None:
    assert parse_line("progress: [3/8] round 4: ratio 1.0\n") == (2, 8, "round 4: ratio 1.0")
    assert parse_line("INFO something else") is None


def test_tracker_counts_done_cells_and_estimates_from_them() -> None:
    now = [100.0]
    tracker = ProgressTracker(clock=lambda: now[0])
    assert tracker.snapshot() is None
    tracker.update(0, 4, "probes before the cells")
    now[0] = 102.0
    tracker.update(0, 4, "cell 1/4 {}")
    tracker.update(0, 4, "round 4: ratio 1.01")
    first = tracker.snapshot()
    assert first is not None and (first.phase, first.cells_done, first.eta_s) == ("measuring", 0, None)
    now[0] = 112.0  # the first cell took 10 s
    tracker.update(0, 4, "done: 40 samples")
    tracker.update(1, 4, "cell 2/4 {}")
    snap = tracker.snapshot()
    assert snap is not None
    assert (snap.cell, snap.cells, snap.cells_done, snap.phase) == (1, 4, 1, "starting")
    assert snap.eta_s == pytest.approx(30.0) and snap.elapsed_s == pytest.approx(12.0)
    tracker.update(1, 4, "a side's own note")  # keeps the phase, shows the message
    assert tracker.snapshot().phase == "starting"  # type: ignore[union-attr]
    assert describe(snap) == "cell 2/4 · starting · 1 done · ETA 30 s · cell 2/4 {}"
