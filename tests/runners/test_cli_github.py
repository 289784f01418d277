"""``--format github`` (``runners/cli/github.py``): workflow-command escaping, which cells are
annotated and at which level."""

from __future__ import annotations

import torch

import kernelab
from kernelab.runners.cli.github import annotation_lines, escape_data, escape_property, summary

# about annotations: one input set. A 250x difference is decided in a few rounds; the budget is room for a
# loaded 2-core machine, where 100 ms could hold too few rounds (an honest inconclusive, no annotation)
FAST = {"budget_ms": 3000, "min_time_ms": 0, "stop_rule": "decided", "placement": "fixed"}


def _slow_double(x: torch.Tensor) -> torch.Tensor:
    for _ in range(300):
        y = x * 2
    return y


def test_escaping_follows_the_actions_toolkit() -> None:
    assert escape_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert escape_property("a:b,c%") == "a%3Ab%2Cc%25"


def test_a_slower_cell_is_a_warning_unless_slower_is_in_fail_on() -> None:
    result = kernelab.compare(
        lambda x: x * 2, _slow_double, inputs={"x": torch.randn(4096)}, measurement=FAST
    )
    assert result.verdicts() == ["slower"]
    (warning,) = annotation_lines(result, frozenset({"failed", "incorrect"}), None)
    assert warning.startswith("::warning title=kernelab compare%3A slower::default: slower +")
    (error,) = annotation_lines(result, frozenset({"slower"}), "http://k/jobs/3")
    assert error.startswith("::error ") and error.endswith("(http://k/jobs/3)")
    assert summary(result, frozenset({"slower"}), "http://k/jobs/3").startswith(
        "**kernelab: gate failed** (1 of 1 cells in --fail-on slower): 1 slower\n\n[Job on the dashboard](http://k/jobs/3)"
    )


def test_faster_and_same_cells_are_not_annotated() -> None:
    result = kernelab.compare(
        _slow_double, lambda x: x * 2, inputs={"x": torch.randn(4096)}, measurement=FAST
    )
    assert result.verdicts() == ["faster"]
    assert annotation_lines(result, frozenset({"slower"}), None) == []
