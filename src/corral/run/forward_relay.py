"""The product-port relay (helper side), run by `helper_main forward` in `helpers-forward`.

It holds no sandbox handle (at most a product's network namespace, to
connect there) and opens no journal. Over its control socket
(a SOCK_SEQPACKET pair with the coordinator, one message per datagram):

    coordinator -> helper   expose ID PORT      + SCM_RIGHTS: a listening socket
                            expose ID PORT ns   + SCM_RIGHTS: a listening socket and
                                                  the product's network namespace
                            expose ID PORT exec DIAL
                                                + SCM_RIGHTS: a listening socket; DIAL
                                                  is gvisor.connect.ExecDial's wire form
                            stop ID
                            conn REQ dial       (journaled: connect to the product yourself)
                            conn REQ ok         + SCM_RIGHTS: a socket connected to the product
                            conn REQ refused
    helper -> coordinator   connect REQ ID

For every connection accepted on an exposed listener the helper asks for a
product connection and relays only once it has one: the coordinator
journals the connection (`rule=product-port`) before it answers, so the
observation is durable before the product is connected or a byte relayed.
With the product's namespace (`dial`) the helper creates and connects the
product's socket itself: a socket is charged to the memory cgroup of the
process that creates it, so both sockets of a relay, their kernel buffers
and every user buffer live in this process, charged to the run. With an
`exec` product (gVisor) the helper starts the product's relay itself
(`gvisor.connect.connect`: `runsc exec`, which joins the sandbox's cgroup):
the socketpair, the relay process's parent and its stderr's drain are here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import re
import socket
import sys

from corral.errors import SandboxStartError
from corral.sandbox.gvisor.connect import DIAL_WIRE_MAX, ExecDial
from corral.sandbox.netns import socket_in

__all__ = ["CHUNK", "SOCK_BUF", "serve"]

#: What one relay reads at a time, and the kernel buffer it asks for on each
#: relayed socket: fixed, so the memory a connection can hold is bounded
#: whoever floods it (autotuning would grow a receive queue to tcp_rmem's max).
CHUNK = 64 << 10
SOCK_BUF = 128 << 10

_MSG_MAX = 128
#: The coordinator's messages: an `exec` expose carries its dial data.
_CTL_MAX = _MSG_MAX + DIAL_WIRE_MAX
_EXPOSE = re.compile(rb"^expose ([0-9]{1,9}) ([0-9]{1,5})( ns| exec (.+))?$", re.DOTALL)
_STOP = re.compile(rb"^stop ([0-9]{1,9})$")
_CONN = re.compile(rb"^conn ([0-9]{1,9}) (ok|refused|dial)$")
#: How long connect() to the product may take (a full listen backlog drops SYNs).
_DIAL_S = 10.0
#: How long a `runsc exec` relay may take to connect inside (it starts a process there).
_EXEC_DIAL_S = 30.0
#: `runsc exec` relays starting at once; more connections wait for one.
_EXEC_DIALS = 4

_Answer = socket.socket | bytes | None


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
        #: id -> (the product's port, its network namespace's descriptor)
        self._netns: dict[int, tuple[int, int]] = {}
        #: id -> (the product's port, how to start a relay inside it)
        self._exec: dict[int, tuple[int, ExecDial]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(
            _EXEC_DIALS, thread_name_prefix="corral-forward-exec"
        )
        self._waiting: dict[int, asyncio.Future[_Answer]] = {}
        self._req = 0
        self._home = os.stat("/proc/thread-self/ns/net").st_ino
        self.done = asyncio.Event()

    def on_ctl(self) -> None:
        try:
            msg, fds, _flags, _addr = socket.recv_fds(self._ctl, _CTL_MAX, 2)
        except BlockingIOError:
            return
        except OSError:
            msg, fds = b"", []
        if not msg:
            _close_fds(fds)
            self.done.set()
            return
        dial = ExecDial.from_wire(m[4]) if (m := _EXPOSE.match(msg)) and m[4] else None
        if m and (dial is not None or not m[4]) and len(fds) == (2 if m[3] == b" ns" else 1):
            listener = socket.socket(fileno=fds[0])
            if dial is not None:
                self._exec[int(m[1])] = (int(m[2]), dial)
            elif m[3]:
                self._netns[int(m[1])] = (int(m[2]), fds[1])
            self._loop.create_task(self._expose(int(m[1]), listener))
            return
        if (m := _CONN.match(msg)) and len(fds) == (1 if m[2] == b"ok" else 0):
            fut = self._waiting.pop(int(m[1]), None)
            if fut is not None and not fut.done():
                fut.set_result(socket.socket(fileno=fds[0]) if fds else m[2])
                return
        elif (m := _STOP.match(msg)) and not fds:
            self._loop.create_task(self._stop(int(m[1])))
            return
        else:
            sys.stderr.write(f"corral forward: unknown control message {msg[:40]!r}\n")
        _close_fds(fds)

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
        _, ns = self._netns.pop(xid, (0, -1))
        if ns >= 0:
            os.close(ns)
        self._exec.pop(xid, None)
        await asyncio.sleep(0)

    async def _product(self, xid: int) -> socket.socket | None:
        self._req += 1
        req = self._req
        fut: asyncio.Future[_Answer] = self._loop.create_future()
        self._waiting[req] = fut
        try:
            self._ctl.send(f"connect {req} {xid}".encode())
            answer = await asyncio.wait_for(fut, 15.0)
        except (OSError, TimeoutError):
            return None
        finally:
            self._waiting.pop(req, None)
        if isinstance(answer, socket.socket):
            _bound(answer)
            return answer
        return await self._dial(xid) if answer == b"dial" else None

    async def _dial(self, xid: int) -> socket.socket | None:
        """A socket of ours connected to the product's 127.0.0.1:PORT in its namespace."""
        if xid in self._exec:
            return await self._dial_exec(*self._exec[xid])
        if xid not in self._netns:
            return None
        port, ns = self._netns[xid]
        try:
            sock = socket_in(ns)
        except SandboxStartError:
            if os.stat("/proc/thread-self/ns/net").st_ino != self._home:
                # Stuck in the product's namespace: nothing more made here may land there.
                os._exit(125)
            return None
        connected = False
        try:
            # Before connect(): the window is negotiated from the receive buffer.
            _bound(sock)
            sock.setblocking(False)
            await asyncio.wait_for(self._loop.sock_connect(sock, ("127.0.0.1", port)), _DIAL_S)
            connected = True
        except (OSError, TimeoutError):
            return None
        finally:
            if not connected:
                sock.close()
        return sock

    async def _dial_exec(self, port: int, dial: ExecDial) -> socket.socket | None:
        """Our end of a relay started inside the product by `runsc exec` (a thread:
        connect() blocks until the relay is connected inside)."""
        from corral.sandbox.gvisor.connect import connect

        cf = self._pool.submit(connect, dial.target, dial.holder, port, _EXEC_DIAL_S)
        try:
            sock = await asyncio.wrap_future(cf)
        except asyncio.CancelledError:
            # The thread cannot be stopped: what it connects is closed when it does.
            cf.add_done_callback(_close_result)
            raise
        except OSError:
            return None
        _bound(sock)
        return sock

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
        self._pool.shutdown(wait=False, cancel_futures=True)


def _close_result(cf: concurrent.futures.Future[socket.socket]) -> None:
    if not cf.cancelled() and cf.exception() is None:
        cf.result().close()


def _close_fds(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


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
