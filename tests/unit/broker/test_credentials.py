"""Placeholder swapping and scrubbing (pure), fuzzed where it parses."""

from __future__ import annotations

import base64

from hypothesis import given
from hypothesis import strategies as st

from corral.broker.credentials import Credential, Credentials, new_placeholder

PH = new_placeholder(b"\x01" * 16).encode()
REAL = b"s3cr3t-real-value"
CREDS = Credentials([Credential("gh", PH, REAL, frozenset({"api.test"}))])
BODY_CREDS = Credentials([Credential("gh", PH, REAL, frozenset({"api.test"}), in_body=True)])


def test_bearer_swapped_only_for_bound_host() -> None:
    ok = CREDS.swap_headers([(b"authorization", b"Bearer " + PH)], "api.test")
    assert ok.data == [(b"authorization", b"Bearer " + REAL)]
    assert (ok.used, ok.leaked) == (("gh",), None)
    bad = CREDS.swap_headers([(b"x-token", PH)], "evil.test")
    assert bad.data == [(b"x-token", PH)]
    assert bad.leaked == "gh"


def test_basic_swapped_inside_base64() -> None:
    token = base64.b64encode(b"x-access-token:" + PH)
    out = CREDS.swap_headers([(b"authorization", b"Basic " + token)], "api.test")
    assert out.data == [(b"authorization", b"Basic " + base64.b64encode(b"x-access-token:" + REAL))]
    # The echo of what was sent is scrubbed back to what the client sent.
    echoed = CREDS.scrub(out.reverse).headers([(b"x-echo", out.data[0][1])])
    assert echoed == [(b"x-echo", b"Basic " + token)]
    assert CREDS.swap_headers([(b"authorization", b"Basic " + token)], "evil.test").leaked == "gh"


def test_body_swapped_only_when_asked() -> None:
    assert CREDS.swap_body(b"t=" + PH, "api.test") == (b"t=" + PH, None)
    assert BODY_CREDS.swap_body(b"t=" + PH, "api.test") == (b"t=" + REAL, None)
    assert BODY_CREDS.swap_body(b"t=" + PH, "evil.test") == (b"t=" + PH, "gh")


@given(st.binary(max_size=200), st.binary(max_size=200), st.lists(st.integers(0, 500)))
def test_scrubber_never_lets_the_value_through(
    before: bytes, after: bytes, cuts: list[int]
) -> None:
    data = before + REAL + after + REAL
    scrubber = CREDS.scrub().stream()
    out = b""
    last = 0
    for cut in sorted({min(c, len(data)) for c in cuts}):
        out += scrubber.feed(data[last:cut])
        last = cut
    out += scrubber.feed(data[last:]) + scrubber.finish()
    assert REAL not in out
    assert out.count(PH) >= 2


@given(st.lists(st.tuples(st.binary(max_size=64), st.binary(max_size=300)), max_size=8))
def test_swap_headers_never_raises_and_never_leaks_to_unbound(
    headers: list[tuple[bytes, bytes]],
) -> None:
    out = CREDS.swap_headers(headers, "evil.test")
    assert all(REAL not in v for _, v in out.data)
    basic = [(b"authorization", b"Basic " + v) for _, v in headers]
    # Towards an unbound host nothing is ever rewritten.
    assert CREDS.swap_headers(basic, "evil.test").data == basic
