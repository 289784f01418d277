"""Source revisions on a runner: the allow-list, a cached clone per repository, a worktree per commit.

A spec side with a ``source`` (``kernelab.service.contract.schemas.SourceSpec``) runs the code of one git
revision.
The runner

1. brings the repository address to its canonical form (``kernelab.service.contract.repo_address``: ``..``,
   encoded forms, credentials, remote helpers refused) and checks it against its allow-list
   (``AllowList``; runner option ``--allow-repo`` or ``KERNELAB_ALLOWED_REPOS``), segment by
   segment; nothing is fetched from a repository that is not on it, and what git fetches is the
   canonical address that was checked (refused when a ``url.<base>.insteadOf`` in the git config
   would rewrite it);
2. keeps one bare clone per repository under ``<cache>/repos/`` (``git clone --bare``; later jobs
   ``git fetch`` it), resolves the ref to a commit sha (``git rev-parse --verify <ref>^{commit}``);
3. checks each commit out once into ``<cache>/worktrees/<repo key>/<sha>/`` (``git worktree add
   --detach``) and runs the source's install steps there once; a ``.kernelab-ready`` marker records
   success, so a failed install is retried by the next job and a good one is reused.

Every git and install command runs as a child process with a timeout, without a shell, with
``GIT_TERMINAL_PROMPT=0`` (never waits for a password), and every git command with ``GIT_SAFETY``:
``http.followRedirects=false`` (a redirect from an allowed URL is not followed) and
``protocol.allow=never`` but for the one transport of the repository being fetched (no switch to
``ext::``, ``fd::`` or another scheme on the way). A ``subdir`` must resolve (symlinks followed)
inside the worktree, and a committed symlink that points outside it refuses the revision. Failures
raise ``RevisionError`` with a
message that names the side, the repository and the command; the worker reports it as the job's
error and the runner stays healthy.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from kernelab.runners import jobns
from kernelab.runners.jobenv import job_env
from kernelab.service.contract.repo_address import (
    RepoAddressError,
    address_kind,
    canonical_repo,
    matches,
    transport,
)
from kernelab.service.contract.schemas import JobSpec, SideSpec, SourceSpec

ALLOWED_REPOS_ENV = "KERNELAB_ALLOWED_REPOS"  # entries separated by whitespace or commas
GIT_TIMEOUT_S = 300.0  # one clone/fetch/worktree command
INSTALL_TIMEOUT_S = 900.0  # one install step
OUTPUT_TAIL_CHARS = 1500  # how much of a failed command's output goes into the error
READY_MARKER = ".kernelab-ready"
SITE_DIR = ".kernelab-site"  # per-revision install target, second on sys.path
GIT_SAFETY = (
    "-c",
    "http.followRedirects=false",
    "-c",
    "protocol.allow=never",
    "-c",
    "core.hooksPath=/dev/null",
)
"""``git -c`` options of every git command (git-config(1): ``http.followRedirects``,
``protocol.allow``, ``core.hooksPath``: no hook a clone or a job left runs);
``_git_options`` adds ``protocol.<transport>.allow=always`` for one transport."""
_SYMLINK_MODE = "120000"  # git's tree entry mode of a symbolic link


class RevisionError(RuntimeError):
    """A source revision cannot be used: not allowed, not found, clone/fetch/install failed."""


def normalize_repo(repo: str) -> str:
    """The canonical form a repository is matched, cached and fetched under
    (``kernelab.service.contract.repo_address.canonical_repo``): a URL with scheme and host lower-cased, no
    trailing
    ``/`` or ``.git``; a local path absolute with symlinks resolved (``~`` expanded).

    Raises ``RevisionError`` for a refused form (``..``, encoded ``.``/``/``, a password, ...).
    """
    try:
        return canonical_repo(repo)
    except RepoAddressError as exc:
        raise RevisionError(f"repository {repo!r} is refused: {exc}") from None


def fetch_address(repo: str) -> str:
    """The address git fetches ``repo`` from: its canonical form, keeping a ``.git`` ending
    (``normalize_repo`` drops it for matching and caching). Raises ``RevisionError`` like it."""
    try:
        return canonical_repo(repo, keep_git=True)
    except RepoAddressError as exc:
        raise RevisionError(f"repository {repo!r} is refused: {exc}") from None


def is_url(repo: str) -> bool:
    """True for a URL or scp-like address, False for a local path (by form only)."""
    return address_kind(repo) != "local"


def _git_options(canonical: str | None = None) -> list[str]:
    """``GIT_SAFETY``, plus ``protocol.<transport>.allow=always`` for the transport of ``canonical``
    (None: a command that fetches nothing)."""
    options = list(GIT_SAFETY)
    if canonical is not None:
        options += ["-c", f"protocol.{transport(canonical)}.allow=always"]
    return options


class AllowList:
    """Repositories a runner may fetch: canonical addresses or patterns
    (``kernelab.service.contract.repo_address``).

    Entries are canonicalised like repositories, so ``.`` or ``~/src/x`` name the absolute folder;
    ``*`` matches within one path segment (``https://github.com/org/*`` allows every repository of
    ``org``, not ``org/a/b``), a last segment ``**`` any depth below. An empty list allows nothing.
    Raises ``RevisionError`` naming an entry in a refused form.
    """

    def __init__(self, entries: Iterable[str] = ()):
        self.entries = []
        for entry in entries:
            if not entry.strip():
                continue
            try:
                self.entries.append(canonical_repo(entry, pattern=True))
            except RepoAddressError as exc:
                raise RevisionError(f"allow-list entry {entry!r} is refused: {exc}") from None

    @classmethod
    def from_env(cls, extra: Iterable[str] = ()) -> AllowList:
        """``extra`` plus the entries of ``KERNELAB_ALLOWED_REPOS`` (whitespace or comma separated)."""
        env = re.split(r"[\s,]+", os.environ.get(ALLOWED_REPOS_ENV, ""))
        return cls([*extra, *env])

    def allows(self, repo: str) -> bool:
        """True when ``repo``'s canonical form equals or matches an entry (False for a refused form)."""
        try:
            norm = normalize_repo(repo)
        except RevisionError:
            return False
        return any(matches(norm, e) for e in self.entries)

    def check(self, repo: str, side: str) -> None:
        """Raise ``RevisionError`` naming ``side`` when ``repo`` is refused or not allowed."""
        try:
            normalize_repo(repo)
        except RevisionError as exc:
            raise RevisionError(f"{side}: {exc}") from None
        if not self.allows(repo):
            allowed = ", ".join(self.entries) or "nothing (no --allow-repo given)"
            raise RevisionError(
                f"{side}: repository {repo!r} is not on this runner's allow-list "
                f"(runner option --allow-repo or {ALLOWED_REPOS_ENV}); it allows: {allowed}"
            )

    def __repr__(self) -> str:
        return f"<AllowList {self.entries}>"


