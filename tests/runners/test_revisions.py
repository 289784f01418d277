"""Source revisions on a runner: allow-list, cached clone and worktrees, ref resolution, spec rules
(real git repositories made in tmp_path; no worker processes here, see tests/e2e/test_revisions.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from kernelab.kernels import validate_spec
from kernelab.runners.engine import measure_interleaved
from kernelab.runners.revisions import (
    AllowList,
    RevisionCache,
    RevisionError,
    install_argv,
    normalize_repo,
    resolve_ref,
    with_revisions,
)
from kernelab.service.contract.schemas import JobSpec, MeasurementSpec, Side, SourceSpec
from tests.e2e.revision_repo import _git, make_repo


def test_allow_list_matches_paths_urls_and_patterns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    allow = AllowList([str(repo), "https://github.com/org/*"])
    assert allow.allows(str(repo)) and allow.allows(f"{tmp_path}/./r/")
    assert allow.allows("https://github.com/org/kernels.git")
    assert not allow.allows("https://github.com/evil/kernels") and not allow.allows(str(tmp_path))
    with pytest.raises(RevisionError, match="candidate: repository 'x' is not on this runner's allow-list"):
        AllowList().check("x", "candidate")
    monkeypatch.setenv("KERNELAB_ALLOWED_REPOS", "git@host:a/b.git, https://h/x")
    env_allow = AllowList.from_env()
    assert env_allow.allows("git@host:a/b") and env_allow.allows("https://h/x/")
    assert normalize_repo("https://h/x.git/") == "https://h/x"


def test_materialise_caches_worktrees_and_reports_failures(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shas = make_repo(repo)
    cache = RevisionCache(tmp_path / "cache")
    allow = AllowList([str(repo)])
    fast = cache.materialise(SourceSpec(repo=str(repo), ref="main~2"), "baseline", allow=allow)
    assert fast.sha == shas["fast"] and (fast.path / "revpkg" / "bench.py").read_text().count("REPEATS = 1")
    slow = cache.materialise(SourceSpec(repo=str(repo), ref="slow"), "candidate", allow=allow)
    assert slow.sha == shas["slow"] and "REPEATS = 4" in (slow.path / "revpkg" / "bench.py").read_text()
    stat, short = cache.diff_stat(fast, slow)
    assert "revpkg/bench.py" in stat and short == "1 file changed, 1 insertion(+), 1 deletion(-)"
    # A new commit is fetched; the worktree of an old one is reused as it is.
    (fast.path / "scratch.txt").write_text("kept")
    (repo / "new.txt").write_text("x")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "new")
    head = cache.materialise(SourceSpec(repo=str(repo), ref="main"), "candidate", allow=allow)
    assert head.sha == _git(repo, "rev-parse", "HEAD") and (head.path / "new.txt").exists()
    again = cache.materialise(SourceSpec(repo=str(repo), ref=shas["fast"]), "baseline", allow=allow)
    assert again.root == fast.root and (again.path / "scratch.txt").read_text() == "kept"

    with pytest.raises(RevisionError, match="candidate: revision 'nope' not found"):
        cache.materialise(SourceSpec(repo=str(repo), ref="nope"), "candidate", allow=allow)
    with pytest.raises(RevisionError, match="does not exist on this runner"):
        cache.materialise(
            SourceSpec(repo=str(tmp_path / "gone"), ref="main"),
            "baseline",
            allow=AllowList([str(tmp_path / "gone")]),
        )
    with pytest.raises(RevisionError, match="subdir 'missing' does not exist"):
        cache.materialise(SourceSpec(repo=str(repo), ref="main", subdir="missing"), "baseline", allow=allow)
    broken = SourceSpec(repo=str(repo), ref="slow", install=['{python} -c "import sys; sys.exit(7)"'])
    with pytest.raises(RevisionError, match="baseline: install step 1 failed: .* exited with status 7"):
        cache.materialise(broken, "baseline", allow=allow)
    # The failed install left no ready marker: a fixed install runs again on the same commit.
    fixed = SourceSpec(repo=str(repo), ref="slow", install=["{python} -c \"open('{site}/ok', 'w')\""])
    done = cache.materialise(fixed, "baseline", allow=allow)
    assert (done.site / "ok").exists()


def test_install_argv_and_ref_resolution(tmp_path: Path) -> None:
    argv = install_argv("{python} -m pip install --target {site} .", site=tmp_path)
    assert argv[-3:] == ["--target", str(tmp_path), "."]
    with pytest.raises(RevisionError, match="cannot be parsed"):
        install_argv("echo 'unbalanced", site=tmp_path)
    repo = tmp_path / "repo"
    shas = make_repo(repo)
    assert resolve_ref(str(repo), "HEAD") == (shas["wrong"], "main")
    spec = JobSpec.model_validate(
        {
            "benchmark": "revpkg.bench:AxpyBenchmark",
            "baseline": {"variant": "torch"},
            "candidate": {
                "variant": "torch",
                "source": {"repo": "elsewhere", "ref": "x", "subdir": "src", "install": ["true"]},
            },
        }
    )
    out = with_revisions(spec, str(repo), "slow", "HEAD")
    assert out.baseline.source == SourceSpec(repo=str(repo.resolve()), ref=shas["slow"], branch="slow")
    assert out.candidate.source is not None
    assert (out.candidate.source.ref, out.candidate.source.subdir) == (shas["wrong"], "src")
    with pytest.raises(RevisionError, match="revision 'nope' not found"):
        with_revisions(spec, str(repo), "nope", None)


def test_source_spec_rules_and_server_side_validation() -> None:
    for bad in ({"ref": "--upload-pack=x"}, {"ref": "a b"}, {"subdir": "../up"}, {"subdir": "/abs"}):
        with pytest.raises(ValidationError):
            SourceSpec.model_validate({"repo": "r", "ref": "main", **bad})
    src = {"repo": "/r", "ref": "main"}
    sourced = {
        "baseline": {"variant": "anything", "source": src},
        "candidate": {"variant": "x"},
        "params": {"unknown": 1},
    }
    # The revision's benchmark is not importable here: variants and parameters wait for the runner.
    assert validate_spec(JobSpec.model_validate({"benchmark": "mypkg.bench:B", **sourced})) == []
    assert validate_spec(JobSpec.model_validate({"benchmark": "matmul", **sourced})) == []
    [error] = validate_spec(JobSpec.model_validate({"benchmark": "some-entry-point", **sourced}))
    assert error["loc"] == ("benchmark",) and "module:object" in error["msg"]


class _Scripted:
    """A PairTimer whose candidate takes twice the baseline's time; records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Side, int]] = []

    def time_ns(self, variant: Side, launches: int) -> float:
        self.calls.append((variant, launches))
        return 1000.0 if variant == "baseline" else 2000.0

    def launches_for(self, variant: Side, per_launch_ns: float) -> int:
        return 3 if variant == "baseline" else 5

    def timer_kind(self, variant: Side) -> str:
        return "scripted"

    def use_fallback(self, variant: Side) -> bool:
        return False


def test_measure_interleaved_drives_any_pair_timer() -> None:
    settings = MeasurementSpec(warmup_ms=0, min_rounds=4, max_rounds=4, budget_ms=10_000)
    pair = _Scripted()
    samples = measure_interleaved(pair, settings)
    assert [(s.variant, s.round, s.launches) for s in samples.rows()] == [
        ("baseline", 0, 3),
        ("candidate", 0, 5),
        ("candidate", 1, 5),
        ("baseline", 1, 3),
        ("baseline", 2, 3),
        ("candidate", 2, 5),
        ("candidate", 3, 5),
        ("baseline", 3, 3),
    ]
    assert pair.calls[-8:] == [(s.variant, s.launches) for s in samples.rows()]
