"""Claude Code (`@anthropic-ai/claude-code`, a native binary) as a corral agent (pure).

Unattended run::

    claude -p --output-format stream-json --verbose --no-session-persistence
           --strict-mcp-config --mcp-config '{"mcpServers": {...}}'
           --settings '{...}' --allowedTools Bash,Edit,...,mcp__NAME
           [--permission-mode bypassPermissions] [--model M] -- PROMPT   </dev/null

- Provider: `ANTHROPIC_BASE_URL` (the broker route) and a placeholder
  `ANTHROPIC_API_KEY` the route replaces. `CLAUDE_CODE_MAX_RETRIES=0` makes a
  dead provider fail the run at once (the default is 10 retries with backoff);
  `API_TIMEOUT_MS` bounds a stalled request.
- Quiet: `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1` alone stops every lookup
  besides the model API (measured: research/agent-clis.md); the autoupdater,
  telemetry and error reporting switches are set as well, explicitly.
- Permissions: inside corral the CLI's own checks are not the boundary, so
  `bypassPermissions` (the CLI runs as uid 1000 there; as root it would refuse
  this mode unless IS_SANDBOX=1). Outside corral it keeps default mode with an
  explicit `--allowedTools` list; anything else is denied, never prompted.
  Claude Code's own sandbox is switched off (`sandbox.enabled: false`).
- MCP: only the servers corral passes (`--strict-mcp-config`: a `.mcp.json`
  planted in the workspace is ignored), each an HTTP server at the gateway.
- Output: stream-json; the last `{"type": "result"}` line has the final text,
  `is_error`, `num_turns`, `usage` and `permission_denials`. A provider error
  still reports `subtype: "success"`, so `is_error` decides.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corral.agents.base import (
    AgentResult,
    ConfigFile,
    Launch,
    LaunchRequest,
    NpmPackage,
    ToolCall,
    Usage,
    WireApi,
    as_int,
    env_pairs,
    json_lines,
)

__all__ = ["BUILTIN_TOOLS", "ClaudeCode"]

BUILTIN_TOOLS: tuple[str, ...] = (
    "Bash",
    "Edit",
    "Write",
    "Read",
    "Glob",
    "Grep",
    "NotebookEdit",
    "TodoWrite",
    "ToolSearch",
)
"""The tools allowed outside corral (inside, every tool is)."""


class ClaudeCode:
    """The Claude Code adapter."""

    name = "claude-code"
    package = NpmPackage("@anthropic-ai/claude-code", "2.1.332", ".bin/claude")
    synthetic_model: str | None = None
    wire: WireApi = "anthropic"

    def launch(self, request: LaunchRequest) -> Launch:
        mcp = {
            "mcpServers": {m.name: {"type": "http", "url": m.url} for m in request.mcp},
        }
        settings = {"sandbox": {"enabled": False}}
        allowed = [*BUILTIN_TOOLS, *(f"mcp__{m.name}" for m in request.mcp)]
        argv = [
            request.executable,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--no-session-persistence",
            "--strict-mcp-config",
            "--mcp-config",
            json.dumps(mcp, sort_keys=True),
            "--settings",
            json.dumps(settings, sort_keys=True),
            "--allowedTools",
            ",".join(allowed),
        ]
        if request.sandboxed:
            argv += ["--permission-mode", "bypassPermissions"]
        if request.provider.model:
            argv += ["--model", request.provider.model]
        argv += [*request.extra_args, "--", request.prompt]
        env = {
            "ANTHROPIC_BASE_URL": request.provider.base_url,
            "ANTHROPIC_API_KEY": request.provider.api_key,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_MAX_RETRIES": "0",
            "API_TIMEOUT_MS": str(int(request.request_timeout_s * 1000)),
            "MCP_TIMEOUT": "30000",
            "NO_COLOR": "1",
        }
        files: tuple[ConfigFile, ...] = ()
        return Launch(argv=tuple(argv), env=env_pairs(env), cwd=request.workspace, files=files)

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult:
        events = json_lines(stdout)
        calls = _tool_calls(events)
        session = next(
            (e["session_id"] for e in events if isinstance(e.get("session_id"), str)), None
        )
        result = next((e for e in reversed(events) if e.get("type") == "result"), None)
        if result is None:
            last_text = _last_assistant_text(events)
            detail = f"; last message: {last_text}" if last_text else ""
            return AgentResult(
                status="failed",
                error=f"claude exited with status {exit_code} without a result event{detail}",
                tool_calls=calls,
                session_id=session,
            )
        text = result.get("result") if isinstance(result.get("result"), str) else None
        is_error = bool(result.get("is_error")) or result.get("subtype") != "success"
        error: str | None = None
        if is_error:
            status = result.get("api_error_status")
            prefix = f"provider error {status}: " if isinstance(status, int) else ""
            error = prefix + (text or str(result.get("subtype") or "error"))
        elif exit_code != 0:
            is_error = True
            error = f"claude exited with status {exit_code}"
        usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
        assert isinstance(usage, dict)
        denials = tuple(
            str(d.get("tool_name", "?"))
            for d in result.get("permission_denials") or ()
            if isinstance(d, dict)
        )
        turns = result.get("num_turns")
        return AgentResult(
            status="failed" if is_error else "succeeded",
            text=text,
            error=error,
            usage=Usage(
                input_tokens=as_int(usage.get("input_tokens")),
                output_tokens=as_int(usage.get("output_tokens")),
                cache_read_tokens=as_int(usage.get("cache_read_input_tokens")),
                cache_write_tokens=as_int(usage.get("cache_creation_input_tokens")),
            ),
            turns=turns if isinstance(turns, int) else None,
            tool_calls=calls,
            denials=denials,
            session_id=session,
        )


def _content(event: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    message = event.get("message")
    if not isinstance(message, dict):
        return []
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [c for c in content if isinstance(c, dict)]


def _tool_calls(events: list[Mapping[str, Any]]) -> tuple[ToolCall, ...]:
    order: list[tuple[str, str]] = []
    outcome: dict[str, bool] = {}
    for event in events:
        for block in _content(event):
            if event.get("type") == "assistant" and block.get("type") == "tool_use":
                order.append((str(block.get("id", "")), str(block.get("name", "?"))))
            elif event.get("type") == "user" and block.get("type") == "tool_result":
                outcome[str(block.get("tool_use_id", ""))] = not block.get("is_error", False)
    return tuple(ToolCall(name, outcome.get(call_id)) for call_id, name in order)


def _last_assistant_text(events: list[Mapping[str, Any]]) -> str | None:
    for event in reversed(events):
        if event.get("type") != "assistant":
            continue
        for block in _content(event):
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                return str(block["text"])[:500]
    return None
