"""Name lookups in a sandbox without egress: answered at once, counted, explained.

A sandbox with no `--allow` has only its own loopback and no resolv.conf, so
its resolver asks 127.0.0.1:53. Nothing listening there gives ECONNREFUSED,
which glibc reports as EAI_AGAIN ("Temporary failure in name resolution"):
a *temporary* error that pip, npm and friends retry with backoff for ~10 s,
and nothing tells the user why. Here corral answers every query on that
port itself with NXDOMAIN (a permanent "no such name"), counts the names,
and after the command prints one line saying egress is off and how to allow
a host, and journals the lookups when there is a journal.

The queries are sandbox data: packets are parsed with fixed bounds (one
question, 255-byte names, no compression pointers) and at most `MAX_NAMES`
distinct names are kept; the answer is built from the header and question
only, so it can never carry more than the sandbox sent.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "MAX_NAMES",
    "NoEgressDns",
    "Query",
    "answer",
    "attach",
    "hint",
    "no_egress_env",
    "parse_query",
]

MAX_NAMES = 32
_PORT = 53
_MAX_PACKET = 512
_RCODE_FORMERR = 1
_RCODE_NXDOMAIN = 3


@dataclass(frozen=True, slots=True)
class Query:
    ident: int
    flags: int
    name: str
    #: Bytes of the question section (name, type, class) as sent.
    question: bytes


def parse_query(packet: bytes) -> Query | None:
    """The one question of a standard query, or None when it is not one."""
    if len(packet) < 12:
        return None
    ident, flags, qd, an, ns, _ar = struct.unpack("!6H", packet[:12])
    if flags & 0x8000 or (flags >> 11) & 0xF or qd != 1 or an or ns:
        return None
    labels: list[str] = []
    pos, total = 12, 0
    while True:
        if pos >= len(packet):
            return None
        size = packet[pos]
        pos += 1
        if size == 0:
            break
        if size > 63 or pos + size > len(packet):
            return None  # a compression pointer or a cut label: not a plain query
        total += size + 1
        if total > 255:
            return None
        labels.append(packet[pos : pos + size].decode("utf-8", "backslashreplace"))
        pos += size
    if pos + 4 > len(packet):
        return None
    return Query(ident, flags, ".".join(labels), packet[12 : pos + 4])


def answer(packet: bytes) -> bytes | None:
    """NXDOMAIN for a query, FORMERR for anything with a header, None otherwise."""
    q = parse_query(packet)
    if q is None:
        if len(packet) < 12:
            return None
        (ident,) = struct.unpack("!H", packet[:2])
        return struct.pack("!6H", ident, 0x8000 | 0x0080 | _RCODE_FORMERR, 0, 0, 0, 0)
    # QR, the query's RD, RA: a plain negative answer the stub takes as final.
    flags = 0x8000 | (q.flags & 0x0100) | 0x0080 | _RCODE_NXDOMAIN
    return struct.pack("!6H", q.ident, flags, 1, 0, 0, 0) + q.question


def no_egress_env() -> dict[str, str]:
    """Defaults for a sandbox without egress (a `--setenv` wins): no retry can succeed.

    pip and npm retry every failed connection with backoff (pip: 5 times,
    ~10 s), whatever the resolver answered.
    """
    return {"PIP_RETRIES": "0", "npm_config_fetch_retries": "0"}


def hint(names: list[str], queries: int) -> str:
    """The line `corral exec` prints after a run whose lookups were refused."""
    from corral.display import show

    shown = ", ".join(show(n, 80) for n in names[:5]) + (", ..." if len(names) > 5 else "")
    first = show(names[0], 80) if names else "HOST"
    return (
        f"egress is off: {queries} name lookup(s) refused ({shown}); "
        f"allow a host with --allow HOST (e.g. --allow {first})"
    )


class NoEgressDns:
    """Answers the sandbox's 127.0.0.1:53 (UDP) from a host thread.

    `attach` is a backend `network` callback; `stop()` joins the thread.
    `bind` makes the socket in the sandbox's namespace (`NetNs.datagram`).
    """

    def __init__(self) -> None:
        self.names: list[str] = []
        self.queries = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        self._lock = threading.Lock()

    def attach_with(self, bind: Callable[[int], socket.socket]) -> None:
        try:
            self._sock = bind(_PORT)
        except OSError:
            # A convenience, not a protection: without it lookups fail as
            # before (ECONNREFUSED), only slower for retrying clients.
            return
        self._thread = threading.Thread(target=self._serve, name="corral-nodns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        fds = [sock.fileno(), self._stop_r]
        while True:
            ready, _, _ = select.select(fds, [], [])
            if self._stop_r in ready:
                return
            try:
                packet, peer = sock.recvfrom(_MAX_PACKET)
            except OSError:
                continue
            reply = answer(packet)
            if reply is None:
                continue
            q = parse_query(packet)
            with self._lock:
                self.queries += 1
                if q is not None and q.name not in self.names and len(self.names) < MAX_NAMES:
                    self.names.append(q.name)
            with contextlib.suppress(OSError):
                sock.sendto(reply, peer)

    def stop(self) -> None:
        if self._stop_w >= 0:
            with contextlib.suppress(OSError):
                os.write(self._stop_w, b"x")
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        for fd in (self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stop_r = self._stop_w = -1
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def attach(responder: NoEgressDns) -> Callable[[object], None]:
    """The backend `network` callback: a namespace sandbox's loopback gets the responder."""

    def hook(net: object) -> None:
        from corral.sandbox.netns import NetNs

        # Other backends' loopbacks (gVisor, microVM) keep their own behaviour.
        if isinstance(net, NetNs):
            responder.attach_with(net.datagram)

    return hook
