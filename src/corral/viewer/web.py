"""The viewer's routes (aiohttp) and a minimal standalone app for `corral view`.

The user's browser receives only these routes' bytes: corral's static page,
script and style, JPEG frames corral validated, and JSON text events whose
product text the page renders with `textContent`. `install()` mounts the
routes on any app (the dashboard's at merge); `standalone_app()` adds the
token, the security headers and the Origin check it needs on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import secrets
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Final

from aiohttp import WSMsgType, web

from corral.viewer.core import Viewer, ViewerEvent
from corral.viewer.inputs import InputRejected, parse_input

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

__all__ = ["COOKIE", "SECURITY_HEADERS", "VIEWER_KEY", "install", "new_token", "standalone_app"]

VIEWER_KEY: Final = web.AppKey("corral_viewer", Viewer)
ORIGIN_KEY: Final = web.AppKey("corral_viewer_origin", str)


class _Sockets:
    def __init__(self) -> None:
        self.open: set[web.WebSocketResponse] = set()


SOCKETS_KEY: Final = web.AppKey("corral_viewer_sockets", _Sockets)
COOKIE = "corral_viewer"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}
_STATIC = {
    "viewer.js": "text/javascript",
    "viewer.css": "text/css",
}


def _asset(name: str) -> bytes:
    return resources.files("corral.viewer").joinpath("static").joinpath(name).read_bytes()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def install(app: web.Application, viewer: Viewer, *, origin: str | None = None) -> None:
    """Add `/viewer`, `/viewer/static/*` and `/viewer/ws` to `app`.

    `origin`: the only `Origin` a WebSocket handshake may carry (the page's
    own, e.g. `http://127.0.0.1:8765`); None leaves that check to the app.
    """
    app[VIEWER_KEY] = viewer
    app[SOCKETS_KEY] = _Sockets()

    async def close_sockets(app: web.Application) -> None:
        # Open WebSockets would hold the server's shutdown until they time out.
        for ws in list(app[SOCKETS_KEY].open):
            await ws.close()

    app.on_shutdown.append(close_sockets)
    if origin is not None:
        app[ORIGIN_KEY] = origin
    page = _asset("viewer.html")
    assets = {name: (_asset(name), ctype) for name, ctype in _STATIC.items()}

    async def viewer_page(_request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        found = assets.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        return web.Response(body=found[0], content_type=found[1], charset="utf-8")

    app.router.add_get("/viewer", viewer_page)
    app.router.add_get("/viewer/static/{name}", static)
    app.router.add_get("/viewer/ws", _ws_handler)


async def _ws_handler(request: web.Request) -> web.WebSocketResponse:
    want = request.app.get(ORIGIN_KEY)
    if want is not None and request.headers.get("Origin") != want:
        raise web.HTTPForbidden(text="bad Origin")
    viewer = request.app[VIEWER_KEY]
    ws = web.WebSocketResponse(max_msg_size=8192, heartbeat=30.0)
    await ws.prepare(request)
    request.app[SOCKETS_KEY].open.add(ws)
    fq, eq = viewer.subscribe()
    history = list(viewer.events)

    async def pump() -> None:
        for ev in history:
            await ws.send_str(ev.to_json())
        frame = await viewer.current_frame()
        if frame is not None:
            await ws.send_bytes(frame)
        get_f = asyncio.ensure_future(fq.get())
        get_e = asyncio.ensure_future(eq.get())
        try:
            while True:
                done, _ = await asyncio.wait({get_f, get_e}, return_when=asyncio.FIRST_COMPLETED)
                if get_e in done:
                    await ws.send_str(get_e.result().to_json())
                    get_e = asyncio.ensure_future(eq.get())
                if get_f in done:
                    await ws.send_bytes(get_f.result())
                    get_f = asyncio.ensure_future(fq.get())
        finally:
            get_f.cancel()
            get_e.cancel()

    sender = asyncio.ensure_future(pump())
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                break
            try:
                ev = parse_input(msg.data, viewer.width, viewer.height)
            except InputRejected as exc:
                refused = ViewerEvent("refused", "error", str(exc), 0.0)
                await ws.send_str(refused.to_json())
                continue
            with contextlib.suppress(Exception):
                await viewer.dispatch(ev)
    finally:
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        viewer.unsubscribe(fq, eq)
        request.app[SOCKETS_KEY].open.discard(ws)
    return ws


def standalone_app(viewer: Viewer, token: str, origin: str) -> web.Application:
    """The viewer alone, behind `token` (query once, then an HttpOnly cookie)."""

    @web.middleware
    async def auth(request: web.Request, handler: _Handler) -> web.StreamResponse:
        given = request.query.get("token")
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            resp = web.HTTPSeeOther(location=request.path)
            resp.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
            raise resp
        cookie = request.cookies.get(COOKIE, "")
        if not hmac.compare_digest(cookie.encode(), token.encode()):
            raise web.HTTPForbidden(text="forbidden: open the URL corral printed")
        return await handler(request)

    async def headers(_request: web.Request, response: web.StreamResponse) -> None:
        response.headers.update(SECURITY_HEADERS)

    async def root(_request: web.Request) -> web.Response:
        raise web.HTTPSeeOther(location="/viewer")

    app = web.Application(middlewares=[auth], client_max_size=64 * 1024)
    app.on_response_prepare.append(headers)
    app.router.add_get("/", root)
    install(app, viewer, origin=origin)
    return app
