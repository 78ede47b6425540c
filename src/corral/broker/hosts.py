"""Host names and addresses as the broker sees them (pure).

Every host that reaches a policy decision is first put in canonical form, so
that one destination has exactly one spelling:

- names are lower-cased, lose one trailing dot and must be valid DNS names
  whose last label is not numeric;
- anything the C library would read as an IPv4 address (`inet_aton` accepts
  `2130706433`, `0x7f000001`, `0177.0.0.1`, `127.1`) becomes a dotted quad,
  because `getaddrinfo` would turn such a "name" into that address without
  any DNS query;
- IPv6 literals lose their brackets and are compressed; zone ids are refused.

`forbidden_category` says why an address may not be reached without an
explicit `allow_private` rule (loopback, private, link-local, CGNAT, cloud
metadata, reserved, ...). IPv6 forms that embed an IPv4 address
(IPv4-mapped, IPv4-compatible, NAT64, 6to4) are judged by the embedded
address, since the kernel or a translator delivers them there.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from typing import Final

__all__ = [
    "ALWAYS_FORBIDDEN",
    "canonical_host",
    "forbidden_category",
    "format_hostport",
    "host_matches",
    "ip_literal",
    "parse_ipv4_numeric",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LABEL = re.compile(r"^[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?$")
_NUMERIC_LABEL = re.compile(r"^(?:[0-9]+|0x[0-9a-f]*)$")

# Categories no rule can allow: these never name a real upstream, and
# connecting to 0.0.0.0 or :: reaches the local host on Linux.
ALWAYS_FORBIDDEN: Final = frozenset({"unspecified", "multicast", "broadcast"})

_V4: Final[tuple[tuple[ipaddress.IPv4Network, str], ...]] = tuple(
    (ipaddress.IPv4Network(net), cat)
    for net, cat in (
        ("255.255.255.255/32", "broadcast"),
        ("169.254.169.254/32", "metadata"),
        ("100.100.100.200/32", "metadata"),
        ("168.63.129.16/32", "metadata"),
        ("0.0.0.0/8", "unspecified"),
        ("10.0.0.0/8", "private"),
        ("100.64.0.0/10", "cgnat"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local"),
        ("172.16.0.0/12", "private"),
        ("192.0.0.0/24", "reserved"),
        ("192.0.2.0/24", "reserved"),
        ("192.88.99.0/24", "reserved"),
        ("192.168.0.0/16", "private"),
        ("198.18.0.0/15", "reserved"),
        ("198.51.100.0/24", "reserved"),
        ("203.0.113.0/24", "reserved"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),
    )
)

_V6_EXACT: Final[dict[ipaddress.IPv6Address, str]] = {
    ipaddress.IPv6Address("::"): "unspecified",
    ipaddress.IPv6Address("::1"): "loopback",
    ipaddress.IPv6Address("fd00:ec2::254"): "metadata",
}
_V6_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
_V6_COMPAT = ipaddress.IPv6Network("::/96")
_V6_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_V6_6TO4 = ipaddress.IPv6Network("2002::/16")
_V6_GLOBAL_UNICAST = ipaddress.IPv6Network("2000::/3")
_V6: Final[tuple[tuple[ipaddress.IPv6Network, str], ...]] = tuple(
    (ipaddress.IPv6Network(net), cat)
    for net, cat in (
        ("64:ff9b:1::/48", "private"),
        ("100::/64", "reserved"),
        ("2001::/23", "reserved"),
        ("2001:db8::/32", "reserved"),
        ("3fff::/20", "reserved"),
        ("fc00::/7", "private"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "private"),
        ("ff00::/8", "multicast"),
    )
)


def parse_ipv4_numeric(text: str) -> ipaddress.IPv4Address | None:
    """Read `text` the way glibc's `inet_aton` does, or return None.

    One to four parts separated by dots; each part decimal, `0x` hex or
    `0`-prefixed octal; the last part fills the remaining bytes.
    """
    parts = text.split(".")
    if not 1 <= len(parts) <= 4:
        return None
    values: list[int] = []
    for part in parts:
        if not part:
            return None
        if part[:2] in ("0x", "0X"):
            digits, base = part[2:], 16
            if not digits or any(c not in "0123456789abcdefABCDEF" for c in digits):
                return None
        elif len(part) > 1 and part[0] == "0":
            digits, base = part[1:], 8
            if any(c not in "01234567" for c in digits):
                return None
        else:
            digits, base = part, 10
            if not digits.isascii() or not digits.isdigit():
                return None
        values.append(int(digits, base))
    *head, last = values
    if any(v > 255 for v in head):
        return None
    if last >= 1 << (8 * (4 - len(head))):
        return None
    number = 0
    for v in head:
        number = (number << 8) | v
    number = (number << (8 * (4 - len(head)))) | last
    return ipaddress.IPv4Address(number)


def canonical_host(raw: str) -> str:
    """Return the one spelling of `raw` used by policy and journal.

    Raises ValueError for anything that is neither a valid DNS name nor an IP
    literal (empty, non-ASCII, zone ids, numeric last labels that are not an
    IPv4 address, over-long names).
    """
    host = raw.strip()
    if not host or not host.isascii():
        raise ValueError(f"invalid host {raw!r}")
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        if "%" in inner:
            raise ValueError(f"IPv6 zone ids are not accepted: {raw!r}")
        try:
            return ipaddress.IPv6Address(inner).compressed
        except ValueError:
            raise ValueError(f"invalid IPv6 literal {raw!r}") from None
    if ":" in host:
        if "%" in host:
            raise ValueError(f"IPv6 zone ids are not accepted: {raw!r}")
        try:
            return ipaddress.IPv6Address(host).compressed
        except ValueError:
            raise ValueError(f"invalid host {raw!r}") from None
    host = host.lower()
    if host.endswith("."):
        host = host[:-1]
    v4 = parse_ipv4_numeric(host)
    if v4 is not None:
        return str(v4)
    if len(host) > 253:
        raise ValueError(f"host name too long: {raw!r}")
    labels = host.split(".")
    if not all(_LABEL.match(label) for label in labels):
        raise ValueError(f"invalid host name {raw!r}")
    if _NUMERIC_LABEL.match(labels[-1]):
        raise ValueError(f"numeric top-level label is not a name: {raw!r}")
    return host


@functools.lru_cache(maxsize=4096)
def ip_literal(host: str) -> IPAddress | None:
    """The address a canonical host denotes, or None when it is a name."""
    if ":" in host:
        return ipaddress.IPv6Address(host)
    if host[-1:].isdigit():
        try:
            return ipaddress.IPv4Address(host)
        except ValueError:
            return None
    return None


def format_hostport(host: str, port: int) -> str:
    """`host:port`, bracketing IPv6 literals."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_matches(pattern: str, host: str) -> bool:
    """Whether canonical `host` matches a canonical name pattern.

    `*.suffix` matches names with at least one label before `.suffix`, never
    the bare suffix and never an IP literal; any other pattern matches
    exactly.
    """
    if pattern.startswith("*."):
        return host.endswith(pattern[1:]) and ip_literal(host) is None
    return host == pattern


