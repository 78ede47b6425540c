"""A namespace sandbox's loopback from the host: sockets created in its network namespace.

The sandbox has no network device besides its own loopback. Corral (root)
creates sockets *inside* its network namespace: `setns(CLONE_NEWNET)` on the
calling thread, `socket()`, `setns` back. A socket belongs to the namespace
it was created in, whatever thread or process uses it later, so a listening
socket handed to the broker serves the sandbox's 127.0.0.1 and nothing else.
`NetNs` is the namespace backend's `SandboxNet`.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import threading
import time

from corral.errors import SandboxStartError

__all__ = ["NetNs", "listen_on", "socket_in"]

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
# setns() changes the calling thread only; the lock keeps two threads of the
# coordinator from interleaving their enter/leave pairs on shared state.
_ns_lock = threading.Lock()


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise SandboxStartError(err, f"setns(CLONE_NEWNET): {os.strerror(err)}")


def listen_on(sock: socket.socket, port: int, *, wait_s: float = 5.0) -> socket.socket:
    """`sock` listening on 127.0.0.1:`port` of its namespace; closed on failure."""
    deadline = time.monotonic() + wait_s
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        while True:
            try:
                sock.bind(("127.0.0.1", port))
                break
            except OSError as exc:
                # bwrap reports the sandbox's pid before its child has brought
                # `lo` up, so 127.0.0.1 may not exist in the namespace yet.
                if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return sock


def socket_in(ns_fd: int, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """An AF_INET socket of the network namespace `ns_fd` (the calling thread
    enters it and comes back; the socket stays in it)."""
    with _ns_lock:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(ns_fd)
            try:
                return socket.socket(socket.AF_INET, kind)
            finally:
                # Back before anything else runs on this thread.
                _setns(own)
        finally:
            os.close(own)


class NetNs:
    """A held reference to a sandbox's network namespace (valid after its pid is gone).

    Holding the descriptor keeps the namespace alive, not the sandbox: once
    the sandbox is torn down its loopback has no listener left, so `connect`
    is refused. `close()` is idempotent.
    """

    def __init__(self, pid: int) -> None:
        try:
            self._fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise SandboxStartError(exc.errno, f"sandbox network namespace gone: {exc}") from exc

    def _socket(self, kind: int = socket.SOCK_STREAM) -> socket.socket:
        if self._fd < 0:
            raise SandboxStartError(0, "the sandbox's network namespace was released")
        return socket_in(self._fd, kind)

    def namespace_fd(self) -> int:
        """The namespace's descriptor (still ours): a process given a copy
        (SCM_RIGHTS) makes its own sockets there with `socket_in`."""
        if self._fd < 0:
            raise SandboxStartError(0, "the sandbox's network namespace was released")
        return self._fd

    def listen(self, port: int) -> socket.socket:
        """A socket listening on the sandbox's 127.0.0.1:`port`."""
        return listen_on(self._socket(), port)

    def datagram(self, port: int) -> socket.socket:
        """A UDP socket bound to the sandbox's 127.0.0.1:`port`."""
        sock = self._socket(socket.SOCK_DGRAM)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            sock.close()
            raise
        return sock

    def connect(self, port: int, timeout_s: float = 10.0) -> socket.socket:
        """A socket connected to the sandbox's 127.0.0.1:`port` (OSError when refused)."""
        sock = self._socket()
        try:
            sock.settimeout(timeout_s)
            sock.connect(("127.0.0.1", port))
            sock.settimeout(None)
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
