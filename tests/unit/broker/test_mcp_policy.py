"""MCP call decisions: server, tool, argument rules; every error denies."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.broker.mcp_policy import (
    McpPolicy,
    decide_tool_call,
    load_mcp_policy,
    parse_mcp_policy,
)
from corral.errors import ConfigError

DOC = {
    "servers": {
        "demo": {
            "command": ["python3", "/opt/demo.py"],
            "tools": ["echo", "write_marker", "shred"],
            "deny_tools": ["shred"],
            "arguments": {
                "write_marker": {
                    "name": {"allow": "^[a-z0-9_-]{1,32}$"},
                    "text": {"deny": "(?i)password", "max_length": 10},
                },
                "echo": {"text": {"deny": "rm -rf"}},
            },
        },
        "open": {"command": ["srv"]},
    }
}


@pytest.fixture
def policy() -> McpPolicy:
    return parse_mcp_policy(DOC)


def _decide(policy: McpPolicy, server: str, tool: str, args: object = None) -> tuple[str, str]:
    d = decide_tool_call(policy, policy.broker_policy(), server, tool, args)  # type: ignore[arg-type]
    return d.verdict, d.rule or ""


def test_allowed_calls(policy: McpPolicy) -> None:
    assert _decide(policy, "demo", "echo", {"text": "hi"}) == ("allow", "mcp:demo")
    assert _decide(policy, "demo", "write_marker", {"name": "ok-1", "text": "x"})[0] == "allow"
    assert _decide(policy, "open", "anything", {"x": [1, 2]}) == ("allow", "mcp:open")


def test_server_and_tool_denials(policy: McpPolicy) -> None:
    assert _decide(policy, "nope", "echo") == ("deny", "default-deny")
    assert _decide(policy, "demo", "shred", {"path": "/"}) == ("deny", "mcp:demo:deny")
    assert _decide(policy, "demo", "not_listed") == ("deny", "default-deny")


@pytest.mark.parametrize(
    ("args", "rule"),
    [
        ({"name": "../../etc/passwd"}, "mcp:demo:args:write_marker.name"),
        ({"name": "a b"}, "mcp:demo:args:write_marker.name"),
        ({}, "mcp:demo:args:write_marker.name"),
        ({"name": ["list"]}, "mcp:demo:args:write_marker.name"),
        ({"name": "ok", "text": "my PassWord"}, "mcp:demo:args:write_marker.text"),
        ({"name": "ok", "text": "x" * 11}, "mcp:demo:args:write_marker.text"),
    ],
)
def test_argument_rules(policy: McpPolicy, args: dict[str, object], rule: str) -> None:
    assert _decide(policy, "demo", "write_marker", args) == ("deny", rule)


def test_non_string_values_are_checked_in_json_form(policy: McpPolicy) -> None:
    assert _decide(policy, "demo", "echo", {"text": {"cmd": "rm -rf /"}})[0] == "deny"


def test_a_failing_decision_denies(policy: McpPolicy) -> None:
    d = decide_tool_call(policy, policy.broker_policy(), "demo", "echo", object())  # type: ignore[arg-type]
    assert d.verdict == "deny" and d.rule == "policy-error"


@pytest.mark.parametrize(
    "doc",
    [
        {"servers": {"Bad Name": {"command": ["x"]}}},
        {"servers": {"demo": {"command": []}}},
        {"servers": {"demo": {"command": ["x"], "arguments": {"t": {"a": {"allow": "("}}}}}},
        {"servers": {"demo": {"command": ["x"], "workspace": "relative"}}},
        {"servers": {"demo": {"command": ["x"], "unknown": 1}}},
        {"unknown": {}},
    ],
)
def test_malformed_policies_are_rejected(doc: object) -> None:
    with pytest.raises(ConfigError):
        parse_mcp_policy(doc)


def test_load_yaml(tmp_path: Path) -> None:
    path = tmp_path / "mcp.yaml"
    path.write_text("servers:\n  demo:\n    command: [python3, /x.py]\n", encoding="utf-8")
    assert list(load_mcp_policy(path).servers) == ["demo"]
    path.write_text("servers: [", encoding="utf-8")
    with pytest.raises(ConfigError):
        load_mcp_policy(path)
    assert load_mcp_policy(_empty(tmp_path)).servers == {}


def _empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.yaml"
    path.write_text("", encoding="utf-8")
    return path
