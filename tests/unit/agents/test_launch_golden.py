"""Golden launches: the exact argv, environment, config files and wrapper script."""

from __future__ import annotations

import json
import tomllib

import pytest

from corral.agents.base import (
    AgentAdapter,
    LaunchRequest,
    McpEndpoint,
    ProviderEndpoint,
)
from corral.agents.claude_code import ClaudeCode
from corral.agents.codex import SYNTHETIC_MODEL, Codex, config_toml
from corral.agents.gemini import GeminiCli
from corral.agents.registry import ADAPTERS
from tests.unit.agents._golden import assert_golden

BROKER = "http://127.0.0.1:3128"


def _request(model: str | None = None, sandboxed: bool = True) -> LaunchRequest:
    return LaunchRequest(
        prompt="Create hello.txt; don't stop",
        executable="/opt/tools/npm/agent/node_modules/.bin/agent",
        workspace="/srv/ws",
        provider=ProviderEndpoint(f"{BROKER}/routes/synthetic", model=model),
        mcp=(McpEndpoint("demo", f"{BROKER}/routes/mcp/demo/mcp"),),
        sandboxed=sandboxed,
        request_timeout_s=90,
    )


def _render(adapter: AgentAdapter, request: LaunchRequest) -> str:
    launch = adapter.launch(request)
    return (
        json.dumps(
            {
                "argv": list(launch.argv),
                "env": dict(launch.env),
                "cwd": launch.cwd,
                "files": {f.path: f.content for f in launch.files},
            },
            indent=1,
        )
        + "\n"
    )


@pytest.mark.parametrize("sandboxed", [True, False], ids=["sandboxed", "host"])
@pytest.mark.parametrize("name", sorted(ADAPTERS))
def test_launch_golden(name: str, sandboxed: bool) -> None:
    adapter = ADAPTERS[name]
    request = _request(adapter.synthetic_model, sandboxed)
    suffix = "sandboxed" if sandboxed else "host"
    assert_golden(f"{name}-{suffix}.json", _render(adapter, request))


def test_wrapper_script_golden() -> None:
    launch = Codex().launch(_request(SYNTHETIC_MODEL))
    assert_golden("codex-wrapper.sh", launch.wrapper_script())
    argv = launch.wrapped_argv()
    assert argv[:2] == ("/bin/sh", "-c")
    assert argv[3] == "corral-agent"
    assert argv[4:] == launch.argv


def test_launch_is_a_fresh_value_each_time() -> None:
    adapter = ClaudeCode()
    assert adapter.launch(_request()) == adapter.launch(_request())


def test_claude_permissions_inside_and_outside() -> None:
    inside = ClaudeCode().launch(_request(sandboxed=True)).argv
    outside = ClaudeCode().launch(_request(sandboxed=False)).argv
    assert "bypassPermissions" in inside
    assert "bypassPermissions" not in outside
    for argv in (inside, outside):
        allowed = argv[argv.index("--allowedTools") + 1]
        assert "mcp__demo" in allowed.split(",")
        assert "--strict-mcp-config" in argv
        # The prompt comes after `--`: a prompt starting with "-" is not an option.
        assert argv[-2:] == ("--", "Create hello.txt; don't stop")


def test_claude_env_fails_fast_and_stays_quiet() -> None:
    env = dict(ClaudeCode().launch(_request()).env)
    assert env["CLAUDE_CODE_MAX_RETRIES"] == "0"
    assert env["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert env["API_TIMEOUT_MS"] == "90000"
    assert env["ANTHROPIC_BASE_URL"] == f"{BROKER}/routes/synthetic"
    assert env["ANTHROPIC_API_KEY"] == "corral-brokered"


def test_codex_config_parses_and_fails_fast() -> None:
    doc = tomllib.loads(config_toml(_request(SYNTHETIC_MODEL)))
    provider = doc["model_providers"]["corral"]
    assert provider["base_url"] == f"{BROKER}/routes/synthetic/v1"
    assert provider["request_max_retries"] == 0
    assert provider["stream_max_retries"] == 0
    assert "env_key" not in provider
    assert doc["analytics"] == {"enabled": False}
    assert doc["features"] == {"plugins": False}
    assert doc["mcp_servers"]["demo"]["url"] == f"{BROKER}/routes/mcp/demo/mcp"
    assert doc["mcp_servers"]["demo"]["required"] is True
    assert doc["model_catalog_json"].endswith("/.codex/corral-models.json")


def test_codex_real_model_has_no_catalog() -> None:
    launch = Codex().launch(_request("gpt-5.5"))
    doc = tomllib.loads(launch.files[0].content)
    assert "model_catalog_json" not in doc
    assert len(launch.files) == 1


def test_codex_home_is_not_under_tmpdir() -> None:
    env = dict(Codex().launch(_request()).env)
    assert env["CODEX_HOME"] == "/home/corral/.codex"
    assert not env["CODEX_HOME"].startswith("/tmp")


def test_codex_sandbox_flags() -> None:
    inside = Codex().launch(_request(sandboxed=True)).argv
    outside = Codex().launch(_request(sandboxed=False)).argv
    assert "--dangerously-bypass-approvals-and-sandbox" in inside
    assert "--dangerously-bypass-approvals-and-sandbox" not in outside
    assert outside[outside.index("--sandbox") + 1] == "workspace-write"


def test_gemini_settings() -> None:
    launch = GeminiCli().launch(_request())
    settings = json.loads(launch.files[0].content)
    assert settings["general"]["maxAttempts"] == 1
    assert settings["tools"]["sandbox"] is False
    assert settings["mcpServers"]["demo"]["httpUrl"] == f"{BROKER}/routes/mcp/demo/mcp"
    assert launch.files[0].path == "/home/corral/.gemini/settings.json"


def test_no_secret_in_any_launch() -> None:
    for adapter in ADAPTERS.values():
        launch = adapter.launch(_request())
        text = json.dumps([launch.argv, launch.env, [f.content for f in launch.files]])
        assert "sk-" not in text
        assert "corral-brokered" in text or adapter.name == "codex"
