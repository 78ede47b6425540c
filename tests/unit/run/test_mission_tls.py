"""A mission's `[network]` method rules, credentials and upstream TLS reach the agent's broker."""

from __future__ import annotations

import pytest

from corral.broker.tls_setup import needs_interception
from corral.errors import ConfigError
from corral.run.environments import agent_broker_config
from corral.run.mission import ProviderRef, parse_mission

_TEXT = """+++
[network]
allow = ["pypi.org"]
{extra}
[[checks]]
name = "unit"
run = "true"
+++
# Demo
Build it.
"""
_TLS = (
    'upstream_tls = { ca_bundle = "/etc/corral/test-ca.pem" }\n'
    '[[network.rules]]\nid = "gh-read"\nhost = "api.github.com"\nports = [443]\n'
    'methods = ["GET"]\n'
    '[[network.credentials]]\nname = "github"\nenv = "GH_TOKEN"\nvalue = "env:GH_TOKEN"\n'
    'hosts = ["api.github.com"]\n'
)


def test_mission_rules_credentials_and_upstream_tls_reach_the_broker() -> None:
    mission = parse_mission(_TEXT.format(extra=_TLS), "/m/demo/MISSION.md")
    cfg = agent_broker_config(mission, ProviderRef("synthetic", "s"), "http://127.0.0.1:1")
    assert [r.id for r in cfg.rules] == ["allow:pypi.org", "gh-read"]
    assert cfg.rules[1].methods == ("GET",)
    assert [(c.name, c.env, c.hosts) for c in cfg.credentials] == [
        ("github", "GH_TOKEN", ("api.github.com",))
    ]
    assert cfg.upstream_tls.ca_bundle == "/etc/corral/test-ca.pem"
    assert needs_interception(cfg)


def test_mission_without_tls_tables_needs_no_interception() -> None:
    mission = parse_mission(_TEXT.format(extra=""), "/m/demo/MISSION.md")
    cfg = agent_broker_config(mission, ProviderRef("synthetic", "s"), "http://127.0.0.1:1")
    assert not needs_interception(cfg)


@pytest.mark.parametrize(
    "extra",
    [
        '[[network.rules]]\nid = "allow:pypi.org"\nhost = "pypi.org"\n',
        '[[network.credentials]]\nname = "a"\nenv = "HTTPS_PROXY"\nvalue = "env:X"\n'
        'hosts = ["a"]\n',
        '[[network.credentials]]\nname = "a"\nenv = "A"\nvalue = "env:X"\nhosts = []\n',
    ],
)
def test_mission_network_tables_are_checked_at_load(extra: str) -> None:
    with pytest.raises(ConfigError):
        parse_mission(_TEXT.format(extra=extra), "/m/demo/MISSION.md")