@dataclass(frozen=True)
class Checkout:
    """One materialised revision: ``root`` is the worktree, ``path`` its ``subdir`` (first on
    ``sys.path``), ``site`` the install target (second), ``sha`` the full commit id."""

    repo: str
    sha: str
    root: Path
    path: Path
    site: Path
    git_dir: Path


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= OUTPUT_TAIL_CHARS else "..." + text[-OUTPUT_TAIL_CHARS:]


def _git_env() -> dict[str, str]:
    """The environment of git and of install steps: the job environment (``kernelab.runners.jobenv``:
    allow-listed, no credentials), no prompts, the C locale."""
    return job_env({"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"})


def run_command(
    argv: Sequence[str], *, cwd: Path | None, timeout_s: float, what: str, env: dict[str, str] | None = None
) -> str:
    """Run ``argv`` (no shell) and return its stdout+stderr; raise ``RevisionError`` on failure.

    ``what`` starts the error message. A non-zero exit, a missing program and running longer than
    ``timeout_s`` seconds are failures; the message carries the tail of the output.
    """
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            env=env if env is not None else _git_env(),
            timeout=timeout_s,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            errors="replace",
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.output if isinstance(exc.output, str) else ""
        raise RevisionError(
            f"{what}: `{shlex.join(argv)}` timed out after {timeout_s:g} s\n{_tail(out)}"
        ) from None
    except OSError as exc:
        raise RevisionError(f"{what}: cannot run `{shlex.join(argv)}`: {exc}") from None
    if proc.returncode != 0:
        raise RevisionError(
            f"{what}: `{shlex.join(argv)}` exited with status {proc.returncode}\n{_tail(proc.stdout)}"
        )
    return proc.stdout


