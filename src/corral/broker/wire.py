"""Pure helpers for the bytes the proxy receives and sends.

HTTP/1.1 framing itself is h11's job; this module reads request targets
(absolute-form `http://...`, authority-form `host:port`, origin-form
`/routes/...`), rewrites header lists for forwarding, renders denials, and
reads the server name out of a TLS ClientHello. Nothing here does I/O.

Parsing is strict on purpose: a target that two parsers could read
differently (userinfo, fragments, percent-encoded hosts, dot segments or
encoded slashes in a path checked against a prefix) is refused rather than
normalised, so the policy and the upstream never disagree about the
destination.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from corral.broker.hosts import canonical_host
from corral.errors import CorralError

__all__ = [
    "HOP_BY_HOP",
    "AbsoluteTarget",
    "MalformedRequest",
    "client_hello_sni",
    "denial_response",
    "forward_request_headers",
    "forward_response_headers",
    "header_safe",
    "is_ambiguous_path",
    "parse_absolute_target",
    "parse_authority",
    "path_has_prefix",
    "split_origin_target",
    "split_route",
]

Header = tuple[bytes, bytes]


class MalformedRequest(CorralError, ValueError):
    """A request the broker cannot read unambiguously; it is denied."""


HOP_BY_HOP: Final = frozenset(
    {
        b"connection",
        b"proxy-connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"upgrade",
        b"expect",
        b"host",
    }
)

_PORT = re.compile(r"^[0-9]{1,5}$")
_REG_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def parse_authority(authority: str | bytes, default_port: int | None) -> tuple[str, int]:
    """`host[:port]` or `[v6][:port]` -> (canonical host, port).

    `default_port=None` makes the port mandatory (CONNECT). Userinfo,
    percent-encoding and empty hosts are refused with MalformedRequest.
    """
    text = authority.decode("ascii", "replace") if isinstance(authority, bytes) else authority
    if "@" in text or "%" in text:
        raise MalformedRequest(f"refused authority {text!r} (userinfo or encoding)")
    port_text: str | None
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep:
            raise MalformedRequest(f"unterminated IPv6 literal in {text!r}")
        if rest and not rest.startswith(":"):
            raise MalformedRequest(f"malformed authority {text!r}")
        port_text = rest[1:] if rest else None
        host = "[" + host + "]"
    else:
        host, sep, port_part = text.partition(":")
        if ":" in port_part:
            raise MalformedRequest(f"unbracketed IPv6 literal or extra ':' in {text!r}")
        port_text = port_part if sep else None
        if not _REG_NAME.match(host):
            raise MalformedRequest(f"invalid host in {text!r}")
    if port_text is None or port_text == "":
        if default_port is None:
            raise MalformedRequest(f"a port is required in {text!r}")
        if port_text == "":
            raise MalformedRequest(f"empty port in {text!r}")
        port = default_port
    else:
        if not _PORT.match(port_text) or not 1 <= int(port_text) <= 65535:
            raise MalformedRequest(f"invalid port in {text!r}")
        port = int(port_text)
    try:
        return canonical_host(host), port
    except ValueError as exc:
        raise MalformedRequest(str(exc)) from None


@dataclass(frozen=True, slots=True)
class AbsoluteTarget:
    """An absolute-form `http://host[:port]/path?query` target, host canonical."""

    host: str
    port: int
    path: str
    query: str


def parse_absolute_target(target: bytes) -> AbsoluteTarget:
    """Read an absolute-form request target; only the `http` scheme is accepted."""
    text = target.decode("ascii", "replace")
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise MalformedRequest(f"not an absolute-form target: {text[:100]!r}")
    if scheme.lower() != "http":
        raise MalformedRequest(f"scheme {scheme[:20]!r} is not proxied (use CONNECT for https)")
    if "#" in rest:
        raise MalformedRequest("fragments are not sent in requests")
    cut = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    authority, tail = rest[:cut], rest[cut:]
    host, port = parse_authority(authority, 80)
    path, query = split_origin_target(tail or "/")
    return AbsoluteTarget(host, port, path, query)


def split_origin_target(target: str) -> tuple[str, str]:
    """`/path?query` -> (path, query); a bare `?query` gets path `/`."""
    path, _, query = target.partition("?")
    if not path:
        path = "/"
    if not path.startswith("/"):
        raise MalformedRequest(f"path must start with '/': {target[:100]!r}")
    if "#" in target:
        raise MalformedRequest("fragments are not sent in requests")
    return path, query


def is_ambiguous_path(path: str) -> bool:
    """Whether servers may resolve `path` to something a prefix check did not see.

    Dot segments (also `..;`), percent-encoded dots, slashes, backslashes or
    NUL, and literal backslashes.
    """
    lower = path.lower()
    if "\\" in path or any(enc in lower for enc in ("%2e", "%2f", "%5c", "%00")):
        return True
    return any(seg.split(";", 1)[0] in (".", "..") for seg in path.split("/"))


def path_has_prefix(path: str, prefix: str) -> bool:
    """Prefix match on a segment boundary: `/v1` admits `/v1` and `/v1/x`, not `/v1x`."""
    if prefix.endswith("/"):
        return path.startswith(prefix) or path == prefix[:-1]
    return path == prefix or path.startswith(prefix + "/")


def split_route(path: str) -> tuple[str, str] | None:
    """`/routes/<name>/<rest>` -> (name, `/<rest>`), or None if not a route path."""
    if not path.startswith("/routes/"):
        return None
    name, sep, rest = path[len("/routes/") :].partition("/")
    if not name:
        return None
    return name, "/" + rest if sep else "/"


def _connection_tokens(headers: Iterable[Header]) -> set[bytes]:
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def forward_request_headers(
    headers: Sequence[Header],
    host: bytes,
    strip: Iterable[bytes] = (),
    inject: Sequence[Header] = (),
    *,
    close: bool = True,
) -> list[Header]:
    """Headers for the upstream request.

    Hop-by-hop headers (and any named in `Connection`) go, `Host` is set to
    the checked destination (a client-supplied Host never picks the virtual
    host), `strip` names are removed, `inject` pairs appended, and with
    `close` a `Connection: close` ends the upstream exchange after one response.
    Framing headers (Content-Length, Transfer-Encoding) stay: h11 validated
    them and frames the body the same way upstream.
    """
    drop = HOP_BY_HOP | _connection_tokens(headers) | set(strip) | {n for n, _ in inject}
    out: list[Header] = [(b"host", host)]
    out.extend((n, v) for n, v in headers if n not in drop)
    out.extend(inject)
    if close:
        out.append((b"connection", b"close"))
    return out


def forward_response_headers(headers: Sequence[Header]) -> list[Header]:
    """Upstream response headers for the client, without hop-by-hop ones.

    Transfer-Encoding goes too: h11 re-frames the body for the client's
    HTTP version.
    """
    drop = HOP_BY_HOP | _connection_tokens(headers) | {b"transfer-encoding"}
    return [(n, v) for n, v in headers if n not in drop]


def header_safe(text: str, limit: int = 200) -> str:
    """`text` reduced to printable ASCII that can sit in a header value."""
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in text)
    return cleaned[:limit]


_STATUS_TEXT: Final = {
    400: "Bad Request",
    403: "Forbidden",
    408: "Request Timeout",
    413: "Content Too Large",
    421: "Misdirected Request",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


def denial_response(status: int, rule: str, reason: str, target: str = "") -> bytes:
    """A complete HTTP/1.1 response that refuses a request and closes the connection.

    Carries `X-Corral-Denied: <rule>` and `X-Corral-Reason: <reason>` and a
    text body a human can read in curl's output.
    """
    what = f" {header_safe(target, 300)}" if target else ""
    body = f"corral broker denied{what}: {header_safe(reason, 500)} (rule: {header_safe(rule)})\n"
    body_bytes = body.encode("ascii")
    head = (
        f"HTTP/1.1 {status} {_STATUS_TEXT.get(status, 'Error')}\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body_bytes)}\r\n"
        "Connection: close\r\n"
        f"X-Corral-Denied: {header_safe(rule)}\r\n"
        f"X-Corral-Reason: {header_safe(reason)}\r\n"
        "\r\n"
    )
    return head.encode("ascii") + body_bytes


SniResult = (
    tuple[Literal["incomplete"], None]
    | tuple[Literal["not-tls"], None]
    | tuple[Literal["malformed"], None]
    | tuple[Literal["ok"], str | None]
)

_MAX_HELLO: Final = 65536


def client_hello_sni(data: bytes) -> SniResult:
    """The server name in the TLS ClientHello that starts `data`.

    Returns ("ok", name-or-None) once the whole ClientHello is in `data`,
    ("incomplete", None) when more bytes are needed, ("not-tls", None) when
    `data` does not start with a TLS handshake record and ("malformed", None)
    otherwise. Handshake messages split over several records are reassembled.
    """
    if not data:
        return ("incomplete", None)
    if data[0] != 0x16:
        return ("not-tls", None)
    handshake = bytearray()
    pos = 0
    while True:
        if len(data) < pos + 5:
            return ("incomplete", None) if len(data) < _MAX_HELLO else ("malformed", None)
        if data[pos] != 0x16 or data[pos + 1] != 0x03:
            return ("malformed", None)
        length = int.from_bytes(data[pos + 3 : pos + 5], "big")
        if length == 0 or length > 16384 + 2048:
            return ("malformed", None)
        if len(data) < pos + 5 + length:
            return ("incomplete", None)
        handshake += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        if len(handshake) >= 4:
            if handshake[0] != 0x01:
                return ("malformed", None)
            hs_len = int.from_bytes(handshake[1:4], "big")
            if hs_len > _MAX_HELLO:
                return ("malformed", None)
            if len(handshake) >= 4 + hs_len:
                return _sni_from_hello(bytes(handshake[4 : 4 + hs_len]))


def _sni_from_hello(body: bytes) -> SniResult:
    try:
        pos = 2 + 32
        pos += 1 + body[pos]
        pos += 2 + int.from_bytes(body[pos : pos + 2], "big")
        pos += 1 + body[pos]
        if pos == len(body):
            return ("ok", None)
        end = pos + 2 + int.from_bytes(body[pos : pos + 2], "big")
        if end > len(body):
            return ("malformed", None)
        pos += 2
        while pos + 4 <= end:
            ext_type = int.from_bytes(body[pos : pos + 2], "big")
            ext_len = int.from_bytes(body[pos + 2 : pos + 4], "big")
            ext = body[pos + 4 : pos + 4 + ext_len]
            if len(ext) != ext_len:
                return ("malformed", None)
            if ext_type == 0:
                return _sni_from_extension(ext)
            pos += 4 + ext_len
        return ("ok", None)
    except IndexError:
        return ("malformed", None)


def _sni_from_extension(ext: bytes) -> SniResult:
    list_len = int.from_bytes(ext[0:2], "big")
    pos, end = 2, min(2 + list_len, len(ext))
    while pos + 3 <= end:
        name_type = ext[pos]
        name_len = int.from_bytes(ext[pos + 1 : pos + 3], "big")
        name = ext[pos + 3 : pos + 3 + name_len]
        if len(name) != name_len:
            return ("malformed", None)
        if name_type == 0:
            try:
                return ("ok", canonical_host(name.decode("ascii")))
            except (UnicodeDecodeError, ValueError):
                return ("malformed", None)
        pos += 3 + name_len
    return ("malformed", None)
