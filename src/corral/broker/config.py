"""The broker's configuration: one JSON document, validated by `BrokerConfig` (pure).

The launcher builds a `BrokerConfig`, serialises it with `to_json()` and hands
it to `python -m corral.broker serve --config FILE|-`. The document holds no
secret: a route's injected header names a source (`env:NAME` in the broker's
own environment, or `file:/path`), read by the broker when it starts.

Rules admit destinations by host (exact name, `*.suffix`, IP literal or CIDR),
port, and optionally method and path prefix. Deny rules win over allow rules;
an action no allow rule matches is denied. A rule restricted by method or
path never admits a CONNECT tunnel, whose requests the broker cannot see.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from corral.broker.hosts import canonical_host
from corral.broker.wire import parse_authority
from corral.errors import ConfigError

__all__ = [
    "DEFAULT_STRIP_HEADERS",
    "BrokerConfig",
    "CredentialConfig",
    "FileRuleConfig",
    "HostServiceConfig",
    "LimitsConfig",
    "McpRuleConfig",
    "MitmConfig",
    "RouteConfig",
    "RuleConfig",
    "TcpRuleConfig",
    "TlsConfig",
    "canonical_rule_host",
    "check_allow_list",
    "parse_secret_ref",
    "split_hostport",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_ROUTE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

# Headers a sandboxed client might use to carry a credential of its own; a
# route removes them so only the broker's injected credential goes upstream.
DEFAULT_STRIP_HEADERS: tuple[str, ...] = (
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "cookie",
)


def canonical_rule_host(raw: str) -> str:
    """Canonical form of a rule's host: a name, `*.suffix`, an IP literal or a CIDR.

    Raises ValueError for anything else (a bare `*` is refused: allowing every
    host is not a rule, it is the absence of a broker).
    """
    text = raw.strip()
    if text.startswith("*."):
        suffix = canonical_host(text[2:])
        if _is_ip(suffix):
            raise ValueError(f"wildcards apply to names, not addresses: {raw!r}")
        return "*." + suffix
    if "*" in text:
        raise ValueError(f"only a leading '*.' wildcard is supported: {raw!r}")
    if "/" in text:
        try:
            return str(ipaddress.ip_network(text.strip("[]"), strict=True))
        except ValueError as exc:
            raise ValueError(f"invalid network {raw!r}: {exc}") from None
    return canonical_host(text)


def split_hostport(text: str) -> tuple[str, tuple[int, ...]]:
    """`host`, `host:port`, `[v6]:port` or a bare IPv6 address as (canonical rule
    host, ports); no port means 80 and 443. ValueError when it is none of them."""
    port_text = ""
    if text.startswith("["):
        inner, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError("malformed bracketed IPv6 address")
        host, port_text = inner, rest[1:]
    elif text.count(":") >= 2:
        host = text
    else:
        host, _, port_text = text.partition(":")
    if port_text and not (port_text.isdigit() and 1 <= int(port_text) <= 65535):
        raise ValueError(f"invalid port {port_text!r}")
    return canonical_rule_host(host), (int(port_text),) if port_text else (80, 443)


def _parse_allow_flag(flag: str) -> tuple[str, tuple[int, ...]]:
    canonical, ports = split_hostport(flag.strip())
    if _is_loopback(canonical):
        # Clients skip the proxy for loopback names (NO_PROXY) and reach the
        # sandbox's own loopback, never the host's: the rule could not work.
        raise ValueError(
            f"{canonical} is the sandbox's own loopback; to reach a service on the host's "
            "loopback declare it in [[host_services]] (corral exec --host-service NAME=PORT) "
            "and connect to NAME.corral.internal:PORT"
        )
    return canonical, ports


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        if "/" in host:
            net = ipaddress.ip_network(host)
            return net.network_address.is_loopback and net.broadcast_address.is_loopback
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _methods(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    out = tuple(m.upper() for m in value)
    for m in out:
        if not _TOKEN.match(m):
            raise ValueError(f"invalid method {m!r}")
    if not out:
        raise ValueError("methods, when given, must not be empty")
    return out


def _prefixes(value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not value:
        raise ValueError("path_prefixes, when given, must not be empty")
    for p in value:
        if not p.startswith("/") or "?" in p or "#" in p:
            raise ValueError(f"a path prefix starts with '/' and has no query: {p!r}")
    return tuple(value)


class RuleConfig(BaseModel):
    """One destination rule."""

    model_config = _FROZEN

    id: str = Field(default="", description="journaled as the deciding rule; derived if empty")
    effect: Literal["allow", "deny"] = "allow"
    host: str
    ports: tuple[int, ...] = (80, 443)
    methods: tuple[str, ...] | None = None
    path_prefixes: tuple[str, ...] | None = None
    allow_private: bool = False

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return canonical_rule_host(value)

    @field_validator("ports")
    @classmethod
    def _ports(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(not 1 <= p <= 65535 for p in value):
            raise ValueError("ports must be a non-empty list of 1..65535")
        return value

    @field_validator("methods")
    @classmethod
    def _m(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return _methods(value)

    @field_validator("path_prefixes")
    @classmethod
    def _p(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return _prefixes(value)

    @model_validator(mode="after")
    def _derive_id(self) -> Self:
        if not self.id:
            ports = ",".join(str(p) for p in self.ports)
            object.__setattr__(self, "id", f"{self.effect}:{self.host}:{ports}")
        return self


class RouteConfig(BaseModel):
    """A named upstream reached at `/routes/<name>/...` with injected credentials.

    `inject_header` maps a header name to a secret source: `env:NAME` (the
    broker's environment) or `file:/absolute/path` (first line, stripped).
    """

    model_config = _FROZEN

    upstream: str
    inject_header: dict[str, str] = Field(default_factory=dict)
    strip_headers: tuple[str, ...] = DEFAULT_STRIP_HEADERS
    allow_private: bool = False
    methods: tuple[str, ...] | None = None
    path_prefixes: tuple[str, ...] | None = None
    meter_usage: bool = Field(
        default=False, description="count provider token usage from responses (metering.py)"
    )
    token_budget: int | None = Field(
        default=None, ge=0, description="refuse requests once this many tokens are spent"
    )

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, value: str) -> str:
        m = re.match(r"^(https?)://([^/?#@]+)(/[^?#]*)?$", value)
        if m is None:
            raise ValueError(f"upstream must be http(s)://host[:port][/path]: {value!r}")
        scheme, authority, _ = m.groups()
        parse_authority(authority, 443 if scheme == "https" else 80)
        return value.rstrip("/")

    @field_validator("inject_header")
    @classmethod
    def _inject(cls, value: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, ref in value.items():
            if not _TOKEN.match(name):
                raise ValueError(f"invalid header name {name!r}")
            parse_secret_ref(ref)
            out[name.lower()] = ref
        return out

    @field_validator("strip_headers")
    @classmethod
    def _strip(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(h.lower() for h in value)

    @field_validator("methods")
    @classmethod
    def _m(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return _methods(value)

    @field_validator("path_prefixes")
    @classmethod
    def _p(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return _prefixes(value)


def parse_secret_ref(ref: str) -> tuple[Literal["env", "file"], str]:
    """Split `env:NAME` / `file:/path`; raises ValueError for anything else."""
    source, _, name = ref.partition(":")
    if source == "env" and re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
        return "env", name
    if source == "file" and name.startswith("/"):
        return "file", name
    raise ValueError(f"a secret is 'env:NAME' or 'file:/absolute/path', not {ref!r}")


class McpRuleConfig(BaseModel):
    """Admits calls to an MCP server's tools (all tools when `tools` is None)."""

    model_config = _FROZEN

    id: str = ""
    server: str
    tools: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _derive_id(self) -> Self:
        if not self.id:
            object.__setattr__(self, "id", f"mcp:{self.server}")
        return self


class FileRuleConfig(BaseModel):
    """Admits file operations below an absolute path."""

    model_config = _FROZEN

    id: str = ""
    path: str
    ops: tuple[Literal["read", "write", "create", "delete", "exec", "list"], ...] = ("read",)

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError(f"file rule paths are absolute: {value!r}")
        return value.rstrip("/") or "/"

    @model_validator(mode="after")
    def _derive_id(self) -> Self:
        if not self.id:
            object.__setattr__(self, "id", f"file:{self.path}")
        return self


_SERVICE_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


class HostServiceConfig(BaseModel):
    """A service on the host's loopback, reached in the sandbox as `NAME.corral.internal:PORT`.

    `host.corral.internal:PORT` reaches it too. The broker connects to
    127.0.0.1:`port` on the host; nothing else of the host's loopback is
    reachable (see `corral.broker.tcp.expand_host_services`).
    """

    model_config = _FROZEN

    name: str
    port: int = Field(ge=1, le=65535)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _SERVICE_NAME.match(value) or value == "host":
            raise ValueError(
                f"a host service name is one lowercase DNS label (not 'host'): {value!r}"
            )
        return value


class TcpRuleConfig(BaseModel):
    """A raw TCP destination reached through the broker's SOCKS5 server.

    `host` is a name, `*.suffix`, an IP literal or a CIDR, as for rules;
    names are resolved by the broker, and private addresses are refused
    unless `allow_private` is set. No `[[tcp]]` rule means no TCP.
    """

    model_config = _FROZEN

    id: str = Field(default="", description="journaled as the deciding rule; derived if empty")
    effect: Literal["allow", "deny"] = "allow"
    host: str
    port: int | None = Field(default=None, ge=1, le=65535)
    ports: tuple[int, ...] = ()
    allow_private: bool = False

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return canonical_rule_host(value)

    @model_validator(mode="after")
    def _ports_and_id(self) -> Self:
        ports = tuple(dict.fromkeys(((self.port,) if self.port is not None else ()) + self.ports))
        if not ports or any(not 1 <= p <= 65535 for p in ports):
            raise ValueError(f"tcp rule {self.host}: give port = N or ports = [N, ...] (1..65535)")
        object.__setattr__(self, "ports", ports)
        object.__setattr__(self, "port", None)
        if not self.id:
            text = ",".join(str(p) for p in ports)
            object.__setattr__(self, "id", f"tcp-{self.effect}:{self.host}:{text}")
        return self

    def as_rule(self) -> RuleConfig:
        """The destination rule the TCP policy is compiled from."""
        return RuleConfig(
            id=self.id,
            effect=self.effect,
            host=self.host,
            ports=self.ports,
            allow_private=self.allow_private,
        )


class TlsConfig(BaseModel):
    """How the broker verifies route upstreams it speaks TLS to."""

    model_config = _FROZEN

    verify: bool = True
    ca_bundle: str | None = None


#: Variables corral sets in a sandbox itself; a credential may not take them over.
_CORRAL_ENV = frozenset(
    {"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "NODE_USE_ENV_PROXY"}
    | {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO"}
    | {"NODE_EXTRA_CA_CERTS", "npm_config_noproxy", "CORRAL_BROKER_URL"}
)


class CredentialConfig(BaseModel):
    """A real secret the sandbox holds only as a placeholder (swapped on `hosts` only).

    `placeholder` is filled in by the launcher (`corral-placeholder-<random>`);
    the sandbox's `env` variable holds it. `value` names the real secret's
    source (`env:NAME` / `file:/path`), read by the broker at start.
    """

    model_config = _FROZEN

    name: str
    env: str
    value: str
    hosts: tuple[str, ...]
    in_body: bool = False
    placeholder: str = ""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _ROUTE_NAME.match(value):
            raise ValueError(f"invalid credential name {value!r}")
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: str) -> str:
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", value):
            raise ValueError(f"invalid environment variable name {value!r}")
        if value in _CORRAL_ENV or value.lower().endswith("_proxy"):
            raise ValueError(f"env {value} is set by corral")
        return value

    @field_validator("value")
    @classmethod
    def _value(cls, value: str) -> str:
        parse_secret_ref(value)
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("a credential is bound to at least one host")
        out = tuple(canonical_host(h) for h in value)
        for h in out:
            if "*" in h:
                raise ValueError(f"credential hosts are exact names: {h!r}")
        return out

    @field_validator("placeholder")
    @classmethod
    def _placeholder(cls, value: str) -> str:
        if value and not re.match(r"^corral-placeholder-[0-9a-f]{32}$", value):
            raise ValueError("placeholder is corral-placeholder-<32 hex digits>")
        return value


class MitmConfig(BaseModel):
    """The run's interception CA: host-private files (the key is 0600, never in the sandbox)."""

    model_config = _FROZEN

    ca_cert: str
    ca_key: str
    max_leaf_certs: int = Field(default=256, ge=1)


class LimitsConfig(BaseModel):
    """Bounds on what one client connection may hold (seconds, bytes)."""

    model_config = _FROZEN

    max_header_bytes: int = Field(default=65536, ge=1024)
    idle_timeout_s: float = Field(default=60.0, gt=0)
    header_timeout_s: float = Field(default=10.0, gt=0)
    body_timeout_s: float = Field(default=120.0, gt=0)
    max_body_bytes: int = Field(default=16 << 20, ge=1024)
    """A request body past this is refused with 413 (rule `body-limit`)."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    resolve_timeout_s: float = Field(default=5.0, gt=0)
    upstream_timeout_s: float = Field(default=600.0, gt=0)
    tunnel_idle_timeout_s: float | None = None
    max_connections: int = Field(default=512, ge=1)
    sni_check: bool = True


class BrokerConfig(BaseModel):
    """Everything `corral.broker serve` needs besides identity and sockets."""

    model_config = _FROZEN

    version: Literal[1] = 1
    rules: tuple[RuleConfig, ...] = ()
    routes: dict[str, RouteConfig] = Field(default_factory=dict)
    mcp: tuple[McpRuleConfig, ...] = ()
    files: tuple[FileRuleConfig, ...] = ()
    resolver_overrides: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    system_dns: bool = True
    upstream_tls: TlsConfig = TlsConfig()
    credentials: tuple[CredentialConfig, ...] = ()
    host_services: tuple[HostServiceConfig, ...] = ()
    tcp: tuple[TcpRuleConfig, ...] = ()
    mitm: MitmConfig | None = None
    limits: LimitsConfig = LimitsConfig()
    hooks: tuple[str, ...] = Field(default=(), description="'module:function' policy hooks")
    journal_synchronous: Literal["normal", "full"] = "normal"
    pauses: str | None = Field(default=None, pattern="^/")
    """The run's published pauses (`tools/pauses.json`): the broker's timers stop
    while the run is paused (`corral.broker.pauseloop`). None: not part of a run.
    The resident broker serves many sandboxes on one clock and ignores it."""

    @field_validator("routes")
    @classmethod
    def _routes(cls, value: dict[str, RouteConfig]) -> dict[str, RouteConfig]:
        for name in value:
            if not _ROUTE_NAME.match(name):
                raise ValueError(f"invalid route name {name!r}")
        return value

    @field_validator("resolver_overrides", mode="before")
    @classmethod
    def _overrides(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        out: dict[str, tuple[str, ...]] = {}
        for name, addrs in value.items():
            listed = (addrs,) if isinstance(addrs, str) else tuple(addrs)
            out[canonical_host(str(name))] = tuple(str(ipaddress.ip_address(a)) for a in listed)
        return out

    @field_validator("hooks")
    @classmethod
    def _hooks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for ref in value:
            if not re.match(r"^[\w.]+:\w+$", ref):
                raise ValueError(f"a hook is 'module:function', not {ref!r}")
        return value

    @model_validator(mode="after")
    def _unique_ids(self) -> Self:
        ids = [r.id for r in self.rules]
        dupes = {i for i in ids if ids.count(i) > 1}
        if dupes:
            raise ValueError(f"duplicate rule ids: {sorted(dupes)}")
        names = [c.name for c in self.credentials]
        if len(set(names)) != len(names):
            raise ValueError("duplicate credential names")
        tcp_ids = [t.id for t in self.tcp]
        if len(set(tcp_ids)) != len(tcp_ids):
            raise ValueError("duplicate tcp rule ids")
        services = [h.name for h in self.host_services]
        if len(set(services)) != len(services):
            raise ValueError("duplicate host service names")
        return self

    @classmethod
    def from_allow_flags(cls, flags: Iterable[str]) -> BrokerConfig:
        """Rules for `corral exec --allow HOST[:PORT]` (other fields at their defaults).

        No port means 80 and 443. `*.suffix` is accepted. An IP literal
        (`10.0.0.5`, `[::1]:8080`) is an explicit destination and so may be
        private; a name never may. Raises ConfigError on a malformed flag.
        Use `model_copy(update=...)` to add routes or resolver overrides.
        """
        rules: list[RuleConfig] = []
        for flag in dict.fromkeys(flags):
            try:
                host, ports = _parse_allow_flag(flag)
                rules.append(
                    RuleConfig(
                        id=f"allow:{flag}",
                        host=host,
                        ports=ports,
                        allow_private=_is_ip(host),
                    )
                )
            except ValueError as exc:
                raise ConfigError(f"--allow {flag!r}: {exc}") from exc
        try:
            return cls(rules=tuple(rules))
        except ValueError as exc:
            raise ConfigError(f"invalid broker configuration: {exc}") from exc

    def to_json(self) -> str:
        """The document `serve --config` reads."""
        # Not part of a run: the same document as before `pauses` existed.
        return self.model_dump_json(exclude={"pauses"} if self.pauses is None else None)

    @classmethod
    def from_json(cls, text: str | bytes) -> BrokerConfig:
        """Parse and validate; raises ConfigError."""
        try:
            return cls.model_validate_json(text)
        except ValueError as exc:
            raise ConfigError(f"invalid broker configuration: {exc}") from exc


def check_allow_list(entries: tuple[str, ...]) -> tuple[str, ...]:
    """A config file's `allow = [...]`, checked as `--allow` flags are (for a
    pydantic validator: ValueError naming the bad entry, without the flag)."""
    try:
        BrokerConfig.from_allow_flags(entries)
    except ConfigError as exc:
        raise ValueError(str(exc).replace("--allow ", "")) from None
    return entries
