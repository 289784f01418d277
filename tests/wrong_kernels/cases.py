"""Job specs of the ``wrongbench`` benchmarks (this folder) for the CLI, e2e and browser tests:
``FAST_WRONG`` (an unnormalised row softmax), ``FORGOTTEN_MASK`` (attention without its padding
mask), ``RAISES`` (a kernel that raises in every cell); all on the CPU, probes off, small budgets."""

from __future__ import annotations

from pathlib import Path

WRONG_DIR = Path(__file__).resolve().parent
"""The folder to put on the import path (``PYTHONPATH``) so that ``wrongbench:...`` resolves."""

SPEC = """\
name: {name}
benchmark: "wrongbench:{bench}"
baseline: {{variant: {baseline}}}
candidate: {{variant: {candidate}}}
{shape}
device: cpu
measurement: {{warmup_ms: 2, budget_ms: 60, min_rounds: 6, max_rounds: 40}}
probes: {{copy_bandwidth: false, all_reduce: false, nvml: false}}
"""
FAST_WRONG = dict(
    name="fast but wrong",
    bench="RowSoftmax",
    baseline="exact",
    candidate="unnormalised",
    shape="sweep: {M: [32], N: [256, 1024]}",
)
FORGOTTEN_MASK = dict(
    name="forgotten mask",
    bench="PaddedAttention",
    baseline="masked",
    candidate="nomask",
    shape="params: {B: 2, H: 2, S: 64, D: 16, valid: 40}",
)
RAISES = dict(
    name="raises",
    bench="RowSoftmax",
    baseline="exact",
    candidate="raises",
    shape="sweep: {M: [8], N: [64, 128]}",
)


def write_spec(folder: Path, case: dict[str, str]) -> Path:
    """``case`` (one of the dicts above) as ``folder/<candidate variant>.yaml``; returns its path."""
    path = folder / f"{case['candidate']}.yaml"
    path.write_text(SPEC.format(**case), encoding="utf-8")
    return path
