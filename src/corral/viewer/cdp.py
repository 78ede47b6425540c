"""A small Chrome DevTools Protocol client over Chromium's `--remote-debugging-pipe`.

Chromium reads commands from its fd 3 and writes answers and events to its
fd 4, each message one JSON text ended by a NUL byte. In the viewer sandbox
those are the sandbox's stdin and stdout, pipes only corral holds: no
DevTools port exists at all, so the product's JavaScript inside that
Chromium has nothing to `fetch` or open a WebSocket to. Everything the
browser sends is treated as hostile: a message is bounded (the reader's
limit) before it is buffered, JSON is parsed only from bounded text, and a
protocol error closes the connection.

The pipe is the browser's own endpoint, not a page's: `attach_page()`
attaches to the first page target with a flat session, and `call()` and the
event handlers then speak to that session only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

from corral.errors import CorralError

__all__ = ["MAX_MESSAGE", "CdpClient", "CdpError"]

#: The largest CDP message read (a base64 JPEG frame of a 2560x1600 view fits).
MAX_MESSAGE = 12 * 1024 * 1024


class CdpError(CorralError, ConnectionError):
    """The DevTools connection failed, misbehaved or answered an error."""


class CdpClient:
    """The browser's DevTools pipe; `call()` and event handlers of one page session.

    Handlers run on the client's loop and must not block; an exception in
    one closes the connection (the view is then dead, never half-working).
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        transport: asyncio.WriteTransport,
        closers: list[Callable[[], None]],
    ) -> None:
        self._reader = reader
        self._transport = transport
        self._closers = closers
        self._next = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._task: asyncio.Task[None] | None = None
        #: The attached page's flat session id; events of other sessions are dropped.
        self.session: str | None = None
        self.closed = asyncio.Event()

    @classmethod
    async def open(cls, read_fd: int, write_fd: int) -> CdpClient:
        """Own `read_fd` (Chromium's fd 4) and `write_fd` (its fd 3) from now on."""
        loop = asyncio.get_running_loop()
        closers: list[Callable[[], None]] = []
        try:
            # The limit bounds readuntil(): a message without its NUL within
            # MAX_MESSAGE bytes raises instead of growing the buffer.
            reader = asyncio.StreamReader(limit=MAX_MESSAGE)
            rfile = os.fdopen(read_fd, "rb", buffering=0)
            closers.append(rfile.close)
            rtrans, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), rfile
            )
            closers.insert(0, rtrans.close)
            wfile = os.fdopen(write_fd, "wb", buffering=0)
            closers.append(wfile.close)
            wtrans, _ = await loop.connect_write_pipe(asyncio.Protocol, wfile)
            closers.insert(0, wtrans.close)
        except BaseException:
            for close in closers:
                with contextlib.suppress(OSError):
                    close()
            raise
        client = cls(reader, wtrans, closers)
        client._task = loop.create_task(client._read_loop())
        return client

    def on(self, method: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self._handlers[method] = handler

    async def attach_page(self, timeout_s: float = 30.0) -> str:
        """Attach to the browser's first page target (flat session); its session id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = await self.call("Target.getTargets", browser=True)
            infos = got.get("targetInfos")
            pages = [
                t
                for t in (infos if isinstance(infos, list) else [])
                if isinstance(t, dict) and t.get("type") == "page"
            ]
            tid = pages[0].get("targetId") if pages else None
            if isinstance(tid, str) and len(tid) <= 128:
                att = await self.call(
                    "Target.attachToTarget", {"targetId": tid, "flatten": True}, browser=True
                )
                sid = att.get("sessionId")
                if not isinstance(sid, str) or not 0 < len(sid) <= 128:
                    raise CdpError("DevTools: no session id")
                self.session = sid
                return sid
            await asyncio.sleep(0.1)
        raise CdpError(f"the viewer's Chromium has no page after {timeout_s:g}s")

    async def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        timeout_s: float = 10.0,
        *,
        browser: bool = False,
    ) -> dict[str, Any]:
        """Call `method` on the page session (`browser=True`: on the browser itself)."""
        if self.closed.is_set():
            raise CdpError("DevTools: connection closed")
        self._next += 1
        mid = self._next
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[mid] = fut
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if not browser:
            if self.session is None:
                raise CdpError("DevTools: no page attached")
            msg["sessionId"] = self.session
        # A NUL cannot occur in json.dumps output (it escapes control characters).
        self._transport.write(json.dumps(msg).encode() + b"\0")
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError as exc:
            raise CdpError(f"DevTools: {method} timed out") from exc
        finally:
            self._pending.pop(mid, None)

    async def _message(self) -> bytes:
        try:
            return (await self._reader.readuntil(b"\0"))[:-1]
        except asyncio.LimitOverrunError as exc:
            raise CdpError("DevTools: message too large") from exc
        except asyncio.IncompleteReadError as exc:
            raise CdpError("DevTools: closed by the browser") from exc

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = json.loads(await self._message())
                if not isinstance(msg, dict):
                    raise CdpError("DevTools: message is not an object")
                mid = msg.get("id")
                if isinstance(mid, int):
                    fut = self._pending.get(mid)
                    if fut is not None and not fut.done():
                        if "error" in msg:
                            fut.set_exception(
                                CdpError(f"DevTools error: {str(msg['error'])[:200]}")
                            )
                        else:
                            result = msg.get("result")
                            fut.set_result(result if isinstance(result, dict) else {})
                    continue
                if self.session is None or msg.get("sessionId") != self.session:
                    continue
                method = msg.get("method")
                params = msg.get("params")
                handler = self._handlers.get(method) if isinstance(method, str) else None
                if handler is not None and isinstance(params, dict):
                    handler(params)
        except (CdpError, OSError, ValueError):
            pass
        finally:
            self.closed.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(CdpError("DevTools: connection closed"))
            self._close_pipes()

    def _close_pipes(self) -> None:
        closers, self._closers = self._closers, []
        for close in closers:
            with contextlib.suppress(OSError):
                close()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._close_pipes()
        self.closed.set()
