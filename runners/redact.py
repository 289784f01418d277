"""Error text that leaves a runner node: bounded, and without the daemon's secrets or environment.

A job's failure message carries the tail of its output, which is output of code a submit token
chose (``sh -c 'env'`` in an install step). Before the daemon posts it (readable with a read
token), ``redact`` replaces

* every secret value the daemon knows (its tokens; values of its variables whose name looks like a
  credential, ``kernelab.runners.jobenv.is_secret_name``) wherever it appears, and
* every ``NAME=value`` line of the daemon's environment (an ``env`` dump) by ``NAME=[redacted]``,

then keeps at most ``MAX_ERROR_CHARS`` characters (the head, which says why, and the tail).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from kernelab.runners.jobenv import is_secret_name

MAX_ERROR_CHARS = 6000  # 6 KB: the reason line plus ~4,000 characters of worker stderr
MIN_SECRET_CHARS = 6  # shorter values ("1", "true") are too common to replace everywhere
REDACTED = "[redacted]"
_ENV_LINE = re.compile(r"^(?:declare -x |export )?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.MULTILINE)


def secret_values(env: Mapping[str, str], known: Iterable[str | None] = ()) -> list[str]:
    """``known`` (tokens the daemon holds) plus the values of ``env``'s credential-like names, each
    at least ``MIN_SECRET_CHARS`` long, longest first (a secret containing another is replaced
    whole)."""
    values = {v for v in known if v and len(v) >= MIN_SECRET_CHARS}
    values |= {v for k, v in env.items() if is_secret_name(k) and len(v) >= MIN_SECRET_CHARS}
    return sorted(values, key=len, reverse=True)


def bound(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text`` cut to at most ``limit`` characters: its first third and its last part around a
    ``[... N characters cut ...]`` line (the head says why, the tail what happened last)."""
    if len(text) <= limit:
        return text
    head = limit // 3
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    tail = max(0, limit - head - len(marker))
    return text[:head] + marker + (text[-tail:] if tail else "")


def redact(
    text: str,
    *,
    secrets: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
    limit: int = MAX_ERROR_CHARS,
) -> str:
    """``text`` with ``secrets`` (see ``secret_values``) replaced by ``REDACTED``, every line
    ``NAME=value`` whose ``NAME`` is a variable of ``env`` (the daemon's environment; also with a
    ``export ``/``declare -x `` prefix) shown as ``NAME=[redacted]``, then ``bound`` to ``limit``
    characters. Never raises."""
    for value in secrets:
        if value:
            text = text.replace(value, REDACTED)
    if env:
        names = set(env)
        text = _ENV_LINE.sub(
            lambda m: f"{m.group(1)}={REDACTED}" if m.group(1) in names else m.group(0), text
        )
    return bound(text, limit)
