"""Issue 14's mission keys (product env/ports/data, restart_product, gemini) and `corral init`."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.agents.routes import ProviderChoice, check_compatible
from corral.errors import AgentError, ConfigError, UsageError
from corral.run.agent_port import resolve_agent
from corral.run.environments import RunLayout, agent_spec, check_spec, product_spec
from corral.run.init import render_mission, write_mission
from corral.run.mission import parse_mission

BASE = """+++
agent = "AGENT"
provider = "synthetic:s.yaml"
PRODUCT
[[checks]]
name = "c"
run = "true"
RESTART
+++
# body
"""


def _mission(product: str = "", agent: str = "script", restart: str = "") -> str:
    return BASE.replace("AGENT", agent).replace("PRODUCT", product).replace("RESTART", restart)


def test_ports_env_data_parse_and_reach_the_specs(tmp_path: Path) -> None:
    m = parse_mission(
        _mission(
            '[product]\ncommand = "serve"\nports = [8000, 8001]\ndata = true\n'
            'env = { GREETING = "hi" }\n',
            restart="restart_product = true",
        ),
        tmp_path / "MISSION.md",
    )
    product = m.settings.product
    assert product is not None and product.port == 8000 and product.all_ports == (8000, 8001)
    assert m.settings.checks[0].restart_product
    layout = RunLayout(tmp_path / "run")
    spec = product_spec(layout, m, 1, start=2)
    env = dict(spec.env)
    assert env["GREETING"] == "hi" and env["PORTS"] == "8000 8001"
    assert env["CORRAL_PRODUCT_START"] == "2" and env["CORRAL_DATA"] == str(layout.root / "data")
    assert [(b.path, b.writable) for b in spec.binds][1] == (str(layout.root / "data"), True)
    assert spec.workspace == str(layout.session_dir(1) / "product-2")
    check = check_spec(
        layout, m, n=1, i=0, check=m.settings.checks[0], http_checker=tmp_path / "h.py"
    )
    assert dict(check.env)["PRODUCT_PORTS"] == "8000 8001"
    assert (str(layout.root / "data"), False) in [(b.path, b.writable) for b in check.binds]


def test_the_agent_sees_the_data_only_when_declared(tmp_path: Path) -> None:
    from corral.agents.base import Launch
    from corral.broker.config import BrokerConfig

    layout = RunLayout(tmp_path / "run")
    launch = Launch(argv=("/bin/true",), env=(), cwd=str(layout.workspace))
    data = str(layout.root / "data")
    for declared, visible in (("", False), ('data_for_agent = "ro"\n', True)):
        m = parse_mission(
            _mission(f'[product]\ncommand = "s"\nport = 8000\ndata = true\n{declared}'),
            tmp_path / "MISSION.md",
        )
        spec = agent_spec(
            layout, mission=m, n=1, launch=launch, broker_config=BrokerConfig(), ro_paths=()
        )
        assert ((data, False) in [(b.path, b.writable) for b in spec.binds]) is visible
        assert all(b.path != data or not b.writable for b in spec.binds)


@pytest.mark.parametrize(
    ("product", "restart", "needle"),
    [
        ('[product]\ncommand = "s"\nport = 8000\nenv = { PORT = "1" }\n', "", "set by corral"),
        ('[product]\ncommand = "s"\nport = 8000\nenv = { CORRAL_DATA = "/" }\n', "", "corral"),
        ('[product]\ncommand = "s"\nport = 8000\nenv = { "A B" = "1" }\n', "", "variable name"),
        ('[product]\ncommand = "s"\nports = [80]\n', "", "1024"),
        (
            '[product]\ncommand = "s"\nports = [' + ", ".join(map(str, range(2000, 2017))) + "]\n",
            "",
            "16",
        ),
        ('[product]\ncommand = "s"\n', "", "port"),
        ("", "restart_product = true", r"needs a \[product\]"),
    ],
)
def test_bad_product_keys_are_refused(product: str, restart: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        parse_mission(_mission(product, restart=restart))


def test_gemini_is_a_run_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_mission(_mission(agent="gemini")).settings.agent == "gemini"
    agent = resolve_agent("gemini")
    assert agent.name == "gemini" and agent.wire == "gemini"
    # A provider whose API the Gemini CLI does not speak is refused before a run exists.
    with pytest.raises(UsageError, match="--provider gemini"):
        check_compatible(ProviderChoice("anthropic"), agent.name, agent.wire)
    check_compatible(ProviderChoice("gemini"), agent.name, agent.wire)
    monkeypatch.setenv("CORRAL_TOOLS", str(tmp_path))
    with pytest.raises(AgentError, match=r"install-agents\.sh gemini"):
        agent.install(tmp_path / "run-tools")


def test_init_renders_a_valid_mission_with_the_description() -> None:
    text = render_mission("# Notes\n\nA notes service.\n+++\nnot front matter")
    m = parse_mission(text)
    assert m.description.startswith("# Notes") and m.description.endswith("not front matter")
    assert m.settings.agent == "claude-code" and m.settings.provider == "anthropic"
    assert [c.name for c in m.settings.checks] == ["the workspace is not empty"]
    assert "# http = " in text and "# restart_product = true" in text


@pytest.mark.parametrize("bad", ["", "  \n", "a\x1b[2Jb", "x" * (65 * 1024)])
def test_init_refuses_an_unusable_description(bad: str) -> None:
    with pytest.raises(ValueError, match="description"):
        render_mission(bad)


def test_init_never_writes_over_a_file_or_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "MISSION.md").write_text("mine")
    with pytest.raises(FileExistsError):
        write_mission(tmp_path, "new")
    assert (tmp_path / "MISSION.md").read_text() == "mine"
    other = tmp_path / "other"
    (other / "d").mkdir(parents=True)
    os.symlink(tmp_path / "target", other / "d" / "MISSION.md")
    with pytest.raises(FileExistsError):
        write_mission(other / "d", "new")
    assert not (tmp_path / "target").exists()


def test_setid_modes_left_in_the_data_are_cleared(tmp_path: Path) -> None:
    from corral.run.product_io import ensure_data_dir, strip_data_setid

    layout = RunLayout(tmp_path / "run")
    assert strip_data_setid(layout) is None
    layout.root.mkdir()
    planted = ensure_data_dir(layout) / "sh"
    planted.write_text("#!/bin/sh")
    planted.chmod(0o6755)
    rep = strip_data_setid(layout)
    assert rep is not None and rep.stripped == 1 and rep.complete
    assert planted.stat().st_mode & 0o7777 == 0o755
