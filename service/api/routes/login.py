"""Dashboard sign-in: ``GET /login?token=`` sets the HttpOnly ``kernelab_token`` cookie.

Mounted at the site root (not under ``/api/v1``) by ``service.app.create_app``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import RedirectResponse

from service.api.deps import TOKEN_COOKIE, SessionDep
from service.auth import authenticate

router = APIRouter(tags=["session"])
COOKIE_MAX_AGE_S = 30 * 24 * 3600  # 30 days


@router.get("/login", response_class=RedirectResponse, status_code=status.HTTP_303_SEE_OTHER)
def login(request: Request, token: Annotated[str, Query(min_length=1, max_length=200)], session: SessionDep):
    """Check ``token`` (needs the read scope), set it as an HttpOnly, SameSite=Lax cookie and
    redirect to ``/``. 401 for an unknown or revoked token, 403 without the read scope."""
    principal = authenticate(session, token)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid or revoked token")
    if not principal.has("read"):
        raise HTTPException(status.HTTP_403_FORBIDDEN, "this token lacks the 'read' scope")
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        TOKEN_COOKIE, token, max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="lax",
        secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


@router.get("/logout", response_class=RedirectResponse, status_code=status.HTTP_303_SEE_OTHER)
def logout():
    """Forget the dashboard cookie and redirect to ``/``."""
    response = RedirectResponse("/", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(TOKEN_COOKIE)
    return response
