"""The revision allow-list compares canonical forms: '..', encoded forms and other
spellings of another repository are refused; '*' stays within one segment; git follows no HTTP
redirect and no url.insteadOf rewrite; subdir and committed symlinks stay inside the worktree
(real git repositories, real HTTP servers on loopback)."""

from __future__ import annotations

import functools
import http.server
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from kernelab.runners.revisions import GIT_SAFETY, AllowList, RevisionCache, RevisionError, normalize_repo
from kernelab.service.contract.repo_address import RepoAddressError, canonical_repo, matches
from kernelab.service.contract.schemas import SourceSpec
from tests.e2e.revision_repo import _git, make_repo

ENTRIES = ["https://github.com/myorg/*", "git@github.com:myorg/*", "ssh://git@github.com/myorg/*",
           "https://git.corp/team/**"]  # fmt: skip

REFUSED = [
    "https://github.com/myorg/../attacker/x",
    "https://github.com/myorg/x/../../attacker/y",
    "https://github.com/myorg/%2e%2e/attacker/x",
    "https://github.com/myorg/%2E%2E/attacker/x",
    "https://github.com/myorg/.%2e/attacker/x",
    "https://github.com/myorg/x%2f..%2f..%2fattacker",
    "https://github.com/myorg/%252e%252e/attacker",
    "https://github.com/myorg/x%5c..%5cattacker",
    "https://github.com/myorg/%c0%ae%c0%ae/attacker",
    "https://github.com/myorg\\..\\attacker",
    "https://github.com/myorg/./x",
    "https://github.com/myorg//x",
    "https://github.com/myorg/x.",
    "https://github.com/myorg/x..",
    "https://github.com/myorg/x?ref=y",
    "https://github.com/myorg/x#y",
    "https://user:secret@github.com/myorg/x",
    "https://github.com%2fattacker/myorg/x",
    "https://github.com/myorg/x y",
    "ftp://github.com/myorg/x",
    "ext::sh -c id",
    "fd::3",
    "git@github.com:myorg/../attacker/x",
    "git@github.com:myorg/%2e%2e/attacker",
    "git@-oProxyCommand=touch:myorg/x",
    "github.com:-x/y",
    "ssh://-oProxyCommand=x/myorg/y",
    "file://attacker.host/srv/x",
    "file:///srv/allowed/../evil",
]


@pytest.mark.parametrize("repo", REFUSED)
def test_other_spellings_of_another_repository_are_refused(repo: str) -> None:
    allow = AllowList([*ENTRIES, "file:///srv/allowed/*", "/srv/allowed/*"])
    assert not allow.allows(repo)
    with pytest.raises(RevisionError, match="^candidate: "):
        allow.check(repo, "candidate")
    with pytest.raises(RepoAddressError):
        canonical_repo(repo, resolve=False)


@pytest.mark.parametrize(("repo", "canonical"), [
    ("HTTPS://GitHub.COM./myorg/x.git/", "https://github.com/myorg/x"),
    ("https://github.com:443/myorg/x", "https://github.com/myorg/x"),
    ("https://github.com/myorg/%78-%5F", "https://github.com/myorg/x-_"),
    ("ssh://git@GitHub.com:22/myorg/x.git", "ssh://git@github.com/myorg/x"),
    ("git@GitHub.com:myorg/x.git", "git@github.com:myorg/x"),
    ("http://127.0.0.1:8080/a/b", "http://127.0.0.1:8080/a/b"),
    ("https://[::1]:8443/a/b", "https://[::1]:8443/a/b"),
])  # fmt: skip
def test_one_repository_has_one_canonical_form(repo: str, canonical: str) -> None:
    assert normalize_repo(repo) == canonical


def test_star_matches_within_one_segment() -> None:
    allow = AllowList(ENTRIES)
    assert allow.allows("https://github.com/myorg/kernels") and allow.allows("git@github.com:myorg/k.git")
    assert not allow.allows("https://github.com/myorg/a/b")
    assert not allow.allows("https://github.com/myorgx/kernels")
    assert not allow.allows("https://github.com/myorg")
    assert not allow.allows("https://x@github.com/myorg/kernels")  # another user is another address
    assert allow.allows("https://git.corp/team/a/b/c") and not allow.allows("https://git.corp/team")
    with pytest.raises(RevisionError, match="allow-list entry .* is refused"):
        AllowList(["https://github.com/myorg/../*"])


