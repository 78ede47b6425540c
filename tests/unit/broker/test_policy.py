"""The pure decision engine: matching, address checks, every action kind, hooks."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.broker.actions import (
    Action,
    FileOp,
    HttpRequest,
    McpCall,
    NetConnect,
    ProcessEvent,
    ProviderCall,
)
from corral.broker.config import (
    BrokerConfig,
    FileRuleConfig,
    McpRuleConfig,
    RouteConfig,
    RuleConfig,
)
from corral.broker.hosts import ALWAYS_FORBIDDEN, forbidden_category, ip_literal
from corral.broker.policy import Decision, DecisionContext, Hook, Policy, decide
from corral.broker.wire import is_ambiguous_path, path_has_prefix

PUBLIC = ("93.184.216.34",)


def policy(*rules: RuleConfig, **routes: RouteConfig) -> Policy:
    return Policy.from_config(BrokerConfig(rules=rules, routes=routes))


def final(action: Action, pol: Policy, addresses: tuple[str, ...] = PUBLIC) -> Decision:
    """Both steps, as the server runs them."""
    first = decide(action, DecisionContext(), pol)
    if first.verdict != "resolve":
        return first
    return decide(action, DecisionContext(addresses=addresses), pol)


def test_name_step_asks_to_resolve_and_address_step_allows() -> None:
    pol = policy(RuleConfig(host="pypi.org", ports=(443,)))
    first = decide(NetConnect(host="pypi.org", port=443), DecisionContext(), pol)
    assert first.verdict == "resolve"
    assert first.resolve_host == "pypi.org"
    assert first.addresses == ()
    second = decide(NetConnect(host="pypi.org", port=443), DecisionContext(addresses=PUBLIC), pol)
    assert second.verdict == "allow"
    assert second.rule == "allow:pypi.org:443"
    assert second.addresses == PUBLIC


def test_unknown_host_is_denied_before_any_resolution() -> None:
    pol = policy(RuleConfig(host="pypi.org"))
    d = decide(NetConnect(host="secret-data.attacker.test", port=443), DecisionContext(), pol)
    assert d.verdict == "deny"
    assert d.rule == "default-deny"
    assert d.resolve_host is None


def test_exact_and_wildcard_hosts() -> None:
    pol = policy(RuleConfig(host="*.github.com"), RuleConfig(host="pypi.org"))
    assert final(NetConnect(host="api.github.com", port=443), pol).allowed
    assert final(NetConnect(host="a.b.github.com", port=443), pol).allowed
    assert not final(NetConnect(host="github.com", port=443), pol).allowed
    assert not final(NetConnect(host="evilgithub.com", port=443), pol).allowed
    assert not final(NetConnect(host="files.pypi.org", port=443), pol).allowed
    both = policy(RuleConfig(host="*.github.com"), RuleConfig(host="github.com"))
    assert final(NetConnect(host="github.com", port=443), both).allowed


def test_ports() -> None:
    pol = policy(RuleConfig(host="pypi.org"), RuleConfig(host="api.test", ports=(8443,)))
    assert final(NetConnect(host="pypi.org", port=80), pol).allowed
    assert final(NetConnect(host="pypi.org", port=443), pol).allowed
    assert not final(NetConnect(host="pypi.org", port=22), pol).allowed
    assert final(NetConnect(host="api.test", port=8443), pol).allowed
    assert not final(NetConnect(host="api.test", port=443), pol).allowed


def test_methods_and_path_prefixes_for_plain_http() -> None:
    pol = policy(
        RuleConfig(
            host="pypi.test", ports=(80,), methods=("GET", "head"), path_prefixes=("/simple/",)
        )
    )

    def req(method: str, path: str) -> HttpRequest:
        return HttpRequest(host="pypi.test", port=80, method=method, path=path)

    assert final(req("GET", "/simple/pkg/"), pol).allowed
    assert final(req("HEAD", "/simple"), pol).allowed
    assert not final(req("POST", "/simple/pkg/"), pol).allowed
    assert not final(req("GET", "/upload/"), pol).allowed
    assert not final(req("GET", "/simplex"), pol).allowed
    assert not final(req("GET", "/simple/../admin"), pol).allowed
    assert not final(req("GET", "/simple/%2e%2e/admin"), pol).allowed


def test_rule_restricted_by_path_never_admits_a_tunnel() -> None:
    pol = policy(RuleConfig(host="pypi.test", methods=("GET",)))
    d = final(NetConnect(host="pypi.test", port=443), pol)
    assert d.verdict == "deny"
    assert "tunnel" in d.reason


def test_deny_rule_wins_and_refuses_tunnels_even_when_restricted() -> None:
    pol = policy(
        RuleConfig(host="*.example.com"),
        RuleConfig(host="gist.example.com", effect="deny"),
        RuleConfig(host="api.example.com", effect="deny", methods=("POST",)),
    )
    assert not final(NetConnect(host="gist.example.com", port=443), pol).allowed
    assert final(NetConnect(host="www.example.com", port=443), pol).allowed
    assert not final(NetConnect(host="api.example.com", port=443), pol).allowed
    get = HttpRequest(host="api.example.com", port=80, method="GET", path="/")
    post = HttpRequest(host="api.example.com", port=80, method="POST", path="/")
    assert final(get, pol).allowed
    denied = final(post, pol)
    assert not denied.allowed
    assert denied.rule == "deny:api.example.com:80,443"


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.0.0.1",
        "172.20.0.1",
        "192.168.0.10",
        "100.64.1.1",
        "169.254.169.254",
        "169.254.0.1",
        "::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "fe80::1",
        "fc00::5",
        "0.0.0.0",
    ],
)
def test_private_resolution_is_refused_without_allow_private(address: str) -> None:
    pol = policy(RuleConfig(host="pypi.test"))
    d = final(NetConnect(host="pypi.test", port=443), pol, (address,))
    assert d.verdict == "deny"
    assert d.rule == "private-address"
    assert address.rsplit(":", maxsplit=1)[-1] in d.reason or address in d.reason


def test_one_private_address_among_public_ones_is_refused() -> None:
    pol = policy(RuleConfig(host="pypi.test"))
    d = final(NetConnect(host="pypi.test", port=443), pol, ("93.184.216.34", "127.0.0.1"))
    assert not d.allowed


def test_allow_private_admits_private_but_never_unspecified_or_multicast() -> None:
    pol = policy(RuleConfig(host="pypi.test", allow_private=True))
    assert final(NetConnect(host="pypi.test", port=443), pol, ("127.0.0.1",)).allowed
    assert final(NetConnect(host="pypi.test", port=443), pol, ("10.1.1.1",)).allowed
    for bad in ("0.0.0.0", "::", "224.0.0.1", "255.255.255.255"):
        assert not final(NetConnect(host="pypi.test", port=443), pol, (bad,)).allowed


def test_no_addresses_is_a_denial() -> None:
    pol = policy(RuleConfig(host="pypi.test"))
    assert not final(NetConnect(host="pypi.test", port=443), pol, ()).allowed


@pytest.mark.parametrize(
    "host", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::ffff:7f00:1]"]
)
def test_ip_encodings_are_literals_checked_as_addresses(host: str) -> None:
    # A name rule never admits an address, whatever its spelling.
    names = policy(RuleConfig(host="localhost"), RuleConfig(host="*.0.1.test"))
    d = final(NetConnect(host=host, port=80), names)
    assert not d.allowed
    assert d.rule == "default-deny"
    # An address rule sees the canonical address and still refuses loopback.
    literal = policy(RuleConfig(host="127.0.0.1"), RuleConfig(host="::ffff:7f00:1"))
    d = final(NetConnect(host=host, port=80), literal)
    assert not d.allowed
    assert d.rule == "private-address"


def test_ip_literal_and_cidr_rules() -> None:
    pol = policy(
        RuleConfig(host="93.184.216.0/24"),
        RuleConfig(host="10.9.9.9", allow_private=True),
        RuleConfig(host="2606:4700::/32"),
    )
    first = decide(NetConnect(host="93.184.216.34", port=443), DecisionContext(), pol)
    assert first.verdict == "allow"
    assert first.addresses == ("93.184.216.34",)
    assert final(NetConnect(host="10.9.9.9", port=443), pol).allowed
    assert not final(NetConnect(host="10.9.9.8", port=443), pol).allowed
    assert final(NetConnect(host="[2606:4700::1111]", port=443), pol).allowed


def test_deny_network_applies_to_resolved_addresses() -> None:
    pol = policy(
        RuleConfig(host="*.corp.test", allow_private=True),
        RuleConfig(host="10.0.0.0/8", effect="deny"),
    )
    assert final(NetConnect(host="a.corp.test", port=443), pol, ("192.168.1.1",)).allowed
    d = final(NetConnect(host="a.corp.test", port=443), pol, ("10.1.1.1",))
    assert not d.allowed
    assert d.rule == "deny:10.0.0.0/8:80,443"


def test_routes() -> None:
    route = RouteConfig(
        upstream="http://127.0.0.1:9999/base",
        allow_private=True,
        methods=("POST",),
        path_prefixes=("/v1/",),
    )
    strict = RouteConfig(upstream="http://127.0.0.1:9998")
    pol = policy(synthetic=route, strict=strict)
    ok = decide(
        ProviderCall(route="synthetic", method="POST", path="/v1/messages"), DecisionContext(), pol
    )
    assert ok.verdict == "allow"
    assert ok.rule == "route:synthetic"
    assert ok.addresses == ("127.0.0.1",)
    assert pol.routes["synthetic"].base_path == "/base"
    for call in (
        ProviderCall(route="synthetic", method="GET", path="/v1/messages"),
        ProviderCall(route="synthetic", method="POST", path="/v2/messages"),
        ProviderCall(route="synthetic", method="POST", path="/v1/../admin"),
        ProviderCall(route="nope", method="POST", path="/v1/messages"),
    ):
        assert decide(call, DecisionContext(), pol).verdict == "deny"
    # Loopback upstream without allow_private is refused.
    d = decide(ProviderCall(route="strict", method="GET", path="/"), DecisionContext(), pol)
    assert (d.verdict, d.rule) == ("deny", "private-address")


def test_named_route_upstream_needs_resolution() -> None:
    pol = policy(anthropic=RouteConfig(upstream="https://api.anthropic.com"))
    call = ProviderCall(route="anthropic", method="POST", path="/v1/messages")
    first = decide(call, DecisionContext(), pol)
    assert (first.verdict, first.resolve_host) == ("resolve", "api.anthropic.com")
    assert decide(call, DecisionContext(addresses=PUBLIC), pol).allowed


def test_mcp_file_and_process_kinds() -> None:
    pol = Policy.from_config(
        BrokerConfig(
            mcp=(McpRuleConfig(server="fs", tools=("read_file",)), McpRuleConfig(server="web")),
            files=(FileRuleConfig(path="/workspace", ops=("read", "write")),),
        )
    )
    ctx = DecisionContext()
    assert decide(McpCall(server="fs", tool="read_file"), ctx, pol).allowed
    assert not decide(McpCall(server="fs", tool="delete"), ctx, pol).allowed
    assert decide(McpCall(server="web", tool="anything"), ctx, pol).allowed
    assert not decide(McpCall(server="other", tool="x"), ctx, pol).allowed
    assert decide(FileOp(op="read", path="/workspace/a.txt"), ctx, pol).allowed
    assert decide(FileOp(op="write", path="/workspace"), ctx, pol).allowed
    assert not decide(FileOp(op="exec", path="/workspace/a.sh"), ctx, pol).allowed
    assert not decide(FileOp(op="read", path="/workspace2/a"), ctx, pol).allowed
    assert not decide(FileOp(op="read", path="/workspace/../etc/passwd"), ctx, pol).allowed
    assert not decide(FileOp(op="read", path="relative"), ctx, pol).allowed
    event = decide(ProcessEvent(event="oom_kill", pid=42), ctx, pol)
    assert (event.verdict, event.rule) == ("observe", None)


def test_empty_policy_denies_every_decidable_kind() -> None:
    pol = Policy.from_config(BrokerConfig())
    ctx = DecisionContext(addresses=PUBLIC)
    actions: list[Action] = [
        NetConnect(host="pypi.org", port=443),
        HttpRequest(host="pypi.org", port=80, method="GET", path="/"),
        ProviderCall(route="anthropic", method="POST", path="/v1/messages"),
        McpCall(server="fs", tool="read"),
        FileOp(op="read", path="/etc/passwd"),
    ]
    for action in actions:
        assert decide(action, ctx, pol).verdict == "deny"


def _boom(action: Action, ctx: DecisionContext, decision: Decision) -> Decision | None:
    raise RuntimeError("hook bug")


def _veto_github(action: Action, ctx: DecisionContext, decision: Decision) -> Decision | None:
    if isinstance(action, NetConnect) and action.host.endswith("github.com"):
        return Decision("deny", "no-github", "vetoed")
    return None


def _widen(action: Action, ctx: DecisionContext, decision: Decision) -> Decision | None:
    return Decision("allow", "widen", "hooks cannot widen")


def _wrong_type(action: Action, ctx: DecisionContext, decision: Decision) -> Decision | None:
    return "allow"  # type: ignore[return-value]


def _with_hooks(*hooks: tuple[str, Hook]) -> Policy:
    return Policy.from_config(
        BrokerConfig(rules=(RuleConfig(host="*.github.com"), RuleConfig(host="pypi.org"))), hooks
    )


def test_hook_exception_denies() -> None:
    d = final(NetConnect(host="pypi.org", port=443), _with_hooks(("boom", _boom)))
    assert (d.verdict, d.rule) == ("deny", "hook:boom")
    assert "hook bug" in d.reason


def test_hooks_can_veto_but_not_widen() -> None:
    pol = _with_hooks(("widen", _widen), ("veto", _veto_github))
    assert final(NetConnect(host="pypi.org", port=443), pol).allowed
    d = final(NetConnect(host="api.github.com", port=443), pol)
    assert (d.verdict, d.rule) == ("deny", "no-github")
    assert not final(NetConnect(host="evil.test", port=443), pol).allowed
    bad = final(NetConnect(host="pypi.org", port=443), _with_hooks(("wrong", _wrong_type)))
    assert (bad.verdict, bad.rule) == ("deny", "hook:wrong")


def test_policy_error_denies() -> None:
    pol = policy(RuleConfig(host="pypi.org"))
    # A corrupted compiled policy (here: a non-address in the context) must deny, not raise.
    d = decide(
        NetConnect(host="pypi.org", port=443), DecisionContext(addresses=("not-an-ip",)), pol
    )
    assert (d.verdict, d.rule) == ("deny", "policy-error")


# --- property: a decision is allow only if some rule matches -------------------------

_NAMES = ["a.test", "b.a.test", "c.test", "x.c.test", "a.test.evil"]
_ADDRS = ["93.184.216.34", "127.0.0.1", "10.0.0.1", "::1", "2606:4700::1", "0.0.0.0"]

rule_strategy = st.builds(
    RuleConfig,
    host=st.sampled_from(
        [
            *_NAMES,
            "*.a.test",
            "*.c.test",
            "93.184.216.0/24",
            "127.0.0.1",
            "10.0.0.0/8",
            "2606:4700::/32",
        ]
    ),
    ports=st.sampled_from([(80,), (443,), (80, 443), (8080,)]),
    methods=st.sampled_from([None, ("GET",), ("POST", "PUT")]),
    path_prefixes=st.sampled_from([None, ("/ok/",), ("/a", "/b/")]),
    allow_private=st.booleans(),
    effect=st.sampled_from(["allow", "allow", "deny"]),
).map(lambda r: r.model_copy(update={"id": ""}))

host_strategy = st.sampled_from([*_NAMES, *_ADDRS])
action_strategy = st.one_of(
    st.builds(NetConnect, host=host_strategy, port=st.sampled_from([80, 443, 8080, 22])),
    st.builds(
        HttpRequest,
        host=host_strategy,
        port=st.sampled_from([80, 443, 8080]),
        method=st.sampled_from(["GET", "POST", "DELETE"]),
        path=st.sampled_from(["/", "/ok/x", "/a", "/b/c", "/ok/../x", "/a%2fb"]),
    ),
)


def _oracle_allows(
    rule: RuleConfig, action: NetConnect | HttpRequest, addrs: tuple[str, ...]
) -> bool:
    """A naive, independent reading of one allow rule."""
    if rule.effect != "allow" or action.port not in rule.ports:
        return False
    literal = ip_literal(action.host)
    if "/" in rule.host or ip_literal(rule.host) is not None:
        if literal is None or literal not in ipaddress.ip_network(rule.host):
            return False
    elif rule.host.startswith("*."):
        suffix, labels = rule.host[2:].split("."), action.host.split(".")
        if literal is not None or len(labels) <= len(suffix) or labels[-len(suffix) :] != suffix:
            return False
    elif rule.host != action.host:
        return False
    if isinstance(action, NetConnect):
        if rule.methods is not None or rule.path_prefixes is not None:
            return False
    else:
        if rule.methods is not None and action.method not in rule.methods:
            return False
        if rule.path_prefixes is not None and not any(
            path_has_prefix(action.path, p) for p in rule.path_prefixes
        ):
            return False
    checked = (action.host,) if literal is not None else addrs
    return all(forbidden_category(a) is None or rule.allow_private for a in checked)


@settings(max_examples=600, deadline=None)
@given(
    rules=st.lists(rule_strategy, max_size=5, unique_by=lambda r: r.id),
    action=action_strategy,
    addrs=st.lists(st.sampled_from(_ADDRS), min_size=1, max_size=2).map(tuple),
)
def test_allow_only_if_some_rule_matches(
    rules: list[RuleConfig], action: NetConnect | HttpRequest, addrs: tuple[str, ...]
) -> None:
    pol = Policy.from_config(BrokerConfig(rules=tuple(rules)))
    d = final(action, pol, addrs)
    assert d.verdict in ("allow", "deny")
    if d.allowed:
        admitting = [r for r in rules if r.id == d.rule]
        assert admitting, d
        assert _oracle_allows(admitting[0], action, addrs), (admitting[0], action, addrs, d)
        assert set(d.addresses) <= {action.host, *addrs}
    elif any(_oracle_allows(r, action, addrs) for r in rules):
        # Denied although an allow rule matches: only a deny rule, an
        # always-forbidden address, a path ambiguity or an earlier matching
        # rule without allow_private may explain it.
        checked = (action.host,) if ip_literal(action.host) is not None else addrs
        explained = (
            d.rule == "private-address"
            or any(r.effect == "deny" and d.rule == r.id for r in rules)
            or any(forbidden_category(a) in ALWAYS_FORBIDDEN for a in checked)
            or (isinstance(action, HttpRequest) and is_ambiguous_path(action.path))
        )
        assert explained, (rules, action, addrs, d)
