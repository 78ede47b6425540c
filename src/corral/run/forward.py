"""The product port, forwarded from the product's loopback to a verifier's loopback.

Neither sandbox has a network device besides its own loopback; each is
reached through its backend's `SandboxNet` (for a namespace sandbox,
sockets created in its network namespace: `sandbox/netns.py`). The verifier gets
a listening socket on its 127.0.0.1:PORT; each connection accepted there is
journaled (`net_connect`, env verifier, rule `product-port`) and only then
relayed to a socket connected to 127.0.0.1:PORT in the product's namespace.
The relay runs on an asyncio loop in one background thread of the
coordinator; `close()` stops it and every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.sandbox.backend import SandboxNet

__all__ = ["PortForwarder", "probe_ready"]


def probe_ready(
    ns: SandboxNet,
    port: int,
    path: str | None,
    timeout_s: float,
    alive: Callable[[], bool],
    *,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[bool, str]:
    """Poll the product until it accepts (and, with `path`, answers HTTP < 500).

    Returns (ready, reason). Gives up when `alive()` turns false (the product
    exited) or after `timeout_s` by `clock` (a run's clock stops while it is
    paused). Only a status line is read from the product.
    """
    deadline = clock() + timeout_s
    last = "no attempt"
    while clock() < deadline:
        if not alive():
            return False, f"the product exited before it was ready ({last})"
        try:
            sock = ns.connect(port)
        except OSError as exc:
            last = f"port {port}: {exc.strerror or exc}"
            time.sleep(0.1)
            continue
        try:
            sock.settimeout(max(0.1, min(2.0, deadline - clock())))
            if path is None:
                return True, f"port {port} accepts connections"
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            head = sock.recv(256).split(b"\r\n", 1)[0].decode("latin-1")
            parts = head.split()
            if len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) < 500:
                return True, f"GET {path} -> {parts[1]}"
            last = f"GET {path} -> {head[:80]!r}"
        except OSError as exc:
            last = f"port {port}: {exc.strerror or exc}"
        finally:
            sock.close()
        time.sleep(0.1)
    # `timeout_s` may be what is left of a shared budget (1.9997...): say it as set.
    return False, f"not ready after {round(timeout_s, 1):g}s ({last})"


class PortForwarder:
    """Relays connections accepted in verifier namespaces to the product's port.

    `on_connect(target_desc)` is called (on the relay thread) before each
    connection is relayed; if it raises, the connection is refused (fail
    closed) - the coordinator journals there.
    """

    def __init__(self, on_connect: Callable[[str], None]) -> None:
        self._on_connect = on_connect
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="corral-forward")
        self._thread.daemon = True
        self._thread.start()
        self._tasks: set[asyncio.Task[None]] = set()

    def expose(self, listener: socket.socket, product: SandboxNet, port: int) -> Callable[[], None]:
        """Serve `listener`; returns a function that stops serving it."""
        listener.setblocking(False)
        fut: Future[asyncio.Server] = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(lambda r, w: self._relay(r, w, product, port), sock=listener),
            self._loop,
        )
        server = fut.result(5.0)

        def stop() -> None:
            async def _close() -> None:
                server.close()
                for task in list(self._tasks):
                    task.cancel()
                await asyncio.sleep(0)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_close(), self._loop).result(5.0)

        return stop

    async def _relay(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        product: SandboxNet,
        port: int,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            try:
                self._on_connect(f"product:127.0.0.1:{port}")
            except Exception:
                return
            try:
                # connect() on a loopback completes or is refused at once; off
                # the loop anyway, so a slow backend channel stalls no relay.
                sock = await asyncio.wait_for(
                    self._loop.run_in_executor(None, product.connect, port), timeout=10.0
                )
            except (OSError, TimeoutError):
                return
            sock.setblocking(False)
            p_reader, p_writer = await asyncio.open_connection(sock=sock)
            await asyncio.gather(
                self._pipe(reader, p_writer), self._pipe(p_reader, writer), return_exceptions=True
            )
            p_writer.close()
        finally:
            writer.close()
            self._tasks.discard(task)

    @staticmethod
    async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await src.read(65536)
                if not data:
                    break
                dst.write(data)
                await dst.drain()
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if dst.can_write_eof():
                    dst.write_eof()

    def close(self) -> None:
        async def _cancel() -> None:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.sleep(0)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(_cancel(), self._loop).result(5.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5.0)
        with contextlib.suppress(Exception):
            self._loop.close()
