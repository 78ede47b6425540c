"""The microVM loopback channel (`microvm/net.py`) against a scripted, hostile guest.

The test plays the guest's relay on the other end of a socketpair: every
frame it sends is one a guest root could send. Assertions are on what the
host side does: what its listener accepts, what its connect() returns,
whether the channel (and every connection on it) is closed.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from corral.sandbox.microvm.net import (
    ACCEPT,
    CLOSE,
    DATA,
    EOF,
    GO,
    GUEST_IDS,
    HEADER,
    LISTEN,
    MAX_CONNS,
    MAX_PAYLOAD,
    OPEN,
    OPENED,
    FrameReader,
    ProtocolError,
    VMNet,
    encode,
)


class Guest:
    """The guest's end of port 4: frames in and out, with a bound on every wait."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.settimeout(10)
        self.buf = b""

    def send(self, kind: int, cid: int, payload: bytes = b"") -> None:
        self.sock.sendall(HEADER.pack(kind, cid, len(payload)) + payload)

    def frame(self) -> tuple[int, int, bytes]:
        while len(self.buf) < HEADER.size:
            self._more()
        kind, cid, length = HEADER.unpack_from(self.buf)
        while len(self.buf) < HEADER.size + length:
            self._more()
        payload = self.buf[HEADER.size : HEADER.size + length]
        self.buf = self.buf[HEADER.size + length :]
        return kind, cid, payload

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        self.buf += chunk

    def closed(self) -> bool:
        """True once the host has ended the channel (EOF after any queued frames)."""
        try:
            while True:
                self.frame()
        except EOFError:
            return True


@pytest.fixture
def pair() -> Iterator[tuple[VMNet, Guest]]:
    host, guest = socket.socketpair()
    net = VMNet(host)
    try:
        yield net, Guest(guest)
    finally:
        net.close()
        guest.close()


def _port(p: int) -> bytes:
    return struct.pack(">H", p)


def test_frame_reader_buffers_partial_frames() -> None:
    r = FrameReader()
    data = encode(DATA, 5, b"abc") + encode(EOF, 5)
    assert r.feed(data[:4]) == []
    frames = r.feed(data[4:])
    assert [(f.kind, f.cid, f.payload) for f in frames] == [(DATA, 5, b"abc"), (EOF, 5, b"")]


