"""The canonical form of a source repository address (``SourceSpec.repo``) and allow-list patterns.

A runner fetches only repositories its allow-list names (``kernelab.runners.revisions.AllowList``). Matching
the text of an address is not enough: ``https://github.com/myorg/../attacker/x``,
``.../myorg/%2e%2e/attacker/x`` and ``file:///allowed/../evil`` all start with an allowed prefix.
So an address is first brought to one canonical form, refusing every form that could mean
something else to git, curl or a server, and the allow-list compares canonical forms segment by
segment. Pure functions, standard library only: the server refuses bad forms at submit time (422)
and the runner (which may import this module, like ``kernelab.service.contract.schemas``) checks again.

Kinds of address (as git tells them apart, ``url.c``/``connect.c``):

* ``scheme://[user@]host[:port]/path`` with scheme ``https``, ``http``, ``ssh``, ``git`` or
  ``file`` (other schemes and git's ``<transport>::<address>`` remote helpers, e.g. ``ext::``, are
  refused). Scheme and host are lower-cased, one trailing dot of the host dropped, the default
  port dropped. A password in the URL is refused (it would be stored with the job, readable with a
  read token: use a credential helper); a user name is kept, so ``https://x@github.com/...`` is
  not ``https://github.com/...``. A query or fragment is refused.
* scp-like ``[user@]host:path`` (a ``:`` with no ``/`` before it): kept in that form (it is not
  the same as ``ssh://host/path``: the path is relative to the remote home); ``%`` is refused
  (git does not decode it there), and a host or path that starts with ``-`` (an ssh option).
* ``file:///path`` and plain local paths: made absolute with symlinks resolved
  (``os.path.realpath``, ``~`` expanded); a ``file://`` URL keeps its scheme (git's file transport
  differs from a local clone); a host other than ``localhost`` is refused.

Path rules for every kind: no ``.`` or ``..`` segment, no empty segment (``//``), no segment that
ends with a dot (``x.``, ``x..``: some file systems and servers drop trailing dots), no backslash,
no control or non-ASCII character, only RFC 3986 path characters. Percent-encoding (URLs only) is
decoded once, and only for the unreserved characters ``A-Z a-z 0-9 - _ ~`` (RFC 3986 §6.2.2.2:
encoding them changes nothing); any other escape (``%2e`` for ``.``, ``%2f`` for ``/``, ``%25``
for ``%``, ``%5c`` for ``\\``, non-ASCII bytes) is refused. A trailing ``/`` and ``.git`` are
dropped from the last segment. A ``.git`` segment (any case, or repeated: ``.git.git``) is refused,
also where a local path resolves to one: ``/allowed/.git`` is the git directory of the repository
``/allowed``, not a repository below it.

Patterns (allow-list entries) follow the same rules, plus ``*``, which matches within one path
segment only (never across ``/``): ``https://github.com/myorg/*`` admits
``https://github.com/myorg/x`` but not ``https://github.com/myorg/a/b``. A last segment ``**``
admits one or more segments: ``https://git.corp/team/**``. Neither matches a ``.git`` segment,
whatever the pattern segment (``*``, ``.*``, ``.g*``). In a host, ``*`` matches host-label
characters within one label (like a TLS wildcard): the part before the path (scheme, user, host,
port) is compared as a whole, so ``https://*.corp.example/x/*`` admits neither
``https://evil@h.corp.example/x/r`` nor ``https://h.corp.example:8443/x/r``. Nothing else is
special (fnmatch's ``?`` and ``[...]`` are not used). Path case is kept:
``https://github.com/MyOrg/x`` does not match an entry ``https://github.com/myorg/*`` even though
GitHub would serve it (a false refusal, never a false admission).
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

DEFAULT_PORTS = {"https": 443, "http": 80, "ssh": 22, "git": 9418, "file": None}
"""Schemes a repository may use and their default ports (IANA service names)."""
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_HELPER = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")  # git remote helper syntax: ext::, fd::, ...
_USER = re.compile(r"^[A-Za-z0-9._~-]+$")
_LABEL = r"[a-z0-9*](?:[a-z0-9*-]*[a-z0-9*])?"
_HOST = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$|^\[[0-9a-f:.]+\]$")
_PCHAR = re.compile(r"^[A-Za-z0-9._~!$&'()*+,;=:@-]*$")  # RFC 3986 pchar, escapes decoded
_ESCAPE = re.compile(r"%(..)")
_GIT_DIR = re.compile(r"(?:\.git)+", re.IGNORECASE)  # .git, .GIT, .git.git: see _refuse_git_dir
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_~")


class RepoAddressError(ValueError):
    """A repository address (or allow-list entry) in a form that is refused; the message says why."""


def canonical_repo(repo: str, *, pattern: bool = False, resolve: bool = True, keep_git: bool = False) -> str:
    """The canonical form of ``repo`` (see the module docstring), or ``RepoAddressError``.

    ``pattern``: ``repo`` is an allow-list entry (``*`` allowed in host labels and path segments,
    a last segment ``**``; a local path may contain ``..``, resolved by ``realpath``).
    ``resolve=False`` (the server's check at submit time): a local path is checked but not made
    absolute or resolved (that is the runner's file system); the result is then only a check.
    ``keep_git``: keep a ``.git`` ending of the last segment (the address git fetches: a plain
    HTTP server serves ``repo.git``, not ``repo``); matching and caching use the form without.
    """
    text = repo.strip()
    if not text:
        raise RepoAddressError("the repository is empty")
    if any(ord(c) < 0x20 or ord(c) >= 0x7F for c in text):
        raise RepoAddressError("a control or non-ASCII character in the repository address")
    if "\\" in text:
        raise RepoAddressError("a backslash in the repository address")
    if "*" in text and not pattern:
        raise RepoAddressError("'*' in a repository address (only allow-list entries are patterns)")
    kind = address_kind(text)
    if kind == "url":
        return _url(text, pattern=pattern, resolve=resolve, keep_git=keep_git)
    if _HELPER.match(text):
        raise RepoAddressError("git remote-helper addresses ('<transport>::...') are refused")
    if kind == "scp":
        return _scp(text, pattern=pattern, keep_git=keep_git)
    return _local(text, pattern=pattern, resolve=resolve)


def address_kind(repo: str) -> str:
    """``"url"`` (``scheme://``), ``"scp"`` (``[user@]host:path``, a ``:`` with no ``/`` before
    it, as git decides) or ``"local"`` (a path) -- by form only, nothing checked."""
    text = repo.strip()
    if _SCHEME.match(text):
        return "url"
    head = text.split(":", 1)[0]
    if ":" in text and "/" not in head and not text.startswith(("~", ".")) and not _HELPER.match(text):
        return "scp"
    return "local"


def transport(canonical: str) -> str:
    """The git protocol a canonical address is fetched with (``protocol.<name>.allow``):
    ``https``/``http``/``ssh``/``git``/``file``; scp-like is ``ssh``, a local path ``file``."""
    match = _SCHEME.match(canonical)
    if match:
        return match.group(1)
    return "file" if canonical.startswith("/") else "ssh"


_HOST_GLOB = "[a-z0-9-]*"
"""What ``*`` in an entry's host matches: host-label characters of a canonical (lower-case) host,
so never a ``.`` (one label only), an ``@`` (a user name) or a ``:`` (a port or scp path)."""
_NOT_GIT_DIR = r"(?!(?i:(?:\.git)+)(?:/|\Z))"
"""Put before a glob segment: it never matches a ``.git`` segment (a repository's own git
directory is that repository, not one below it), in any case (a case-insensitive file system) or
repeated (``.git.git`` loses one ``.git`` as a last segment)."""


def matches(canonical: str, entry: str) -> bool:
    """Whether the canonical address ``canonical`` matches the canonical entry ``entry``.

    The part before the path (scheme, user, host, port) is equal, where ``*`` in the host matches
    host-label characters only (``_HOST_GLOB``); the path is equal segment by segment, where ``*``
    matches within one segment and a last ``**`` one or more segments, and neither matches a
    ``.git`` segment (``_NOT_GIT_DIR``)."""
    head, path = _split_path(entry)
    address_head, address_path = _split_path(canonical)
    if not re.fullmatch(re.escape(head).replace(r"\*", _HOST_GLOB), address_head):
        return False
    parts = path.split("/")
    tail = ""
    if parts[-1] == "**":
        parts, tail = parts[:-1], f"(?:/{_NOT_GIT_DIR}[^/]+)+"
    regex = "/".join(_segment_regex(p) for p in parts) + tail
    return re.fullmatch(regex, address_path) is not None


def _segment_regex(segment: str) -> str:
    if "*" not in segment:
        return re.escape(segment)
    return _NOT_GIT_DIR + re.escape(segment).replace(r"\*", "[^/]*")


def _split_path(canonical: str) -> tuple[str, str]:
    """``(head, path)`` of a canonical address or entry: ``scheme://authority`` and the path from
    its ``/``; ``[user@]host:`` and the rest for scp-like; ``""`` and the path for a local one."""
    match = _SCHEME.match(canonical)
    if match:
        slash = canonical.find("/", match.end())
        slash = len(canonical) if slash < 0 else slash
        return canonical[:slash], canonical[slash:]
    if address_kind(canonical) == "scp":
        colon = canonical.index(":") + 1
        return canonical[:colon], canonical[colon:]
    return "", canonical


def _refuse_git_dir(segments: list[str]) -> None:
    """``RepoAddressError`` for a ``.git`` segment (any case, or repeated): that is the git directory of the
    repository above it, which a pattern for the repositories below would otherwise admit."""
    for seg in segments:
        if _GIT_DIR.fullmatch(seg):
            raise RepoAddressError(
                f"a {seg!r} segment in the repository path: name the repository, not its git directory"
            )


def _decode_once(path: str) -> str:
    """``path`` with escapes of unreserved characters decoded; any other escape is refused."""

    def one(m: re.Match[str]) -> str:
        try:
            char = chr(int(m.group(1), 16))
        except ValueError:
            raise RepoAddressError(f"a malformed escape {m.group(0)!r} in the repository path") from None
        if char not in _UNRESERVED:
            raise RepoAddressError(
                f"an encoded {char!r} ({m.group(0)}) in the repository path: write the address plainly"
            )
        return char

    return _ESCAPE.sub(one, path)


def _segments(path: str, *, pattern: bool, keep_git: bool = False) -> list[str]:
    """The path's segments (``path`` without its leading ``/``), checked; ``.git`` dropped."""
    segments = path.rstrip("/").split("/") if path.rstrip("/") else []
    for i, seg in enumerate(segments):
        if seg in (".", ".."):
            raise RepoAddressError(f"a {seg!r} segment in the repository path")
        if seg == "":
            raise RepoAddressError("an empty segment ('//') in the repository path")
        if seg.endswith("."):
            raise RepoAddressError(f"the path segment {seg!r} ends with a dot")
        if not _PCHAR.match(seg):
            raise RepoAddressError(f"the path segment {seg!r} has a character a repository path cannot have")
        if seg == "**" and (not pattern or i != len(segments) - 1):
            raise RepoAddressError("'**' is only allowed as the last segment of an allow-list entry")
    if not keep_git and segments and segments[-1].endswith(".git") and len(segments[-1]) > 4:
        segments[-1] = segments[-1][:-4]
        if segments[-1].endswith("."):
            raise RepoAddressError(f"the path segment {segments[-1]!r}.git ends with a dot")
    _refuse_git_dir(segments)
    return segments


def _host(host: str, *, pattern: bool) -> str:
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    if not host or not _HOST.match(host) or ("*" in host and not pattern):
        raise RepoAddressError(f"{host!r} is not a host name")
    return host


def _url(text: str, *, pattern: bool, resolve: bool, keep_git: bool) -> str:
    if "?" in text or "#" in text:
        raise RepoAddressError("a query ('?') or fragment ('#') in the repository URL")
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise RepoAddressError(f"the scheme {scheme!r} is not one of {', '.join(DEFAULT_PORTS)}")
    netloc = parts.netloc
    if "%" in netloc:
        raise RepoAddressError("an escape ('%') in the URL's user or host")
    user = ""
    if "@" in netloc:
        userinfo, netloc = netloc.rsplit("@", 1)
        if ":" in userinfo:
            raise RepoAddressError("a password in the repository URL: use a credential helper on the runner")
        if not _USER.match(userinfo):
            raise RepoAddressError(f"{userinfo!r} is not a user name")
        user = userinfo + "@"
    try:
        port = parts.port
    except ValueError:
        raise RepoAddressError("the URL's port is not a number from 0 to 65535") from None
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal: urlsplit took its brackets off
        host = f"[{host}]"
    if scheme == "file":
        if user or port is not None or host not in ("", "localhost"):
            raise RepoAddressError("a file:// URL names a path on the runner: file:///path")
        path = _decode_once(parts.path)
        return "file://" + _local(path, pattern=pattern, resolve=resolve, absolute=True)
    host = _host(host, pattern=pattern)
    if host.startswith("-"):
        raise RepoAddressError(f"the host {host!r} starts with '-'")
    if port == 0:
        raise RepoAddressError("port 0 in the repository URL")
    where = f":{port}" if port is not None and port != DEFAULT_PORTS[scheme] else ""
    segments = _segments(_decode_once(parts.path).removeprefix("/"), pattern=pattern, keep_git=keep_git)
    if not segments:
        raise RepoAddressError("the repository URL has no path")
    return f"{scheme}://{user}{host}{where}/" + "/".join(segments)


def _scp(text: str, *, pattern: bool, keep_git: bool) -> str:
    authority, path = text.split(":", 1)
    user = ""
    if "@" in authority:
        user, authority = authority.rsplit("@", 1)
        if not _USER.match(user):
            raise RepoAddressError(f"{user!r} is not a user name")
        user += "@"
    host = _host(authority, pattern=pattern)
    if host.startswith("-") or path.startswith("-"):
        raise RepoAddressError("a host or path that starts with '-' (an ssh option)")
    if "%" in path:
        raise RepoAddressError("'%' in an scp-like address (git does not decode it there)")
    lead = "/" if path.startswith("/") else ""
    segments = _segments(path.removeprefix("/"), pattern=pattern, keep_git=keep_git)
    if not segments:
        raise RepoAddressError("the scp-like address has no path")
    return f"{user}{host}:{lead}" + "/".join(segments)


def _local(text: str, *, pattern: bool, resolve: bool, absolute: bool = False) -> str:
    """A local path: ``..`` refused in a repository (allowed in an entry), then made absolute with
    symlinks resolved; in an entry, only the part before the first ``*`` segment is resolved."""
    if absolute and not text.startswith("/"):
        raise RepoAddressError("a file:// URL needs an absolute path: file:///path")
    raw = text.split("/")
    if not pattern:
        for seg in raw:
            if seg == "..":
                raise RepoAddressError("a '..' segment in the repository path: give the absolute path")
            if seg.endswith(".") and seg != ".":
                raise RepoAddressError(f"the path segment {seg!r} ends with a dot")
    _refuse_git_dir(raw)
    if not resolve:
        return text
    first_glob = next((i for i, seg in enumerate(raw) if "*" in seg), len(raw))
    base = os.path.realpath(os.path.expanduser("/".join(raw[:first_glob]) or "/"))
    rest = [seg for seg in raw[first_glob:] if seg]
    if any(seg in (".", "..") for seg in rest):
        raise RepoAddressError("'.' or '..' after a '*' in an allow-list entry")
    if rest and "**" in rest[:-1]:
        raise RepoAddressError("'**' is only allowed as the last segment of an allow-list entry")
    _refuse_git_dir(base.split("/"))  # a symlink, or '..' in an entry, may resolve to one
    return "/".join([base.rstrip("/"), *rest]) if rest else base


def source_errors(sides: dict[str, object]) -> list[dict[str, object]]:
    """Pydantic-style errors (``{"loc", "msg", "type"}``) for each side whose ``source.repo`` is in
    a refused form, checked without touching the file system (``resolve=False``): the server's
    check at submit time (422 naming ``<side>.source.repo``). ``sides``: side name -> ``SideSpec``.
    """
    errors: list[dict[str, object]] = []
    for side, variant in sides.items():
        source = getattr(variant, "source", None)
        if source is None:
            continue
        try:
            canonical_repo(source.repo, resolve=False)
        except RepoAddressError as exc:
            errors.append({"loc": (side, "source", "repo"), "msg": str(exc), "type": "value_error"})
    return errors
