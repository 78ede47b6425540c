"""The no-egress DNS responder's packet handling (pure): bounded, never echoes more than asked."""

from __future__ import annotations

import struct

import pytest

from corral.sandbox.nodns import answer, hint, parse_query


def _query(*labels: bytes, ident: int = 0x1234, flags: int = 0x0100) -> bytes:
    name = b"".join(bytes([len(x)]) + x for x in labels) + b"\0"
    return struct.pack("!6H", ident, flags, 1, 0, 0, 0) + name + struct.pack("!2H", 28, 1)


def test_nxdomain_echoes_only_the_question() -> None:
    q = _query(b"pypi", b"org")
    reply = answer(q + b"trailing junk")
    assert reply is not None
    ident, flags, qd, an, ns, ar = struct.unpack("!6H", reply[:12])
    assert (ident, flags & 0xF, qd, an, ns, ar) == (0x1234, 3, 1, 0, 0, 0)
    assert flags & 0x8000 and flags & 0x0100
    assert reply[12:] == q[12:]
    parsed = parse_query(q)
    assert parsed is not None and parsed.name == "pypi.org"


@pytest.mark.parametrize(
    "packet",
    [
        struct.pack("!6H", 1, 0, 1, 0, 0, 0) + b"\xc0\x0c\0\1\0\1",  # compression pointer
        struct.pack("!6H", 1, 0, 2, 0, 0, 0) + b"\0\0\1\0\1",  # two questions
        struct.pack("!6H", 1, 0x8000, 1, 0, 0, 0) + b"\0\0\1\0\1",  # a response
        _query(*([b"a" * 63] * 5)),  # a name over 255 bytes
        _query(b"pypi", b"org")[:-3],  # cut short
    ],
)
def test_anything_else_gets_a_bare_formerr(packet: bytes) -> None:
    assert parse_query(packet) is None
    reply = answer(packet)
    assert reply is not None and len(reply) == 12 and reply[3] & 0xF == 1


def test_short_packets_get_nothing() -> None:
    assert answer(b"") is None and answer(b"x" * 11) is None


def test_hint_names_the_flag_and_escapes_names() -> None:
    line = hint(["\x1b[2Jx", "b.test"], 4)
    assert "\x1b" not in line and "\\x1b[2Jx" in line
    assert "4 name lookup(s) refused" in line and "--allow HOST" in line