@pytest.mark.parametrize(
    "frame",
    [
        HEADER.pack(LISTEN, 0, 2) + _port(22),  # a host-only kind
        HEADER.pack(GO, 0, 0),
        HEADER.pack(OPEN, 2, 2) + _port(22),
        HEADER.pack(99, 0, 0),
        HEADER.pack(DATA, 1, MAX_PAYLOAD + 1),  # refused from the header alone
        HEADER.pack(ACCEPT, 7, 2) + _port(3128),  # no guest-id bit
        HEADER.pack(ACCEPT, GUEST_IDS, 3) + b"abc",
        HEADER.pack(EOF, 3, 1) + b"x",
    ],
    ids=["listen", "go", "open", "unknown", "oversized", "accept-host-id", "accept-len", "eof"],
)
def test_frame_reader_refuses_what_a_guest_may_not_send(frame: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameReader().feed(frame)


def test_listen_binds_in_the_guest_then_carries_its_connection(
    pair: tuple[VMNet, Guest],
) -> None:
    net, guest = pair
    lst = net.listen(3128)
    lst.settimeout(10)
    net.go()
    assert guest.frame() == (LISTEN, 0, _port(3128))
    assert guest.frame() == (GO, 0, b"")
    guest.send(ACCEPT, GUEST_IDS | 1, _port(3128))
    guest.send(DATA, GUEST_IDS | 1, b"GET / HTTP/1.1\r\n")
    conn, _ = lst.accept()
    with conn:
        conn.settimeout(10)
        assert conn.recv(100) == b"GET / HTTP/1.1\r\n"
        conn.sendall(b"HTTP/1.1 403")
        assert guest.frame() == (DATA, GUEST_IDS | 1, b"HTTP/1.1 403")
        guest.send(EOF, GUEST_IDS | 1)
        assert conn.recv(100) == b""
    assert guest.frame() == (EOF, GUEST_IDS | 1, b"")
    # Both directions ended: the host forgets the connection and says so.
    assert guest.frame() == (CLOSE, GUEST_IDS | 1, b"")
    lst.close()


def test_accept_for_a_port_nobody_listens_on_ends_the_channel(
    pair: tuple[VMNet, Guest],
) -> None:
    net, guest = pair
    lst = net.listen(3128)
    lst.settimeout(10)
    guest.send(ACCEPT, GUEST_IDS | 1, _port(3128))
    conn, _ = lst.accept()
    # The attack: a connection to a host port the host never offered.
    guest.send(ACCEPT, GUEST_IDS | 2, _port(22))
    assert guest.closed()
    conn.settimeout(10)
    assert conn.recv(10) == b""  # the live connection went down with the channel
    assert net.failure is not None and "22" in net.failure
    with pytest.raises(ConnectionRefusedError):
        net.connect(8080, timeout_s=1)
    conn.close()
    lst.close()


def test_reused_guest_id_ends_the_channel(pair: tuple[VMNet, Guest]) -> None:
    net, guest = pair
    lst = net.listen(3128)
    lst.settimeout(10)
    guest.send(ACCEPT, GUEST_IDS | 1, _port(3128))
    conn, _ = lst.accept()
    guest.send(ACCEPT, GUEST_IDS | 1, _port(3128))
    assert guest.closed()
    conn.close()
    lst.close()


def test_oversized_frame_ends_the_channel(pair: tuple[VMNet, Guest]) -> None:
    net, guest = pair
    net.listen(3128).close()
    guest.sock.sendall(HEADER.pack(DATA, GUEST_IDS | 1, 0xFFFF))
    assert guest.closed()
    assert net.failure is not None


def test_live_connections_are_capped(pair: tuple[VMNet, Guest]) -> None:
    net, guest = pair
    lst = net.listen(3128)
    lst.settimeout(10)
    assert guest.frame()[0] == LISTEN
    for i in range(MAX_CONNS + 5):
        guest.send(ACCEPT, GUEST_IDS | i, _port(3128))
    # Beyond the cap the host refuses the guest's connection (CLOSE), and
    # its listener never sees it.
    refused = {guest.frame() for _ in range(5)}
    assert refused == {(CLOSE, GUEST_IDS | i, b"") for i in range(MAX_CONNS, MAX_CONNS + 5)}
    accepted = []
    for _ in range(MAX_CONNS):
        accepted.append(lst.accept()[0])
    lst.setblocking(False)
    with pytest.raises(BlockingIOError):
        lst.accept()
    for c in accepted:
        c.close()
    lst.close()


def test_connect_opens_inside_and_a_refusal_raises(pair: tuple[VMNet, Guest]) -> None:
    net, guest = pair
    import threading

    got: list[socket.socket] = []
    t = threading.Thread(target=lambda: got.append(net.connect(8080, timeout_s=10)))
    t.start()
    kind, cid, payload = guest.frame()
    assert (kind, payload) == (OPEN, _port(8080)) and not cid & GUEST_IDS
    guest.send(OPENED, cid)
    guest.send(DATA, cid, b"from-server-inside")
    t.join(10)
    with got[0] as c:
        c.settimeout(10)
        assert c.recv(100) == b"from-server-inside"

    errors: list[BaseException] = []

    def refused() -> None:
        try:
            net.connect(9090, timeout_s=10).close()
        except ConnectionRefusedError as exc:
            errors.append(exc)

    t = threading.Thread(target=refused)
    t.start()
    # The first connection's EOF/CLOSE (from closing it above) is sent by its
    # pump thread and may arrive before or after this OPEN.
    kind, cid2, _ = guest.frame()
    while kind != OPEN:
        kind, cid2, _ = guest.frame()
    guest.send(CLOSE, cid2)
    t.join(10)
    assert len(errors) == 1


def test_opened_for_a_guest_id_ends_the_channel(pair: tuple[VMNet, Guest]) -> None:
    net, guest = pair
    lst = net.listen(3128)
    lst.settimeout(10)
    guest.send(ACCEPT, GUEST_IDS | 1, _port(3128))
    conn, _ = lst.accept()
    guest.send(OPENED, GUEST_IDS | 1)
    assert guest.closed()
    conn.close()
    lst.close()


def test_the_host_listener_is_in_a_private_directory(pair: tuple[VMNet, Guest]) -> None:
    import os
    import stat

    net, _ = pair
    lst = net.listen(3128)
    path = lst.getsockname()
    assert isinstance(path, str)
    st = os.stat(os.path.dirname(path))
    assert stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.geteuid()
    lst.close()
    net.close()
    assert not os.path.exists(os.path.dirname(path))
