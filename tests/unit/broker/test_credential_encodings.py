"""Re-encoded placeholders towards an unbound host are recognised (pure, Hypothesis)."""

from __future__ import annotations

import base64
import urllib.parse
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from corral.broker.credentials import Credential, Credentials, new_placeholder

Encoder = Callable[[bytes], bytes]

ENCODINGS: dict[str, Encoder] = {
    "exact": lambda b: b,
    "hex": lambda b: b.hex().encode(),
    "HEX": lambda b: b.hex().upper().encode(),
    "base64": base64.b64encode,
    "base64url": base64.urlsafe_b64encode,
    "base64-unpadded": lambda b: base64.b64encode(b).rstrip(b"="),
    "percent-all": lambda b: "".join(f"%{c:02X}" for c in b).encode(),
    "percent-quote": lambda b: urllib.parse.quote_from_bytes(b, safe="").encode(),
    "percent-of-base64": lambda b: urllib.parse.quote_from_bytes(base64.b64encode(b)).encode(),
    "percent-of-hex": lambda b: "".join(f"%{c:02x}" for c in b.hex().encode()).encode(),
}

_text = st.binary(max_size=64)


@given(
    random=st.binary(min_size=16, max_size=16),
    encoding=st.sampled_from(sorted(ENCODINGS)),
    before=_text,
    after=_text,
)
def test_any_recognised_encoding_is_a_leak_to_an_unbound_host(
    random: bytes, encoding: str, before: bytes, after: bytes
) -> None:
    ph = new_placeholder(random).encode()
    creds = Credentials([Credential("gh", ph, b"real", frozenset({"api.test"}))])
    encode = ENCODINGS[encoding]
    # The placeholder inside other bytes, encoded together (base64 at any alignment).
    for data in (before + encode(ph) + after, encode(before + ph + after)):
        assert creds.encoded_leak(data, "evil.test") == "gh"
        assert creds.encoded_leak(data, "api.test") is None


@given(data=st.binary(max_size=2048), random=st.binary(min_size=16, max_size=16))
def test_data_without_the_placeholder_is_no_leak(data: bytes, random: bytes) -> None:
    ph = new_placeholder(random).encode()
    creds = Credentials([Credential("gh", ph, b"real", frozenset({"api.test"}))])
    assert creds.encoded_leak(data, "evil.test") is None


def test_only_unbound_credentials_are_looked_for() -> None:
    a = new_placeholder(b"\x01" * 16).encode()
    b = new_placeholder(b"\x02" * 16).encode()
    creds = Credentials(
        [
            Credential("a", a, b"ra", frozenset({"a.test"})),
            Credential("b", b, b"rb", frozenset({"b.test"})),
        ]
    )
    body = b"x=" + base64.b64encode(b)
    assert creds.encoded_leak(body, "b.test") is None
    assert creds.encoded_leak(body, "a.test") == "b"
    assert Credentials([]).encoded_leak(body, "a.test") is None


@given(
    random=st.binary(min_size=16, max_size=16),
    mask=st.lists(st.sampled_from(["keep", "lower", "upper"]), min_size=51, max_size=51),
    around=_text,
)
def test_a_placeholder_with_any_characters_percent_encoded_is_a_leak(
    random: bytes, mask: list[str], around: bytes
) -> None:
    ph = new_placeholder(random).encode()
    assert len(ph) == len(mask)
    shown = b"".join(
        bytes([c]) if m == "keep" else (f"%{c:02x}" if m == "lower" else f"%{c:02X}").encode()
        for c, m in zip(ph, mask, strict=True)
    )
    creds = Credentials([Credential("gh", ph, b"real", frozenset({"api.test"}))])
    assert creds.encoded_leak(around + shown + around, "evil.test") == "gh"


@given(data=st.binary(max_size=512), safe=st.sampled_from(["", "/", "%\\"]))
def test_percent_view_decodes_what_urllib_encodes(data: bytes, safe: str) -> None:
    from corral.broker.credentials import _percent_decoded

    # A '%' or '\\' left unescaped must not shift what follows.
    quoted = urllib.parse.quote_from_bytes(data, safe=safe).encode()
    if "%" not in safe:
        assert _percent_decoded(quoted) == data
    assert len(_percent_decoded(quoted)) <= len(quoted)


def test_a_stray_percent_before_an_encoded_placeholder_is_still_a_leak() -> None:
    """Found by the property above: `%` + placeholder with its last character escaped.
    Decoded as a bad escape the `%` swallowed the placeholder's first character, so it
    matched in neither the raw nor the decoded view; urllib keeps the `%` literal."""
    ph = new_placeholder(b"\0" * 16).encode()
    shown = b"%" + ph[:-1] + b"%%%02x" % ph[-1] + b"%"
    creds = Credentials([Credential("gh", ph, b"real", frozenset({"api.test"}))])
    assert creds.encoded_leak(shown, "evil.test") == "gh"
    assert urllib.parse.unquote_to_bytes(shown) == b"%" + ph + b"%"
