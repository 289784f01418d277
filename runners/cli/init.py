"""``kernelab init NAME``: a new benchmark's three files, which run on a CPU at once.

``NAME.py`` (the benchmark in the function form, ``kernelab.benchmark``: eager PyTorch softmax
against a Triton kernel, run by the Triton interpreter on a CPU), ``NAME.yaml`` (a spec of it for
``kernelab run``/``submit``; small shapes on the CPU, ``sweep_by_device``) and ``test_NAME.py`` (a
pytest test through kernelab's pytest plugin, ``kernelab_bench``). Existing files are never
overwritten (exit 2 naming them) unless ``--force``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from kernelab.runners.cli.common import EXIT_BAD_INPUT, fail

MODULE = '''"""Benchmark {name}: row softmax of an (M, N) tensor, eager PyTorch against a Triton kernel.

Made by ``kernelab init {name}``; see docs/writing-benchmarks.md. Run it with
``kernelab run {name}.yaml`` or ``pytest test_{name}.py``.
"""

import torch

import kernelab

bench = kernelab.benchmark("{name}", params={{"M": 64, "N": 128, "dtype": "float32"}})


@bench.inputs
def inputs(p, device, seed):
    """x: (M, N) of p.dtype on device, standard normal, reproducible from seed."""
    g = torch.Generator(device).manual_seed(seed)
    return {{"x": torch.randn(p.M, p.N, generator=g, device=device, dtype=getattr(torch, p.dtype))}}


@bench.prepared("torch")
def eager(p, x):
    out = torch.empty_like(x)
    return lambda: torch.softmax(x, dim=-1, out=out)


@bench.prepared("triton")
def fused(p, x):
    import triton  # imported here: on a CPU kernelab sets the interpreter mode first

    from {name}_kernel import softmax_kernel

    out = torch.empty_like(x)
    block = triton.next_power_of_2(p.N)

    def launch():
        softmax_kernel[(p.M,)](x, out, p.N, x.stride(0), BLOCK=block)
        return out

    return launch


@bench.reference
def reference(p, x):
    return torch.softmax(x.double(), dim=-1)


@bench.reduction
def reduction(p):
    """Terms summed into each output (a row's N exponentials): the tolerance grows with them."""
    return p.N


@bench.work
def work(p, variant):
    size = torch.finfo(getattr(torch, p.dtype)).bits // 8
    return kernelab.Work(flops=5 * p.M * p.N, bytes_read=size * p.M * p.N, bytes_written=size * p.M * p.N)
'''

KERNEL = '''"""The Triton kernel of benchmark {name} (imported by {name}.py's "triton" variant)."""

import triton
import triton.language as tl


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)
'''

SPEC = """name: {name}
benchmark: "{name}:bench"
baseline: {{variant: torch}}
candidate: {{variant: triton}}
sweep:
  M: [4096]
  N: [1024, 4096]
sweep_by_device:          # the Triton interpreter is slow: small shapes on a CPU
  cpu: {{M: [8], N: [128]}}
measurement: {{budget_ms: 1000}}
"""

TEST = '''"""pytest test of benchmark {name} through kernelab's pytest plugin (fixture kernelab_bench).

Fails when a cell is failed, incorrect or (on a GPU) slower (--kernelab-fail-on); the comparison
JSON goes to --kernelab-json (default .kernelab/results).
"""

import torch

from {name} import bench

# On a CPU the Triton kernel runs in the interpreter, thousands of times slower than compiled:
# there only correctness can gate.
FAIL_ON = None if torch.cuda.is_available() else "failed,incorrect"


def test_{name}_triton_not_slower(kernelab_bench):
    result = kernelab_bench.measure(
        bench, "torch", "triton", sweep={{"M": [8], "N": [128]}}, measurement={{"budget_ms": 300}},
        fail_on=FAIL_ON,
    )
    assert result.cells[0].error is None
'''


def init(
    name: Annotated[str, typer.Argument(help="benchmark name: a Python identifier", show_default=False)],
    directory: Annotated[Path, typer.Option("--dir", help="where to write the files")] = Path("."),
    force: Annotated[bool, typer.Option("--force", help="overwrite existing files")] = False,
) -> None:
    """Scaffold a benchmark: NAME.py (function form), NAME_kernel.py (its Triton kernel),
    NAME.yaml (a spec) and test_NAME.py (a pytest test); all run on a CPU as they are."""
    if not name.isidentifier() or name.startswith("test"):
        raise fail(
            f"init: {name!r} is not a usable module name (a Python identifier, not test*)", EXIT_BAD_INPUT
        )
    files = {
        directory / f"{name}.py": MODULE,
        directory / f"{name}_kernel.py": KERNEL,
        directory / f"{name}.yaml": SPEC,
        directory / f"test_{name}.py": TEST,
    }
    existing = [str(p) for p in files if p.exists()]
    if existing and not force:
        raise fail(f"init: {', '.join(existing)} exist(s); pass --force to overwrite", EXIT_BAD_INPUT)
    directory.mkdir(parents=True, exist_ok=True)
    for path, template in files.items():
        path.write_text(template.format(name=name), encoding="utf-8")
        typer.echo(f"wrote {path}")
    typer.echo(
        f"next: kernelab run {directory / name}.yaml   |   pytest {directory / f'test_{name}.py'}   |   "
        f"python -c \"import kernelab, {name}; print(kernelab.measure({name}.bench, 'torch', 'triton'))\""
    )
