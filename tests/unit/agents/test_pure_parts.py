"""TOML writer, providers and routes, runner decisions, install pins, gateway helpers."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.agents import tomlw
from corral.agents.base import AgentResult, ConfigFile, Launch, McpEndpoint, Usage, single_quote
from corral.agents.install import default_tools_dir, executable_path, npm_install_argv
from corral.agents.launch import finalize
from corral.agents.registry import ADAPTERS, get_adapter
from corral.agents.routes import (
    ProviderChoice,
    broker_document,
    check_compatible,
    parse_provider,
    provider_route,
    route_secret_env,
)
from corral.broker.config import BrokerConfig
from corral.broker.mcp_gateway import denial_text, server_argv
from corral.broker.mcp_policy import McpServerConfig
from corral.broker.policy import Decision
from corral.errors import AgentError, ConfigError, UsageError

REPO = Path(__file__).resolve().parents[3]

_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(),
)
_keys = st.text(min_size=1, max_size=12)


@given(
    st.dictionaries(
        _keys,
        st.one_of(
            _scalars,
            st.lists(_scalars, max_size=3),
            st.dictionaries(_keys, _scalars, max_size=3),
        ),
        max_size=5,
    )
)
def test_toml_round_trip(doc: dict[str, object]) -> None:
    assert tomllib.loads(tomlw.dumps(doc)) == doc


def test_toml_quotes_a_key_with_a_trailing_newline() -> None:
    assert tomllib.loads(tomlw.dumps({"0\n": False})) == {"0\n": False}


def test_toml_refuses_what_it_cannot_write() -> None:
    with pytest.raises(ConfigError):
        tomlw.dumps({"x": float("nan")})
    with pytest.raises(ConfigError):
        tomlw.value(object())


def test_toml_skips_none_and_nests_tables() -> None:
    text = tomlw.dumps({"a": None, "b": {"c": {"d": 1}}, "e": "x"})
    assert text == 'e = "x"\n\n[b.c]\nd = 1\n'


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\0")))
def test_single_quote_is_one_shell_word(text: str) -> None:
    quoted = single_quote(text)
    assert quoted.startswith("'") and quoted.endswith("'")
    assert shlex.split(quoted) == [text]


def test_launch_refuses_bad_names_and_paths() -> None:
    with pytest.raises(AgentError):
        Launch(argv=("x",), env=(("BAD-NAME", "v"),), cwd="/")
    with pytest.raises(AgentError):
        Launch(argv=("x",), env=(), cwd="/", files=(ConfigFile("relative/path", ""),))
    with pytest.raises(AgentError):
        Launch(argv=("x",), env=(), cwd="/", files=(ConfigFile("/home/../etc/x", ""),))
    with pytest.raises(UsageError):
        McpEndpoint("Bad Name", "http://x")


def test_parse_provider() -> None:
    assert parse_provider("synthetic:s.yaml") == ProviderChoice("synthetic", "s.yaml")
    assert parse_provider("anthropic") == ProviderChoice("anthropic")
    assert str(parse_provider("synthetic:a/b.yaml")) == "synthetic:a/b.yaml"
    for bad in ("synthetic:", "claude", "", "OPENAI"):
        with pytest.raises(UsageError):
            parse_provider(bad)


def test_compatibility() -> None:
    check_compatible(ProviderChoice("anthropic"), "claude-code", "anthropic")
    check_compatible(ProviderChoice("openai"), "codex", "responses")
    check_compatible(ProviderChoice("synthetic", "x"), "codex", "responses")
    with pytest.raises(UsageError, match="use --provider openai"):
        check_compatible(ProviderChoice("anthropic"), "codex", "responses")


def test_routes_are_valid_broker_config_and_hold_no_secret() -> None:
    env = {"ANTHROPIC_API_KEY": "sk-ant-secret", "OPENAI_API_KEY": "sk-oai-secret"}
    for kind in ("anthropic", "openai", "gemini"):
        choice = parse_provider(kind)
        doc = broker_document({choice.route: provider_route(choice, None)})
        config = BrokerConfig.model_validate(doc)
        assert "secret" not in config.to_json()
        assert choice.route in config.routes
    synthetic = provider_route(ProviderChoice("synthetic", "s"), "http://127.0.0.1:9")
    assert synthetic == {"upstream": "http://127.0.0.1:9", "allow_private": True}
    assert route_secret_env(parse_provider("openai"), env) == {
        "CORRAL_OPENAI_AUTHORIZATION": "Bearer sk-oai-secret"
    }
    assert route_secret_env(parse_provider("anthropic"), env) == {
        "ANTHROPIC_API_KEY": "sk-ant-secret"
    }
    with pytest.raises(UsageError, match="GEMINI_API_KEY"):
        route_secret_env(parse_provider("gemini"), env)
    with pytest.raises(UsageError):
        provider_route(ProviderChoice("synthetic", "s"), None)


def test_finalize() -> None:
    ok = AgentResult(status="succeeded", text="done", usage=Usage(1, 2))
    assert finalize(ok, 0, {"exit": 0, "reason": "exited"}, "", 5) == ok
    timed = finalize(ok, 124, {"exit": 124, "reason": "timeout"}, "", 5)
    assert timed.status == "timeout" and timed.usage == ok.usage
    assert timed.error == "the agent was killed after the 5 s wall-clock limit"
    refused = finalize(ok, 125, {"exit": 125, "reason": "refused", "message": "no bwrap"}, "", 5)
    assert refused.status == "refused" and refused.error is not None
    assert "no bwrap" in refused.error
    bare = finalize(ok, 125, None, "corral exec: refused: landlock missing\n", 5)
    assert bare.status == "refused" and "landlock missing" in (bare.error or "")
    oom = finalize(ok, 137, {"exit": 137, "reason": "oom"}, "", 5)
    assert oom.status == "failed" and oom.error == "the agent was killed by the memory limit"


def test_install_script_pins_match_the_adapters() -> None:
    script = (REPO / "scripts" / "install-agents.sh").read_text(encoding="utf-8")
    for name, adapter in ADAPTERS.items():
        assert f'[{name}]="{adapter.package.name}"' in script
        assert f'[{name}]="{adapter.package.version}"' in script


def test_install_paths(tmp_path: Path) -> None:
    adapter = get_adapter("claude-code")
    assert default_tools_dir({"CORRAL_TOOLS": str(tmp_path)}) == tmp_path.resolve()
    assert executable_path(adapter, tmp_path) == (
        tmp_path / "npm" / "claude-code" / "node_modules" / ".bin" / "claude"
    )
    assert npm_install_argv(adapter, tmp_path) == [
        "npm", "install", "--prefix", str(tmp_path / "npm" / "claude-code"), "--save-exact",
        "--no-fund", "--no-audit", "--loglevel=error", "@anthropic-ai/claude-code@2.1.332",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="known: claude-code, codex, gemini"):
        get_adapter("cursor")


def test_server_argv() -> None:
    cfg = McpServerConfig(
        command=("python3", "/opt/s.py"), ro=("/opt",), allow_egress=("example.org:443",)
    )
    assert server_argv(cfg, workspace="/w", sandbox=False) == ["python3", "/opt/s.py"]
    assert server_argv(cfg, workspace="/w", sandbox=True, journal="/j", corral=("c",)) == [
        "c", "exec", "--workspace", "/w", "--memory", "512M", "--ro", "/opt",
        "--allow", "example.org:443", "--journal", "/j", "--", "python3", "/opt/s.py",
    ]  # fmt: skip


def test_denial_text_names_the_rule() -> None:
    text = denial_text("demo", "shred", Decision("deny", "mcp:demo:deny", "tool is denied"))
    assert text.startswith("corral denied the MCP call demo/shred")
    assert "rule mcp:demo:deny" in text and "not forwarded" in text
