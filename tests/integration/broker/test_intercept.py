"""TLS interception: method rules inside HTTPS, placeholders, Host/CONNECT agreement.

Real curl through a real broker to real HTTPS servers on 127.0.0.1 (names
resolve only in the broker's overrides). The upstreams' certificates come from
the throwaway test CA (trusted by the broker through `upstream_tls`); curl
trusts the run's interception CA. Every test asserts what the servers received
and what the journal holds.
"""

from __future__ import annotations

import base64
import socket
import ssl
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

LOOP = "127.0.0.1"
REAL = "ghp_REALsecretVALUE0123456789abcdefXYZ"
PLACEHOLDER = new_placeholder(bytes(range(16)))


@pytest.fixture
def mitm(tmp_path: Path) -> CaFiles:
    return create_ca(tmp_path / "mitm")


def _echo(hit: Hit) -> Reply:
    auth = hit.headers.get("authorization", "")
    return 200, [("X-Echo", auth)], f"{hit.method} {hit.path} auth={auth}\n".encode()


def _config(
    rules: list[RuleConfig],
    ca: CaFiles | None,
    test_ca: ThrowawayCA,
    credentials: tuple[CredentialConfig, ...] = (),
    trust_upstream: bool = True,
) -> BrokerConfig:
    return BrokerConfig(
        rules=tuple(rules),
        resolver_overrides={n: (LOOP,) for n in ("secure.test", "other.test")},
        system_dns=False,
        upstream_tls=TlsConfig(ca_bundle=str(test_ca.ca_pem) if trust_upstream else None),
        mitm=MitmConfig(ca_cert=str(ca.cert), ca_key=str(ca.key)) if ca is not None else None,
        credentials=credentials,
    )


def _https(ca: CaFiles, *args: str, proxy: str) -> tuple[int, str, str]:
    out = curl("--cacert", str(ca.cert), "-D", "-", *args, proxy=proxy)
    return out.returncode, out.stdout, out.stderr


def test_method_rule_is_enforced_inside_https(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, mitm: CaFiles
) -> None:
    server = servers({"/": _echo}, tls=test_ca)
    rule = RuleConfig(
        id="gh-read",
        host="secure.test",
        ports=(server.port,),
        methods=("GET",),
        allow_private=True,
    )
    broker = brokers(_config([rule], mitm, test_ca))
    url = f"https://secure.test:{server.port}/repo"
    rc, out, err = _https(mitm, url, proxy=broker.proxy)
    assert rc == 0, err
    assert out.endswith("GET /repo auth=\n")
    rc, out, err = _https(mitm, "-X", "POST", "--data", "x=1", url, proxy=broker.proxy)
    assert rc == 0, err
    assert "403 Forbidden" in out
    assert header(out, "X-Corral-Denied") == "default-deny"
    assert [(h.method, h.path) for h in server.hits] == [("GET", "/repo")]
    rows = broker.wait_rows(lambda rs: sum(r.kind == "http_request" for r in rs) >= 2)
    inner = [(r.decision, r.target, r.rule) for r in rows if r.kind == "http_request"]
    assert inner == [
        ("allow", f"GET https://secure.test:{server.port}/repo", "gh-read"),
        ("deny", f"POST https://secure.test:{server.port}/repo", "default-deny"),
    ]


