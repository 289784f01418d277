"""Every registered probe names a measuring function the runner has (``Probe.runner``), and
``run_probes`` reaches it through ``runner_function``."""

from __future__ import annotations

import dataclasses

import pytest

from kernelab.runners.probes import runner_function
from kernelab.service.contract.schemas.probe_protocol import registered


@pytest.mark.parametrize("probe", registered(), ids=lambda p: p.name)
def test_every_probe_names_a_runner_function_that_exists(probe) -> None:
    assert callable(runner_function(probe))


def test_a_runner_function_that_is_not_there_is_named() -> None:
    probe = dataclasses.replace(registered()[0], runner="kernelab.runners.probes.format:no_such_function")
    with pytest.raises(AttributeError, match="no_such_function"):
        runner_function(probe)
