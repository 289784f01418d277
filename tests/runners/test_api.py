"""``kernelab.compare``: the engine of ``kernelab run`` from Python, its ``Result`` prints as the table."""

from __future__ import annotations

import json

import pytest
import torch

import kernelab
from kernelab.service.contract.schemas import Comparison
from kernelab.service.judge.report import format_table

FAST = {"budget_ms": 60, "min_time_ms": 0}


def test_compare_returns_the_comparison_json_that_prints_as_the_table() -> None:
    x = torch.randn(512)
    kept = x.clone()
    result = kernelab.compare(
        lambda x: x * 2,
        lambda x: x + x,
        inputs={"x": x},
        reference=lambda x: x.double() * 2,
        work={"flops": 512, "bytes_read": 2048, "bytes_written": 2048},
        measurement=FAST,
    )
    assert isinstance(result, Comparison)
    again = Comparison.model_validate_json(result.model_dump_json())
    assert json.loads(again.model_dump_json()) == json.loads(result.model_dump_json())
    assert str(result) == format_table(again)
    assert result._repr_html_().startswith('<pre class="kernelab-comparison">')
    assert "&lt;" not in str(result) and result.cells[0].verdict != "incorrect"
    assert result.cells[0].error is None and [p.phase for p in result.probes] == []  # probes off
    assert torch.equal(x, kept)  # the caller's tensors are copied, never refilled
    assert result.result is not None and result.result.cells[0].timed_checks  # the timed checks ran


def test_a_wrong_candidate_is_incorrect_however_fast() -> None:
    x = torch.randn(256)
    result = kernelab.compare(lambda x: x * 2, lambda x: x * 2.5, inputs={"x": x}, measurement=FAST)
    assert result.verdicts() == ["incorrect"]
    assert result.failing() == [result.cells[0].label]
    assert "incorrect" in str(result)


def test_a_candidate_that_raises_is_failed_not_an_exception() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")

    result = kernelab.compare(lambda x: x * 2, broken, inputs={"x": torch.randn(8)}, measurement=FAST)
    assert result.verdicts() == ["failed"] and "boom" in (result.cells[0].error or "")


def test_inputs_drawn_by_a_function_and_bad_arguments() -> None:
    def make(device: torch.device, seed: int) -> dict[str, torch.Tensor]:
        return {"x": torch.randn(64, generator=torch.Generator().manual_seed(seed)).to(device)}

    result = kernelab.compare(torch.neg, lambda x: -x, inputs=make, measurement=FAST)
    assert result.cells[0].error is None
    with pytest.raises(kernelab.BenchmarkError, match="candidate must be a callable"):
        kernelab.compare(torch.neg, "neg", inputs=make)  # type: ignore[arg-type]
    with pytest.raises(kernelab.BenchmarkError, match="inputs must be a dict"):
        kernelab.compare(torch.neg, torch.neg, inputs=[torch.ones(2)])  # type: ignore[arg-type]
    with pytest.raises(Exception, match="budget_ms"):
        kernelab.compare(torch.neg, torch.neg, inputs=make, measurement={"budget_ms": -1})


def test_measure_a_named_builtin_and_an_unknown_variant() -> None:
    result = kernelab.measure("softmax", "torch", "torch", params={"M": 4, "N": 8}, measurement=FAST)
    assert result.benchmark == "softmax" and result.cells[0].error is None
    with pytest.raises(kernelab.BenchmarkError, match="unknown candidate variant 'cuda'"):
        kernelab.measure("softmax", "torch", "cuda")


@pytest.mark.parametrize("side", ["baseline", "candidate", "reference"])
def test_a_callable_that_does_not_take_the_inputs_names_is_refused_before_measuring(side, capfd) -> None:
    """A callable whose parameters do not bind to the inputs' names raises ``BenchmarkError``
    naming which callable and the mismatch (it used to print a traceback and return a failed
    Result)."""
    fns = {"baseline": lambda x: torch.softmax(x, -1), "candidate": lambda x: x, "reference": None}
    fns[side] = lambda y: y
    with pytest.raises(kernelab.BenchmarkError, match=rf"^{side} .*\(y\).*\(x\).*'y'") as info:
        kernelab.compare(
            fns["baseline"],
            fns["candidate"],
            reference=fns["reference"],
            inputs={"x": torch.ones(8)},
            measurement=FAST,
        )
    assert "does not fit" in str(info.value)
    assert "Traceback" not in capfd.readouterr().err
