"""An extension's routes (the viewer's page and WebSocket) sit behind the same gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from corral.dashboard import VIEWER_ROUTE, create_app
from corral.dashboard.security import SECURITY_HEADERS

pytestmark = pytest.mark.timeout(30)

TOKEN = "t" * 43


def _viewer(app: web.Application) -> None:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="viewer")

    async def socket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str("frame")
        await ws.close()
        return ws

    app.router.add_get("/view", page, name=VIEWER_ROUTE)
    app.router.add_get("/view/ws", socket)


async def _scenario(runs: Path) -> None:
    server = TestServer(create_app(runs, TOKEN, extensions=[_viewer]), host="127.0.0.1")
    await server.start_server()
    origin = f"http://127.0.0.1:{server.port}"
    try:
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as s:
            async with s.get(f"{origin}/view") as r:
                assert r.status == 403
                assert all(r.headers[k] == v for k, v in SECURITY_HEADERS.items())
            cookie = {"Cookie": f"corral_dash={TOKEN}"}
            async with s.get(f"{origin}/view", headers=cookie) as r:
                assert r.status == 200 and await r.text() == "viewer"
                assert all(r.headers[k] == v for k, v in SECURITY_HEADERS.items())
            for bad in ({}, {"Origin": "http://evil.example"}, {"Origin": "null"}):
                with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                    await s.ws_connect(f"{origin}/view/ws", headers={**cookie, **bad})
                assert exc.value.status == 403, bad
            with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                await s.ws_connect(f"{origin}/view/ws", headers={"Origin": origin})
            assert exc.value.status == 403
            async with s.ws_connect(
                f"{origin}/view/ws", headers={**cookie, "Origin": origin}
            ) as ws:
                assert (await ws.receive_str()) == "frame"
            # The run page links the viewer once an extension names a route for it.
            (runs / "r").mkdir(parents=True)
            from corral.run.store import Store

            with Store(runs / "r" / "state.sqlite") as st:
                st.create_run(
                    "r", mission="m", agent="a", provider="p", max_sessions=1, memory_cap=1
                )
            async with s.get(f"{origin}/run/r", headers=cookie) as r:
                assert r.status == 200 and 'href="/view?run=r"' in await r.text()
    finally:
        await server.close()


def test_extension_routes_are_gated(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path / "runs"))


def test_short_token_is_refused(tmp_path: Path) -> None:
    from corral.errors import UsageError

    with pytest.raises(UsageError):
        create_app(tmp_path, "short")
