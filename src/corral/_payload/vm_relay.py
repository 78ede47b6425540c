"""The microVM guest's loopback relay: one virtio-serial port <-> many guest TCP connections.

Runs inside the guest as guest root, started by the init before the
command (`/usr/bin/python3 -I -S vm_relay.py PORTDEV GOFIFO`), standard
library only. The host (`corral.sandbox.microvm.net`) speaks the frame
protocol below over the port; this side:

- LISTEN port: listen on the guest's 127.0.0.1:port; each connection the
  command makes there becomes ACCEPT (a guest-chosen id, high bit set);
- GO: every LISTEN before it is bound; write "go" to GOFIFO so the init
  starts the command;
- OPEN id port: connect to the guest's 127.0.0.1:port, answer OPENED or CLOSE;
- DATA / EOF / CLOSE: bytes, half-close and reset of one connection.

Frame: type (1 byte), connection id (4 bytes, big endian), payload length
(2 bytes), payload (at most MAX_PAYLOAD bytes).
"""

import contextlib
import os
import socket
import struct
import sys
import threading

LISTEN, GO, OPEN, OPENED, ACCEPT, DATA, EOF, CLOSE = range(1, 9)
HEADER = struct.Struct(">BIH")
MAX_PAYLOAD = 16384
GUEST_IDS = 0x80000000

port_fd = os.open(sys.argv[1], os.O_RDWR)
go_path = sys.argv[2]
wlock = threading.Lock()
conns: dict[int, socket.socket] = {}
clock = threading.Lock()
next_id = [GUEST_IDS]


def send(kind: int, cid: int, payload: bytes = b"") -> None:
    data = HEADER.pack(kind, cid, len(payload)) + payload
    with wlock:
        view = memoryview(data)
        while view:
            view = view[os.write(port_fd, view) :]


def read_exact(n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = os.read(port_fd, n - len(buf))
        if not chunk:
            os._exit(0)
        buf += chunk
    return buf


def pump(cid: int, sock: socket.socket) -> None:
    try:
        while True:
            data = sock.recv(MAX_PAYLOAD)
            if not data:
                send(EOF, cid)
                return
            send(DATA, cid, data)
    except OSError:
        drop(cid)
        send(CLOSE, cid)


def drop(cid: int) -> None:
    with clock:
        sock = conns.pop(cid, None)
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.close()


def add(cid: int, sock: socket.socket) -> None:
    with clock:
        conns[cid] = sock
    threading.Thread(target=pump, args=(cid, sock), daemon=True).start()


def serve(srv: socket.socket, port: int) -> None:
    while True:
        c, _ = srv.accept()
        with clock:
            cid = next_id[0]
            next_id[0] = GUEST_IDS | ((cid + 1) & 0x7FFFFFFF)
        # ACCEPT before any DATA of the connection: the pump starts after it.
        send(ACCEPT, cid, struct.pack(">H", port))
        add(cid, c)


def opener(cid: int, port: int) -> None:
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=10)
        c.settimeout(None)
    except OSError:
        send(CLOSE, cid)
        return
    send(OPENED, cid)
    add(cid, c)


while True:
    kind, cid, length = HEADER.unpack(read_exact(HEADER.size))
    payload = read_exact(length) if length else b""
    if kind == LISTEN:
        port = struct.unpack(">H", payload)[0]
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        srv.bind(("127.0.0.1", port))
        srv.listen(256)
        threading.Thread(target=serve, args=(srv, port), daemon=True).start()
    elif kind == GO:
        with open(go_path, "w") as fh:
            fh.write("go\n")
    elif kind == OPEN:
        port = struct.unpack(">H", payload)[0]
        threading.Thread(target=opener, args=(cid, port), daemon=True).start()
    elif kind == DATA:
        with clock:
            sock = conns.get(cid)
        if sock is not None:
            try:
                sock.sendall(payload)
            except OSError:
                drop(cid)
                send(CLOSE, cid)
    elif kind == EOF:
        with clock:
            sock = conns.get(cid)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
    elif kind == CLOSE:
        drop(cid)
