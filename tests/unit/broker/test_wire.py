"""Request targets, header rewriting, denials and ClientHello parsing."""

from __future__ import annotations

import ssl

import h11
import pytest

from corral.broker.wire import (
    MalformedRequest,
    client_hello_sni,
    denial_response,
    forward_request_headers,
    forward_response_headers,
    is_ambiguous_path,
    parse_absolute_target,
    parse_authority,
    path_has_prefix,
    split_route,
)


@pytest.mark.parametrize(
    ("target", "host", "port", "path", "query"),
    [
        (b"http://pypi.org/simple/", "pypi.org", 80, "/simple/", ""),
        (b"http://PyPI.org:8080", "pypi.org", 8080, "/", ""),
        (b"HTTP://example.com?x=1", "example.com", 80, "/", "x=1"),
        (b"http://[::1]:81/a?b", "::1", 81, "/a", "b"),
        (b"http://2130706433/", "127.0.0.1", 80, "/", ""),
        (b"http://0x7f.1:8000/x", "127.0.0.1", 8000, "/x", ""),
    ],
)
def test_parse_absolute_target(target: bytes, host: str, port: int, path: str, query: str) -> None:
    parsed = parse_absolute_target(target)
    assert (parsed.host, parsed.port, parsed.path, parsed.query) == (host, port, path, query)


@pytest.mark.parametrize(
    "target",
    [
        b"https://pypi.org/",
        b"ftp://pypi.org/",
        b"http://user:pw@pypi.org/",
        b"http://evil.com@pypi.org/",
        b"http://pypi.org/#frag",
        b"http://pypi%2eorg/",
        b"http://pypi.org:0/",
        b"http://pypi.org:99999/",
        b"http://pypi.org:/",
        b"http://::1/",
        b"http:///path",
        b"pypi.org/",
    ],
)
def test_parse_absolute_target_refuses(target: bytes) -> None:
    with pytest.raises(MalformedRequest):
        parse_absolute_target(target)


def test_parse_authority() -> None:
    assert parse_authority(b"example.com:443", None) == ("example.com", 443)
    assert parse_authority("[2606:4700::1]:443", None) == ("2606:4700::1", 443)
    with pytest.raises(MalformedRequest):
        parse_authority(b"example.com", None)
    with pytest.raises(MalformedRequest):
        parse_authority(b"a@example.com:443", None)


@pytest.mark.parametrize(
    ("path", "ambiguous"),
    [
        ("/simple/pkg/", False),
        ("/a/./b", True),
        ("/a/../b", True),
        ("/a/..", True),
        ("/a/..;/b", True),
        ("/a/%2e%2e/b", True),
        ("/a/%2E./b", True),
        ("/a%2fb", True),
        ("/a\\b", True),
        ("/a/%00", True),
        ("/a/..b/c", False),
        ("/a/.well-known", False),
    ],
)
def test_is_ambiguous_path(path: str, ambiguous: bool) -> None:
    assert is_ambiguous_path(path) is ambiguous


def test_path_prefix_on_segment_boundary() -> None:
    assert path_has_prefix("/v1", "/v1")
    assert path_has_prefix("/v1/messages", "/v1")
    assert not path_has_prefix("/v1x", "/v1")
    assert path_has_prefix("/simple/x", "/simple/")
    assert path_has_prefix("/simple", "/simple/")
    assert not path_has_prefix("/simplex", "/simple/")


def test_split_route() -> None:
    assert split_route("/routes/anthropic/v1/messages") == ("anthropic", "/v1/messages")
    assert split_route("/routes/anthropic") == ("anthropic", "/")
    assert split_route("/routes/") is None
    assert split_route("/other") is None


def test_forward_request_headers_rewrites_host_and_drops_hop_by_hop() -> None:
    headers = [
        (b"host", b"evil.example"),
        (b"connection", b"keep-alive, x-secret-hop"),
        (b"x-secret-hop", b"1"),
        (b"proxy-authorization", b"Basic abc"),
        (b"proxy-connection", b"keep-alive"),
        (b"upgrade", b"websocket"),
        (b"expect", b"100-continue"),
        (b"content-length", b"3"),
        (b"x-api-key", b"dummy"),
        (b"accept", b"*/*"),
    ]
    out = forward_request_headers(
        headers, b"api.test", strip={b"x-api-key"}, inject=[(b"x-api-key", b"real")]
    )
    assert out == [
        (b"host", b"api.test"),
        (b"content-length", b"3"),
        (b"accept", b"*/*"),
        (b"x-api-key", b"real"),
        (b"connection", b"close"),
    ]


def test_forward_response_headers() -> None:
    out = forward_response_headers(
        [
            (b"transfer-encoding", b"chunked"),
            (b"connection", b"close"),
            (b"location", b"http://x/"),
            (b"keep-alive", b"timeout=5"),
        ]
    )
    assert out == [(b"location", b"http://x/")]


def test_denial_response_is_valid_http() -> None:
    raw = denial_response(403, "default-deny", "no rule admits evil.test:80\r\nX-Inject: 1")
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    response = conn.next_event()
    assert isinstance(response, h11.Response)
    assert response.status_code == 403
    headers = dict(response.headers)
    assert headers[b"x-corral-denied"] == b"default-deny"
    assert b"x-inject" not in headers
    body = conn.next_event()
    assert isinstance(body, h11.Data)
    assert b"default-deny" in body.data


def _client_hello(server_name: str | None) -> bytes:
    ctx = ssl.create_default_context()
    if server_name is None:
        ctx.check_hostname = False
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=server_name)
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def test_client_hello_sni() -> None:
    hello = _client_hello("Secure.Example.test")
    assert client_hello_sni(hello) == ("ok", "secure.example.test")
    assert client_hello_sni(hello[:3]) == ("incomplete", None)
    assert client_hello_sni(hello[: len(hello) // 2]) == ("incomplete", None)
    assert client_hello_sni(_client_hello(None)) == ("ok", None)
    assert client_hello_sni(b"GET / HTTP/1.1\r\n") == ("not-tls", None)
    assert client_hello_sni(b"\x16\x03\x01\x00\x00") == ("malformed", None)
    assert client_hello_sni(b"\x16\x03\x01\x00\x05\x02\x00\x00\x01\x00") == ("malformed", None)


def test_client_hello_split_over_records() -> None:
    hello = _client_hello("split.test")
    body = hello[5:]
    half = len(body) // 2
    records = b"".join(
        b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part for part in (body[:half], body[half:])
    )
    assert client_hello_sni(records) == ("ok", "split.test")
