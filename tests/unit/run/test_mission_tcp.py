"""A mission's `[network]` host services and TCP rules reach the agent's broker and sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.agents.base import LaunchRequest, ProviderEndpoint
from corral.errors import ConfigError
from corral.run.agent_port import ScriptAgent
from corral.run.environments import RunLayout, agent_broker_config, agent_spec, provider_base_url
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
_SERVICES = (
    '[[network.host_services]]\nname = "db"\nport = 5432\n'
    '[[network.tcp]]\nhost = "github.com"\nport = 22\n'
)


def test_mission_host_services_and_tcp_reach_the_broker_and_the_agent_env() -> None:
    mission = parse_mission(_TEXT.format(extra=_SERVICES), "/m/demo/MISSION.md")
    cfg = agent_broker_config(mission, ProviderRef("synthetic", "s"), "http://127.0.0.1:1")
    assert [(h.name, h.port) for h in cfg.host_services] == [("db", 5432)]
    assert [t.id for t in cfg.tcp] == ["tcp-allow:github.com:22"]
    launch = ScriptAgent().launch(
        LaunchRequest(
            prompt="hi",
            executable="/r/demo-1/tools/script_agent.py",
            workspace="/r/demo-1/workspace",
            provider=ProviderEndpoint(provider_base_url()),
        )
    )
    spec = agent_spec(
        RunLayout(Path("/r/demo-1")),
        mission=mission,
        n=1,
        launch=launch,
        broker_config=cfg,
        ro_paths=(),
    )
    env = dict(spec.env)
    assert env["ALL_PROXY"] == "socks5h://127.0.0.1:3128"
    assert "ProxyCommand=" in env["GIT_SSH_COMMAND"]
    # The agent's ssh config routes plain ssh through the broker too.
    assert spec.network.ssh_config is not None
    assert f"ProxyCommand {env['CORRAL_SSH_PROXY_COMMAND']}" in spec.network.ssh_config


def test_mission_without_tcp_keeps_the_http_proxy_only() -> None:
    mission = parse_mission(_TEXT.format(extra=""), "/m/demo/MISSION.md")
    cfg = agent_broker_config(mission, ProviderRef("synthetic", "s"), "http://127.0.0.1:1")
    assert cfg.tcp == () and cfg.host_services == ()


@pytest.mark.parametrize("entry", ["127.0.0.1:5432", "localhost:8000", "[::1]:80"])
def test_mission_allow_of_loopback_points_at_host_services(entry: str) -> None:
    text = _TEXT.format(extra="").replace('allow = ["pypi.org"]', f'allow = ["{entry}"]')
    with pytest.raises(ConfigError, match="host_services"):
        parse_mission(text, "/m/demo/MISSION.md")