def test_placeholder_swapped_for_bound_host_only(
    servers: ServerFactory,
    brokers: BrokerFactory,
    test_ca: ThrowawayCA,
    mitm: CaFiles,
    tmp_path: Path,
) -> None:
    bound = servers({"/": _echo}, tls=test_ca)
    other = servers({"/": _echo}, tls=test_ca)
    cred = CredentialConfig(
        name="github",
        env="GH_TOKEN",
        value="env:REAL_GH",
        hosts=("secure.test",),
        placeholder=PLACEHOLDER,
    )
    rules = [
        RuleConfig(host="secure.test", ports=(bound.port,), allow_private=True),
        # A method rule makes other.test intercepted: the broker sees its requests.
        RuleConfig(
            host="other.test", ports=(other.port,), methods=("GET", "POST"), allow_private=True
        ),
    ]
    broker = brokers(_config(rules, mitm, test_ca, (cred,)), environ={"REAL_GH": REAL})
    bearer = f"Authorization: Bearer {PLACEHOLDER}"
    rc, out, err = _https(
        mitm, "-H", bearer, f"https://secure.test:{bound.port}/api", proxy=broker.proxy
    )
    assert rc == 0, err
    # git sends the token as Basic user:password.
    rc2, out2, err2 = _https(
        mitm,
        "-u",
        f"x-access-token:{PLACEHOLDER}",
        f"https://secure.test:{bound.port}/git",
        proxy=broker.proxy,
    )
    assert rc2 == 0, err2
    assert [h.headers["authorization"] for h in bound.hits] == [
        f"Bearer {REAL}",
        "Basic " + base64.b64encode(f"x-access-token:{REAL}".encode()).decode(),
    ]
    # The echoes come back with the placeholder, never the real value.
    for text in (out, out2):
        assert REAL not in text
        assert base64.b64encode(REAL.encode()).decode() not in text
    assert f"auth=Bearer {PLACEHOLDER}" in out

    rc, out, err = _https(
        mitm, "-H", bearer, f"https://other.test:{other.port}/steal", proxy=broker.proxy
    )
    assert rc == 0, err
    assert header(out, "X-Corral-Denied") == "exfiltration"
    assert other.hits == []
    rows = broker.wait_rows(lambda rs: any(r.rule == "exfiltration" for r in rs))
    [leak] = [r for r in rows if r.rule == "exfiltration"]
    assert leak.decision == "deny"
    assert leak.target == f"GET https://other.test:{other.port}/steal"
    broker.process.stop()
    journal = b"".join(
        p.read_bytes() for p in broker.journal.parent.glob(broker.journal.name + "*")
    )
    assert REAL.encode() not in journal
    assert base64.b64encode(f"x-access-token:{REAL}".encode()) not in journal


def test_placeholder_over_plain_http_is_refused(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, mitm: CaFiles
) -> None:
    plain = servers({"/": _echo})
    cred = CredentialConfig(
        name="github",
        env="GH_TOKEN",
        value="env:REAL_GH",
        hosts=("secure.test",),
        placeholder=PLACEHOLDER,
    )
    rules = [RuleConfig(host="other.test", ports=(plain.port,), allow_private=True)]
    broker = brokers(_config(rules, mitm, test_ca, (cred,)), environ={"REAL_GH": REAL})
    out = curl("-i", f"http://other.test:{plain.port}/x?t={PLACEHOLDER}", proxy=broker.proxy)
    assert header(out.stdout, "X-Corral-Denied") == "exfiltration"
    assert plain.hits == []


def test_host_header_must_match_connect_target(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, mitm: CaFiles
) -> None:
    server = servers(tls=test_ca)
    rules = [
        RuleConfig(host="secure.test", ports=(server.port,), methods=("GET",), allow_private=True),
        RuleConfig(host="other.test", ports=(server.port,), allow_private=True),
    ]
    broker = brokers(_config(rules, mitm, test_ca))
    rc, out, err = _https(
        mitm,
        "-H",
        f"Host: other.test:{server.port}",
        f"https://secure.test:{server.port}/front",
        proxy=broker.proxy,
    )
    assert rc == 0, err
    assert "421 Misdirected Request" in out
    assert header(out, "X-Corral-Denied") == "host-mismatch"
    assert server.hits == []
    rows = broker.wait_rows(lambda rs: any(r.rule == "host-mismatch" for r in rs))
    assert [r.decision for r in rows if r.rule == "host-mismatch"] == ["deny"]


