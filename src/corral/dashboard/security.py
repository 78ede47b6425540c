"""The dashboard's gate: loopback Host, a per-start token, Origin and CSRF checks, headers.

Every request passes `security_middleware`, which admits it only when

- its `Host` is `127.0.0.1:PORT` or `localhost:PORT` (PORT: the socket the
  request arrived on), so a DNS-rebound name pointing at 127.0.0.1 gets 403;
- it carries the token, either as the `corral_dash` cookie or once as
  `?token=` (answered by a redirect that sets the cookie and drops the token
  from the address bar and history);
- for POST: `Origin` is the dashboard's own origin and the form's `csrf`
  field equals the per-start CSRF token; for a WebSocket handshake: `Origin`
  is the dashboard's own origin.

and stamps the security headers on every response it lets out, errors,
refusals and redirects included. Routes added by extensions (the viewer)
are in the same application, so the same middleware covers them; code that
handles a request outside it calls `check_request`.
"""

from __future__ import annotations

import hmac
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from aiohttp import web

__all__ = [
    "AUTH_KEY",
    "COOKIE",
    "SECURITY_HEADERS",
    "Auth",
    "check_request",
    "own_origin",
    "security_middleware",
    "stamp_headers",
]

COOKIE: Final = "corral_dash"

SECURITY_HEADERS: Final[Mapping[str, str]] = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data: blob:; frame-ancestors 'none';"
        " base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


@dataclass(frozen=True, slots=True)
class Auth:
    """The secrets of one dashboard start."""

    token: str
    csrf: str

    @staticmethod
    def new(token: str) -> Auth:
        return Auth(token=token, csrf=secrets.token_urlsafe(32))


AUTH_KEY: Final = web.AppKey("corral_dashboard_auth", Auth)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _port(request: web.Request) -> int | None:
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if isinstance(sock, tuple) and len(sock) >= 2 and isinstance(sock[1], int):
        return sock[1]
    return None


def own_origin(request: web.Request) -> str | None:
    """`http://HOST:PORT` when the Host header names this loopback socket, else None."""
    port = _port(request)
    host = request.headers.get("Host", "")
    if port is None or host not in (f"127.0.0.1:{port}", f"localhost:{port}"):
        return None
    return f"http://{host}"


def _same(given: str | None, expected: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _forbidden(why: str) -> web.HTTPForbidden:
    return web.HTTPForbidden(text=f"403: {why}\n")


def check_request(request: web.Request, auth: Auth, *, csrf: str | None = None) -> str | None:
    """None when `request` may proceed, else why it is refused (pure; no body is read).

    `csrf`: the form's CSRF field for a POST (checked only for POST).
    """
    origin = own_origin(request)
    if origin is None:
        return "wrong Host"
    if not (
        _same(request.cookies.get(COOKIE), auth.token)
        or _same(request.query.get("token"), auth.token)
    ):
        return "no valid token"
    upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
    if (request.method not in ("GET", "HEAD") or upgrade) and request.headers.get(
        "Origin"
    ) != origin:
        return "cross-origin request"
    if request.method not in ("GET", "HEAD") and not _same(csrf, auth.csrf):
        return "missing or wrong CSRF token"
    return None


async def _gate(request: web.Request, handler: Handler) -> web.StreamResponse:
    auth = request.app[AUTH_KEY]
    csrf: str | None = None
    if request.method not in ("GET", "HEAD"):
        if request.content_length is not None and request.content_length > 4096:
            raise _forbidden("request body too large")
        if request.headers.get("Origin") == own_origin(request):
            form = await request.post()
            field = form.get("csrf")
            csrf = field if isinstance(field, str) else None
    why = check_request(request, auth, csrf=csrf)
    if why is not None:
        raise _forbidden(why)
    if request.method == "GET" and "token" in request.query:
        rest = str(request.rel_url.without_query_params("token"))
        # A path such as `//host/` would be a redirect to another site.
        resp = web.HTTPSeeOther(location=rest if not rest.startswith("//") else "/")
        resp.set_cookie(COOKIE, auth.token, httponly=True, samesite="Strict", path="/")
        raise resp
    return await handler(request)


@web.middleware
async def security_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The gate; an unexpected error becomes a bare 500."""
    try:
        return await _gate(request, handler)
    except web.HTTPException:
        raise
    except Exception:
        # Fail closed and say nothing of the cause: the text may come from a run.
        raise web.HTTPInternalServerError(text="500: internal error\n") from None


async def stamp_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: every response, streamed, static or error, gets the headers."""
    response.headers.update(SECURITY_HEADERS)
