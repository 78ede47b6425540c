"""The proxy against real curl and real HTTP(S) servers on 127.0.0.1.

Test names (`*.test`) resolve only in the broker's resolver overrides, so a
request can reach a server only through the broker. Every test checks the
effect on the servers (what they received) and on the journal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.broker.config import BrokerConfig, RouteConfig, RuleConfig, TlsConfig

from .conftest import BrokerFactory, ServerFactory
from .testlib import Hit, Reply, ThrowawayCA, curl, header

pytestmark = pytest.mark.requires_curl

LOOP = "127.0.0.1"


def _config(rules: list[RuleConfig], names: list[str], **extra: object) -> BrokerConfig:
    return BrokerConfig.model_validate(
        {
            "rules": rules,
            "resolver_overrides": {n: LOOP for n in names},
            "system_dns": False,
            **extra,
        }
    )


def test_plain_http_allowed_and_denied(servers: ServerFactory, brokers: BrokerFactory) -> None:
    allowed = servers()
    canary = servers()
    broker = brokers(
        _config(
            [RuleConfig(host="ok.test", ports=(allowed.port,), allow_private=True)],
            ["ok.test", "canary.test"],
        )
    )
    ok = curl("-i", f"http://ok.test:{allowed.port}/hello?q=1", proxy=broker.proxy)
    assert ok.returncode == 0, ok.stderr
    assert "200 OK" in ok.stdout.splitlines()[0]
    assert ok.stdout.endswith("ok GET /hello?q=1\n")
    [hit] = allowed.hits
    # The broker sets Host from the checked destination.
    assert hit.headers["host"] == f"ok.test:{allowed.port}"
    assert "proxy-connection" not in hit.headers

    denied = curl("-i", f"http://canary.test:{canary.port}/secret", proxy=broker.proxy)
    assert denied.returncode == 0, denied.stderr
    assert "403 Forbidden" in denied.stdout.splitlines()[0]
    assert header(denied.stdout, "X-Corral-Denied") == "default-deny"
    assert "no rule admits" in denied.stdout
    assert canary.hits == []

    rows = broker.wait_rows(lambda rs: any(r.outcome for r in rs if r.decision == "allow"))
    http = [r for r in rows if r.kind == "http_request"]
    assert [(r.decision, r.target) for r in http] == [
        ("allow", f"GET http://ok.test:{allowed.port}/hello"),
        ("deny", f"GET http://canary.test:{canary.port}/secret"),
    ]
    assert http[0].detail["query"] == "q=1"
    assert http[0].outcome is not None
    assert http[0].outcome["status"] == 200
    assert http[0].bytes_down == len("ok GET /hello?q=1\n")
    assert (http[0].run, http[0].session, http[0].env) == ("test-run", "s1", "exec")


def test_host_header_cannot_pick_another_virtual_host(
    servers: ServerFactory, brokers: BrokerFactory
) -> None:
    server = servers()
    broker = brokers(
        _config([RuleConfig(host="ok.test", ports=(server.port,), allow_private=True)], ["ok.test"])
    )
    out = curl("-H", "Host: evil.test", f"http://ok.test:{server.port}/", proxy=broker.proxy)
    assert out.returncode == 0, out.stderr
    assert [h.headers["host"] for h in server.hits] == [f"ok.test:{server.port}"]


def test_https_through_connect(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA
) -> None:
    secure = servers(tls=test_ca)
    other = servers(tls=test_ca)
    broker = brokers(
        _config(
            [RuleConfig(host="secure.test", ports=(secure.port,), allow_private=True)],
            ["secure.test", "other.test"],
        )
    )
    ok = curl(
        "--cacert",
        str(test_ca.ca_pem),
        f"https://secure.test:{secure.port}/tls",
        proxy=broker.proxy,
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout == "ok GET /tls\n"

    refused = curl(
        "--cacert",
        str(test_ca.ca_pem),
        "-D",
        "-",
        f"https://other.test:{other.port}/",
        proxy=broker.proxy,
    )
    assert refused.returncode == 56
    assert "CONNECT tunnel failed, response 403" in refused.stderr
    assert header(refused.stdout, "X-Corral-Denied") == "default-deny"
    assert other.hits == []

    rows = broker.wait_rows(lambda rs: any(r.outcome for r in rs if r.decision == "allow"))
    tunnels = [(r.decision, r.target) for r in rows if r.kind == "net_connect"]
    assert tunnels == [
        ("allow", f"secure.test:{secure.port}"),
        ("deny", f"other.test:{other.port}"),
    ]
    allowed = next(r for r in rows if r.kind == "net_connect")
    assert allowed.outcome is not None
    assert allowed.bytes_up > 200 and allowed.bytes_down > 200


def test_sni_that_differs_from_connect_host_is_cut(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA
) -> None:
    secure = servers(tls=test_ca)
    broker = brokers(
        _config(
            [RuleConfig(host="secure.test", ports=(secure.port,), allow_private=True)],
            ["secure.test"],
        )
    )
    # curl --connect-to keeps SNI "other.test" but tunnels to the allowed name.
    out = curl(
        "--cacert",
        str(test_ca.ca_pem),
        "--connect-to",
        f"other.test:{secure.port}:secure.test:{secure.port}",
        f"https://other.test:{secure.port}/fronted",
        proxy=broker.proxy,
    )
    assert out.returncode != 0
    assert secure.hits == []
    rows = broker.wait_rows(lambda rs: any(r.rule == "sni-mismatch" for r in rs))
    [tunnel, refusal] = [r for r in rows if r.kind == "net_connect"]
    assert (tunnel.decision, refusal.decision, refusal.rule) == ("allow", "deny", "sni-mismatch")
    assert refusal.cause == tunnel.id
    assert refusal.detail["sni"] == "other.test"


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_allowlisted_name_resolving_to_loopback_is_refused(
    scheme: str, servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA
) -> None:
    # DNS rebinding: the rule names the host, but it resolves to host loopback.
    server = servers(tls=test_ca if scheme == "https" else None)
    broker = brokers(_config([RuleConfig(host="pypi.test", ports=(server.port,))], ["pypi.test"]))
    out = curl(
        "-i",
        "--cacert",
        str(test_ca.ca_pem),
        f"{scheme}://pypi.test:{server.port}/",
        proxy=broker.proxy,
    )
    if scheme == "http":
        assert "403 Forbidden" in out.stdout
        assert header(out.stdout, "X-Corral-Denied") == "private-address"
    else:
        assert "CONNECT tunnel failed, response 403" in out.stderr
    assert server.hits == []
    [row] = [r for r in broker.rows() if r.kind in ("http_request", "net_connect")]
    assert (row.decision, row.rule) == ("deny", "private-address")
    assert "loopback address 127.0.0.1" in row.reason


@pytest.mark.parametrize(
    "spelling", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::ffff:127.0.0.1]"]
)
def test_ip_spellings_of_loopback_are_refused(
    spelling: str, servers: ServerFactory, brokers: BrokerFactory
) -> None:
    server = servers()
    broker = brokers(_config([RuleConfig(host="127.0.0.1", ports=(server.port,))], []))
    out = curl("-i", f"http://{spelling}:{server.port}/", proxy=broker.proxy)
    assert "403 Forbidden" in out.stdout, out.stdout + out.stderr
    assert server.hits == []


def test_redirect_to_forbidden_host_is_not_followed(
    servers: ServerFactory, brokers: BrokerFactory
) -> None:
    forbidden = servers()

    def redirect(hit: Hit) -> Reply:
        return 302, [("Location", f"http://forbidden.test:{forbidden.port}/stolen")], b""

    origin = servers({"/": redirect})
    broker = brokers(
        _config(
            [RuleConfig(host="origin.test", ports=(origin.port,), allow_private=True)],
            ["origin.test", "forbidden.test"],
        )
    )
    out = curl("-i", "-L", f"http://origin.test:{origin.port}/start", proxy=broker.proxy)
    statuses = [line for line in out.stdout.splitlines() if line.startswith("HTTP/")]
    assert statuses[0].startswith("HTTP/1.1 302")
    assert statuses[-1].startswith("HTTP/1.1 403")
    assert forbidden.hits == []
    assert len(origin.hits) == 1
    rows = [(r.decision, r.target) for r in broker.rows("http_request")]
    assert rows == [
        ("allow", f"GET http://origin.test:{origin.port}/start"),
        ("deny", f"GET http://forbidden.test:{forbidden.port}/stolen"),
    ]


def test_route_injects_credential_upstream(
    servers: ServerFactory, brokers: BrokerFactory, test_ca: ThrowawayCA, tmp_path: Path
) -> None:
    secret = "sk-real-secret-0123456789"

    def provider(hit: Hit) -> Reply:
        return 200, [("Content-Type", "application/json")], b'{"id":"msg_1"}'

    upstream = servers({"/": provider}, tls=test_ca)
    config = _config(
        [],
        ["api.provider.test"],
        routes={
            "prov": RouteConfig(
                upstream=f"https://api.provider.test:{upstream.port}/base",
                inject_header={"x-api-key": "env:CORRAL_TEST_PROVIDER_KEY"},
                allow_private=True,
            )
        },
        upstream_tls=TlsConfig(ca_bundle=str(test_ca.ca_pem)),
    )
    broker = brokers(config, environ={"CORRAL_TEST_PROVIDER_KEY": secret, "PATH": "/usr/bin:/bin"})
    base = f"http://127.0.0.1:{broker.port}/routes/prov"
    out = curl(
        "-i",
        "-X",
        "POST",
        "-H",
        "x-api-key: dummy",
        "-H",
        "Authorization: Bearer dummy",
        "-H",
        "content-type: application/json",
        "--data",
        '{"model":"m"}',
        f"{base}/v1/messages?beta=true",
    )
    assert out.returncode == 0, out.stderr
    assert "200 OK" in out.stdout.splitlines()[0]
    assert out.stdout.endswith('{"id":"msg_1"}')
    # The same route reached as an absolute-form proxy request to the broker itself.
    via_proxy = curl(f"{base}/v1/models", proxy=broker.proxy)
    assert via_proxy.returncode == 0, via_proxy.stderr

    first, second = upstream.hits
    assert (first.method, first.path) == ("POST", "/base/v1/messages?beta=true")
    assert first.headers["x-api-key"] == secret
    assert "authorization" not in first.headers
    assert first.headers["host"] == f"api.provider.test:{upstream.port}"
    assert first.body == b'{"model":"m"}'
    assert second.path == "/base/v1/models"
    assert second.headers["x-api-key"] == secret

    rows = broker.wait_rows(lambda rs: sum(1 for r in rs if r.outcome) >= 2)
    calls = [r for r in rows if r.kind == "provider_call"]
    assert [(r.decision, r.target, r.rule) for r in calls] == [
        ("allow", "prov POST /v1/messages", "route:prov"),
        ("allow", "prov GET /v1/models", "route:prov"),
    ]
    assert calls[0].bytes_up == len('{"model":"m"}')
    journal_bytes = b"".join(p.read_bytes() for p in tmp_path.glob("journal.sqlite*"))
    assert secret.encode() not in journal_bytes


def test_route_refusals(servers: ServerFactory, brokers: BrokerFactory) -> None:
    upstream = servers()
    config = _config(
        [],
        [],
        routes={
            "synthetic": RouteConfig(
                upstream=f"http://127.0.0.1:{upstream.port}",
                allow_private=True,
                path_prefixes=("/v1/",),
            ),
            "noprivate": RouteConfig(upstream=f"http://127.0.0.1:{upstream.port}"),
        },
    )
    broker = brokers(config)
    base = f"http://127.0.0.1:{broker.port}"
    cases = {
        "/routes/synthetic/v1/../admin": "route:synthetic",
        "/routes/synthetic/v1/%2e%2e/admin": "route:synthetic",
        "/routes/synthetic/admin": "route:synthetic",
        "/routes/unknown/v1/messages": "default-deny",
        "/routes/noprivate/v1/messages": "private-address",
        "/not-a-route": "malformed-request",
    }
    for path, rule in cases.items():
        out = curl("-i", "--path-as-is", base + path)
        assert "403 Forbidden" in out.stdout, (path, out.stdout, out.stderr)
        assert header(out.stdout, "X-Corral-Denied") == rule, path
    assert upstream.hits == []
    ok = curl(base + "/routes/synthetic/v1/ok")
    assert ok.stdout == "ok GET /v1/ok\n"
    assert [h.path for h in upstream.hits] == ["/v1/ok"]


def test_bodies_stream_both_ways(
    servers: ServerFactory, brokers: BrokerFactory, tmp_path: Path
) -> None:
    big = bytes(range(256)) * 8192  # 2 MiB

    def echo_size(hit: Hit) -> Reply:
        return 200, [("Content-Type", "text/plain")], str(len(hit.body)).encode()

    def download(hit: Hit) -> Reply:
        return 200, [("Content-Type", "application/octet-stream")], big

    server = servers({"/upload": echo_size, "/download": download})
    broker = brokers(
        _config([RuleConfig(host="ok.test", ports=(server.port,), allow_private=True)], ["ok.test"])
    )
    payload = tmp_path / "payload.bin"
    payload.write_bytes(big)
    base = f"http://ok.test:{server.port}"
    # curl sends "Expect: 100-continue" for a body this large.
    up = curl("--data-binary", f"@{payload}", f"{base}/upload", proxy=broker.proxy)
    assert up.stdout == str(len(big)), up.stderr
    chunked = curl(
        "-H", "Transfer-Encoding: chunked", "--data-binary", f"@{payload}", f"{base}/upload",
        proxy=broker.proxy,
    )  # fmt: skip
    assert chunked.stdout == str(len(big)), chunked.stderr
    out = tmp_path / "out.bin"
    down = curl("-o", str(out), f"{base}/download", proxy=broker.proxy)
    assert down.returncode == 0, down.stderr
    assert out.read_bytes() == big
    head = curl("-I", f"{base}/download", proxy=broker.proxy)
    assert head.returncode == 0, head.stderr
    assert header(head.stdout, "Content-Length") == str(len(big))
    rows = broker.wait_rows(lambda rs: sum(1 for r in rs if r.outcome) >= 4)
    by_target = [(r.target, r.bytes_up, r.bytes_down) for r in rows if r.kind == "http_request"]
    assert by_target[0] == (f"POST {base}/upload", len(big), len(str(len(big))))
    assert by_target[1] == (f"POST {base}/upload", len(big), len(str(len(big))))
    assert by_target[2] == (f"GET {base}/download", 0, len(big))
    assert by_target[3] == (f"HEAD {base}/download", 0, 0)
