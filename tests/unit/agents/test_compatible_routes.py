"""Compatible providers (pure): parsing, the broker route, the key read on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.agents.routes import (
    ProviderChoice,
    UpstreamOverride,
    check_compatible,
    parse_provider,
    provider_route,
    route_secret_env,
)
from corral.broker.actions import HttpRequest, ProviderCall
from corral.broker.config import BrokerConfig, RouteConfig, RuleConfig
from corral.broker.policy import DecisionContext, Policy, decide
from corral.errors import UsageError


def test_parse_compatible() -> None:
    c = parse_provider("openai-compatible:http://127.0.0.1:11434/v1/", "env:OLLAMA_KEY")
    assert c == ProviderChoice(
        "openai-compatible", url="http://127.0.0.1:11434", key="env:OLLAMA_KEY"
    )
    assert str(c) == "openai-compatible:http://127.0.0.1:11434"
    assert "OLLAMA" not in str(c)
    a = parse_provider("anthropic-compatible:https://gw.example/llm")
    assert (a.url, a.key, a.route) == ("https://gw.example/llm", None, "anthropic-compatible")
    for bad in (
        "openai-compatible:",
        "openai-compatible:ftp://x",
        "openai-compatible:http://a b",
        "anthropic-compatible:http://h:99999",
        "openai-compatible:http://h/?q=1",
    ):
        with pytest.raises(UsageError):
            parse_provider(bad)
    for bad_key in ("KEY", "env:", "env:A-B", "file:relative/path", "sk-the-key-itself"):
        with pytest.raises(UsageError):
            parse_provider("openai-compatible:http://h:1", bad_key)
    with pytest.raises(UsageError, match="compatible"):
        parse_provider("anthropic", "env:X")


def test_wire_fits_the_cli() -> None:
    check_compatible(parse_provider("anthropic-compatible:http://h:1"), "claude-code", "anthropic")
    check_compatible(parse_provider("openai-compatible:http://h:1"), "codex", "responses")
    with pytest.raises(UsageError):
        check_compatible(parse_provider("openai-compatible:http://h:1"), "claude-code", "anthropic")


def test_key_is_read_on_the_host_and_only_named_in_the_route(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_text("sk-file-key\nsecond line ignored\n", encoding="utf-8")
    o = parse_provider("openai-compatible:http://127.0.0.1:8000", f"file:{key_file}")
    assert route_secret_env(o, {}) == {"CORRAL_PROVIDER_KEY": "Bearer sk-file-key"}
    a = parse_provider("anthropic-compatible:http://127.0.0.1:8000", "env:GW")
    assert route_secret_env(a, {"GW": "sk-env"}) == {"CORRAL_PROVIDER_KEY": "sk-env"}
    doc = provider_route(a, None)
    assert doc["inject_header"] == {"x-api-key": "env:CORRAL_PROVIDER_KEY"}
    assert "sk-env" not in repr(doc)
    assert provider_route(o, None)["inject_header"] == {"authorization": "env:CORRAL_PROVIDER_KEY"}
    # No key: nothing injected, and the agent's placeholder is still stripped.
    bare = provider_route(parse_provider("openai-compatible:http://127.0.0.1:8000"), None)
    assert "inject_header" not in bare
    assert "authorization" in RouteConfig.model_validate(bare).strip_headers
    assert route_secret_env(parse_provider("openai-compatible:http://h:1"), {}) == {}
    for ref in ("env:GW", f"file:{tmp_path}/missing"):
        with pytest.raises(UsageError):
            route_secret_env(parse_provider("anthropic-compatible:http://h:1", ref), {})
    (tmp_path / "empty").write_text("\n", encoding="utf-8")
    with pytest.raises(UsageError, match="empty"):
        route_secret_env(
            parse_provider("anthropic-compatible:http://h:1", f"file:{tmp_path}/empty"), {}
        )


def _policy(config: BrokerConfig) -> Policy:
    return Policy.from_config(config)


def test_loopback_is_admitted_for_the_compatible_route_only() -> None:
    choice = parse_provider("openai-compatible:http://127.0.0.1:8000")
    route = RouteConfig.model_validate(provider_route(choice, None))
    # `--allow localhost:8000` is refused (sandbox loopback); the same rule written out:
    config = BrokerConfig(rules=(RuleConfig(host="localhost", ports=(8000,)),)).model_copy(
        update={"routes": {"provider": route}}
    )
    pol = _policy(config)
    call = ProviderCall(route="provider", method="POST", path="/v1/responses")
    assert decide(call, DecisionContext(), pol).verdict == "allow"
    assert (
        decide(
            ProviderCall(route="provider", method="POST", path="/admin"), DecisionContext(), pol
        ).verdict
        == "deny"
    )
    # The same loopback server reached as an ordinary destination stays refused.
    direct = HttpRequest(host="localhost", port=8000, method="POST", path="/v1/responses")
    d = decide(direct, DecisionContext(addresses=("127.0.0.1",)), pol)
    assert (d.verdict, d.rule) == ("deny", "private-address")


def test_upstream_override_is_host_config() -> None:
    route = RouteConfig.model_validate(provider_route(parse_provider("anthropic"), None))
    broker = UpstreamOverride("127.9.9.9", "/tmp/ca.pem").apply(
        BrokerConfig(routes={"anthropic": route}), "anthropic"
    )
    assert broker.resolver_overrides == {"api.anthropic.com": ("127.9.9.9",)}
    assert broker.upstream_tls.ca_bundle == "/tmp/ca.pem" and broker.upstream_tls.verify
    assert broker.routes["anthropic"].upstream == "https://api.anthropic.com"
    assert broker.routes["anthropic"].inject_header == {"x-api-key": "env:ANTHROPIC_API_KEY"}
    # Without the hook the real route never admits a private address.
    plain = _policy(BrokerConfig(routes={"anthropic": route}))
    call = ProviderCall(route="anthropic", method="POST", path="/v1/messages")
    d = decide(call, DecisionContext(addresses=("127.9.9.9",)), plain)
    assert (d.verdict, d.rule) == ("deny", "private-address")
    assert decide(call, DecisionContext(addresses=("127.9.9.9",)), _policy(broker)).allowed
