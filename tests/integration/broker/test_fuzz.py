"""Hostile bytes against a live broker: it answers or closes in time, forwards nothing unallowed.

A canary server stands behind every name the broker can resolve. Policy
admits only `GET /ok/...` on `allowed.test`; afterwards every request the
canary saw must be such a request, and the broker must still be serving.
"""

from __future__ import annotations

import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.broker.config import BrokerConfig, LimitsConfig, RuleConfig
from corral.broker.wire import is_ambiguous_path

from .conftest import BrokerFactory, ServerFactory
from .testlib import RecordingServer, RunningBroker, raw_exchange


def _setup(servers: ServerFactory, brokers: BrokerFactory) -> tuple[RecordingServer, RunningBroker]:
    canary = servers()
    config = BrokerConfig(
        rules=(
            RuleConfig(
                host="allowed.test",
                ports=(canary.port,),
                methods=("GET",),
                path_prefixes=("/ok/",),
                allow_private=True,
            ),
        ),
        resolver_overrides={n: ("127.0.0.1",) for n in ("allowed.test", "forbidden.test")},
        system_dns=False,
        limits=LimitsConfig(
            header_timeout_s=1.0, idle_timeout_s=2.0, max_header_bytes=8192, body_timeout_s=2.0
        ),
    )
    return canary, brokers(config)


def _assert_canary_clean(canary: RecordingServer, broker: RunningBroker) -> None:
    for hit in canary.hits:
        assert hit.headers.get("host") == f"allowed.test:{canary.port}", hit
        assert hit.method == "GET", hit
        path = hit.path.split("?", 1)[0]
        assert path.startswith("/ok/") and not is_ambiguous_path(path), hit
    assert broker.process.poll() is None


def _requests(port: int) -> st.SearchStrategy[bytes]:
    known = st.sampled_from(
        [
            f"http://allowed.test:{port}/ok/x",
            f"http://allowed.test:{port}/ok/y?z=1",
            f"http://ALLOWED.test.:{port}/ok/x",
            f"http://allowed.test:{port}/ok/../secret",
            f"http://allowed.test:{port}/ok/%2e%2e/secret",
            f"http://allowed.test:{port}/secret",
            f"http://forbidden.test:{port}/ok/x",
            f"http://allowed.test@forbidden.test:{port}/ok/x",
            f"http://forbidden.test:{port}@allowed.test/ok/x",
            f"http://127.0.0.1:{port}/ok/x",
            f"http://2130706433:{port}/ok/x",
            f"allowed.test:{port}",
            f"forbidden.test:{port}",
            "/routes/none/x",
            "/",
            "*",
            "http://[::1",
            "https://allowed.test/ok/x",
        ]
    )
    targets = st.one_of(
        known,
        known,
        known,
        st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40),
    )
    methods = st.sampled_from(
        ["GET"] * 6 + ["POST", "CONNECT", "CONNECT", "HEAD", "get", "FOO", "", "G T"]
    )
    versions = st.sampled_from(["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/2.0", "HTTP/1.1x", ""])
    header = st.tuples(
        st.sampled_from(
            ["Host", "Content-Length", "Transfer-Encoding", "Connection", "Expect", "X-A", "Host "]
        )
        | st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=10),
        st.sampled_from(
            [
                f"allowed.test:{port}",
                "forbidden.test",
                "5",
                "-1",
                "chunked",
                "close",
                "100-continue",
            ]
        )
        | st.text(st.characters(min_codepoint=0, max_codepoint=255), max_size=20),
    )
    eol = st.sampled_from(["\r\n"] * 5 + ["\n"])

    @st.composite
    def structured(draw: st.DrawFn) -> bytes:
        nl = draw(eol)
        head = f"{draw(methods)} {draw(targets)} {draw(versions)}{nl}"
        if draw(st.integers(0, 4)):
            head += f"Host: {draw(st.sampled_from(['x', 'forbidden.test', 'allowed.test']))}{nl}"
        if draw(st.integers(0, 2)) == 0:
            for name, value in draw(st.lists(header, max_size=3)):
                head += f"{name}: {value}{nl}"
        data = (head + nl).encode("latin-1")
        if draw(st.integers(0, 3)) == 0:
            data += draw(st.binary(max_size=64))
        if draw(st.integers(0, 4)) == 0:
            data = data[: draw(st.integers(0, len(data)))]
        return data * draw(st.sampled_from([1, 1, 1, 2]))

    return st.one_of(structured(), structured(), structured(), st.binary(max_size=512))