def _git(
    args: Sequence[str],
    *,
    git_dir: Path,
    what: str,
    timeout_s: float = GIT_TIMEOUT_S,
    repo: str | None = None,
) -> str:
    """``git <GIT_SAFETY> --git-dir=<git_dir> <args>``; ``repo``: the canonical address it fetches."""
    argv = ["git", *_git_options(repo), f"--git-dir={git_dir}", *args]
    return run_command(argv, cwd=None, timeout_s=timeout_s, what=what)


def _check_not_rewritten(canonical: str, side: str) -> None:
    """Refuse ``canonical`` when the runner's git config rewrites it (``url.<base>.insteadOf``):
    git would fetch another address than the one the allow-list admitted.
    ``git ls-remote --get-url`` prints the address after rewriting without contacting it."""
    out = run_command(["git", *_git_options(), "ls-remote", "--get-url", "--", canonical], cwd=None,
                      timeout_s=GIT_TIMEOUT_S, what=f"{side}: git ls-remote --get-url")  # fmt: skip
    if out.strip() != canonical:
        raise RevisionError(
            f"{side}: the runner's git config rewrites {canonical!r} to {out.strip()!r} "
            "(url.<base>.insteadOf); the allow-list admitted the address before rewriting, so it is refused"
        )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (two runners sharing a cache never clone at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class RevisionCache:
    """Bare clones and worktrees under ``root`` (the runner's ``work_dir/revisions``)."""

    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()

    def repo_key(self, repo: str) -> str:
        """A folder name for ``repo``: its last path part and 12 hex digits of its sha256."""
        norm = normalize_repo(repo)
        stem = re.sub(r"[^A-Za-z0-9._-]", "_", norm.rstrip("/").rsplit("/", 1)[-1])[:40] or "repo"
        return f"{stem}-{hashlib.sha256(norm.encode()).hexdigest()[:12]}"

    def _update_clone(self, repo: str, side: str) -> Path:
        """The bare clone of ``repo``, cloned or fetched now (branches, tags and the remote HEAD)."""
        norm = fetch_address(repo)
        git_dir = self.root / "repos" / f"{self.repo_key(repo)}.git"
        if not is_url(norm) and not Path(norm).exists():
            raise RevisionError(f"{side}: repository {repo!r} does not exist on this runner")
        _check_not_rewritten(norm, side)
        if not (git_dir / "HEAD").exists():
            git_dir.parent.mkdir(parents=True, exist_ok=True)
            run_command(
                ["git", *_git_options(norm), "clone", "--bare", "--quiet", "--", norm, str(git_dir)],
                cwd=None,
                timeout_s=GIT_TIMEOUT_S,
                what=f"{side}: cannot clone {repo!r}",
            )
        _git(
            [
                "fetch",
                "--quiet",
                "--force",
                "--prune",
                "--",
                norm,
                "+refs/heads/*:refs/heads/*",
                "+refs/tags/*:refs/tags/*",
                "+HEAD:refs/kernelab/remote-HEAD",
            ],
            git_dir=git_dir,
            what=f"{side}: cannot fetch {repo!r}",
            repo=norm,
        )
        return git_dir

    def _resolve(self, git_dir: Path, repo: str, ref: str, side: str) -> str:
        """Full sha of ``ref``; a sha not on any branch is fetched by id. Raises ``RevisionError``."""

        def rev_parse() -> str | None:
            try:
                out = _git(
                    ["rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
                    git_dir=git_dir,
                    what="rev-parse",
                )
            except RevisionError:
                return None
            return out.strip() or None

        sha = rev_parse()
        if sha is None and re.fullmatch(r"[0-9a-fA-F]{7,64}", ref):
            with contextlib.suppress(RevisionError):
                norm = fetch_address(repo)
                _git(["fetch", "--quiet", "--", norm, ref], git_dir=git_dir, what="fetch sha", repo=norm)
            sha = rev_parse()
        if sha is None:
            raise RevisionError(f"{side}: revision {ref!r} not found in repository {repo!r}")
        return sha

    def materialise(self, source: SourceSpec, side: str, *, allow: AllowList) -> Checkout:
        """Check ``source`` against ``allow``, then the worktree of its commit, installed.

        Raises ``RevisionError`` (message starting with ``side``) when the repository is refused,
        not allowed or missing, the ref does not resolve, ``subdir`` does not exist at that commit
        or resolves (through a symlink) outside the worktree, a committed symlink points outside
        the worktree, or an install step fails.
        """
        allow.check(source.repo, side)
        key = self.repo_key(source.repo)
        with _locked(self.root / "locks" / f"{key}.lock"):
            git_dir = self._update_clone(source.repo, side)
            sha = self._resolve(git_dir, source.repo, source.ref, side)
            root = self.root / "worktrees" / key / sha
            if not (root / READY_MARKER).exists() or not _marker_matches(root, source):
                self._fresh_worktree(git_dir, root, sha, side)
                _clear(root / READY_MARKER)  # a committed one is not ours: ready only after our install
                _check_symlinks(git_dir, root, sha, side)
                path = _subdir_path(root, source.subdir, sha, side)
                _install(source, path, root / SITE_DIR, side, cache_root=self.root)
                _write_marker(root / READY_MARKER, {"install": source.install, "subdir": source.subdir})
            path = _subdir_path(root, source.subdir, sha, side)
        return Checkout(
            repo=source.repo, sha=sha, root=root, path=path, site=root / SITE_DIR, git_dir=git_dir
        )

    def _fresh_worktree(self, git_dir: Path, root: Path, sha: str, side: str) -> None:
        if root.exists():  # a failed install or another subdir/install earlier: start over
            with contextlib.suppress(RevisionError):
                _git(["worktree", "remove", "--force", str(root)], git_dir=git_dir, what="worktree remove")
            if root.exists():
                shutil.rmtree(root)
        _git(["worktree", "prune"], git_dir=git_dir, what=f"{side}: git worktree prune")
        root.parent.mkdir(parents=True, exist_ok=True)
        _git(
            ["worktree", "add", "--detach", "--force", str(root), sha],
            git_dir=git_dir,
            what=f"{side}: cannot check out {sha[:12]}",
        )

    def diff_stat(self, baseline: Checkout, candidate: Checkout) -> tuple[str, str]:
        """``(git diff --stat, git diff --shortstat)`` from baseline to candidate; empty strings
        when the two come from different repositories."""
        if baseline.git_dir != candidate.git_dir:
            return "", ""
        args = [f"{baseline.sha}", f"{candidate.sha}", "--"]
        stat = _git(["diff", "--stat=120", *args], git_dir=baseline.git_dir, what="git diff --stat")
        short = _git(["diff", "--shortstat", *args], git_dir=baseline.git_dir, what="git diff --shortstat")
        return stat.rstrip(), short.strip()


def _subdir_path(root: Path, subdir: str, sha: str, side: str) -> Path:
    """``root / subdir`` with symlinks resolved; ``RevisionError`` unless it is a folder inside
    ``root`` (a committed symlink must not take ``subdir`` out of the worktree)."""
    real_root = Path(os.path.realpath(root))
    path = Path(os.path.realpath(root / subdir)) if subdir else real_root
    if not path.is_relative_to(real_root):
        raise RevisionError(f"{side}: subdir {subdir!r} resolves outside the worktree at {sha[:12]} "
                            "(through a symlink)")  # fmt: skip
    if not path.is_dir():
        raise RevisionError(f"{side}: subdir {subdir!r} does not exist at {sha[:12]}")
    return path


def _check_symlinks(git_dir: Path, root: Path, sha: str, side: str) -> None:
    """``RevisionError`` when a symlink committed at ``sha`` points outside the worktree ``root``
    (benchmark code that imports or reads it would read the runner's files)."""
    listing = _git(["ls-tree", "-r", "-z", "--full-tree", sha], git_dir=git_dir, what=f"{side}: git ls-tree")
    real_root = Path(os.path.realpath(root))
    for entry in filter(None, listing.split("\0")):
        meta, _, name = entry.partition("\t")
        if meta.split(" ", 1)[0] != _SYMLINK_MODE:
            continue
        target = Path(os.path.realpath(root / name))
        if not target.is_relative_to(real_root):
            raise RevisionError(f"{side}: the committed symlink {name!r} at {sha[:12]} points outside the "
                                "worktree; such a revision is refused")  # fmt: skip


def _clear(path: Path) -> None:
    """Remove ``path`` (a file, a link, not followed, or a folder) if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        path.unlink()


def _write_marker(path: Path, data: dict[str, object]) -> None:
    """Write ``path`` afresh: whatever an install step left there (a link to a cached clone's
    config, say) is removed first and never followed (``O_NOFOLLOW | O_EXCL``)."""
    _clear(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(json.dumps(data))


def _marker_matches(root: Path, source: SourceSpec) -> bool:
    try:
        if (root / READY_MARKER).is_symlink():
            return False
        marker = json.loads((root / READY_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(marker.get("install") == source.install and marker.get("subdir") == source.subdir)


def install_argv(step: str, *, site: Path) -> list[str]:
    """One install step split like a shell would (``shlex``), ``{python}`` and ``{site}`` replaced.

    Raises ``RevisionError`` for an empty step or unbalanced quotes.
    """
    try:
        argv = shlex.split(step)
    except ValueError as exc:
        raise RevisionError(f"install step {step!r} cannot be parsed: {exc}") from None
    if not argv:
        raise RevisionError("an install step is empty")
    return [a.replace("{python}", sys.executable).replace("{site}", str(site)) for a in argv]


def _install(source: SourceSpec, path: Path, site: Path, side: str, *, cache_root: Path) -> None:
    """Run ``source``'s install steps in ``path``. In an isolated job (``jobns.JOBNS_ENV``) each
    step runs with the revision cache ``cache_root`` read-only but for this worktree: a step cannot
    change other revisions, the cached clones (their config and hooks) or the locks."""
    site.mkdir(parents=True, exist_ok=True)
    env = _git_env()
    env["KERNELAB_SITE"] = str(site)
    # HOME is not the daemon's (~/.kernelab holds its token file): a per-cache home for pip & co.
    home = site.parent / ".kernelab-home"  # in the revision's worktree, made afresh with it
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    for i, step in enumerate(source.install):
        try:
            argv = install_argv(step, site=site)
        except RevisionError as exc:
            raise RevisionError(f"{side}: {exc}") from None
        run_command(
            jobns.nested(argv, readonly=cache_root, writable=[site.parent]),
            cwd=path,
            timeout_s=INSTALL_TIMEOUT_S,
            env=env,
            what=f"{side}: install step {i + 1} failed",
        )


def resolve_ref(repo: str, ref: str) -> tuple[str, str]:
    """``(sha, branch label)`` of ``ref`` in the local checkout ``repo``, for ``kernelab submit``.

    The label is the ref as given, except ``HEAD`` (or ``@``), which becomes the checked-out
    branch's name (``HEAD`` when detached). Raises ``RevisionError`` when ``repo`` is not a git
    checkout or ``ref`` does not name a commit there.
    """
    path = Path(repo).expanduser()
    what = f"revision {ref!r} not found in {repo!r}"
    sha = run_command(
        ["git", "-C", str(path), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
        cwd=None,
        timeout_s=GIT_TIMEOUT_S,
        what=what,
    ).strip()
    label = ref
    if ref in ("HEAD", "@"):
        label = (
            run_command(
                ["git", "-C", str(path), "rev-parse", "--abbrev-ref", "HEAD"],
                cwd=None,
                timeout_s=GIT_TIMEOUT_S,
                what=what,
            ).strip()
            or "HEAD"
        )
    return sha, label


def is_dirty(repo: str) -> bool:
    """True when the local checkout ``repo`` has uncommitted changes to tracked files."""
    out = run_command(
        ["git", "-C", str(Path(repo).expanduser()), "status", "--porcelain", "--untracked-files=no"],
        cwd=None,
        timeout_s=GIT_TIMEOUT_S,
        what="git status",
    )
    return bool(out.strip())


def with_revisions(spec: JobSpec, repo: str, baseline_ref: str | None, candidate_ref: str | None) -> JobSpec:
    """``spec`` with each side given a ref taken from ``repo`` at that ref.

    A local ``repo`` is made absolute and each ref resolved to its commit sha here (the runner may
    be another machine, and ``HEAD`` means the submitter's HEAD); the ref's name is kept as the
    branch label. A URL keeps the refs as given. A side's existing ``subdir`` and ``install``
    are kept. Raises ``RevisionError`` for a ref that does not resolve.
    """
    updates: dict[str, SideSpec] = {}
    for side, ref in (("baseline", baseline_ref), ("candidate", candidate_ref)):
        if ref is None:
            continue
        current: SideSpec = getattr(spec, side)
        if is_url(repo):
            repo_value, sha, label = repo, ref, ref
        else:
            repo_value = normalize_repo(repo)
            sha, label = resolve_ref(repo_value, ref)
        old = current.source
        source = SourceSpec(
            repo=repo_value,
            ref=sha,
            branch=label,
            subdir=old.subdir if old else "",
            install=old.install if old else [],
        )
        updates[side] = current.model_copy(update={"source": source})
    return spec.model_copy(update=updates)
