"""The pure parts of one session: routes, MCP wiring, mission MCP, defaults, the launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.agents.base import LaunchRequest, McpEndpoint, ProviderEndpoint
from corral.agents.launch import mcp_endpoints
from corral.broker.config import BrokerConfig, RouteConfig
from corral.broker.mcp_gateway import server_argv
from corral.broker.mcp_policy import McpServerConfig
from corral.errors import ConfigError
from corral.run.agent_port import ScriptAgent
from corral.run.agent_run import default_state_dir
from corral.run.mission import parse_mission
from corral.run.session import mcp_launcher, with_mcp_route

MISSION = """+++
[mcp.servers.demo]
command = "python3"
args = ["demo_mcp.py", "--flag"]
env = { DEMO = "1" }
ro = ["tools", "/abs"]
tools = ["echo", "write_marker"]
deny_tools = ["shred"]
arguments = { write_marker = { name = { allow = "^[a-z]+$", max_length = 8 } } }
memory = "256M"
call_timeout = "5s"

[[checks]]
name = "x"
run = "true"
+++
# m
"""


def test_mission_mcp_servers_become_the_gateway_policy() -> None:
    mission = parse_mission(MISSION, "/srv/m/MISSION.md")
    cfg = mission.mcp_policy().servers["demo"]
    assert cfg.command == ("python3", "demo_mcp.py", "--flag")
    assert cfg.ro == ("/srv/m/tools", "/abs")
    assert cfg.env == {"DEMO": "1"} and cfg.memory == "256M" and cfg.call_timeout_s == 5.0
    assert cfg.tools == ("echo", "write_marker") and cfg.deny_tools == ("shred",)
    rule = cfg.arguments["write_marker"]["name"]
    assert rule.allow == "^[a-z]+$" and rule.max_length == 8


@pytest.mark.parametrize(
    ("old", "new", "problem"),
    [
        ('allow = "^[a-z]+$"', 'allow = "("', "invalid regular expression"),
        ("[mcp.servers.demo]", "[mcp.servers.Demo]", "invalid MCP server name"),
        ('memory = "256M"', 'memory = "lots"', "memory"),
        ("deny_tools", "deny_toolz", "deny_toolz"),
    ],
)
def test_bad_mission_mcp_is_refused_at_parse(old: str, new: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        parse_mission(MISSION.replace(old, new), "/srv/m/MISSION.md")


def test_the_mcp_route_points_at_the_gateway_and_keeps_the_provider() -> None:
    provider = RouteConfig(upstream="http://127.0.0.1:9/", meter_usage=True)
    base = BrokerConfig(routes={"provider": provider})
    got = with_mcp_route(base, "http://127.0.0.1:4242")
    assert got.routes["provider"] == provider
    assert got.routes["mcp"].upstream == "http://127.0.0.1:4242"
    assert got.routes["mcp"].allow_private and not got.routes["mcp"].meter_usage
    assert "mcp" not in base.routes  # a new config, the old one unchanged


def test_the_agent_sees_each_server_behind_the_broker_route() -> None:
    assert mcp_endpoints(["demo", "db"]) == (
        McpEndpoint("demo", "http://127.0.0.1:3128/routes/mcp/demo/mcp"),
        McpEndpoint("db", "http://127.0.0.1:3128/routes/mcp/db/mcp"),
    )


def test_the_script_agent_is_told_its_mcp_servers() -> None:
    req = LaunchRequest(
        prompt="p",
        executable="/t/script_agent.py",
        workspace="/w",
        provider=ProviderEndpoint(base_url="http://127.0.0.1:3128/routes/provider"),
        mcp=mcp_endpoints(["demo"]),
    )
    env = dict(ScriptAgent().launch(req).env)
    assert json.loads(env["CORRAL_MCP_SERVERS"]) == {
        "demo": "http://127.0.0.1:3128/routes/mcp/demo/mcp"
    }
    no_mcp = LaunchRequest(
        prompt="p", executable="/x", workspace="/w", provider=ProviderEndpoint(base_url="u")
    )
    assert "CORRAL_MCP_SERVERS" not in dict(ScriptAgent().launch(no_mcp).env)


def test_server_env_reaches_the_sandbox_as_setenv() -> None:
    cfg = McpServerConfig(command=("s",), env={"B": "2", "A": "1"})
    argv = server_argv(cfg, workspace="/w", sandbox=True, corral=("c",))
    assert argv[argv.index("--setenv") :] == ["--setenv", "A=1", "--setenv", "B=2", "--", "s"]
    labelled = server_argv(cfg, workspace="/w", sandbox=True, corral=("c",), run="r", session="2")
    assert labelled[-7:] == ["B=2", "--run", "r", "--session", "2", "--", "s"]


def test_mcp_servers_start_through_the_launcher() -> None:
    prefix = mcp_launcher("run-1")
    assert prefix[1:6] == ("-m", "corral.run.mcp_launch", str(os.getpid()), "run-1", "--")
    assert prefix[-2:] == ("-m", "corral") and mcp_launcher(None)[4] == "-"


def test_the_launcher_refuses_when_its_parent_is_already_gone(tmp_path: Path) -> None:
    # PR_SET_PDEATHSIG is not retroactive: a parent that died first must be caught.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    wrong = subprocess.run(
        [sys.executable, "-m", "corral.run.mcp_launch", "1", "-", "--", "true"],
        env=env,
        check=False,
    )
    assert wrong.returncode == 125
    launch = [sys.executable, "-m", "corral.run.mcp_launch", str(os.getpid()), "-", "--"]
    right = subprocess.run(
        [*launch, "/bin/sh", "-c", f"echo started > {tmp_path}/out"],
        env=env,
        check=False,
    )
    assert right.returncode == 0 and (tmp_path / "out").read_text() == "started\n"


def test_the_default_state_dir_is_never_the_current_directory(tmp_path: Path) -> None:
    xdg = default_state_dir("s1", {"XDG_STATE_HOME": str(tmp_path)})
    assert xdg == tmp_path.resolve() / "corral" / "agent" / "s1"
    # A relative XDG_STATE_HOME is invalid (XDG spec): ignored, not resolved against cwd.
    rel = default_state_dir("s1", {"XDG_STATE_HOME": "state"})
    assert rel == (Path.home() / ".local/state/corral/agent/s1").resolve()
    assert Path.cwd() not in rel.parents or Path.cwd() == Path.home()
