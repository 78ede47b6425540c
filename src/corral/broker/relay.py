"""The byte pump under every tunnel (HTTP CONNECT in proxy.py, SOCKS5 in socks.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

__all__ = ["first_failure", "pump"]


async def pump(
    src: socket.socket,
    dst: socket.socket,
    counts: list[int],
    index: int,
    *,
    idle_s: float | None,
    bufsize: int,
) -> None:
    """Copy `src` to `dst` until `src` ends, adding the bytes to `counts[index]`.

    TimeoutError once `src` sends nothing for `idle_s`; at `src`'s end `dst`
    is half-closed, so the other direction can still finish."""
    loop = asyncio.get_running_loop()
    while True:
        if idle_s is None:
            data = await loop.sock_recv(src, bufsize)
        else:
            async with asyncio.timeout(idle_s):
                data = await loop.sock_recv(src, bufsize)
        if not data:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            return
        counts[index] += len(data)
        await loop.sock_sendall(dst, data)


async def first_failure(up: asyncio.Task[None], down: asyncio.Task[None]) -> str | None:
    """Wait for both pumps; the first one's exception (repr) as soon as it fails."""
    done, _ = await asyncio.wait({up, down}, return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        if task.exception() is not None:
            return repr(task.exception())
    await asyncio.gather(up, down)
    return None
