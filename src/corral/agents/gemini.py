"""Gemini CLI (`@google/gemini-cli`, Node.js) as a corral agent (pure).

Unattended run::

    gemini --output-format stream-json --skip-trust --approval-mode yolo [-m M] -p PROMPT

with `~/.gemini/settings.json` written by the wrapper:

- Provider: `GOOGLE_GEMINI_BASE_URL` (the broker route), a placeholder
  `GEMINI_API_KEY`, `security.auth.selectedType = gemini-api-key`;
  `general.maxAttempts = 1` and `general.retryFetchErrors = false` so a dead
  provider fails the run at once.
- Quiet: auto-update and its notification off, usage statistics and
  telemetry off; `GEMINI_CLI_NO_RELAUNCH` keeps it in one Node process.
- Sandbox: `tools.sandbox = false` (its own container sandbox cannot run in
  corral's); inside corral `--approval-mode yolo`, outside `auto_edit` (shell
  commands then need an approval nobody gives, so they are refused).
- MCP: `mcpServers.NAME.httpUrl` at the gateway, `trust: true` (the gateway
  is where calls are decided).
- Output: stream-json events; the last `{"type": "result"}` carries `status`
  and `stats` (token counts); `message` events with role assistant carry the
  text, `tool_use` / `tool_result` the tool calls.
"""

from __future__ import annotations

import json
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

__all__ = ["GeminiCli", "settings_json"]


def settings_json(request: LaunchRequest) -> str:
    """The `~/.gemini/settings.json` of one run."""
    doc: dict[str, Any] = {
        "general": {
            "enableAutoUpdate": False,
            "enableAutoUpdateNotification": False,
            "maxAttempts": 1,
            "retryFetchErrors": False,
        },
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "tools": {"sandbox": False},
        "mcpServers": {m.name: {"httpUrl": m.url, "trust": True} for m in request.mcp},
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


class GeminiCli:
    """The Gemini CLI adapter."""

    name = "gemini"
    package = NpmPackage("@google/gemini-cli", "0.61.0", ".bin/gemini")
    synthetic_model: str | None = "corral-synthetic"
    wire: WireApi = "gemini"

    def launch(self, request: LaunchRequest) -> Launch:
        argv = [
            request.executable,
            "--output-format",
            "stream-json",
            "--skip-trust",
            "--approval-mode",
            "yolo" if request.sandboxed else "auto_edit",
        ]
        if request.provider.model:
            argv += ["-m", request.provider.model]
        argv += [*request.extra_args, "-p", request.prompt]
        env = {
            "GOOGLE_GEMINI_BASE_URL": request.provider.base_url,
            "GEMINI_API_KEY": request.provider.api_key,
            "GEMINI_CLI_NO_RELAUNCH": "true",
            "NO_COLOR": "1",
        }
        home = request.home.rstrip("/")
        files = (ConfigFile(home + "/.gemini/settings.json", settings_json(request)),)
        return Launch(argv=tuple(argv), env=env_pairs(env), cwd=request.workspace, files=files)

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult:
        events = json_lines(stdout)
        session = next(
            (e["session_id"] for e in events if isinstance(e.get("session_id"), str)), None
        )
        text_parts: list[str] = []
        names: dict[str, str] = {}
        order: list[str] = []
        outcome: dict[str, bool] = {}
        for event in events:
            kind = event.get("type")
            if kind == "message" and event.get("role") == "assistant":
                content = event.get("content")
                if isinstance(content, str):
                    if not event.get("delta"):
                        text_parts = []
                    text_parts.append(content)
            elif kind == "tool_use":
                call_id = str(event.get("tool_id", len(order)))
                names[call_id] = str(event.get("tool_name", "?"))
                order.append(call_id)
                text_parts = []
            elif kind == "tool_result":
                outcome[str(event.get("tool_id", ""))] = event.get("status") == "success"
        calls = tuple(ToolCall(names[c], outcome.get(c)) for c in order)
        text = "".join(text_parts) or None
        result = next((e for e in reversed(events) if e.get("type") == "result"), None)
        if result is None:
            return AgentResult(
                status="failed",
                text=text,
                error=f"gemini exited with status {exit_code} without a result event",
                tool_calls=calls,
                session_id=session,
            )
        stats = result.get("stats") if isinstance(result.get("stats"), dict) else {}
        assert isinstance(stats, dict)
        error: str | None = None
        if result.get("status") != "success":
            raw = result.get("error")
            message = raw.get("message") if isinstance(raw, dict) else raw
            error = str(message or result.get("status") or "error")
        elif exit_code != 0:
            error = f"gemini exited with status {exit_code}"
        return AgentResult(
            status="failed" if error else "succeeded",
            text=text,
            error=error,
            usage=Usage(
                input_tokens=as_int(stats.get("input_tokens")),
                output_tokens=as_int(stats.get("output_tokens")),
                cache_read_tokens=as_int(stats.get("cached")),
            ),
            turns=None,
            tool_calls=calls,
            session_id=session,
        )
