"""The product-port forwarder in its helper (coordinator side); see run/forward_relay.py.

`expose(listener, product, port)` serves a listener made in a verifier's
namespace and returns its `stop`; `on_connect(target)` journals each
connection before it is relayed, and if it raises the connection is refused
(fail closed). The listener is handed to the helper with SCM_RIGHTS and
closed here; the bytes are relayed there, charged to the run's
`helpers-forward` cgroup.

What the coordinator still does per connection is O(1): read one bounded
request from its control socket, journal, and say "dial". A product whose
`SandboxNet` is a network namespace (`NamespaceNet`, the namespace
backend) has that namespace's descriptor handed to the helper with the
listener, and the helper creates and connects the product's socket itself:
the socket is allocated in the run cgroup, so its kernel buffers are
charged there (a socket's memory is charged to the cgroup of the process
that created it, whoever holds it later). A product reached by a relay
command (`ExecNet`, gVisor's `runsc exec`) has what that command needs
(runsc's state, the container, the holder's pid: host-made, bounded) sent
with the listener, and the helper starts each relay itself: the process,
its socketpair and the thread draining it are the run's. For any other
backend the handle cannot leave the coordinator: it connects and passes
the socket over, and that socket stays the coordinator's
(docs/resources.md). What the
helper says is hostile: one datagram of at most `_MSG_MAX` bytes, one exact
form, descriptors it sends are closed unread.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from corral.errors import HelperError
from corral.pauseclock import Clock
from corral.run.helpers import Helper
from corral.sandbox.backend import ExecNet, NamespaceNet

if TYPE_CHECKING:
    from corral.sandbox.backend import SandboxNet

__all__ = ["HelperForwarder"]

_MSG_MAX = 128
#: Connections waiting for the journal and connect(); past it, refused.
_PENDING_MAX = 256
_CONNECT = re.compile(rb"^connect ([0-9]{1,9}) ([0-9]{1,9})$")


class HelperForwarder:
    """Relays verifier connections to the product's port from the `forward` helper."""

    def __init__(
        self,
        on_connect: Callable[[str], None],
        cgroup_procs: Sequence[str],
        log: Path,
        clock: Clock = time.monotonic,
    ) -> None:
        """`clock`: what the helper's start is timed on (the run's: a pause does not count)."""
        self._on_connect = on_connect
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._helper = Helper.spawn(
                "forward",
                (str(theirs.fileno()),),
                cgroup_procs,
                log,
                pass_fds=(theirs.fileno(),),
                clock=clock,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._ctl = ours
        try:
            line = self._helper.read_line(30.0)
            if line != "ready":
                raise HelperError(f"the forward helper did not say ready: {line[:80]!r}")
        except BaseException:
            self._helper.close(1.0)
            ours.close()
            raise
        self._lock = threading.Lock()
        #: id -> (product, port, the helper dials it itself)
        self._exposed: dict[int, tuple[SandboxNet, int, bool]] = {}
        self._next = 0
        self._pending = 0
        self._closed = False
        # connect() on a loopback completes or is refused at once; a slow
        # backend channel still must not hold up every other connection.
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="corral-forward")
        self._reader = threading.Thread(target=self._read, name="corral-forward-ctl", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self._helper.proc.pid

    def dead(self) -> HelperError | None:
        """Why the helper is gone, or None while it runs."""
        code = self._helper.poll()
        return None if code is None else self._helper.failure(code)

    def expose(self, listener: socket.socket, product: SandboxNet, port: int) -> Callable[[], None]:
        """Serve `listener` (handed to the helper, closed here); returns its `stop`."""
        exec_dial = product.exec_dial() if isinstance(product, ExecNet) else None
        dial = isinstance(product, NamespaceNet) or exec_dial is not None
        with self._lock:
            self._next += 1
            xid = self._next
            self._exposed[xid] = (product, port, dial)
        try:
            if isinstance(product, NamespaceNet):
                msg, fds = f"expose {xid} {port} ns".encode(), [product.namespace_fd()]
            elif exec_dial is not None:
                msg, fds = f"expose {xid} {port} exec ".encode() + exec_dial.to_wire(), []
            else:
                msg, fds = f"expose {xid} {port}".encode(), []
            socket.send_fds(self._ctl, [msg], [listener.fileno(), *fds])
        except OSError as exc:
            gone = self.dead()
            raise (gone or HelperError(f"the forward helper: {exc}")) from exc
        finally:
            listener.close()

        def stop() -> None:
            with self._lock:
                self._exposed.pop(xid, None)
            with contextlib.suppress(OSError):
                self._ctl.send(f"stop {xid}".encode())

        return stop

    def _read(self) -> None:
        while True:
            try:
                msg, fds, _flags, _addr = socket.recv_fds(self._ctl, _MSG_MAX + 1, 1)
            except OSError:
                return
            for fd in fds:
                with contextlib.suppress(OSError):
                    socket.socket(fileno=fd).close()
            if not msg:
                return
            m = _CONNECT.match(msg) if len(msg) <= _MSG_MAX else None
            if m is None:
                continue
            with self._lock:
                exposed = self._exposed.get(int(m[2]))
            req = int(m[1])
            with self._lock:
                busy = self._pending >= _PENDING_MAX
                if exposed is not None and not busy:
                    self._pending += 1
            if exposed is None or busy:
                self._answer(req, None)
                continue
            try:
                self._pool.submit(self._connect, req, *exposed)
            except RuntimeError:
                return

    def _connect(self, req: int, product: SandboxNet, port: int, dial: bool) -> None:
        try:
            self._connect_one(req, product, port, dial)
        finally:
            with self._lock:
                self._pending -= 1

    def _connect_one(self, req: int, product: SandboxNet, port: int, dial: bool) -> None:
        try:
            # Journaled (durable) before the product is even connected.
            self._on_connect(f"product:127.0.0.1:{port}")
            if dial:
                self._answer(req, "dial")
                return
            sock = product.connect(port)
        except Exception:
            self._answer(req, None)
            return
        try:
            self._answer(req, sock)
        finally:
            sock.close()

    def _answer(self, req: int, sock: socket.socket | Literal["dial"] | None) -> None:
        with contextlib.suppress(OSError):
            if sock is None:
                self._ctl.send(f"conn {req} refused".encode())
            elif isinstance(sock, str):
                self._ctl.send(f"conn {req} dial".encode())
            else:
                socket.send_fds(self._ctl, [f"conn {req} ok".encode()], [sock.fileno()])

    def close(self) -> None:
        """End the helper and every relay; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._ctl.shutdown(socket.SHUT_RDWR)
        self._helper.close(5.0)
        self._reader.join(5.0)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._ctl.close()