GIT_DIRS = [
    "https://github.com/myorg/.git", "https://github.com/myorg/.git/", "https://github.com/myorg/.GIT",
    "https://github.com/myorg/.git.git", "https://github.com/myorg/%2Egit", "git@github.com:myorg/.git",
    "ssh://git@github.com/myorg/.Git", "https://git.corp/team/.git/x", "https://git.corp/team/x/.git",
]  # fmt: skip


@pytest.mark.parametrize("repo", GIT_DIRS)
def test_a_git_directory_segment_is_refused_not_matched_by_a_star(repo: str) -> None:
    # '<dir>/.git' is the repository <dir> itself: '<dir>/*' must not admit it.
    assert not AllowList(ENTRIES).allows(repo)
    with pytest.raises(RepoAddressError):
        canonical_repo(repo, resolve=False)


@pytest.mark.parametrize("entry", ["https://h/o/*", "https://h/o/.*", "https://h/o/.g*", "https://h/o/*t",
                                   "https://h/o/**", "https://h/**"])  # fmt: skip
def test_no_glob_segment_matches_a_git_directory_even_given_one(entry: str) -> None:
    # The matcher holds by itself, for canonical forms that reach it by another road.
    for address in ("https://h/o/.git", "https://h/o/.GIT", "https://h/o/.git.git", "https://h/o/.git/x"):
        assert not matches(address, entry), (address, entry)
    assert matches("https://h/o/.gitignore-t", entry)  # a name that only starts with .git is a name


def test_a_host_glob_matches_host_label_characters_only() -> None:
    allow = AllowList(["https://*.corp.example/team/*", "git@*.corp.example:team/*", "https://git.*/t/*"])
    assert allow.allows("https://x.corp.example/team/r") and allow.allows("git@x.corp.example:team/r")
    for repo in ("https://evil@x.corp.example/team/r",  # a user name is not part of the host
                 "https://evil@corp.example/team/r", "evil@x.corp.example:team/r",
                 "https://a.b.corp.example/team/r",  # one label, like a TLS wildcard
                 "https://x.corp.example:8443/team/r",  # nor a port
                 "https://git.corp:8443/t/r", "https://git.a.b/t/r"):  # fmt: skip
        assert not allow.allows(repo), repo
    assert not matches("https://evil@x.corp.example/team/r", "https://*x.corp.example/team/*")


