"""A small Chrome DevTools Protocol client over a WebSocket on a given socket.

The socket is one `SandboxNet.connect()` returned: the viewer's Chromium
listens on its own sandbox's loopback only, so no host TCP port exists that
the product (or anything else) could reach. Everything the browser sends is
treated as hostile: frames and messages are size-bounded before they are
buffered, JSON is parsed only from bounded text, and a protocol error closes
the connection.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from corral.errors import CorralError

__all__ = ["MAX_MESSAGE", "CdpClient", "CdpError", "http_get_json"]

#: The largest CDP message read (a base64 JPEG frame of a 2560x1600 view fits).
MAX_MESSAGE = 12 * 1024 * 1024
_MAX_HEAD = 16 * 1024


class CdpError(CorralError, ConnectionError):
    """The DevTools connection failed, misbehaved or answered an error."""


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
        raise CdpError("DevTools: no HTTP head") from exc
    if len(head) > _MAX_HEAD:
        raise CdpError("DevTools: HTTP head too long")
    return head


async def http_get_json(sock: socket.socket, path: str, host: str, limit: int = 256 * 1024) -> Any:
    """GET `path` over `sock` (HTTP/1.0) and parse the bounded JSON body."""
    sock.setblocking(False)
    reader, writer = await asyncio.open_connection(sock=sock, limit=_MAX_HEAD)
    try:
        # Chromium answers nothing to HTTP/1.0 or a Host without its port.
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        head = await _read_head(reader)
        if not head.startswith(b"HTTP/1.1 200") and not head.startswith(b"HTTP/1.0 200"):
            raise CdpError(f"DevTools: GET {path} -> {head[:40]!r}")
        body = await reader.read(limit + 1)
        if len(body) > limit:
            raise CdpError("DevTools: answer too long")
        return json.loads(body)
    except ValueError as exc:
        raise CdpError("DevTools: answer is not JSON") from exc
    finally:
        writer.close()


class CdpClient:
    """One WebSocket to a DevTools target; `call()` and event handlers.

    Handlers run on the client's loop and must not block; an exception in
    one closes the connection (the view is then dead, never half-working).
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._next = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._handlers: dict[str, Callable[[dict[str, Any]], None]] = {}
        self._task: asyncio.Task[None] | None = None
        self.closed = asyncio.Event()

    @classmethod
    async def connect(cls, sock: socket.socket, path: str, host: str) -> CdpClient:
        if not path.startswith("/devtools/") or any(c in path for c in "\r\n "):
            raise CdpError(f"DevTools: unexpected target path {path[:80]!r}")
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=_MAX_HEAD)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            (
                f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        await writer.drain()
        head = await _read_head(reader)
        if not head.startswith(b"HTTP/1.1 101"):
            writer.close()
            raise CdpError(f"DevTools: no WebSocket upgrade ({head[:40]!r})")
        client = cls(reader, writer)
        client._task = asyncio.get_running_loop().create_task(client._read_loop())
        return client

    def on(self, method: str, handler: Callable[[dict[str, Any]], None]) -> None:
        self._handlers[method] = handler

    async def call(
        self, method: str, params: dict[str, Any] | None = None, timeout_s: float = 10.0
    ) -> dict[str, Any]:
        if self.closed.is_set():
            raise CdpError("DevTools: connection closed")
        self._next += 1
        mid = self._next
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[mid] = fut
        msg = json.dumps({"id": mid, "method": method, "params": params or {}})
        self._send(msg.encode())
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError as exc:
            raise CdpError(f"DevTools: {method} timed out") from exc
        finally:
            self._pending.pop(mid, None)

    def _send(self, payload: bytes, opcode: int = 0x1) -> None:
        mask = os.urandom(4)
        n = len(payload)
        if n < 126:
            head = struct.pack("!BB", 0x80 | opcode, 0x80 | n)
        elif n < 1 << 16:
            head = struct.pack("!BBH", 0x80 | opcode, 0x80 | 126, n)
        else:
            head = struct.pack("!BBQ", 0x80 | opcode, 0x80 | 127, n)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self._writer.write(head + mask + masked)

    async def _frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = await self._reader.readexactly(2)
        if b1 & 0x80:
            raise CdpError("DevTools: masked frame from the server")
        n = b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self._reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self._reader.readexactly(8))
        if n > MAX_MESSAGE:
            raise CdpError("DevTools: frame too large")
        return bool(b0 & 0x80), b0 & 0x0F, await self._reader.readexactly(n)

    async def _message(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            fin, op, data = await self._frame()
            if op == 0x8:
                raise CdpError("DevTools: closed by the browser")
            if op == 0x9:
                self._send(data, 0xA)
                continue
            if op == 0xA:
                continue
            size += len(data)
            if size > MAX_MESSAGE:
                raise CdpError("DevTools: message too large")
            parts.append(data)
            if fin:
                return b"".join(parts)

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
                method = msg.get("method")
                params = msg.get("params")
                handler = self._handlers.get(method) if isinstance(method, str) else None
                if handler is not None and isinstance(params, dict):
                    handler(params)
        except (CdpError, OSError, ValueError, asyncio.IncompleteReadError):
            pass
        finally:
            self.closed.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(CdpError("DevTools: connection closed"))
            self._writer.close()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        self._writer.close()
        self.closed.set()