def test_invalid_upstream_certificate_is_refused(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, mitm: CaFiles
) -> None:
    server = servers(tls=test_ca)
    rule = RuleConfig(
        host="secure.test", ports=(server.port,), methods=("GET",), allow_private=True
    )
    # The upstream's CA is not in the broker's trust store here.
    broker = brokers(_config([rule], mitm, test_ca, trust_upstream=False))
    rc, out, err = _https(mitm, f"https://secure.test:{server.port}/", proxy=broker.proxy)
    assert rc == 0, err
    assert "502 Bad Gateway" in out
    assert "certificate verify failed" in out or "CERTIFICATE_VERIFY_FAILED" in out
    assert server.hits == []


def test_alpn_offers_only_http11(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, mitm: CaFiles
) -> None:
    server = servers(tls=test_ca)
    rule = RuleConfig(
        host="secure.test", ports=(server.port,), methods=("GET",), allow_private=True
    )
    broker = brokers(_config([rule], mitm, test_ca))
    out = curl(
        "--http2",
        "-v",
        "--cacert",
        str(mitm.cert),
        f"https://secure.test:{server.port}/h",
        proxy=broker.proxy,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok GET /h\n"
    assert (
        "ALPN: server accepted http/1.1" in out.stderr
        or "ALPN, server accepted to use http/1.1" in out.stderr
    )


def _echo_body(hit: Hit) -> Reply:
    return 200, [], b"got " + hit.body


def test_in_body_swap_and_response_body_scrubbed(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, mitm: CaFiles
) -> None:
    server = servers({"/": _echo_body}, tls=test_ca)
    cred = CredentialConfig(
        name="npm", env="NPM_TOKEN", value="env:REAL_GH", hosts=("secure.test",), in_body=True,
        placeholder=PLACEHOLDER,
    )  # fmt: skip
    rule = RuleConfig(host="secure.test", ports=(server.port,), allow_private=True)
    broker = brokers(_config([rule], mitm, test_ca, (cred,)), environ={"REAL_GH": REAL})
    body = f'{{"token": "{PLACEHOLDER}", "pad": "{"x" * 5000}"}}'
    rc, out, err = _https(
        mitm, "--compressed", "--data-binary", body, f"https://secure.test:{server.port}/login",
        proxy=broker.proxy,
    )  # fmt: skip
    assert rc == 0, err
    [hit] = server.hits
    assert hit.headers["accept-encoding"] == "identity"
    assert hit.body == body.replace(PLACEHOLDER, REAL).encode()
    # The upstream echoed the real value back: the sandbox gets the placeholder.
    assert REAL not in out
    assert out.endswith("got " + body)


def test_client_hello_sent_with_the_connect_is_not_lost(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, mitm: CaFiles
) -> None:
    server = servers(tls=test_ca)
    rule = RuleConfig(
        host="secure.test", ports=(server.port,), methods=("GET",), allow_private=True
    )
    broker = brokers(_config([rule], mitm, test_ca))
    ctx = ssl.create_default_context(cafile=str(mitm.cert))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="secure.test")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    connect = f"CONNECT secure.test:{server.port} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        # The ClientHello rides in the same write as the CONNECT head.
        sock.sendall(connect + outgoing.read())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
        assert head.startswith(b"HTTP/1.1 200")
        request = f"GET /early HTTP/1.1\r\nHost: secure.test:{server.port}\r\n\r\n".encode()
        reply = b""
        sent = False
        while b"ok GET /early" not in reply:
            try:
                if not sent:
                    tls.do_handshake()
                    tls.write(request)
                    sent = True
                reply += tls.read(65536)
            except ssl.SSLWantReadError:
                pass
            data = outgoing.read()
            if data:
                sock.sendall(data)
            if b"ok GET /early" in reply:
                break
            chunk = sock.recv(65536)
            assert chunk, reply
            incoming.write(chunk)
    assert [h.path for h in server.hits] == ["/early"]
