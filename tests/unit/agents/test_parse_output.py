"""Results parsed from real CLI output (fixtures recorded against the synthetic provider)."""

from __future__ import annotations

from corral.agents.base import ToolCall
from corral.agents.claude_code import ClaudeCode
from corral.agents.codex import Codex
from corral.agents.gemini import GeminiCli
from tests.unit.agents._golden import fixture


def test_claude_success_with_tools_and_mcp() -> None:
    r = ClaudeCode().parse_output(fixture("claude-code-edit-and-mcp.jsonl"), 0)
    assert r.status == "succeeded"
    assert r.text == "notes.md is final and the MCP echo answered."
    assert r.error is None
    assert r.turns == 6
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert [t.name for t in r.tool_calls] == [
        "Write",
        "Read",
        "Edit",
        "ToolSearch",
        "mcp__demo__echo",
    ]
    assert all(t.ok for t in r.tool_calls)
    assert r.session_id


def test_claude_provider_error_is_a_failure_despite_subtype_success() -> None:
    r = ClaudeCode().parse_output(fixture("claude-code-failing-provider.jsonl"), 1)
    assert r.status == "failed"
    assert r.error is not None
    assert r.error.startswith("provider error 529: API Error: 529")
    assert r.usage.total == 0


def test_claude_without_result_event() -> None:
    text = fixture("claude-code-edit-and-mcp.jsonl")
    cut = "\n".join(line for line in text.splitlines() if '"type":"result"' not in line)
    r = ClaudeCode().parse_output(cut, 137)
    assert r.status == "failed"
    assert r.error is not None and "status 137 without a result event" in r.error
    assert "last message: notes.md is final" in r.error
    assert len(r.tool_calls) == 5


def test_claude_nonzero_exit_after_success_result() -> None:
    r = ClaudeCode().parse_output(fixture("claude-code-edit-and-mcp.jsonl"), 3)
    assert r.status == "failed"
    assert r.error == "claude exited with status 3"


def test_claude_garbage_and_empty() -> None:
    assert ClaudeCode().parse_output("", 0).status == "failed"
    assert ClaudeCode().parse_output("not json\n{broken\n[1]\n", 0).status == "failed"


def test_codex_success() -> None:
    r = Codex().parse_output(fixture("codex-edit-and-mcp.jsonl"), 0)
    assert r.status == "succeeded"
    assert r.text == "notes.md is final and the MCP echo answered."
    assert r.turns == 1
    assert r.usage.input_tokens == 33093
    assert r.usage.output_tokens == 65
    assert r.tool_calls == (
        ToolCall("apply_patch", True),
        ToolCall("shell", True),
        ToolCall("apply_patch", True),
        ToolCall("mcp__demo__echo", True),
    )


def test_codex_provider_error() -> None:
    r = Codex().parse_output(fixture("codex-failing-provider.jsonl"), 1)
    assert r.status == "failed"
    assert r.error is not None and "529" in r.error
    assert r.turns == 0


def test_codex_no_turn() -> None:
    r = Codex().parse_output('{"type":"thread.started","thread_id":"t"}\n', 0)
    assert r.status == "failed"
    assert r.session_id == "t"
    assert r.error == "codex exited with status 0 without completing a turn"


def test_codex_warning_items_are_not_failures() -> None:
    text = (
        '{"type":"item.completed","item":{"id":"i","type":"error","message":"metadata"}}\n'
        '{"type":"item.completed","item":{"id":"j","type":"agent_message","text":"ok"}}\n'
        '{"type":"turn.completed","usage":{"input_tokens":1,"output_tokens":2}}\n'
    )
    r = Codex().parse_output(text, 0)
    assert r.status == "succeeded"
    assert r.usage.total == 3


def test_gemini_success_with_a_failed_tool() -> None:
    r = GeminiCli().parse_output(fixture("gemini-edit-and-mcp.jsonl"), 0)
    assert r.status == "succeeded"
    assert r.text == "notes.md is final and the MCP echo answered."
    assert [t.name for t in r.tool_calls] == ["write_file", "read_file", "replace", "mcp_demo_echo"]
    assert [t.ok for t in r.tool_calls] == [True, True, False, True]
    assert r.usage.input_tokens > 0


def test_gemini_provider_error() -> None:
    r = GeminiCli().parse_output(fixture("gemini-failing-provider.jsonl"), 17)
    assert r.status == "failed"
    assert r.error is not None and "overloaded_error" in r.error
