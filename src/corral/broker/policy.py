"""The broker's decision engine: `decide(action, context, policy) -> Decision` (pure).

No I/O happens here. A network action is decided in up to two steps, so
that the broker never resolves a name no rule admits (a DNS lookup of an
arbitrary name is itself an exfiltration channel):

1. `decide(action, ctx, policy)` with `ctx.addresses is None` matches rules on
   the name. A denial is final; an admitted *name* gives verdict `resolve`
   with `resolve_host` set.
2. The server resolves that host and calls `decide` again with
   `ctx.addresses`. Every resolved address must be public unless the
   admitting rule has `allow_private` (unspecified, multicast and broadcast
   addresses are never admitted), and must not fall in a deny rule's network.
   The final `allow` carries the checked `addresses`: the only ones the
   server may connect to.

IP-literal hosts skip step 1's resolution. Deny rules win over allow rules;
without a matching allow rule the verdict is `deny` with rule
`default-deny`. Hooks run on admitted actions and may only deny. Any
exception raised while deciding - a malformed policy, a failing hook -
yields a denial.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal, TypeAlias

from corral.broker.actions import (
    Action,
    Env,
    FileOp,
    HttpRequest,
    McpCall,
    NetConnect,
    ProcessEvent,
    ProviderCall,
    TcpConnect,
)
from corral.broker.config import BrokerConfig, RuleConfig
from corral.broker.hosts import (
    ALWAYS_FORBIDDEN,
    forbidden_category,
    format_hostport,
    host_matches,
    ip_literal,
)
from corral.broker.wire import is_ambiguous_path, parse_authority, path_has_prefix

__all__ = [
    "DEFAULT_DENY",
    "Decision",
    "DecisionContext",
    "Hook",
    "Policy",
    "RoutePolicy",
    "decide",
]

Verdict: TypeAlias = Literal["allow", "deny", "observe", "resolve"]
DEFAULT_DENY = "default-deny"


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome of `decide`.

    `verdict` is `allow`, `deny`, `observe` (events that are recorded, not
    decided) or `resolve` (name admitted; resolve `resolve_host` and decide
    again). `addresses` holds the checked addresses of an allowed network
    action.
    """

    verdict: Verdict
    rule: str | None
    reason: str
    addresses: tuple[str, ...] = ()
    resolve_host: str | None = None
    intercept: bool = False
    """An admitted tunnel the broker must open (TLS interception): its requests are decided."""

    @property
    def allowed(self) -> bool:
        return self.verdict == "allow"


@dataclass(frozen=True, slots=True)
class DecisionContext:
    """Who acts, and what the action's host resolved to (None: not resolved yet)."""

    env: Env = "exec"
    run: str | None = None
    session: str | None = None
    addresses: tuple[str, ...] | None = None

    def with_addresses(self, addresses: tuple[str, ...]) -> DecisionContext:
        return replace(self, addresses=addresses)


Hook: TypeAlias = Callable[[Action, DecisionContext, Decision], Decision | None]
"""A policy hook: return None to keep an admitting decision or a `deny` Decision."""

IPNetwork: TypeAlias = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class _Rule:
    index: int
    id: str
    effect: Literal["allow", "deny"]
    pattern: str
    network: IPNetwork | None
    ports: frozenset[int]
    methods: frozenset[str] | None
    path_prefixes: tuple[str, ...] | None
    allow_private: bool

    @property
    def restricted(self) -> bool:
        return self.methods is not None or self.path_prefixes is not None

    def matches_host(self, host: str) -> bool:
        if self.network is not None:
            ip = ip_literal(host)
            return ip is not None and ip.version == self.network.version and ip in self.network
        return host_matches(self.pattern, host)

    def matches_request(self, method: str | None, path: str | None) -> bool:
        if method is None or path is None:
            return not self.restricted
        if self.methods is not None and method not in self.methods:
            return False
        if self.path_prefixes is not None:
            if is_ambiguous_path(path):
                return False
            return any(path_has_prefix(path, p) for p in self.path_prefixes)
        return True


def _compile_rule(index: int, rule: RuleConfig) -> _Rule:
    network: IPNetwork | None = None
    if "/" in rule.host or ip_literal(rule.host) is not None:
        network = ipaddress.ip_network(rule.host)
    return _Rule(
        index=index,
        id=rule.id,
        effect=rule.effect,
        pattern=rule.host,
        network=network,
        ports=frozenset(rule.ports),
        methods=frozenset(rule.methods) if rule.methods is not None else None,
        path_prefixes=rule.path_prefixes,
        allow_private=rule.allow_private,
    )


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    """A route as the policy sees it: where it goes and what it admits."""

    name: str
    scheme: Literal["http", "https"]
    host: str
    port: int
    base_path: str
    allow_private: bool
    methods: frozenset[str] | None
    path_prefixes: tuple[str, ...] | None

    @property
    def rule_id(self) -> str:
        return f"route:{self.name}"


