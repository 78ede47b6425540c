"""The viewer's routes, mounted into the dashboard (`corral view`).

The user's browser receives only these routes' bytes: corral's static page,
script and style, JPEG frames corral validated, and JSON text events whose
product text the page renders with `textContent`. `install()` is a dashboard
extension: the routes sit in the dashboard's application, so its gate (the
loopback Host, the per-start token and cookie, the WebSocket `Origin` check)
and its security headers cover them; the viewer has no gate of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable
from importlib import resources
from typing import Final

from aiohttp import WSMsgType, web

from corral.viewer.core import Viewer, ViewerEvent
from corral.viewer.inputs import InputRejected, parse_input

__all__ = ["VIEWER_KEY", "extension", "install", "new_token"]

VIEWER_KEY: Final = web.AppKey("corral_viewer", Viewer)
VIEWED_RUN_KEY: Final = web.AppKey("corral_viewer_run", str)


class _Sockets:
    def __init__(self) -> None:
        self.open: set[web.WebSocketResponse] = set()


SOCKETS_KEY: Final = web.AppKey("corral_viewer_sockets", _Sockets)
_STATIC = {
    "viewer.js": "text/javascript",
    "viewer.css": "text/css",
}


def _asset(name: str) -> bytes:
    return resources.files("corral.viewer").joinpath("static").joinpath(name).read_bytes()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def install(app: web.Application, viewer: Viewer, *, run_id: str | None = None) -> None:
    """Add `/viewer` (named `VIEWER_ROUTE`), `/viewer/static/*` and `/viewer/ws` to `app`.

    `app` is the dashboard's (`create_app(..., extensions=[extension(...)])`),
    whose middleware authenticates every request and checks the handshake's
    `Origin`. `run_id`: the run whose product `viewer` shows; the page for
    another run (`/viewer?run=OTHER`) is a 404 and the run pages link only it.
    """
    from corral.dashboard.server import VIEWABLE_KEY, VIEWER_ROUTE

    app[VIEWER_KEY] = viewer
    app[SOCKETS_KEY] = _Sockets()
    if run_id is not None:
        app[VIEWED_RUN_KEY] = run_id
        app[VIEWABLE_KEY] = frozenset({run_id})

    async def close_sockets(app: web.Application) -> None:
        # Open WebSockets would hold the server's shutdown until they time out.
        for ws in list(app[SOCKETS_KEY].open):
            await ws.close()

    app.on_shutdown.append(close_sockets)
    page = _asset("viewer.html")
    assets = {name: (_asset(name), ctype) for name, ctype in _STATIC.items()}

    async def viewer_page(request: web.Request) -> web.Response:
        asked = request.query.get("run")
        if asked is not None and asked != request.app.get(VIEWED_RUN_KEY, asked):
            raise web.HTTPNotFound(text="404: this view shows another run\n")
        return web.Response(body=page, content_type="text/html", charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        found = assets.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        return web.Response(body=found[0], content_type=found[1], charset="utf-8")

    app.router.add_get("/viewer", viewer_page, name=VIEWER_ROUTE)
    app.router.add_get("/viewer/static/{name}", static)
    app.router.add_get("/viewer/ws", _ws_handler)


def extension(viewer: Viewer, run_id: str | None = None) -> Callable[[web.Application], None]:
    """`install` as a dashboard extension."""

    def extend(app: web.Application) -> None:
        install(app, viewer, run_id=run_id)

    return extend


async def _ws_handler(request: web.Request) -> web.WebSocketResponse:
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
