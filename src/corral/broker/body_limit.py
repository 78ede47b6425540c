"""An ASGI wrapper that refuses request bodies past a byte limit with 413.

The MCP gateway's HTTP app (Starlette) reads a whole request body into memory
before it parses the JSON-RPC in it; this bounds what one request can make it
hold. A declared length past the limit is refused before any of the body is
read; a chunked body is cut off where the count passes the limit (the app
sees a disconnect, and whatever it answers is replaced by the 413).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

__all__ = ["BodyLimit"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


def _declared(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _drain(receive: Receive, declared: int) -> None:
    """Read and drop what the client sends (bounded by time and its declared length).

    Clients send a whole body before they read the answer; refusing
    mid-upload resets the connection and the 413 is lost. Dropped chunk by
    chunk, this costs time, never memory.
    """
    drained = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5.0):
            while drained < declared:
                message = await receive()
                if message["type"] != "http.request":
                    return
                drained += len(message.get("body", b""))
                if not message.get("more_body", False):
                    return


class BodyLimit:
    """`app`, with request bodies over `limit` bytes refused (413); `on_refused(path, why)`."""

    def __init__(self, app: App, limit: int, on_refused: Callable[[str, str], None]) -> None:
        self.app = app
        self.limit = limit
        self.on_refused = on_refused

    async def _refuse(self, scope: Scope, send: Send, why: str) -> None:
        # The refusal is journaled first; a journal failure still refuses.
        try:
            self.on_refused(str(scope.get("path", "")), why)
        finally:
            body = json.dumps({"error": why}).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _declared(scope)
        if declared is not None and declared > self.limit:
            why = f"request body of {declared} bytes is over the {self.limit}-byte limit"
            await _drain(receive, declared)
            await self._refuse(scope, send, why)
            return
        seen = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over and not started:
                return
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.app(scope, limited_receive, guarded_send)
        if over and not started:
            await self._refuse(scope, send, f"request body is over the {self.limit}-byte limit")
