"""Bearer tokens with scopes, stored as SHA-256 digests.

Tokens are ``secrets.token_urlsafe(32)`` (32 random bytes, 256 bits): a guessing attack is
hopeless, so a fast unsalted hash is the right store (as GitHub does for its tokens); a slow
password hash would only cost CPU on every request. Plain tokens are returned once by
``create_token`` and never stored or logged.

Scopes: ``admin`` implies ``submit`` implies ``read``. ``runner`` is separate: a runner token is
bound to one runner row (its leases), and through it to one node (``runners.node_name``,
``kernelab.service.server.runner_identity``); only runner tokens may claim and post results.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from kernelab.service.server import models

Scope = Literal["read", "submit", "admin", "runner"]
SCOPES: tuple[Scope, ...] = ("read", "submit", "admin", "runner")
_IMPLIES: dict[str, frozenset[str]] = {
    "admin": frozenset({"admin", "submit", "read"}),
    "submit": frozenset({"submit", "read"}),
    "read": frozenset({"read"}),
    "runner": frozenset({"runner"}),
}
TOKEN_BYTES = 32  # secrets.token_urlsafe(32): 256 random bits


@dataclass(frozen=True)
class Principal:
    """Who made a request: the token's row id, name, effective scopes and runner (if any), the
    device type ("cpu"/"cuda") that runner registered with (None when not a runner or unknown),
    and the node that runner is bound to (``runners.node_name``; None: not bound yet)."""

    token_id: int
    name: str
    scopes: frozenset[str]
    runner_id: int | None = None
    device_type: str | None = None
    node_name: str | None = None
    benchmarks_sha256: str | None = None  # the runner's stored advertisement (kernelab.service.server.offers)

    def has(self, scope: Scope) -> bool:
        """Whether this principal's scopes (after implication) include ``scope``."""
        return scope in self.scopes


def hash_token(token: str) -> str:
    """SHA-256 hex digest (64 chars) of a plain token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def effective_scopes(scopes: Iterable[str]) -> frozenset[str]:
    """Expand implied scopes: ``{"admin"} -> {"admin", "submit", "read"}``.

    Raises ``ValueError`` for an unknown scope name.
    """
    out: set[str] = set()
    for scope in scopes:
        if scope not in _IMPLIES:
            raise ValueError(f"unknown scope {scope!r}; known: {list(SCOPES)}")
        out |= _IMPLIES[scope]
    return frozenset(out)


def create_token(
    session: Session, name: str, scopes: Iterable[Scope], *, runner_id: int | None = None
) -> str:
    """Store a new token (hashed) and return the plain token, which is shown only this once.

    Does not commit. Raises ``ValueError`` for an unknown scope.
    """
    scope_list = sorted(set(scopes))
    effective_scopes(scope_list)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    session.add(
        models.Token(name=name, token_sha256=hash_token(token), scopes=scope_list, runner_id=runner_id)
    )
    session.flush()
    return token


def ensure_token(session: Session, token: str, name: str, scopes: Iterable[Scope]) -> models.Token:
    """Make sure ``token`` (a plain token chosen by the operator) exists with ``scopes``.

    Used at start-up for ``KERNELAB_ADMIN_TOKEN``. An existing row with the same digest gets the
    scopes; a revoked one stays revoked (a restart must not bring a leaked, revoked admin token
    back: the operator sets a new ``KERNELAB_ADMIN_TOKEN``). Returns the row, whose
    ``revoked_at`` tells the caller. Does not commit. Raises ``ValueError`` for an unknown scope or
    a token shorter than 16 characters.
    """
    if len(token) < 16:
        raise ValueError("a bootstrap token must be at least 16 characters")
    scope_list = sorted(set(scopes))
    effective_scopes(scope_list)
    digest = hash_token(token)
    row = session.scalar(select(models.Token).where(models.Token.token_sha256 == digest))
    if row is None:
        row = models.Token(name=name, token_sha256=digest, scopes=scope_list)
        session.add(row)
    elif row.revoked_at is None:
        row.scopes = sorted(set(row.scopes) | set(scope_list))
    session.flush()
    return row


_tokens, _runners = models.Base.metadata.tables["tokens"], models.Base.metadata.tables["runners"]
_BY_DIGEST = (
    select(_tokens.c.id, _tokens.c.name, _tokens.c.scopes, _tokens.c.runner_id,
           _runners.c.node["device_type"].as_string(), _runners.c.node_name, _runners.c.benchmarks_sha256)
    .select_from(_tokens.outerjoin(_runners, _runners.c.id == _tokens.c.runner_id))
    .where(_tokens.c.token_sha256 == bindparam("digest"), _tokens.c.revoked_at.is_(None))
)  # fmt: skip
"""A live token by digest, with its runner's registered device type and bound node: built once (it
runs on every request; building and compiling it per call cost more CPU than the query)."""


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal of a plain bearer token, or None when it is unknown or revoked.

    One indexed read (``_BY_DIGEST``); for a runner token it also gives the runner's registered
    device type (used by claims) and the node it is bound to (``kernelab.service.server.runner_identity``).
    """
    row = session.execute(_BY_DIGEST, {"digest": hash_token(token)}).one_or_none()
    if row is None:
        return None
    token_id, name, scopes, runner_id, device_type, node_name, offers_sha = row
    return Principal(token_id, name, effective_scopes(scopes), runner_id, device_type, node_name, offers_sha)


def revoke_token(session: Session, token_id: int) -> bool:
    """Mark a token revoked; False when there is no such token. Does not commit."""
    row = session.get(models.Token, token_id)
    if row is None:
        return False
    row.revoked_at = models.utcnow()
    return True
