"""The broker's SOCKS5 server against hostile and well-formed clients (no sandbox)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from corral.broker.config import BrokerConfig, TcpRuleConfig

from .conftest import BrokerFactory


@pytest.fixture
def upstream() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP server that records what it receives and answers a fixed 1000 bytes."""
    got: list[bytes] = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                data = b""
                try:
                    while len(data) < 300:
                        chunk = conn.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    got.append(data)
                    conn.sendall(b"x" * 1000)
                except OSError:
                    got.append(data)

    threading.Thread(target=serve, daemon=True).start()
    yield int(sock.getsockname()[1]), got
    sock.close()


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        return out


def _connect(host: bytes, port: int) -> bytes:
    return (
        b"\x05\x01\x00" + b"\x05\x01\x00\x03" + bytes([len(host)]) + host + port.to_bytes(2, "big")
    )


def test_bytes_are_counted_and_the_outcome_journaled(
    brokers: BrokerFactory, upstream: tuple[int, list[bytes]]
) -> None:
    port, got = upstream
    cfg = BrokerConfig(
        tcp=(TcpRuleConfig(host="svc.test", port=port, allow_private=True),),
        resolver_overrides={"svc.test": ("127.0.0.1",)},
        system_dns=False,
    )
    broker = brokers(cfg)
    # The greeting, the request and 300 payload bytes in a single write.
    reply = _exchange(broker.port, _connect(b"svc.test", port) + b"p" * 300)
    assert reply[:2] == b"\x05\x00" and reply[2:4] == b"\x05\x00"
    assert reply.endswith(b"x" * 1000)
    assert got == [b"p" * 300]
    rows = broker.wait_rows(lambda rs: any(r.kind == "tcp_connect" and r.bytes_down for r in rs))
    row = next(r for r in rows if r.kind == "tcp_connect")
    assert (row.target, row.decision, row.rule) == (
        f"tcp://svc.test:{port}",
        "allow",
        f"tcp-allow:svc.test:{port}",
    )
    assert (row.bytes_up, row.bytes_down) == (300, 1000)
    assert row.outcome is not None and row.outcome["address"] == "127.0.0.1"
    assert row.detail["resolved"] == ["127.0.0.1"]


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (b"\x05\x01\x02", b"\x05\xff"),  # only username/password offered
        (b"\x05\x01\x00\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x16", b"\x05\x00\x05\x07"),  # BIND
        (b"\x05\x01\x00\x05\x01\x00\x07", b"\x05\x00\x05\x08"),  # unknown address type
        (b"\x05\x01\x00\x05\x01\x00\x03\x03a\xffb\x00\x16", b"\x05\x00\x05\x04"),  # non-ASCII
    ],
)
def test_unsupported_requests_are_refused_and_journaled(
    brokers: BrokerFactory, upstream: tuple[int, list[bytes]], data: bytes, answer: bytes
) -> None:
    port, got = upstream
    broker = brokers(
        BrokerConfig(tcp=(TcpRuleConfig(host="127.0.0.1", port=port, allow_private=True),))
    )
    assert _exchange(broker.port, data).startswith(answer)
    rows = broker.wait_rows(lambda rs: any(r.rule == "malformed" for r in rs))
    assert any(r.kind == "process_event" and r.decision == "deny" for r in rows)
    assert got == []


def test_http_on_the_same_port_is_unaffected(brokers: BrokerFactory) -> None:
    broker = brokers(BrokerConfig())
    reply = _exchange(
        broker.port, b"GET http://nowhere.test/ HTTP/1.1\r\nHost: nowhere.test\r\n\r\n"
    )
    assert reply.startswith(b"HTTP/1.1 403")
