"""The Triton interpreter rule and seeded inputs (kernelab.kernels._device)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

from kernelab.kernels import BenchmarkError
from kernelab.kernels._device import (
    TRITON_INTERPRET_ENV,
    check_kernel_mode,
    configure_triton_env,
    import_triton_kernels,
    is_interpreted,
    randn,
    seeded_generator,
)


def test_cpu_sets_the_interpreter_and_cuda_clears_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRITON_INTERPRET_ENV, raising=False)
    configure_triton_env("cpu")
    assert os.environ[TRITON_INTERPRET_ENV] == "1"
    configure_triton_env(torch.device("cuda", 0))
    assert TRITON_INTERPRET_ENV not in os.environ


def test_decoration_time_decides_the_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    def body(x_ptr, BLOCK: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32))

    monkeypatch.delenv(TRITON_INTERPRET_ENV, raising=False)
    compiled = triton.jit(body)
    monkeypatch.setenv(TRITON_INTERPRET_ENV, "1")
    interpreted = triton.jit(body)
    assert not is_interpreted(compiled) and is_interpreted(interpreted)
    check_kernel_mode([interpreted], "cpu")  # this session imported triton interpreted (conftest)
    wrong_mode = "'body' was imported compiled but device cpu needs it interpreted"
    with pytest.raises(BenchmarkError, match=wrong_mode) as info:
        check_kernel_mode([compiled], "cpu")
    assert info.value.loc == ("device",)
    with pytest.raises(BenchmarkError, match="imported interpreted but device cuda:0 needs it compiled"):
        check_kernel_mode([compiled], "cuda:0")  # triton's own tl.sum is interpreted here


_FIRST_IMPORT = """
import os
from kernelab.kernels import BenchmarkError
from kernelab.kernels._device import import_triton_kernels, is_interpreted
os.environ["TRITON_INTERPRET"] = {first_env!r}
first = import_triton_kernels("kernelab.kernels.triton_kernels.matmul", {first_device!r})
print("first interpreted:", is_interpreted(first.matmul_kernel), os.environ.get("TRITON_INTERPRET"))
try:
    import_triton_kernels("kernelab.kernels.triton_kernels.softmax", {second_device!r})
except BenchmarkError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize(
    ("first_env", "first_device", "second_device", "expect"),
    [
        # Importing compiled kernels needs no GPU; launching them would.
        (
            "1",
            "cuda",
            "cpu",
            ["first interpreted: False None", "refused: Triton kernel 'sum' was imported comp"],
        ),
        (
            "0",
            "cpu",
            "cuda",
            ["first interpreted: True 1", "refused: Triton kernel 'sum' was imported interp"],
        ),
    ],
)
def test_first_import_fixes_the_mode_of_the_process(
    first_env: str, first_device: str, second_device: str, expect: list[str]
) -> None:
    # A fresh interpreter, so triton's first import happens in the script, with the variable set
    # the wrong way round for the first device.
    script = _FIRST_IMPORT.format(first_env=first_env, first_device=first_device, second_device=second_device)
    env = {k: v for k, v in os.environ.items() if k != TRITON_INTERPRET_ENV}
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith(e) for line, e in zip(lines, expect, strict=True)), lines


def test_in_process_import_for_cpu_is_interpreted() -> None:
    module = import_triton_kernels("kernelab.kernels.triton_kernels.softmax", "cpu")
    assert all(is_interpreted(k) for k in module.KERNELS)


def test_seeded_inputs_are_reproducible_normal_and_never_zero() -> None:
    a = randn((256, 64), dtype=torch.float16, device="cpu", generator=seeded_generator("cpu", 7))
    b = randn((256, 64), dtype=torch.float16, device="cpu", generator=seeded_generator("cpu", 7))
    c = randn((256, 64), dtype=torch.float16, device="cpu", generator=seeded_generator("cpu", 8))
    assert a.dtype == torch.float16 and a.shape == (256, 64)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.count_nonzero() > 0.99 * a.numel()
    assert abs(float(a.float().mean())) < 0.05 and abs(float(a.float().std()) - 1.0) < 0.05