def test_local_git_directories_are_refused(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    make_repo(allowed)
    make_repo(allowed / "child")
    (allowed / "link").symlink_to(allowed / ".git")
    allow = AllowList([f"{allowed}/*", f"file://{allowed}/*", f"{allowed}/**"])
    for repo in (f"{allowed}/.git", f"file://{allowed}/.git", f"{allowed}/link", f"{allowed}/.GIT"):
        assert not allow.allows(repo), repo
    with pytest.raises(RepoAddressError, match="git directory"):
        canonical_repo(f"{allowed}/link")
    assert allow.allows(f"{allowed}/child") and allow.allows(str(allowed / "child" / "revpkg"))


def test_local_paths_resolve_symlinks_before_matching(tmp_path: Path) -> None:
    allowed, evil = tmp_path / "allowed", tmp_path / "evil"
    allowed.mkdir()
    make_repo(evil)
    (allowed / "link").symlink_to(evil)
    allow = AllowList([f"{allowed}/*", f"file://{allowed}/*"])
    for repo in (
        f"{allowed}/link",
        f"file://{allowed}/link",
        f"{allowed}/../evil",
        f"file://{allowed}/../evil",
    ):
        assert not allow.allows(repo), repo
    (allowed / "good").mkdir()
    assert allow.allows(f"{allowed}/good") and allow.allows(f"file://{allowed}/good")


class _Redirect(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        self.send_response(301)
        self.send_header("Location", self.target + self.path)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class _Quiet(http.server.SimpleHTTPRequestHandler):
    hits: list[str] = []

    def do_GET(self) -> None:
        _Quiet.hits.append(self.path)
        super().do_GET()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(redirecting URL, direct URL) of one bare repository served by git's dumb HTTP protocol:
    the first answers 301 to the second."""
    make_repo(tmp_path / "src")
    bare = tmp_path / "www" / "repo.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(tmp_path / "src"), str(bare)], check=True)
    subprocess.run(["git", f"--git-dir={bare}", "update-server-info"], check=True)
    handler = functools.partial(_Quiet, directory=str(tmp_path / "www"))
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    direct = f"http://127.0.0.1:{files.server_address[1]}"
    _Redirect.target = direct
    redirect = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Redirect)
    servers = (files, redirect)
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    _Quiet.hits = []
    try:
        yield f"http://127.0.0.1:{redirect.server_address[1]}/repo.git", f"{direct}/repo.git"
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def test_an_http_redirect_from_an_allowed_url_is_not_followed(
    tmp_path: Path, served: tuple[str, str]
) -> None:
    redirecting, direct = served
    cache = RevisionCache(tmp_path / "cache")
    source = SourceSpec(repo=redirecting, ref="main")
    with pytest.raises(RevisionError, match="cannot clone") as refused:
        cache.materialise(source, "candidate", allow=AllowList([redirecting]))
    assert "http.followRedirects=false" in str(refused.value) and _Quiet.hits == []
    # The same repository, allowed by its own address, is fetched: the refusal above is the redirect's.
    done = cache.materialise(SourceSpec(repo=direct, ref="main"), "candidate", allow=AllowList([direct]))
    assert (done.path / "revpkg" / "bench.py").exists() and _Quiet.hits
    assert GIT_SAFETY[:2] == ("-c", "http.followRedirects=false")


def test_a_git_config_rewrite_of_an_allowed_address_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good, evil = tmp_path / "good", tmp_path / "evil"
    make_repo(good)
    make_repo(evil)
    home = tmp_path / "home"  # the runner user's ~/.gitconfig (git run for a job keeps HOME)
    home.mkdir()
    (home / ".gitconfig").write_text(f'[url "{evil}"]\n\tinsteadOf = {good}\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    cache = RevisionCache(tmp_path / "cache")
    with pytest.raises(RevisionError, match="rewrites"):
        cache.materialise(SourceSpec(repo=str(good), ref="main"), "baseline", allow=AllowList([str(good)]))
    assert not (tmp_path / "cache" / "repos").exists() or not any((tmp_path / "cache" / "repos").iterdir())


def _commit_symlink(repo: Path, name: str, target: str) -> None:
    os.symlink(target, repo / name)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", f"symlink {name}")


def test_subdir_and_committed_symlinks_stay_inside_the_worktree(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.json").write_text("{}")
    repo = tmp_path / "repo"
    make_repo(repo)
    _commit_symlink(repo, "inside", "revpkg")  # a symlink within the tree is fine
    cache, allow = RevisionCache(tmp_path / "cache"), AllowList([str(repo)])
    ok = cache.materialise(SourceSpec(repo=str(repo), ref="main", subdir="inside"), "baseline", allow=allow)
    assert ok.path == ok.root / "revpkg" and (ok.path / "bench.py").exists()

    _commit_symlink(repo, "escape", str(outside))
    with pytest.raises(RevisionError, match="baseline: the committed symlink 'escape' .* points outside"):
        cache.materialise(SourceSpec(repo=str(repo), ref="main", subdir="escape"), "baseline", allow=allow)
    with pytest.raises(RevisionError, match="points outside"):
        cache.materialise(SourceSpec(repo=str(repo), ref="main"), "candidate", allow=allow)


def test_subdir_through_a_symlink_outside_is_refused_even_if_the_tree_check_is_passed(tmp_path: Path) -> None:
    from kernelab.runners.revisions import _subdir_path

    root, outside = tmp_path / "wt", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "up").symlink_to(outside)
    with pytest.raises(RevisionError, match="resolves outside the worktree"):
        _subdir_path(root, "up", "0" * 40, "baseline")
    (root / "pkg").mkdir()
    assert _subdir_path(root, "pkg", "0" * 40, "baseline") == root.resolve() / "pkg"


def test_runner_refuses_to_start_with_an_allow_list_entry_in_a_refused_form(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelab.runners.cli import app

    args = ["runner", "--server", "http://127.0.0.1:9", "--token", "t" * 20, "--work-dir", str(tmp_path),
            "--once", "--allow-repo", "https://github.com/myorg/%2e%2e/*"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "allow-list entry" in result.output and "Traceback" not in result.output
