"""A git repository with three commits of a small PyTorch benchmark, for revision A/B tests:
``fast`` (y = 2x + 1), ``slow`` (the same computed 4 times; also branch ``slow``), ``wrong``
(y = 2x + 1.5, fails the correctness check). Module ``revpkg.bench``, class ``AxpyBenchmark``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BENCH = '''\
from typing import Any

import torch
from pydantic import Field

from kernelab.kernels.base import Benchmark, Params
from kernelab.service.contract.schemas import Work

REPEATS = 1
OFFSET = 1.0


class AxpyParams(Params):
    N: int = Field(gt=0)


class AxpyBenchmark(Benchmark[AxpyParams]):
    """y = 2 x + OFFSET, computed REPEATS times (the slow commit does 4x the work)."""

    name = "axpy"
    Params = AxpyParams
    variants = ("torch",)

    def make_inputs(self, params: AxpyParams, device: Any, seed: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(seed)
        return {"x": torch.randn(params.N, generator=g).to(device)}

    def prepare(self, variant: str, params: AxpyParams, inputs: dict[str, Any]) -> Any:
        x = inputs["x"]
        out = torch.empty_like(x)

        def fn() -> torch.Tensor:
            for _ in range(REPEATS):
                torch.mul(x, 2.0, out=out)
                out.add_(OFFSET)
            return out
        return fn

    def reference(self, params: AxpyParams, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["x"].double() * 2.0 + 1.0

    def work(self, params: AxpyParams, variant: str) -> Work:
        return Work(flops=2.0 * params.N, bytes_read=4.0 * params.N, bytes_written=4.0 * params.N)
'''


def _git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    ).stdout.strip()


def make_repo(path: Path) -> dict[str, str]:
    """Three commits on ``main`` (fast, slow, wrong) plus branch ``slow``; returns their shas."""
    (path / "revpkg").mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "revpkg" / "__init__.py").write_text("")
    bench = path / "revpkg" / "bench.py"
    shas = {}
    for name, text in (
        ("fast", BENCH),
        ("slow", BENCH.replace("REPEATS = 1", "REPEATS = 4")),
        ("wrong", BENCH.replace("OFFSET = 1.0", "OFFSET = 1.5")),
    ):
        bench.write_text(text)
        _git(path, "add", "-A")
        _git(path, "commit", "-q", "-m", name)
        shas[name] = _git(path, "rev-parse", "HEAD")
        if name == "slow":
            _git(path, "branch", "slow")
    return shas


def make_bisect_repo(path: Path, commits: int, planted: int) -> tuple[str, list[str]]:
    """A repository for ``kernelab bisect``: the good end (tag ``v1``) and ``commits`` commits after
    it, each touching a comment; commit index ``planted`` (0-based) sets ``REPEATS = 16`` (16x the
    work), which the later ones keep. Returns (good sha, the commits' shas, oldest first)."""
    (path / "revpkg").mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "revpkg" / "__init__.py").write_text("")
    bench = path / "revpkg" / "bench.py"
    bench.write_text(BENCH)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "good end")
    _git(path, "tag", "v1")
    good = _git(path, "rev-parse", "HEAD")
    shas, text = [], BENCH
    for i in range(commits):
        if i == planted:
            text = text.replace("REPEATS = 1", "REPEATS = 16")
        bench.write_text(text + f"\n# change {i}\n")
        _git(path, "commit", "-q", "-am", "slow down: compute it 16 times" if i == planted else f"tidy {i}")
        shas.append(_git(path, "rev-parse", "HEAD"))
    return good, shas
