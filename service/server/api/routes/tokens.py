"""``/tokens`` (admin): list, create, rotate and revoke bearer tokens.

A plain token is in the answer of ``create`` and ``rotate`` only, once; the server keeps its
SHA-256 digest (``kernelab.service.server.auth``). Rotating issues a new token with the same name, scopes and
runner and revokes the old one in the same transaction, so exactly one of them works at any
moment. A revoked token gets 401 on its next request (tokens are checked on every request).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response, status
from pydantic import BaseModel, Field
from sqlalchemy import func, select

from kernelab.service.contract.schemas import AtDoor, Text
from kernelab.service.server import models
from kernelab.service.server.admin_guard import LAST_ADMIN, is_last_admin
from kernelab.service.server.api.deps import (
    DEFAULT_LIMIT,
    MAX_ROW_ID,
    AdminToken,
    Limit,
    Offset,
    SessionDep,
    page_headers,
)
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.auth import Scope, create_token, hash_token, revoke_token

router = APIRouter(prefix="/tokens", tags=["tokens"], route_class=DoorRoute)

TokenId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="token id")]


class TokenPublic(BaseModel):
    """A token's row without its secret."""

    id: int
    name: str
    scopes: list[str]
    runner_id: int | None = None
    created_at: datetime
    revoked_at: datetime | None = None


class TokensPage(BaseModel):
    data: list[TokenPublic]
    count: int


class TokenCreate(BaseModel):
    """A new token: ``name`` (who holds it) and ``scopes`` (``read`` ⊂ ``submit`` ⊂ ``admin``)."""

    model_config = {"extra": "forbid"}
    name: Annotated[Text, Field(min_length=1), AtDoor(max_length=200)]
    scopes: list[Scope] = Field(min_length=1, max_length=4)


class TokenIssued(TokenPublic):
    """A token row and its plain secret, shown this once."""

    token: str


def _public(row: models.Token) -> TokenPublic:
    return TokenPublic(id=row.id, name=row.name, scopes=list(row.scopes), runner_id=row.runner_id,
                       created_at=row.created_at, revoked_at=row.revoked_at)  # fmt: skip


def _get(session: SessionDep, token_id: int) -> models.Token:
    row = session.get(models.Token, token_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"token {token_id} does not exist")
    return row


def _by_secret(session: SessionDep, plain: str) -> models.Token:
    row = session.scalar(select(models.Token).where(models.Token.token_sha256 == hash_token(plain)))
    assert row is not None  # create_token flushed it
    return row


@router.get("")
def list_tokens(
    request: Request,
    response: Response,
    _: AdminToken,
    session: SessionDep,
    offset: Offset = 0,
    limit: Limit = DEFAULT_LIMIT,
    revoked: bool | None = None,
) -> TokensPage:
    """Tokens, newest first; ``revoked=false`` lists only live ones."""
    where = []
    if revoked is not None:
        where.append(models.Token.revoked_at.is_not(None) if revoked else models.Token.revoked_at.is_(None))
    count = session.scalar(select(func.count()).select_from(models.Token).where(*where)) or 0
    rows = session.scalars(
        select(models.Token).where(*where).order_by(models.Token.id.desc()).offset(offset).limit(limit)
    )
    response.headers.update(page_headers(request, total=count, offset=offset, limit=limit))
    return TokensPage(data=[_public(r) for r in rows], count=count)


@router.post("", status_code=status.HTTP_201_CREATED)
def create(body: TokenCreate, _: AdminToken, session: SessionDep) -> TokenIssued:
    """Issue a token with ``scopes`` (``runner`` tokens come from ``/runners/register``)."""
    if "runner" in body.scopes:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                            "scopes: runner tokens are issued by POST /runners/register")  # fmt: skip
    plain = create_token(session, body.name, body.scopes)
    return TokenIssued(**_public(_by_secret(session, plain)).model_dump(), token=plain)


@router.post("/{token_id}/rotate", status_code=status.HTTP_201_CREATED)
def rotate(token_id: TokenId, _: AdminToken, session: SessionDep) -> TokenIssued:
    """Issue a replacement (same name, scopes, runner) and revoke ``token_id``; 404 unknown,
    409 already revoked, 409 for the only live admin token (its caller would depend on this one
    answer to keep any admin access: ``kernelab.service.server.admin_guard``)."""
    old = _get(session, token_id)
    if old.revoked_at is not None:
        raise HTTPException(status.HTTP_409_CONFLICT, f"token {token_id} is revoked; create a new one")
    if is_last_admin(session, old):
        raise HTTPException(status.HTTP_409_CONFLICT, LAST_ADMIN.format(id=token_id))
    plain = create_token(session, old.name, old.scopes, runner_id=old.runner_id)
    revoke_token(session, token_id)
    session.flush()
    return TokenIssued(**_public(_by_secret(session, plain)).model_dump(), token=plain)


@router.post("/{token_id}/revoke")
def revoke(token_id: TokenId, principal: AdminToken, session: SessionDep) -> TokenPublic:
    """Revoke ``token_id`` (idempotent: a revoked token stays revoked); 404 unknown; 409 for the
    caller's own token (it would lock the caller out mid-request) and for the last live admin
    token (two admins revoking each other at once: ``kernelab.service.server.admin_guard``)."""
    row = _get(session, token_id)
    if token_id == principal.token_id:
        raise HTTPException(status.HTTP_409_CONFLICT, "a token cannot revoke itself; use another admin token")
    if is_last_admin(session, row):
        raise HTTPException(status.HTTP_409_CONFLICT, LAST_ADMIN.format(id=token_id))
    if row.revoked_at is None:
        revoke_token(session, token_id)
        session.flush()
    return _public(row)
