"""The product-port relay (helper side), run by `helper_main forward` in `helpers-forward`.

It holds no sandbox handle and opens no journal. Over its control socket
(a SOCK_SEQPACKET pair with the coordinator, one message per datagram):

    coordinator -> helper   expose ID PORT      + SCM_RIGHTS: a listening socket
                            stop ID
                            conn REQ ok         + SCM_RIGHTS: a socket connected to the product
                            conn REQ refused
    helper -> coordinator   connect REQ ID

For every connection accepted on an exposed listener the helper asks for a
product connection and relays only once it has one: the coordinator
journals the connection (`rule=product-port`) before it connects, so the
observation is durable before a byte is relayed. The bytes themselves, and
every buffer they need, live in this process and are charged to the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import sys

__all__ = ["CHUNK", "SOCK_BUF", "serve"]

#: What one relay reads at a time, and the kernel buffer it asks for on each
#: relayed socket: fixed, so the memory a connection can hold is bounded
#: whoever floods it (autotuning would grow a receive queue to tcp_rmem's max).
CHUNK = 64 << 10
SOCK_BUF = 128 << 10

_MSG_MAX = 128
_EXPOSE = re.compile(rb"^expose ([0-9]{1,9}) ([0-9]{1,5})$")
_STOP = re.compile(rb"^stop ([0-9]{1,9})$")
_CONN = re.compile(rb"^conn ([0-9]{1,9}) (ok|refused)$")


def _bound(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCK_BUF)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCK_BUF)


class _Relay:
    def __init__(self, ctl: socket.socket) -> None:
        self._ctl = ctl
        self._loop = asyncio.get_running_loop()
        self._servers: dict[int, asyncio.Server] = {}
        self._tasks: dict[int, set[asyncio.Task[None]]] = {}
        self._waiting: dict[int, asyncio.Future[socket.socket | None]] = {}
        self._req = 0
        self.done = asyncio.Event()

    def on_ctl(self) -> None:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self._ctl, _MSG_MAX, 1)
        except BlockingIOError:
            return
        except OSError:
            msg, fds = b"", []
        if not msg:
            for fd in fds:
                with contextlib.suppress(OSError):
                    socket.socket(fileno=fd).close()
            self.done.set()
            return
        sock = socket.socket(fileno=fds[0]) if fds else None
        if m := _EXPOSE.match(msg):
            if sock is not None:
                self._loop.create_task(self._expose(int(m[1]), sock))
                return
        elif m := _STOP.match(msg):
            self._loop.create_task(self._stop(int(m[1])))
        elif m := _CONN.match(msg):
            fut = self._waiting.pop(int(m[1]), None)
            if fut is not None and not fut.done() and m[2] == b"ok" and sock is not None:
                fut.set_result(sock)
                return
            if fut is not None and not fut.done():
                fut.set_result(None)
        else:
            sys.stderr.write(f"corral forward: unknown control message {msg[:40]!r}\n")
        if sock is not None:
            sock.close()

    async def _expose(self, xid: int, listener: socket.socket) -> None:
        listener.setblocking(False)
        self._tasks[xid] = set()
        self._servers[xid] = await asyncio.start_server(
            lambda r, w: self._serve(xid, r, w), sock=listener, limit=CHUNK
        )

    async def _stop(self, xid: int) -> None:
        server = self._servers.pop(xid, None)
        if server is not None:
            server.close()
        for task in self._tasks.pop(xid, set()):
            task.cancel()
        await asyncio.sleep(0)

    async def _product(self, xid: int) -> socket.socket | None:
        self._req += 1
        req = self._req
        fut: asyncio.Future[socket.socket | None] = self._loop.create_future()
        self._waiting[req] = fut
        try:
            self._ctl.send(f"connect {req} {xid}".encode())
            return await asyncio.wait_for(fut, 15.0)
        except (OSError, TimeoutError):
            return None
        finally:
            self._waiting.pop(req, None)

    async def _serve(
        self, xid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks = self._tasks.get(xid)
        if tasks is None:
            writer.close()
            return
        tasks.add(task)
        try:
            accepted = writer.get_extra_info("socket")
            if accepted is not None:
                _bound(accepted)
            sock = await self._product(xid)
            if sock is None:
                return
            _bound(sock)
            sock.setblocking(False)
            p_reader, p_writer = await asyncio.open_connection(sock=sock, limit=CHUNK)
            await asyncio.gather(
                _pipe(reader, p_writer), _pipe(p_reader, writer), return_exceptions=True
            )
            p_writer.close()
        finally:
            writer.close()
            tasks.discard(task)

    async def close(self) -> None:
        for xid in list(self._servers):
            await self._stop(xid)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await src.read(CHUNK)
            if not data:
                break
            dst.write(data)
            await dst.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if dst.can_write_eof():
                dst.write_eof()


async def _main(ctl: socket.socket) -> int:
    ctl.setblocking(False)
    relay = _Relay(ctl)
    loop = asyncio.get_running_loop()
    loop.add_reader(ctl.fileno(), relay.on_ctl)
    # stdin closing is the coordinator's "stop"; its death is PDEATHSIG.
    stdin_done = asyncio.Event()
    loop.add_reader(sys.stdin.fileno(), lambda: _drain_stdin(stdin_done))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    waiters = [asyncio.ensure_future(relay.done.wait()), asyncio.ensure_future(stdin_done.wait())]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for waiter in waiters:
        waiter.cancel()
    loop.remove_reader(ctl.fileno())
    await relay.close()
    return 0


def _drain_stdin(done: asyncio.Event) -> None:
    import os

    try:
        data = os.read(sys.stdin.fileno(), 512)
    except OSError:
        data = b""
    if not data:
        asyncio.get_running_loop().remove_reader(sys.stdin.fileno())
        done.set()


def serve(ctl_fd: int) -> int:
    """Relay until the coordinator closes stdin or the control socket."""
    ctl = socket.socket(fileno=ctl_fd)
    try:
        return asyncio.run(_main(ctl))
    finally:
        ctl.close()
