"""BrokerConfig: validation, --allow flags, JSON round trip."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from corral.broker.config import BrokerConfig, RouteConfig, RuleConfig, parse_secret_ref
from corral.errors import ConfigError


def test_from_allow_flags() -> None:
    cfg = BrokerConfig.from_allow_flags(
        [
            "pypi.org",
            "api.github.com:443",
            "*.npmjs.org",
            "10.0.0.5:8080",
            "[fd00::1]:9000",
            "2001:db8::1",
        ]
    )
    got = [(r.id, r.host, r.ports, r.allow_private) for r in cfg.rules]
    assert got == [
        ("allow:pypi.org", "pypi.org", (80, 443), False),
        ("allow:api.github.com:443", "api.github.com", (443,), False),
        ("allow:*.npmjs.org", "*.npmjs.org", (80, 443), False),
        ("allow:10.0.0.5:8080", "10.0.0.5", (8080,), True),
        ("allow:[fd00::1]:9000", "fd00::1", (9000,), True),
        ("allow:2001:db8::1", "2001:db8::1", (80, 443), True),
    ]


@pytest.mark.parametrize(
    "flag", ["*", "pypi.org:0", "pypi.org:http", "exa mple.com", "[::1", "*.1.2.3.4"]
)
def test_from_allow_flags_refuses(flag: str) -> None:
    with pytest.raises(ConfigError):
        BrokerConfig.from_allow_flags([flag])


def test_json_round_trip_and_defaults() -> None:
    cfg = BrokerConfig(
        rules=(RuleConfig(host="PyPI.org.", methods=("get",), path_prefixes=("/simple/",)),),
        routes={
            "anthropic": RouteConfig(
                upstream="https://api.anthropic.com/",
                inject_header={"X-Api-Key": "env:ANTHROPIC_API_KEY"},
            )
        },
        resolver_overrides={"pypi.test": ("127.0.0.1",)},
    )
    again = BrokerConfig.from_json(cfg.to_json())
    assert again == cfg
    assert again.rules[0].host == "pypi.org"
    assert again.rules[0].methods == ("GET",)
    assert again.routes["anthropic"].upstream == "https://api.anthropic.com"
    assert again.routes["anthropic"].inject_header == {"x-api-key": "env:ANTHROPIC_API_KEY"}
    assert "x-api-key" in again.routes["anthropic"].strip_headers


def test_resolver_overrides_accept_a_single_address() -> None:
    cfg = BrokerConfig.model_validate({"resolver_overrides": {"PyPI.test": "127.0.0.1"}})
    assert cfg.resolver_overrides == {"pypi.test": ("127.0.0.1",)}


@pytest.mark.parametrize(
    "doc",
    [
        '{"rules": [{"host": "*"}]}',
        '{"rules": [{"host": "a.test", "ports": []}]}',
        '{"rules": [{"host": "a.test", "path_prefixes": ["x"]}]}',
        '{"rules": [{"host": "a.test"}, {"host": "a.test"}]}',
        '{"rules": [{"host": "a.test", "colour": "red"}]}',
        '{"routes": {"Bad Name": {"upstream": "http://127.0.0.1:1"}}}',
        '{"routes": {"r": {"upstream": "ftp://x"}}}',
        '{"routes": {"r": {"upstream": "http://u@x"}}}',
        '{"routes": {"r": {"upstream": "http://x", "inject_header": {"a": "literal-secret"}}}}',
        '{"hooks": ["not a ref"]}',
        '{"version": 2}',
        "not json",
    ],
)
def test_bad_documents_are_config_errors(doc: str) -> None:
    with pytest.raises(ConfigError):
        BrokerConfig.from_json(doc)


def test_secret_refs() -> None:
    assert parse_secret_ref("env:ANTHROPIC_API_KEY") == ("env", "ANTHROPIC_API_KEY")
    assert parse_secret_ref("file:/run/secrets/key") == ("file", "/run/secrets/key")
    for bad in ("sk-ant-123", "env:", "file:relative", "env:A-B"):
        with pytest.raises(ValueError):
            parse_secret_ref(bad)


def test_models_are_frozen() -> None:
    rule = RuleConfig(host="a.test")
    with pytest.raises(ValidationError):
        rule.host = "b.test"


def test_repeated_allow_flags_are_one_rule() -> None:
    cfg = BrokerConfig.from_allow_flags(["pypi.org", "pypi.org"])
    assert [r.id for r in cfg.rules] == ["allow:pypi.org"]