def test_hostile_requests_are_answered_or_closed(
    servers: ServerFactory, brokers: BrokerFactory
) -> None:
    canary, broker = _setup(servers, brokers)

    @settings(
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        derandomize=False,
    )
    @given(data=_requests(canary.port))
    def check(data: bytes) -> None:
        reply, closed = raw_exchange(broker.port, data, timeout=5.0)
        assert closed, (data, reply)
        if reply:
            assert reply.startswith(b"HTTP/1.1 "), reply[:100]

    check()
    _assert_canary_clean(canary, broker)
    # The allowed request itself still works after all that.
    reply, _ = raw_exchange(
        broker.port,
        f"GET http://allowed.test:{canary.port}/ok/final HTTP/1.1\r\nHost: x\r\n\r\n".encode(),
    )
    assert reply.startswith(b"HTTP/1.1 200")
    _assert_canary_clean(canary, broker)


def test_slowloris_is_cut_at_the_header_deadline(
    servers: ServerFactory, brokers: BrokerFactory
) -> None:
    canary, broker = _setup(servers, brokers)
    head = f"GET http://allowed.test:{canary.port}/ok/x HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode()
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.settimeout(0.25)
        reply = b""
        for byte in head + b"a" * 40:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break
            try:
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                break
            if not chunk:
                break
            reply += chunk
    # Dripped in at least a byte per 0.25 s, the whole request takes ~25 s: a
    # 408 means the deadline counted from the first byte (a per-read timeout
    # would never fire). How long a loaded host took to send it decides nothing.
    assert reply.startswith(b"HTTP/1.1 408")
    assert canary.hits == []
    rows = [r for r in broker.rows() if r.rule == "malformed-request"]
    assert rows and "timed out" in rows[0].reason


@pytest.mark.parametrize("size", [20_000, 1_000_000])
def test_huge_headers_are_refused(
    size: int, servers: ServerFactory, brokers: BrokerFactory
) -> None:
    canary, broker = _setup(servers, brokers)
    data = (
        f"GET http://allowed.test:{canary.port}/ok/x HTTP/1.1\r\nHost: x\r\nX-Big: ".encode()
        + b"a" * size
        + b"\r\n\r\n"
    )
    reply, closed = raw_exchange(broker.port, data, timeout=5.0)
    assert closed
    assert reply.startswith(b"HTTP/1.1 431")
    assert canary.hits == []


def test_known_bypass_attempts_are_denied(servers: ServerFactory, brokers: BrokerFactory) -> None:
    canary, broker = _setup(servers, brokers)
    p = canary.port
    attacks = [
        f"GET http://allowed.test:{p}/ok/../secret HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://allowed.test:{p}/ok/%2e%2e/secret HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://allowed.test:{p}/ok/..;/secret HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://allowed.test:{p}/okay HTTP/1.1\r\nHost: x\r\n\r\n",
        f"POST http://allowed.test:{p}/ok/x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        f"get http://allowed.test:{p}/ok/x HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://allowed.test@forbidden.test:{p}/ok/x HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://forbidden.test:{p}#@allowed.test/ok/x HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://forbidden.test:{p}/ok/x HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n",
        f"GET /ok/x HTTP/1.1\r\nHost: allowed.test:{p}\r\n\r\n",
        f"CONNECT allowed.test:{p} HTTP/1.1\r\nHost: x\r\n\r\nGET /secret HTTP/1.1\r\n\r\n",
        f"GET https://allowed.test:{p}/ok/x HTTP/1.1\r\nHost: x\r\n\r\n",
        f"GET http://127.0.0.1:{p}/ok/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n",
        (
            f"GET http://allowed.test:{p}/ok/x HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n"
            "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
            f"GET http://allowed.test:{p}/secret HTTP/1.1\r\nHost: x\r\n\r\n"
        ),
    ]
    for attack in attacks:
        reply, closed = raw_exchange(broker.port, attack.encode(), timeout=5.0)
        assert closed, attack
        assert reply.startswith((b"HTTP/1.1 403", b"HTTP/1.1 400")), (attack, reply[:200])
    assert canary.hits == []
    # Pipelining: the second request on a kept-alive connection is checked too.
    pipelined = (
        f"GET http://allowed.test:{p}/ok/first HTTP/1.1\r\nHost: x\r\n\r\n"
        f"GET http://forbidden.test:{p}/ok/second HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    reply, _ = raw_exchange(broker.port, pipelined.encode(), timeout=5.0)
    assert reply.startswith(b"HTTP/1.1 200")
    assert b"HTTP/1.1 403" in reply
    assert [h.path for h in canary.hits] == ["/ok/first"]
    _assert_canary_clean(canary, broker)