_V4_RANGES: Final = tuple(
    (int(net.network_address), int(net.broadcast_address), cat) for net, cat in _V4
)


def _v4_category(addr: ipaddress.IPv4Address) -> str | None:
    value = int(addr)
    for first, last, cat in _V4_RANGES:
        if first <= value <= last:
            return cat
    return None


@functools.lru_cache(maxsize=4096)
def _category_of(address: str) -> str | None:
    return forbidden_category(ipaddress.ip_address(address))


def forbidden_category(address: str | IPAddress) -> str | None:
    """Why `address` is not a public destination, or None when it is one."""
    if isinstance(address, str):
        return _category_of(address)
    addr = address
    if isinstance(addr, ipaddress.IPv4Address):
        return _v4_category(addr)
    if addr.scope_id:
        return "link-local"
    exact = _V6_EXACT.get(addr)
    if exact is not None:
        return exact
    embedded: ipaddress.IPv4Address | None = None
    if addr in _V6_MAPPED or addr in _V6_COMPAT or addr in _V6_NAT64:
        embedded = ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    elif addr in _V6_6TO4:
        embedded = ipaddress.IPv4Address((int(addr) >> 80) & 0xFFFFFFFF)
    if embedded is not None:
        inner = _v4_category(embedded)
        if addr in _V6_COMPAT:
            # IPv4-compatible addresses are deprecated; nothing legitimate
            # resolves to them.
            return inner or "reserved"
        return inner
    for net, cat in _V6:
        if addr in net:
            return cat
    if addr not in _V6_GLOBAL_UNICAST:
        return "reserved"
    return None
