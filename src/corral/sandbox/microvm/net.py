"""A microVM's loopback from the host: one virtio-serial port, multiplexed.

The guest has no network device but `lo` (no NIC, and no vhost-vsock on
hosts without /dev/vhost-vsock). Port 4 ("net") is one byte stream between
QEMU (a socketpair end corral hands it) and the guest's relay
(`corral/_payload/vm_relay.py`, guest root, started by the init before the
command), carrying frames: `FrameReader` parses them, `VMNet` is the
backend's `SandboxNet`.

- `listen(port)`: the relay listens on the guest's 127.0.0.1:port (bound
  before the command starts: LISTEN frames precede GO on the ordered
  stream); the host gets an AF_UNIX listening socket in a private 0700
  directory, and each connection the guest accepts is connected to it. The
  broker takes that socket like any listener (`--listen-fd`).
- `connect(port)`: the relay connects to the guest's 127.0.0.1:port; the
  caller gets one end of a socketpair.

Everything from the port is the guest's: frame lengths are bounded, a
guest-opened connection must carry a guest id (high bit) for a port the host
listens on, live connections are capped (MAX_CONNS; beyond it the guest's
connection is closed), and any malformed frame ends the whole channel
(every connection is closed: fail closed, never resynchronise).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import tempfile
import threading
from dataclasses import dataclass

from corral.errors import SandboxStartError

__all__ = [
    "ACCEPT",
    "CLOSE",
    "DATA",
    "EOF",
    "GO",
    "GUEST_IDS",
    "HEADER",
    "LISTEN",
    "MAX_CONNS",
    "MAX_PAYLOAD",
    "OPEN",
    "OPENED",
    "Frame",
    "FrameReader",
    "ProtocolError",
    "VMNet",
    "encode",
]

LISTEN, GO, OPEN, OPENED, ACCEPT, DATA, EOF, CLOSE = range(1, 9)
HEADER = struct.Struct(">BIH")
MAX_PAYLOAD = 16384
#: Connection ids the guest chooses have this bit; the host's never do.
GUEST_IDS = 0x80000000
MAX_CONNS = 256
#: The frame kinds the guest may send.
_FROM_GUEST = frozenset({OPENED, ACCEPT, DATA, EOF, CLOSE})


class ProtocolError(ValueError):
    """The guest broke the frame protocol (the channel is then closed)."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: int
    cid: int
    payload: bytes


