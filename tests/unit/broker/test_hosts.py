"""Host canonical forms and address classification."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.broker.hosts import (
    canonical_host,
    forbidden_category,
    host_matches,
    ip_literal,
    parse_ipv4_numeric,
)


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("PyPI.org", "pypi.org"),
        ("pypi.org.", "pypi.org"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7F.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("169.254.43518", "169.254.169.254"),
        ("[::1]", "::1"),
        ("[0:0:0:0:0:ffff:7f00:1]", "::ffff:7f00:1"),
        ("::FFFF:127.0.0.1", "::ffff:7f00:1"),
        ("a_b.example.com", "a_b.example.com"),
    ],
)
def test_canonical_host(raw: str, canonical: str) -> None:
    assert canonical_host(raw) == canonical


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "exa mple.com",
        "ex%61mple.com",
        "1.2.3.4.5",
        "256.0.0.1",
        "08.0.0.1",
        "foo.123",
        "[fe80::1%eth0]",
        "fe80::1%eth0",
        "münchen.de",
        "-lead.example.com",
        "a..b",
        "a" * 64 + ".com",
    ],
)
def test_canonical_host_refuses(raw: str) -> None:
    with pytest.raises(ValueError):
        canonical_host(raw)


@settings(max_examples=3000)
@given(st.text(alphabet="0123456789abcdefxX.", min_size=1, max_size=16))
def test_ipv4_numeric_parse_agrees_with_inet_aton(text: str) -> None:
    try:
        expected: str | None = socket.inet_ntoa(socket.inet_aton(text))
    except OSError:
        expected = None
    parsed = parse_ipv4_numeric(text)
    assert (str(parsed) if parsed is not None else None) == expected


@pytest.mark.parametrize(
    ("address", "category"),
    [
        ("8.8.8.8", None),
        ("1.1.1.1", None),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "cgnat"),
        ("100.127.255.255", "cgnat"),
        ("169.254.169.254", "metadata"),
        ("169.254.1.1", "link-local"),
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
        ("198.18.0.1", "reserved"),
        ("::1", "loopback"),
        ("::", "unspecified"),
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "metadata"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:8.8.8.8", None),
        ("::127.0.0.1", "loopback"),
        ("::8.8.8.8", "reserved"),
        ("64:ff9b::a00:1", "private"),
        ("64:ff9b::808:808", None),
        ("2002:7f00:1::", "loopback"),
        ("2002:a9fe:a9fe::1", "metadata"),
        ("fd00:ec2::254", "metadata"),
        ("fc00::1", "private"),
        ("fe80::1", "link-local"),
        ("fec0::1", "private"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "reserved"),
        ("2606:4700:4700::1111", None),
        ("4000::1", "reserved"),
    ],
)
def test_forbidden_category(address: str, category: str | None) -> None:
    assert forbidden_category(address) == category


def test_wildcard_matches_subdomains_only() -> None:
    assert host_matches("*.example.com", "a.example.com")
    assert host_matches("*.example.com", "a.b.example.com")
    assert not host_matches("*.example.com", "example.com")
    assert not host_matches("*.example.com", "badexample.com")
    assert not host_matches("*.example.com", "example.com.evil.net")
    assert host_matches("example.com", "example.com")
    assert not host_matches("example.com", "a.example.com")


def test_ip_literal() -> None:
    assert str(ip_literal("127.0.0.1")) == "127.0.0.1"
    assert str(ip_literal("::1")) == "::1"
    assert ip_literal("host1") is None
    assert ip_literal("pypi.org") is None
