"""The SOCKS5 parser (sans-IO), the TCP policy and host-service expansion (pure)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.broker.actions import TcpConnect, action_target
from corral.broker.config import BrokerConfig, HostServiceConfig, TcpRuleConfig
from corral.broker.policy import DecisionContext, decide
from corral.broker.socks import (
    MAX_MESSAGE,
    REPLY_ADDRESS_TYPE,
    REPLY_COMMAND,
    ConnectRequest,
    SocksError,
    parse_greeting,
    parse_request,
    reply,
)
from corral.broker.tcp import (
    expand_host_services,
    parse_host_service_flag,
    sandbox_env_for,
    sandbox_ssh_config,
    ssh_proxy_command,
    tcp_policy,
)
from corral.errors import ConfigError


def test_greeting() -> None:
    assert parse_greeting(b"") is None
    assert parse_greeting(b"\x05") is None
    assert parse_greeting(b"\x05\x02\x00") is None
    assert parse_greeting(b"\x05\x02\x02\x00rest") == (True, 4)
    assert parse_greeting(b"\x05\x01\x02") == (False, 3)
    with pytest.raises(SocksError):
        parse_greeting(b"\x04\x01\x00")
    with pytest.raises(SocksError):
        parse_greeting(b"\x05\x00")


def test_requests_of_each_address_type() -> None:
    name = b"\x05\x01\x00\x03\x0agithub.com\x00\x16"
    assert parse_request(name) == (ConnectRequest("github.com", 22, 3), len(name))
    v4 = b"\x05\x01\x00\x01\x7f\x00\x00\x01\x15\xb3xx"
    assert parse_request(v4) == (ConnectRequest("127.0.0.1", 5555, 1), 10)
    v6 = b"\x05\x01\x00\x04" + ipaddress.IPv6Address("::1").packed + b"\x00\x50"
    assert parse_request(v6) == (ConnectRequest("::1", 80, 4), 22)
    for cut in range(len(name)):
        assert parse_request(name[:cut]) is None


def test_unsupported_requests_carry_their_reply_code() -> None:
    with pytest.raises(SocksError) as bind:
        parse_request(b"\x05\x02\x00\x01\x7f\x00\x00\x01\x00\x16")
    assert bind.value.code == REPLY_COMMAND
    with pytest.raises(SocksError) as atyp:
        parse_request(b"\x05\x01\x00\x09\x00\x00")
    assert atyp.value.code == REPLY_ADDRESS_TYPE
    for bad in (
        b"\x05\x01\x01\x01",
        b"\x05\x01\x00\x03\x00\x00\x16",
        b"\x05\x01\x00\x01\0\0\0\0\0\0",
    ):
        with pytest.raises(SocksError):
            parse_request(bad)


def test_reply_encodes_the_bound_address() -> None:
    assert reply(0, ("10.0.0.2", 4242)) == b"\x05\x00\x00\x01\x0a\x00\x00\x02\x10\x92"
    assert reply(2) == b"\x05\x02\x00\x01\x00\x00\x00\x00\x00\x00"
    assert len(reply(0, ("::1", 1))) == 22


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=MAX_MESSAGE + 8))
def test_parsers_never_raise_anything_but_socks_error(data: bytes) -> None:
    for parse in (parse_greeting, parse_request):
        try:
            out = parse(data)
        except SocksError:
            continue
        if out is not None:
            assert 0 < out[1] <= len(data)


@settings(max_examples=200, deadline=None)
@given(
    st.from_regex(r"[a-z0-9-]{1,20}(\.[a-z0-9-]{1,20}){0,3}", fullmatch=True),
    st.integers(1, 65535),
    st.binary(max_size=16),
)
def test_a_domain_request_round_trips_and_keeps_trailing_bytes(
    host: str, port: int, tail: bytes
) -> None:
    raw = b"\x05\x01\x00\x03" + bytes([len(host)]) + host.encode() + port.to_bytes(2, "big")
    parsed = parse_request(raw + tail)
    assert parsed == (ConnectRequest(host, port, 3), len(raw))


def _config(*tcp: TcpRuleConfig, services: tuple[HostServiceConfig, ...] = ()) -> BrokerConfig:
    return expand_host_services(BrokerConfig(tcp=tcp, host_services=services))


def test_tcp_policy_admits_its_rules_only_and_checks_addresses() -> None:
    cfg = _config(TcpRuleConfig(host="github.com", port=22))
    pol = tcp_policy(cfg)
    ctx = DecisionContext()
    first = decide(TcpConnect(host="github.com", port=22), ctx, pol)
    assert first.verdict == "resolve" and first.resolve_host == "github.com"
    public = decide(
        TcpConnect(host="github.com", port=22), ctx.with_addresses(("140.82.1.3",)), pol
    )
    assert public.verdict == "allow" and public.rule == "tcp-allow:github.com:22"
    # A name that resolves to a private address is refused (rebinding).
    private = decide(TcpConnect(host="github.com", port=22), ctx.with_addresses(("10.0.0.1",)), pol)
    assert (private.verdict, private.rule) == ("deny", "private-address")
    assert decide(TcpConnect(host="github.com", port=2222), ctx, pol).verdict == "deny"
    assert decide(TcpConnect(host="10.0.0.1", port=22), ctx, pol).verdict == "deny"


def test_http_rules_never_admit_tcp() -> None:
    cfg = BrokerConfig.from_allow_flags(["github.com:22"])
    assert tcp_policy(cfg).rules == ()


def test_host_services_expand_to_names_on_the_host_loopback() -> None:
    cfg = _config(services=(HostServiceConfig(name="db", port=5432),))
    assert cfg.resolver_overrides["db.corral.internal"] == ("127.0.0.1",)
    assert cfg.resolver_overrides["host.corral.internal"] == ("127.0.0.1",)
    pol = tcp_policy(cfg)
    loop = DecisionContext(addresses=("127.0.0.1",))
    assert decide(TcpConnect(host="db.corral.internal", port=5432), loop, pol).allowed
    assert decide(TcpConnect(host="host.corral.internal", port=5432), loop, pol).allowed
    # Only the declared port; the host's other loopback services stay out of reach.
    assert not decide(TcpConnect(host="db.corral.internal", port=22), loop, pol).allowed
    assert not decide(TcpConnect(host="host.corral.internal", port=22), loop, pol).allowed
    assert not decide(TcpConnect(host="127.0.0.1", port=5432), DecisionContext(), pol).allowed
    assert {r.id for r in cfg.rules} == {"host-service:db", "host-service:host"}


@pytest.mark.parametrize(
    "flag",
    [
        "127.0.0.1:5432",
        "localhost",
        "[::1]:80",
        "127.1.2.3",
        "127.0.0.0/8",
        "db.localhost",
        "[::ffff:127.0.0.1]:80",
    ],
)
def test_allowing_loopback_points_at_host_services(flag: str) -> None:
    with pytest.raises(ConfigError, match="host_services"):
        BrokerConfig.from_allow_flags([flag])


def test_networks_containing_more_than_loopback_are_not_loopback() -> None:
    assert len(BrokerConfig.from_allow_flags(["0.0.0.0/0", "10.0.0.0/8"]).rules) == 2


@pytest.mark.parametrize("flag", ["db", "db=", "db=x", "Db=1", "host=80", "db=70000", "-x=1"])
def test_host_service_flag_refuses(flag: str) -> None:
    with pytest.raises(ConfigError, match="--host-service"):
        parse_host_service_flag(flag)


def test_tcp_rule_ports_and_ids() -> None:
    rule = TcpRuleConfig(host="*.example.org", ports=(22, 2222))
    assert rule.ports == (22, 2222) and rule.id == "tcp-allow:*.example.org:22,2222"
    with pytest.raises(ValueError, match="port"):
        TcpRuleConfig(host="example.org")
    assert action_target(TcpConnect(host="Example.org", port=22)) == "tcp://example.org:22"


def test_sandbox_env_only_with_tcp_or_services() -> None:
    assert sandbox_env_for(BrokerConfig(), 3128) == {}
    env = sandbox_env_for(BrokerConfig(tcp=(TcpRuleConfig(host="a.test", port=22),)), 3128)
    assert env["ALL_PROXY"] == "socks5h://127.0.0.1:3128"
    assert "'" not in ssh_proxy_command(3128)
    assert env["GIT_SSH_COMMAND"].startswith("ssh -o 'ProxyCommand=python3 ")


def test_ssh_config_only_with_tcp_or_services() -> None:
    assert sandbox_ssh_config(BrokerConfig(), 3128) is None
    text = sandbox_ssh_config(BrokerConfig(tcp=(TcpRuleConfig(host="a.test", port=22),)), 3128)
    assert text is not None
    lines = [x for x in text.splitlines() if not x.startswith("#")]
    assert lines == ["Host *", f"    ProxyCommand {ssh_proxy_command(3128)}"]