def encode(kind: int, cid: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError("frame payload too large")
    return HEADER.pack(kind, cid, len(payload)) + payload


class FrameReader:
    """Frames from the guest's bytes, incrementally (pure; bounded buffer)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buf += data
        out: list[Frame] = []
        while len(self._buf) >= HEADER.size:
            kind, cid, length = HEADER.unpack_from(self._buf)
            if kind not in _FROM_GUEST:
                raise ProtocolError(f"frame kind {kind} from the guest")
            if length > MAX_PAYLOAD:
                raise ProtocolError(f"frame length {length} over {MAX_PAYLOAD}")
            if kind == ACCEPT and (length != 2 or not cid & GUEST_IDS):
                raise ProtocolError("malformed ACCEPT")
            if kind in (OPENED, EOF, CLOSE) and length:
                raise ProtocolError("control frame with a payload")
            if len(self._buf) < HEADER.size + length:
                break
            payload = bytes(self._buf[HEADER.size : HEADER.size + length])
            del self._buf[: HEADER.size + length]
            out.append(Frame(kind, cid, payload))
        return out


class _Conn:
    """One multiplexed connection; `sock` is the host's local end."""

    def __init__(self, cid: int, sock: socket.socket) -> None:
        self.cid = cid
        self.sock = sock
        self.opened = threading.Event()
        self.refused = False
        self.sent_eof = False
        self.got_eof = False


class VMNet:
    """The microVM's `SandboxNet` over the host end of port 4 (`channel`).

    `go()` releases the guest's command (after the broker attached); `close()`
    ends the channel and every connection; idempotent.
    """

    def __init__(self, channel: socket.socket) -> None:
        self._chan = channel
        self._wlock = threading.Lock()
        self._lock = threading.Lock()
        self._conns: dict[int, _Conn] = {}
        self._listeners: dict[int, str] = {}
        self._next = 2
        #: the channel ended (guest gone or protocol broken): connect() refuses
        self._ended = False
        self._closed = False
        #: Why the channel ended early (a protocol violation), for diagnostics.
        self.failure: str | None = None
        self._dir = tempfile.mkdtemp(prefix="corral-vmnet-")
        os.chmod(self._dir, 0o700)
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # -- SandboxNet ---------------------------------------------------------
    def listen(self, port: int) -> socket.socket:
        _check_port(port)
        path = os.path.join(self._dir, f"{port}.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(256)
        except OSError:
            sock.close()
            raise
        with self._lock:
            self._listeners[port] = path
        self._send(LISTEN, 0, struct.pack(">H", port))
        return sock

    def connect(self, port: int, timeout_s: float = 30.0) -> socket.socket:
        _check_port(port)
        mine, theirs = socket.socketpair()
        with self._lock:
            if self._ended:
                mine.close()
                theirs.close()
                raise ConnectionRefusedError(0, "the VM's channel is closed")
            cid = self._next
            self._next = (self._next + 2) & 0x7FFFFFFF or 2
            conn = _Conn(cid, theirs)
            self._conns[cid] = conn
        self._send(OPEN, cid, struct.pack(">H", port))
        if not conn.opened.wait(timeout_s) or conn.refused:
            self._drop(cid, tell_guest=not conn.refused)
            mine.close()
            raise ConnectionRefusedError(0, f"nothing accepts on the VM's 127.0.0.1:{port}")
        threading.Thread(target=self._pump, args=(conn,), daemon=True).start()
        return mine

    # -- lifecycle ----------------------------------------------------------
    def go(self) -> None:
        """Let the guest init start the command (every LISTEN sent is bound first)."""
        self._send(GO, 0)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._end_all()
        self._reader.join(timeout=5.0)
        _close_quietly(self._chan)
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- internals ----------------------------------------------------------
    def _send(self, kind: int, cid: int, payload: bytes = b"") -> None:
        data = encode(kind, cid, payload)
        with self._wlock:
            try:
                self._chan.sendall(data)
            except OSError as exc:
                raise ConnectionResetError(exc.errno, "the VM's channel is closed") from exc

    def _drop(self, cid: int, *, tell_guest: bool) -> None:
        with self._lock:
            conn = self._conns.pop(cid, None)
        if conn is not None:
            _close_quietly(conn.sock)
            if tell_guest:
                with contextlib.suppress(OSError):
                    self._send(CLOSE, cid)

    def _half_closed(self, conn: _Conn, *, sent: bool) -> bool:
        """Record one direction's EOF; True once both directions ended."""
        with self._lock:
            if sent:
                conn.sent_eof = True
            else:
                conn.got_eof = True
            return conn.sent_eof and conn.got_eof

    def _pump(self, conn: _Conn) -> None:
        """Host end -> guest: DATA frames, then EOF (or CLOSE on an error)."""
        try:
            while True:
                data = conn.sock.recv(MAX_PAYLOAD)
                if not data:
                    self._send(EOF, conn.cid)
                    if self._half_closed(conn, sent=True):
                        self._drop(conn.cid, tell_guest=True)
                    return
                self._send(DATA, conn.cid, data)
        except OSError:
            self._drop(conn.cid, tell_guest=True)

    def _read_loop(self) -> None:
        reader = FrameReader()
        try:
            while True:
                data = self._chan.recv(65536)
                if not data:
                    return
                for frame in reader.feed(data):
                    self._dispatch(frame)
        except ProtocolError as exc:
            self.failure = str(exc)
        except OSError:
            pass
        finally:
            self._end_all()

    def _end_all(self) -> None:
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
            self._ended = True
        for c in conns:
            _close_quietly(c.sock)
            c.refused = True
            c.opened.set()
        with contextlib.suppress(OSError):
            self._chan.shutdown(socket.SHUT_RDWR)

    def _dispatch(self, f: Frame) -> None:
        if f.kind == ACCEPT:
            self._accept(f.cid, struct.unpack(">H", f.payload)[0])
            return
        with self._lock:
            conn = self._conns.get(f.cid)
        if conn is None:
            return  # a connection already dropped here: its late frames mean nothing
        if f.kind == OPENED:
            if f.cid & GUEST_IDS or conn.opened.is_set():
                raise ProtocolError("OPENED for a connection the host did not open")
            conn.opened.set()
        elif f.kind == DATA:
            try:
                conn.sock.sendall(f.payload)
            except OSError:
                self._drop(f.cid, tell_guest=True)
        elif f.kind == EOF:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            if self._half_closed(conn, sent=False):
                self._drop(f.cid, tell_guest=True)
        elif f.kind == CLOSE:
            conn.refused = not conn.opened.is_set()
            conn.opened.set()
            self._drop(f.cid, tell_guest=False)

    def _accept(self, cid: int, port: int) -> None:
        with self._lock:
            path = self._listeners.get(port)
            known = cid in self._conns
            full = len(self._conns) >= MAX_CONNS
        if known:
            raise ProtocolError("ACCEPT reuses a live connection id")
        if path is None:
            raise ProtocolError(f"ACCEPT for port {port}, which the host does not listen on")
        if full:
            with contextlib.suppress(OSError):
                self._send(CLOSE, cid)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(10.0)
            sock.connect(path)
            sock.settimeout(None)
        except OSError:
            sock.close()
            with contextlib.suppress(OSError):
                self._send(CLOSE, cid)
            return
        conn = _Conn(cid, sock)
        conn.opened.set()
        with self._lock:
            self._conns[cid] = conn
        threading.Thread(target=self._pump, args=(conn,), daemon=True).start()


def _check_port(port: int) -> None:
    if not 0 < port < 65536:
        raise SandboxStartError(0, f"port {port} out of range")


def _close_quietly(sock: socket.socket) -> None:
    # shutdown() first: it wakes a thread blocked in send/recv on it, close() does not.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()
