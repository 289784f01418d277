"""Job isolation on a runner: job code cannot read the daemon's work dir (token file, spool).

``python -m kernelab.runners.jobns [--hide DIR ...] [--keep PATH ...] [--readonly DIR ...] [--writable
PATH ...] -- ARGV...`` runs ``ARGV`` in a private user + mount namespace (unprivileged user
namespaces, ``user_namespaces(7)``; no root needed) in which each ``--hide`` folder is an empty
tmpfs except the ``--keep`` paths inside it (bind-mounted back from the real folder: the job's
scratch folder, the revision cache), and each ``--readonly`` folder is read-only except the
``--writable`` paths inside it (a job's own worktree in the revision cache). The user and group
ids stay the caller's own (mapped to themselves). The mounts are then locked
(``mount_namespaces(7)``, "restrictions on mount namespaces"): the helper enters a second user
+ mount namespace before ``exec``, so job code
cannot unmount the tmpfs, even as root of its namespace. Exit status 125 when the namespace cannot
be made (message on stderr), else ``ARGV``'s own.

The daemon side: ``probe()`` tries this once at start-up (some kernels or AppArmor policies refuse
unprivileged user namespaces), ``wrap()`` builds the command line, ``set_non_dumpable()`` makes the
daemon's own ``/proc/<pid>/environ``, ``mem`` and ``fd`` unreadable to same-uid processes
(``prctl(PR_SET_DUMPABLE, 0)``, ``prctl(2)``). ``docs/security.md`` ("Job code on runners")
states what this does not cover.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

# constants from <sched.h>, <sys/mount.h>, <sys/prctl.h> (Linux UAPI)
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_NOSUID = 2
MS_NODEV = 4
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_DUMPABLE = 4
EXIT_NO_NAMESPACE = 125
PROBE_TIMEOUT_S = 20.0
ISOLATION_MODES = ("auto", "namespace", "none")  # RunnerDaemon(job_isolation=...)


class IsolationError(RuntimeError):
    """The private namespace could not be made (no unprivileged user namespaces, a mount refused)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise IsolationError(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = _libc()
    rc = libc.mount(
        source.encode() if source else None,
        target.encode(),
        fstype.encode() if fstype else None,
        ctypes.c_ulong(flags),
        data.encode() if data else None,
    )
    _check(rc, f"mount {source or ''} on {target}")


def _enter_user_namespace(uid: int, gid: int) -> None:
    """``unshare(CLONE_NEWUSER | CLONE_NEWNS)`` with ``uid``/``gid`` mapped to themselves."""
    _check(_libc().unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
    Path("/proc/self/setgroups").write_text("deny")
    Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
    Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")


MS_REMOUNT = 32
MS_RDONLY = 1


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """``paths`` resolved, without those inside another one (hiding the outer hides them)."""
    reals = sorted({path.resolve() for path in paths}, key=lambda p: len(p.parts))
    out: list[Path] = []
    for real in reals:
        if not any(real == root or root in real.parents for root in out):
            out.append(real)
    return out


def enter(
    hide: Sequence[Path],
    keep: Sequence[Path],
    *,
    readonly: Sequence[Path] = (),
    writable: Sequence[Path] = (),
) -> None:
    """Make this process's private namespace: each ``hide`` folder an empty tmpfs but for the
    ``keep`` paths inside it (which must exist); each ``readonly`` folder read-only but for the
    ``writable`` paths inside it; the mounts locked. Raises ``IsolationError`` or ``OSError``."""
    roots = _outermost(hide)
    reals = _inside(keep, hide, "--keep", "--hide")
    ro_roots = _outermost(readonly)
    holes = _inside(writable, readonly, "--writable", "--readonly")
    uid, gid = os.getuid(), os.getgid()
    _enter_user_namespace(uid, gid)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # opened in the new namespace (a bind source must be one of its mounts), before the tmpfs hides them
    kept = [(real, os.open(real, os.O_PATH)) for real in reals]
    opened = [(real, os.open(real, os.O_PATH)) for real in holes]
    for root in roots:
        _mount("kernelab-hidden", str(root), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0700,size=16m")
    for real, fd in kept:
        _bind_back(fd, real)
    for root in ro_roots:
        _mount(str(root), str(root), None, MS_BIND | MS_REC)
        _mount(None, str(root), None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for real, fd in opened:
        _bind_back(fd, real)
    _enter_user_namespace(uid, gid)  # a less privileged copy: the mounts above are locked


def _inside(paths: Sequence[Path], roots: Sequence[Path], flag: str, root_flag: str) -> list[Path]:
    """``paths`` resolved, each inside one of ``roots`` and reached without a symbolic link below
    that root: a link a job planted (``.kernelab-triton -> ../../repos``) would otherwise widen
    what it may write. Raises ``IsolationError``."""
    out = []
    for path in paths:
        absolute = Path(os.path.abspath(path))
        for root in roots:
            root_abs = Path(os.path.abspath(root))
            if absolute == root_abs or root_abs in absolute.parents:
                expected = root_abs.resolve() / absolute.relative_to(root_abs)
                if absolute.resolve() != expected:
                    raise IsolationError(f"{flag} {path} goes through a symbolic link below {root}")
                out.append(expected)
                break
        else:
            raise IsolationError(
                f"{flag} {path} is not inside a {root_flag} folder ({', '.join(map(str, roots))})"
            )
    return out


def _bind_back(fd: int, target: Path) -> None:
    """Bind the path ``fd`` (``O_PATH``) was opened on back at ``target``; closes ``fd``."""
    if os.path.isdir(f"/proc/self/fd/{fd}"):
        if not target.exists():
            target.mkdir(parents=True, exist_ok=True)
    elif not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    _mount(f"/proc/self/fd/{fd}", str(target), None, MS_BIND | MS_REC)
    os.close(fd)


def set_non_dumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)`` for this process: same-uid processes can no longer read its
    ``/proc/<pid>/environ``, ``mem``, ``fd/`` or ``root/`` nor attach a debugger. Returns False
    when refused (never raises)."""
    try:
        return int(_libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def wrap(
    argv: Sequence[str],
    *,
    hide: Path | Sequence[Path] = (),
    keep: Sequence[Path] = (),
    readonly: Sequence[Path] = (),
    writable: Sequence[Path] = (),
) -> list[str]:
    """The command line running ``argv`` through this helper (module docstring)."""
    cmd = [sys.executable, "-P", "-m", "kernelab.runners.jobns"]
    for flag, paths in (
        ("--hide", [hide] if isinstance(hide, Path) else hide),
        ("--keep", keep),
        ("--readonly", readonly),
        ("--writable", writable),
    ):
        for path in paths:
            cmd += [flag, str(path)]
    return [*cmd, "--", *argv]


JOBNS_ENV = "KERNELAB_JOBNS"
"""Set to ``1`` in a worker's environment when it runs in the private namespace: the code it runs
for a job (install steps, revision workers) then runs in a nested one where the revision cache is
read-only but for that job's own worktree (``nested``)."""


def nested(argv: Sequence[str], *, readonly: Path, writable: Sequence[Path]) -> list[str]:
    """``argv`` with ``readonly`` read-only but for ``writable`` when this process is isolated
    (``JOBNS_ENV``), else as it is."""
    if os.environ.get(JOBNS_ENV) != "1":
        return list(argv)
    return wrap(argv, readonly=[readonly], writable=writable)


_PROBE_CHECK = """
import ctypes, os, sys
hidden, kept, root = sys.argv[1], sys.argv[2], sys.argv[3]
visible = os.path.exists(hidden) or open(kept).read() != "kept"
unmounted = ctypes.CDLL(None).umount2(root.encode(), 2) == 0  # MNT_DETACH: refused when locked
sys.exit(1 if visible or unmounted else 0)
"""


def probe() -> str:
    """``""`` when a job can run in the private namespace here, else why not (one line)."""
    with tempfile.TemporaryDirectory(prefix="kernelab-jobns-") as tmp:
        root = Path(tmp)
        (root / "secret.json").write_text("secret")
        (root / "keep").mkdir()
        (root / "keep" / "f").write_text("kept")
        cmd = wrap(
            [
                sys.executable,
                "-c",
                _PROBE_CHECK,
                str(root / "secret.json"),
                str(root / "keep" / "f"),
                str(root),
            ],
            hide=root,
            keep=[root / "keep"],
        )
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"the namespace helper did not run: {exc}"
        if proc.returncode == 0:
            return ""
        lines = (proc.stderr or "").strip().splitlines()
        return lines[-1] if lines else f"the check in the namespace failed (exit status {proc.returncode})"


def main(argv: list[str] | None = None) -> int:
    """Enter the namespace and ``exec`` the command (module docstring); 125 when that fails."""
    p = argparse.ArgumentParser(prog="python -m kernelab.runners.jobns", description=__doc__.splitlines()[0])
    p.add_argument("--hide", type=Path, action="append", default=[])
    p.add_argument("--keep", type=Path, action="append", default=[])
    p.add_argument("--readonly", type=Path, action="append", default=[])
    p.add_argument("--writable", type=Path, action="append", default=[])
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        p.error("no command after --")
    try:
        enter(args.hide, args.keep, readonly=args.readonly, writable=args.writable)
    except (IsolationError, OSError) as exc:
        print(f"jobns: cannot isolate the job: {exc}", file=sys.stderr)
        return EXIT_NO_NAMESPACE
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"jobns: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())
