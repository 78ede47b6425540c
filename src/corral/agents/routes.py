"""Which model provider an agent talks to, and the broker routes that carry it (pure).

`--provider` takes `synthetic:FILE` (corral's scripted fake API, started on
the host for the run), `anthropic`, `openai`, `gemini` (the real APIs), or
`anthropic-compatible:URL` / `openai-compatible:URL` (a local or self-hosted
server: Ollama, vLLM, llama.cpp, LiteLLM, a gateway). A compatible provider's
key is optional and named by `env:NAME` or `file:/path` (`provider_key`),
read by corral on the host. A
real provider is reached only through a credential-injecting broker route:
the agent sees `http://127.0.0.1:3128/routes/<name>` and a placeholder key;
the broker strips whatever credential the agent sends and adds the real one,
which it reads from its own environment (`ROUTE_SECRETS`), so the key stays
on the host.

OpenAI wants `Authorization: Bearer <key>` and a route injects a header's
whole value, so the runner gives the broker `CORRAL_OPENAI_AUTHORIZATION`
(`Bearer ` + `$OPENAI_API_KEY`) in its environment (`route_secret_env`).

A compatible provider's route is the only place a private or loopback
upstream is admitted for a real agent (`allow_private` on that route, not on
any rule): a local model server usually listens on 127.0.0.1.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from corral.agents.base import WireApi
from corral.errors import UsageError

if TYPE_CHECKING:
    from corral.broker.config import BrokerConfig

__all__ = [
    "MCP_ROUTE",
    "REAL_PROVIDERS",
    "ProviderChoice",
    "ProviderKind",
    "UpstreamOverride",
    "broker_document",
    "check_compatible",
    "compatible_url",
    "parse_key_ref",
    "parse_provider",
    "provider_route",
    "route_secret_env",
]

ProviderKind: TypeAlias = Literal[
    "synthetic", "anthropic", "openai", "gemini", "anthropic-compatible", "openai-compatible"
]
COMPATIBLE: tuple[ProviderKind, ...] = ("anthropic-compatible", "openai-compatible")

MCP_ROUTE = "mcp"
"""The broker route that leads to the host-side MCP gateway."""

_WIRE: Mapping[ProviderKind, WireApi] = {
    "anthropic": "anthropic",
    "openai": "responses",
    "gemini": "gemini",
    "anthropic-compatible": "anthropic",
    "openai-compatible": "responses",
}

REAL_PROVIDERS: Mapping[str, dict[str, Any]] = {
    "anthropic": {
        "upstream": "https://api.anthropic.com",
        "inject_header": {"x-api-key": "env:ANTHROPIC_API_KEY"},
        "path_prefixes": ["/v1/"],
    },
    "openai": {
        "upstream": "https://api.openai.com",
        "inject_header": {"authorization": "env:CORRAL_OPENAI_AUTHORIZATION"},
        "path_prefixes": ["/v1/"],
    },
    "gemini": {
        "upstream": "https://generativelanguage.googleapis.com",
        "inject_header": {"x-goog-api-key": "env:GEMINI_API_KEY"},
        "path_prefixes": ["/v1beta/", "/v1/"],
    },
}
"""Broker route settings per real provider (the secret named, never held)."""

_KEY_VARIABLES: Mapping[str, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "gemini": "GEMINI_API_KEY",
}


@dataclass(frozen=True, slots=True)
class ProviderChoice:
    """A parsed `--provider` value."""

    kind: ProviderKind
    scenario: str | None = None
    url: str | None = None
    """A compatible provider's base URL (`compatible_url`'s form)."""
    key: str | None = None
    """A compatible provider's key source, `env:NAME` or `file:/path` (never the key)."""

    @property
    def route(self) -> str:
        """The broker route name (also the journal's `target` prefix)."""
        return self.kind

    def __str__(self) -> str:
        if self.kind == "synthetic":
            return f"synthetic:{self.scenario}"
        return f"{self.kind}:{self.url}" if self.url is not None else self.kind


_URL = re.compile(r"^(https?)://([A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?(/[^?#\s]*)?$")


def compatible_url(text: str) -> str:
    """A compatible provider's base URL, without a trailing `/` or `/v1`.

    Both CLIs append `/v1/...` themselves (Claude Code `/v1/messages`, Codex
    `/v1/responses`), so `http://h:8000/v1`, the usual way an OpenAI-compatible
    server is written, means the same as `http://h:8000`. UsageError otherwise.
    """
    m = _URL.match(text)
    if m is None or (m.group(3) and not 1 <= int(m.group(3)[1:]) <= 65535):
        raise UsageError(
            f"a compatible provider's URL is http(s)://host[:port][/path], not {text!r}"
        )
    url = text.rstrip("/")
    return url.removesuffix("/v1")


def parse_key_ref(text: str) -> str:
    """`env:NAME` or `file:/absolute/path` (where corral reads a key); UsageError otherwise."""
    kind, _, rest = text.partition(":")
    if kind == "env" and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", rest):
        return text
    if kind == "file" and rest.startswith("/"):
        return text
    raise UsageError(f"a provider key is 'env:NAME' or 'file:/absolute/path', not {text!r}")


