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
import fcntl
import os
import select
import socket
import struct
import threading
import time

from corral.errors import SandboxStartError

__all__ = ["NetNs", "listen_on", "socket_in"]

_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_IFF_UP = 0x1
_RTMGRP_LINK = 0x1
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
                # A namespace whose `lo` is not configured yet (see
                # NetNs.await_loopback) may refuse the address, on some kernels.
                if exc.errno != errno.EADDRNOTAVAIL or time.monotonic() >= deadline:
                    raise
                time.sleep(0.005)
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return sock


def socket_in(
    ns_fd: int,
    kind: int = socket.SOCK_STREAM,
    family: int = socket.AF_INET,
    proto: int = 0,
) -> socket.socket:
    """A socket (AF_INET unless `family`) of the network namespace `ns_fd` (the
    calling thread enters it and comes back; the socket stays in it)."""
    with _ns_lock:
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _setns(ns_fd)
            try:
                return socket.socket(family, kind, proto)
            finally:
                # Back before anything else runs on this thread.
                _setns(own)
        finally:
            os.close(own)


def _link_up(sock: socket.socket, name: bytes) -> bool:
    """Whether interface `name` of `sock`'s network namespace is up (any
    socket's SIOCGIFFLAGS answers for the namespace it was made in)."""
    ifr = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack("16s24x", name))
    return bool(struct.unpack_from("16sH", ifr)[1] & _IFF_UP)


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

    def await_loopback(self, pid: int, timeout_s: float = 10.0) -> None:
        """Return once the namespace's `lo` is up; `pid` is the process that
        brings it up (bwrap's child). SandboxStartError if `pid` exits first
        or `timeout_s` passes.

        bwrap reports its child's pid before that child has configured `lo`
        (RTM_NEWADDR, then RTM_NEWLINK IFF_UP). Until then a connect() to
        127.0.0.1 fails with ENETUNREACH, yet bind() to it already succeeds
        (Linux 6.18), so a listener made at once cannot tell. We cannot bring `lo` up
        ourselves: the kernel then adds 127.0.0.1 and bwrap's exclusive
        RTM_NEWADDR fails. The link group is joined before the flags are
        read, so the change cannot fall between the read and the wait.
        """
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as exc:
            raise SandboxStartError(
                exc.errno, f"the sandbox exited before its loopback was up: {exc}"
            ) from exc
        try:
            nl = socket_in(
                self.namespace_fd(), socket.SOCK_RAW, socket.AF_NETLINK, socket.NETLINK_ROUTE
            )
            with nl:
                nl.bind((0, _RTMGRP_LINK))
                nl.setblocking(False)
                deadline = time.monotonic() + timeout_s
                while not _link_up(nl, b"lo"):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise SandboxStartError(
                            errno.ETIMEDOUT,
                            f"the sandbox's loopback was not up after {timeout_s:g}s",
                        )
                    ready, _, _ = select.select([nl.fileno(), pidfd], [], [], left)
                    if pidfd in ready and not _link_up(nl, b"lo"):
                        raise SandboxStartError(0, "the sandbox exited before its loopback was up")
                    # Whatever arrived (a link message, or ENOBUFS after an
                    # overflow) only means "read the flags again".
                    with contextlib.suppress(OSError):
                        while nl.recv(65536):
                            pass
        finally:
            os.close(pidfd)

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