@dataclass(frozen=True, slots=True)
class Policy:
    """Compiled rules; build with `Policy.from_config`."""

    rules: tuple[_Rule, ...] = ()
    routes: Mapping[str, RoutePolicy] = field(default_factory=dict)
    mcp: tuple[tuple[str, str, frozenset[str] | None], ...] = ()
    files: tuple[tuple[str, str, frozenset[str]], ...] = ()
    hooks: tuple[tuple[str, Hook], ...] = ()
    _exact: Mapping[str, tuple[_Rule, ...]] = field(default_factory=dict)
    _suffix: Mapping[str, tuple[_Rule, ...]] = field(default_factory=dict)
    _network: tuple[_Rule, ...] = ()
    _deny_networks: tuple[_Rule, ...] = ()
    credential_hosts: frozenset[str] = frozenset()
    mitm: bool = False

    def intercepts(self, host: str, port: int) -> bool:
        """Whether a tunnel to host:port is opened (rules look inside, or a credential is bound)."""
        if not self.mitm:
            return False
        if host in self.credential_hosts:
            return True
        return any(r.restricted for r in self.candidates(host) if port in r.ports)

    @classmethod
    def from_config(cls, config: BrokerConfig, hooks: tuple[tuple[str, Hook], ...] = ()) -> Policy:
        """Compile `config`; `hooks` are (name, callable) pairs run in order."""
        rules = tuple(_compile_rule(i, r) for i, r in enumerate(config.rules))
        exact: dict[str, list[_Rule]] = {}
        suffix: dict[str, list[_Rule]] = {}
        for r in rules:
            if r.network is not None:
                continue
            if r.pattern.startswith("*."):
                suffix.setdefault(r.pattern[2:], []).append(r)
            else:
                exact.setdefault(r.pattern, []).append(r)
        routes: dict[str, RoutePolicy] = {}
        for name, route in config.routes.items():
            scheme, _, rest = route.upstream.partition("://")
            authority, slash, base = rest.partition("/")
            host, port = parse_authority(authority, 443 if scheme == "https" else 80)
            routes[name] = RoutePolicy(
                name=name,
                scheme="https" if scheme == "https" else "http",
                host=host,
                port=port,
                base_path=("/" + base).rstrip("/") if slash else "",
                allow_private=route.allow_private,
                methods=frozenset(route.methods) if route.methods is not None else None,
                path_prefixes=route.path_prefixes,
            )
        return cls(
            rules=rules,
            routes=routes,
            mcp=tuple(
                (m.id, m.server, frozenset(m.tools) if m.tools is not None else None)
                for m in config.mcp
            ),
            files=tuple((f.id, f.path, frozenset(f.ops)) for f in config.files),
            hooks=hooks,
            _exact={k: tuple(v) for k, v in exact.items()},
            _suffix={k: tuple(v) for k, v in suffix.items()},
            _network=tuple(r for r in rules if r.network is not None),
            _deny_networks=tuple(r for r in rules if r.network is not None and r.effect == "deny"),
            credential_hosts=frozenset(h for c in config.credentials for h in c.hosts),
            mitm=config.mitm is not None,
        )

    def candidates(self, host: str) -> list[_Rule]:
        """Rules whose host pattern matches canonical `host`, in configuration order."""
        found: list[_Rule] = []
        if ip_literal(host) is not None:
            found.extend(r for r in self._network if r.matches_host(host))
        else:
            found.extend(self._exact.get(host, ()))
            labels = host.split(".")
            for i in range(1, len(labels)):
                found.extend(self._suffix.get(".".join(labels[i:]), ()))
        if len(found) > 1:
            found.sort(key=lambda r: r.index)
        return found


def _deny(rule: str | None, reason: str) -> Decision:
    return Decision("deny", rule, reason)


def _decide_destination(
    host: str,
    port: int,
    *,
    method: str | None,
    path: str | None,
    ctx: DecisionContext,
    policy: Policy,
) -> Decision:
    where = format_hostport(host, port)
    candidates = [r for r in policy.candidates(host) if port in r.ports]
    if method is None and policy.intercepts(host, port):
        # The tunnel is opened and each request in it decided on its own, so
        # only unrestricted rules decide the tunnel itself.
        for r in candidates:
            if r.effect == "deny" and not r.restricted:
                return _deny(r.id, f"{where} is denied by rule {r.id}")
        admit = next((r for r in candidates if r.effect == "allow"), None)
        if admit is None:
            return _deny(DEFAULT_DENY, f"no rule admits {where}")
        return replace(
            _check_addresses(host, admit.id, admit.allow_private, ctx, policy), intercept=True
        )
    for r in candidates:
        # A deny rule restricted by method/path still refuses tunnels to its
        # destination: the broker cannot see what a tunnel will carry.
        if r.effect == "deny" and (method is None or r.matches_request(method, path)):
            return _deny(r.id, f"{where} is denied by rule {r.id}")
    rule = next(
        (r for r in candidates if r.effect == "allow" and r.matches_request(method, path)),
        None,
    )
    if rule is None:
        if method is None and any(r.effect == "allow" and r.restricted for r in candidates):
            return _deny(
                DEFAULT_DENY,
                f"{where} is admitted only for some methods/paths; a tunnel cannot be checked",
            )
        what = f"{method} {where}{path}" if method is not None else where
        return _deny(DEFAULT_DENY, f"no rule admits {what}")
    return _check_addresses(host, rule.id, rule.allow_private, ctx, policy)