def parse_provider(text: str, key: str | None = None) -> ProviderChoice:
    """`synthetic:FILE`, `anthropic`, `openai`, `gemini` or `*-compatible:URL`; else UsageError.

    `key` (`env:NAME` / `file:/path`) is only for a compatible provider: the
    real ones have their fixed variables.
    """
    for kind in COMPATIBLE:
        if text.startswith(kind + ":"):
            url = compatible_url(text[len(kind) + 1 :])
            return ProviderChoice(kind, url=url, key=None if key is None else parse_key_ref(key))
    if key is not None:
        raise UsageError("a provider key is for anthropic-compatible:URL or openai-compatible:URL")
    if text.startswith("synthetic:"):
        scenario = text[len("synthetic:") :]
        if not scenario:
            raise UsageError("--provider synthetic:FILE needs a scenario file")
        return ProviderChoice("synthetic", scenario)
    if text == "anthropic":
        return ProviderChoice("anthropic")
    if text == "openai":
        return ProviderChoice("openai")
    if text == "gemini":
        return ProviderChoice("gemini")
    raise UsageError(
        f"unknown provider {text!r}: use synthetic:FILE, anthropic, openai, gemini, "
        "anthropic-compatible:URL or openai-compatible:URL"
    )


def check_compatible(choice: ProviderChoice, agent: str, wire: WireApi) -> None:
    """Refuse a real provider whose API the agent's CLI does not speak."""
    if choice.kind == "synthetic":
        return
    if _WIRE[choice.kind] != wire:
        fitting = [k + ":URL" if k in COMPATIBLE else k for k, w in _WIRE.items() if w == wire]
        raise UsageError(
            f"{agent} speaks the {wire} API, which {choice.kind} does not serve; "
            f"use --provider {', '.join(fitting)} or synthetic:FILE"
        )


def provider_route(choice: ProviderChoice, synthetic_url: str | None) -> dict[str, Any]:
    """The broker route document for `choice` (`synthetic_url`: the host-side fake API)."""
    if choice.kind == "synthetic":
        if synthetic_url is None:
            raise UsageError("the synthetic provider is not running")
        return {"upstream": synthetic_url, "allow_private": True}
    if choice.kind in COMPATIBLE:
        assert choice.url is not None
        doc: dict[str, Any] = {
            "upstream": choice.url,
            "allow_private": True,
            "path_prefixes": ["/v1/"],
        }
        if choice.key is not None:
            header = "x-api-key" if choice.kind == "anthropic-compatible" else "authorization"
            doc["inject_header"] = {header: f"env:{_COMPATIBLE_KEY_VARIABLE}"}
        return doc
    return dict(REAL_PROVIDERS[choice.kind])


_COMPATIBLE_KEY_VARIABLE = "CORRAL_PROVIDER_KEY"
"""The broker's variable holding a compatible provider's header value."""


def _read_key(ref: str, environ: Mapping[str, str]) -> str:
    kind, _, rest = parse_key_ref(ref).partition(":")
    if kind == "env":
        key = environ.get(rest, "")
        if not key:
            raise UsageError(f"provider key {ref}: ${rest} is not set in corral's environment")
        return key
    try:
        with Path(rest).open(encoding="utf-8") as f:
            # A key file is one line; a bounded read keeps a wrong path cheap.
            key = f.readline(4096).strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"provider key {ref}: cannot read it: {exc}") from None
    if not key:
        raise UsageError(f"provider key {ref}: the file's first line is empty")
    return key


def route_secret_env(choice: ProviderChoice, environ: Mapping[str, str]) -> dict[str, str]:
    """Variables the broker needs for `choice`'s route; UsageError names a missing key."""
    if choice.kind == "synthetic":
        return {}
    if choice.kind in COMPATIBLE:
        if choice.key is None:
            return {}
        key = _read_key(choice.key, environ)
        if any(c in key for c in "\r\n\0"):
            raise UsageError(f"provider key {choice.key}: it contains a line break")
        value = key if choice.kind == "anthropic-compatible" else f"Bearer {key}"
        return {_COMPATIBLE_KEY_VARIABLE: value}
    name = _KEY_VARIABLES[choice.kind]
    key = environ.get(name, "")
    if not key:
        raise UsageError(f"--provider {choice.kind} needs ${name} in corral's environment")
    if choice.kind == "openai":
        return {"CORRAL_OPENAI_AUTHORIZATION": f"Bearer {key}"}
    return {name: key}


@dataclass(frozen=True, slots=True)
class UpstreamOverride:
    """A test hook on the host: where a route's upstream host really is, and its CA.

    Only host-side code builds one (`corral.run.agent_run.run_agent(upstream=)`);
    it becomes the broker's `resolver_overrides` and `upstream_tls.ca_bundle`,
    which are in the broker's configuration, never in the sandbox. The address
    is an explicit, host-chosen destination, so the route admits it even when
    it is private or loopback.
    """

    address: str
    ca_bundle: str | None = None

    def apply(self, broker: BrokerConfig, route: str) -> BrokerConfig:
        from corral.broker.config import TlsConfig
        from corral.broker.hosts import canonical_host

        old = broker.routes[route]
        host = old.upstream.split("://", 1)[1].split("/", 1)[0].rsplit(":", 1)[0]
        routes = {**broker.routes, route: old.model_copy(update={"allow_private": True})}
        overrides = {**broker.resolver_overrides, canonical_host(host): (self.address,)}
        tls = TlsConfig(verify=True, ca_bundle=self.ca_bundle)
        return broker.model_copy(
            update={"routes": routes, "resolver_overrides": overrides, "upstream_tls": tls}
        )


def broker_document(routes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The `corral exec --config` document: routes only, no other egress."""
    return {"routes": {name: dict(route) for name, route in routes.items()}}
