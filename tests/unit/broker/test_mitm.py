"""The run CA's leaves: valid for their host only, verified by a client, cache bounded."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

import pytest

from corral.broker.mitm import CertAuthority, create_ca


def _handshake(server: ssl.SSLContext, cafile: Path, name: str) -> str | None:
    client = ssl.create_default_context(cafile=str(cafile))
    client.set_alpn_protocols(["h2", "http/1.1"])
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=name)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for obj in (c, s):
            with contextlib.suppress(ssl.SSLWantReadError):
                obj.do_handshake()
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        try:
            c.do_handshake()
            return c.selected_alpn_protocol()
        except ssl.SSLWantReadError:
            continue
    raise AssertionError("handshake did not finish")


def test_leaf_verifies_for_its_host_only_and_offers_http11(tmp_path: Path) -> None:
    files = create_ca(tmp_path / "ca")
    ca = CertAuthority.load(str(files.cert), str(files.key), max_leaves=2)
    assert _handshake(ca.server_context("api.test"), files.cert, "api.test") == "http/1.1"
    assert _handshake(ca.server_context("10.0.0.7"), files.cert, "10.0.0.7") == "http/1.1"
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(ca.server_context("api.test"), files.cert, "evil.test")


def test_leaf_cache_is_bounded(tmp_path: Path) -> None:
    files = create_ca(tmp_path / "ca")
    ca = CertAuthority.load(str(files.cert), str(files.key), max_leaves=2)
    first = ca.server_context("a.test")
    assert ca.server_context("a.test") is first
    ca.server_context("b.test")
    ca.server_context("c.test")
    assert ca.server_context("a.test") is not first
