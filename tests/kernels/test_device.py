"""The Triton interpreter rule and seeded inputs (kernels._device)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import triton
import triton.language as tl

from kernels import BenchmarkError
from kernels._device import (
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
    check_kernel_mode([compiled], "cuda")
    check_kernel_mode([interpreted], "cpu")
    with pytest.raises(BenchmarkError, match="imported compiled but device cpu needs it interpreted") as info:
        check_kernel_mode([compiled], "cpu")
    assert info.value.loc == ("device",)
    with pytest.raises(BenchmarkError, match="imported interpreted but device cuda:0 needs it compiled"):
        check_kernel_mode([interpreted], "cuda:0")


def test_kernel_modules_import_in_the_mode_of_the_device() -> None:
    # A fresh interpreter, so the modules' first import happens here, with the variable set the
    # wrong way round both times. Importing compiled kernels needs no GPU; launching would.
    script = textwrap.dedent("""
        import os
        from kernels import BenchmarkError
        from kernels._device import import_triton_kernels, is_interpreted
        os.environ["TRITON_INTERPRET"] = "1"
        mm = import_triton_kernels("kernels.triton_kernels.matmul", "cuda")
        assert "TRITON_INTERPRET" not in os.environ and not is_interpreted(mm.matmul_kernel)
        sm = import_triton_kernels("kernels.triton_kernels.softmax", "cpu")
        assert os.environ["TRITON_INTERPRET"] == "1" and is_interpreted(sm.softmax_kernel)
        try:
            import_triton_kernels("kernels.triton_kernels.matmul", "cpu")
        except BenchmarkError as exc:
            print("refused:", exc)
    """)
    env = {k: v for k, v in os.environ.items() if k != TRITON_INTERPRET_ENV}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "refused: Triton kernel 'matmul_kernel' was imported compiled" in done.stdout


def test_in_process_import_for_cpu_is_interpreted() -> None:
    module = import_triton_kernels("kernels.triton_kernels.softmax", "cpu")
    assert all(is_interpreted(k) for k in module.KERNELS)


def test_seeded_inputs_are_reproducible_normal_and_never_zero() -> None:
    a = randn((256, 64), dtype=torch.float16, device="cpu", generator=seeded_generator("cpu", 7))
    b = randn((256, 64), dtype=torch.float16, device="cpu", generator=seeded_generator("cpu", 7))
    c = randn((256, 64), dtype=torch.float16, device="cpu", generator=seeded_generator("cpu", 8))
    assert a.dtype == torch.float16 and a.shape == (256, 64)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.count_nonzero() > 0.99 * a.numel()
    assert abs(float(a.float().mean())) < 0.05 and abs(float(a.float().std()) - 1.0) < 0.05