def _check_addresses(
    host: str, rule_id: str, allow_private: bool, ctx: DecisionContext, policy: Policy
) -> Decision:
    literal = ip_literal(host)
    if literal is not None:
        addresses: tuple[str, ...] = (host,)
    elif ctx.addresses is None:
        return Decision("resolve", rule_id, f"{host} admitted by rule {rule_id}", (), host)
    else:
        addresses = ctx.addresses
    if not addresses:
        return _deny(rule_id, f"{host} did not resolve to any address")
    for a in addresses:
        cat = forbidden_category(a)
        if cat is not None and (cat in ALWAYS_FORBIDDEN or not allow_private):
            return _deny(
                "private-address",
                f"{host} resolves to {cat} address {a}; rule {rule_id} does not allow it",
            )
        if policy._deny_networks:
            ip = ipaddress.ip_address(a)
            for r in policy._deny_networks:
                if r.network is not None and ip.version == r.network.version and ip in r.network:
                    return _deny(r.id, f"{host} resolves to {a}, denied by rule {r.id}")
    return Decision("allow", rule_id, f"admitted by rule {rule_id}", tuple(addresses))


def _decide_route(action: ProviderCall, ctx: DecisionContext, policy: Policy) -> Decision:
    route = policy.routes.get(action.route)
    if route is None:
        return _deny(DEFAULT_DENY, f"no route named {action.route!r}")
    if is_ambiguous_path(action.path):
        return _deny(route.rule_id, f"ambiguous path {action.path!r} is refused on routes")
    if route.methods is not None and action.method not in route.methods:
        return _deny(route.rule_id, f"method {action.method} is not admitted on this route")
    if route.path_prefixes is not None and not any(
        path_has_prefix(action.path, p) for p in route.path_prefixes
    ):
        return _deny(route.rule_id, f"path {action.path} is not admitted on this route")
    return _check_addresses(route.host, route.rule_id, route.allow_private, ctx, policy)


def _decide_mcp(action: McpCall, policy: Policy) -> Decision:
    for rule_id, server, tools in policy.mcp:
        if server == action.server and (tools is None or action.tool in tools):
            return Decision("allow", rule_id, f"admitted by rule {rule_id}")
    return _deny(DEFAULT_DENY, f"no rule admits MCP tool {action.server}/{action.tool}")


def _decide_file(action: FileOp, policy: Policy) -> Decision:
    if not action.path.startswith("/") or is_ambiguous_path(action.path):
        return _deny(DEFAULT_DENY, f"path {action.path!r} is not absolute and normal")
    for rule_id, prefix, ops in policy.files:
        if action.op in ops and (prefix == "/" or path_has_prefix(action.path, prefix)):
            return Decision("allow", rule_id, f"admitted by rule {rule_id}")
    return _deny(DEFAULT_DENY, f"no rule admits {action.op} of {action.path}")


def _decide(action: Action, ctx: DecisionContext, policy: Policy) -> Decision:
    match action:
        case NetConnect() | TcpConnect():
            # A TcpConnect is decided on the `[[tcp]]` policy (broker/tcp.py).
            return _decide_destination(
                action.host, action.port, method=None, path=None, ctx=ctx, policy=policy
            )
        case HttpRequest():
            return _decide_destination(
                action.host,
                action.port,
                method=action.method,
                path=action.path,
                ctx=ctx,
                policy=policy,
            )
        case ProviderCall():
            return _decide_route(action, ctx, policy)
        case McpCall():
            return _decide_mcp(action, policy)
        case FileOp():
            return _decide_file(action, policy)
        case ProcessEvent():
            return Decision("observe", None, f"process event {action.event} observed")
    return _deny(DEFAULT_DENY, f"unknown action {type(action).__name__}")


def decide(action: Action, ctx: DecisionContext, policy: Policy) -> Decision:
    """Decide `action`. Never raises: any error denies (rule `policy-error` or `hook:<name>`)."""
    try:
        decision = _decide(action, ctx, policy)
    except Exception as exc:
        return _deny("policy-error", f"policy failed: {type(exc).__name__}: {exc}")
    if decision.verdict not in ("allow", "resolve"):
        return decision
    for name, hook in policy.hooks:
        try:
            verdict = hook(action, ctx, decision)
        except Exception as exc:
            return _deny(f"hook:{name}", f"hook {name} raised {type(exc).__name__}: {exc}")
        if verdict is None:
            continue
        if not isinstance(verdict, Decision):
            return _deny(f"hook:{name}", f"hook {name} returned {type(verdict).__name__}")
        if verdict.verdict == "deny":
            return Decision("deny", verdict.rule or f"hook:{name}", verdict.reason)
    return decision
