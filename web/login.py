"""Dashboard sign-in and sign-out: ``GET /login`` shows a form, ``POST /login`` (form field
``token``) sets the HttpOnly ``kernelab_token`` cookie, ``POST /logout`` clears it.

Signing in is a POST from this server's own page: a ``GET /login?token=`` that set the cookie
would let any link on another site sign a visitor in as the attacker (login CSRF). A POST whose
``Origin`` is another site, or that the browser marks ``Sec-Fetch-Site: cross-site``/``same-site``,
is refused with 403 (``same_origin``); browsers send ``Origin`` on every form POST, and clients
without one (curl, scripts) are no CSRF victims. ``GET /login?token=`` sets nothing any more.

A dashboard page, so it lives in ``web/`` with the other pages and renders their templates
(``kernelab.web.routes.templates``); the token it checks is the API's (``kernelab.service.server.auth``).
Mounted at the site root (not under ``/api/v1``) by ``kernelab.app.create_app``.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, Request, status
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from kernelab.service.server.api.deps import TOKEN_COOKIE, SessionDep
from kernelab.service.server.api.door import DoorRoute
from kernelab.service.server.auth import authenticate
from kernelab.web.routes import templates

router = APIRouter(tags=["session"], include_in_schema=False, route_class=DoorRoute)
COOKIE_MAX_AGE_S = 30 * 24 * 3600  # 30 days
MAX_TOKEN_CHARS = 200  # longer than any token this server issues (43) or accepts at start-up
LOGIN_FORM_MAX_BYTES = 4096  # a sign-in form is one short field: larger bodies are a 413 before parsing


def same_origin(request: Request) -> bool:
    """Whether a state-changing browser request comes from this server's own pages: its ``Origin``
    (when sent) is the request's own ``scheme://host[:port]`` or ``KERNELAB_PUBLIC_URL``'s, and its
    ``Sec-Fetch-Site`` (when sent) is ``same-origin`` or ``none`` (typed by the user). The Host
    compared with is the one the browser sent, which a cross-site page cannot choose."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    origin = request.headers.get("origin")
    if origin is None:
        return True
    own = {f"{request.url.scheme}://{request.headers.get('host', '')}".lower()}
    public_url = getattr(request.app.state.settings, "public_url", None)
    if public_url:
        parts = urlsplit(public_url)
        own.add(f"{parts.scheme}://{parts.netloc}".lower())
    return origin.lower() in own


def safe_next(value: str | None) -> str:
    """Where to go after signing in: ``value`` when it is a path of this site (``/jobs/3?cell=1``),
    else ``/`` (an absolute or scheme-relative URL, ``//evil.example``, a backslash trick: an open
    redirect otherwise)."""
    if not value or not value.startswith("/") or value.startswith("//") or "\\" in value:
        return "/"
    if any(ord(ch) < 0x20 for ch in value) or len(value) > 2000:
        return "/"
    return value


def sign_in_form(
    request: Request, *, message: str = "", status_code: int = status.HTTP_200_OK, next_url: str = "/"
) -> HTMLResponse:
    """The sign-in page (``login.html``) with ``message`` (empty: none) and the page to return to."""
    context = {"message": message, "next_url": safe_next(next_url)}
    return templates.TemplateResponse(request, "login.html", context, status_code=status_code)


_form = sign_in_form


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/") -> HTMLResponse:
    """The sign-in form; ``next``: the page of this site to open after signing in. A ``?token=`` in
    the URL is ignored (it signs nobody in)."""
    ignored = "token" in request.query_params
    message = "Sign-in links are no longer accepted: paste the token." if ignored else ""
    return _form(request, message=message, next_url=next)


@router.post(
    "/login",
    response_class=RedirectResponse,
    status_code=status.HTTP_303_SEE_OTHER,
    max_body_size=LOGIN_FORM_MAX_BYTES,
)
def login(
    request: Request,
    session: SessionDep,
    token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
) -> Response:
    """Check ``token`` (needs the read scope), set it as an HttpOnly, SameSite=Lax cookie (a link
    from a pull request still opens signed in) and redirect (303) to ``next`` (a path of this site,
    ``safe_next``; default ``/``). The form again, with a message, for every refusal: 422 for an
    empty or missing token, 401 for an unknown, revoked or over-long one (longer than
    ``MAX_TOKEN_CHARS``: no token is), 403 without the read scope or from another site's page
    (``same_origin``)."""
    if not same_origin(request):
        return _form(request, message="Refused: this sign-in came from another site.", status_code=403)
    token = token.strip()
    if not token:
        return _form(request, message="Paste a token: the field was empty.", next_url=next,
                     status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)  # fmt: skip
    principal = authenticate(session, token) if len(token) <= MAX_TOKEN_CHARS else None
    if principal is None:
        return _form(request, message="Invalid or revoked token.", next_url=next,
                     status_code=status.HTTP_401_UNAUTHORIZED)  # fmt: skip
    if not principal.has("read"):
        return _form(request, message="This token lacks the 'read' scope.", next_url=next,
                     status_code=status.HTTP_403_FORBIDDEN)  # fmt: skip
    response = RedirectResponse(safe_next(next), status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        TOKEN_COOKIE, token, max_age=COOKIE_MAX_AGE_S, httponly=True, samesite="lax",
        secure=request.url.scheme == "https",
    )  # fmt: skip
    return response


@router.post("/logout", response_class=RedirectResponse, status_code=status.HTTP_303_SEE_OTHER)
def logout(request: Request) -> Response:
    """Forget the dashboard cookie and redirect (303) to ``/login``; 403 from another site's page."""
    if not same_origin(request):
        return _form(request, message="Refused: this sign-out came from another site.", status_code=403)
    response = RedirectResponse("/login", status_code=status.HTTP_303_SEE_OTHER)
    response.delete_cookie(TOKEN_COOKIE, httponly=True, samesite="lax")
    return response
