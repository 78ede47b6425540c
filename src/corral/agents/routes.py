"""Which model provider an agent talks to, and the broker routes that carry it (pure).

`--provider` takes `synthetic:FILE` (corral's scripted fake API, started on
the host for the run), or `anthropic`, `openai`, `gemini` (the real APIs). A
real provider is reached only through a credential-injecting broker route:
the agent sees `http://127.0.0.1:3128/routes/<name>` and a placeholder key;
the broker strips whatever credential the agent sends and adds the real one,
which it reads from its own environment (`ROUTE_SECRETS`), so the key stays
on the host.

OpenAI wants `Authorization: Bearer <key>` and a route injects a header's
whole value, so the runner gives the broker `CORRAL_OPENAI_AUTHORIZATION`
(`Bearer ` + `$OPENAI_API_KEY`) in its environment (`route_secret_env`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from corral.agents.base import WireApi
from corral.errors import UsageError

__all__ = [
    "MCP_ROUTE",
    "REAL_PROVIDERS",
    "ProviderChoice",
    "ProviderKind",
    "broker_document",
    "check_compatible",
    "parse_provider",
    "provider_route",
    "route_secret_env",
]

ProviderKind: TypeAlias = Literal["synthetic", "anthropic", "openai", "gemini"]

MCP_ROUTE = "mcp"
"""The broker route that leads to the host-side MCP gateway."""

_WIRE: Mapping[ProviderKind, WireApi] = {
    "anthropic": "anthropic",
    "openai": "responses",
    "gemini": "gemini",
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

    @property
    def route(self) -> str:
        """The broker route name (also the journal's `target` prefix)."""
        return self.kind

    def __str__(self) -> str:
        return f"synthetic:{self.scenario}" if self.kind == "synthetic" else self.kind


def parse_provider(text: str) -> ProviderChoice:
    """`synthetic:FILE`, `anthropic`, `openai` or `gemini`; UsageError otherwise."""
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
    raise UsageError(f"unknown provider {text!r}: use synthetic:FILE, anthropic, openai or gemini")


def check_compatible(choice: ProviderChoice, agent: str, wire: WireApi) -> None:
    """Refuse a real provider whose API the agent's CLI does not speak."""
    if choice.kind == "synthetic":
        return
    if _WIRE[choice.kind] != wire:
        fitting = next(k for k, w in _WIRE.items() if w == wire)
        raise UsageError(
            f"{agent} speaks the {wire} API, which {choice.kind} does not serve; "
            f"use --provider {fitting} or synthetic:FILE"
        )


def provider_route(choice: ProviderChoice, synthetic_url: str | None) -> dict[str, Any]:
    """The broker route document for `choice` (`synthetic_url`: the host-side fake API)."""
    if choice.kind == "synthetic":
        if synthetic_url is None:
            raise UsageError("the synthetic provider is not running")
        return {"upstream": synthetic_url, "allow_private": True}
    return dict(REAL_PROVIDERS[choice.kind])


def route_secret_env(choice: ProviderChoice, environ: Mapping[str, str]) -> dict[str, str]:
    """Variables the broker needs for `choice`'s route; UsageError names a missing key."""
    if choice.kind == "synthetic":
        return {}
    name = _KEY_VARIABLES[choice.kind]
    key = environ.get(name, "")
    if not key:
        raise UsageError(f"--provider {choice.kind} needs ${name} in corral's environment")
    if choice.kind == "openai":
        return {"CORRAL_OPENAI_AUTHORIZATION": f"Bearer {key}"}
    return {name: key}


def broker_document(routes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The `corral exec --config` document: routes only, no other egress."""
    return {"routes": {name: dict(route) for name, route in routes.items()}}
