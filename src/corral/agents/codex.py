"""OpenAI Codex CLI (`@openai/codex`, a static musl binary) as a corral agent (pure).

Unattended run::

    codex exec --json --ephemeral --skip-git-repo-check --strict-config --color never
               -C WORKSPACE --dangerously-bypass-approvals-and-sandbox [-m M] -- PROMPT  </dev/null

with `$CODEX_HOME/config.toml` written by the wrapper (`CODEX_HOME` is
`~/.codex`, never under TMPDIR: Codex refuses to set up its helpers there).

- Provider: a custom `model_providers.corral` with `wire_api = "responses"`
  (the only wire Codex still speaks), `base_url` at the broker route plus
  `/v1`, no `env_key` (the route injects the credential), and
  `request_max_retries = stream_max_retries = 0` so a dead provider fails the
  run at once; `stream_idle_timeout_ms` bounds a stalled stream.
- Quiet: `check_for_update_on_startup = false`, `[analytics] enabled = false`
  and `[features] plugins = false` (the last two are both needed for zero
  lookups besides the model API, measured in research/agent-clis.md).
- Sandbox: inside corral, `--dangerously-bypass-approvals-and-sandbox` (its
  own bubblewrap sandbox cannot nest inside corral's, and corral's is the
  boundary). Outside corral: `--sandbox workspace-write` with approvals off.
  stdin is closed (`</dev/null`); an open stdin makes `exec` wait on it.
- MCP: `[mcp_servers.NAME] url = ...` (streamable HTTP to the gateway),
  `required = true` so a server that fails to start fails the run instead of
  racing the first request.
- Synthetic runs ask for the model `corral-synthetic`, described by a
  one-entry `model_catalog_json` the wrapper writes: classic function tools,
  `apply_patch` as Codex's edit tool, MCP tools offered directly. Codex's
  bundled models either speak "code mode" (one JavaScript `exec` tool) or
  hide MCP tools behind a hosted `tool_search`, neither of which a scripted
  provider can drive.
- `--strict-config` turns a config key this version does not know into an
  error rather than a silently ignored setting.
- Output: `--json` JSONL events: `item.completed` (agent_message,
  command_execution, file_change, mcp_tool_call, error = a warning),
  `turn.completed` with usage, `turn.failed` / `error` on failure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from corral.agents import tomlw
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

__all__ = ["SYNTHETIC_MODEL", "Codex", "config_toml", "native_executable", "synthetic_catalog"]

SYNTHETIC_MODEL = "corral-synthetic"

_TRIPLES = {
    "x86_64": ("codex-linux-x64", "x86_64-unknown-linux-musl"),
    "aarch64": ("codex-linux-arm64", "aarch64-unknown-linux-musl"),
}


def native_executable(machine: str) -> str:
    """The native binary below node_modules for `platform.machine()` (skips the Node shim)."""
    package, triple = _TRIPLES.get(machine, _TRIPLES["x86_64"])
    return f"@openai/{package}/vendor/{triple}/bin/codex"


def synthetic_catalog() -> str:
    """A model catalog with only `corral-synthetic` (see the module docstring)."""
    model = {
        "slug": SYNTHETIC_MODEL,
        "display_name": "corral synthetic",
        "description": "corral's scripted provider",
        "base_instructions": "You are a coding agent driven by corral's synthetic provider.",
        "apply_patch_tool_type": "freeform",
        "shell_type": "shell_command",
        "supports_search_tool": False,
        "supports_parallel_tool_calls": False,
        "support_verbosity": False,
        "supports_reasoning_summaries": False,
        "context_window": 272000,
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "supported_reasoning_levels": [],
        "default_reasoning_level": "medium",
        "input_modalities": ["text"],
        "experimental_supported_tools": [],
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
    }
    return json.dumps({"models": [model]}, indent=1, sort_keys=True) + "\n"


def _codex_home(request: LaunchRequest) -> str:
    return request.home.rstrip("/") + "/.codex"


def config_toml(request: LaunchRequest) -> str:
    """The `$CODEX_HOME/config.toml` of one run."""
    catalog = None
    if request.provider.model == SYNTHETIC_MODEL:
        catalog = _codex_home(request) + "/corral-models.json"
    doc: dict[str, Any] = {
        "model": request.provider.model,
        "model_catalog_json": catalog,
        "model_provider": "corral",
        "check_for_update_on_startup": False,
        "approval_policy": "never",
        "sandbox_mode": "danger-full-access" if request.sandboxed else "workspace-write",
        "model_providers": {
            "corral": {
                "name": "corral",
                "base_url": request.provider.base_url + "/v1",
                "wire_api": "responses",
                "request_max_retries": 0,
                "stream_max_retries": 0,
                "stream_idle_timeout_ms": int(request.request_timeout_s * 1000),
            }
        },
        "analytics": {"enabled": False},
        "features": {"plugins": False},
        "history": {"persistence": "none"},
        "mcp_servers": {
            m.name: {
                "url": m.url,
                "required": True,
                "startup_timeout_sec": 30,
                "tool_timeout_sec": 120,
                "default_tools_approval_mode": "approve",
            }
            for m in request.mcp
        }
        or None,
    }
    return tomlw.dumps(doc)


class Codex:
    """The Codex CLI adapter."""

    name = "codex"
    package = NpmPackage("@openai/codex", "0.171.0", native_executable("x86_64"))
    synthetic_model: str | None = SYNTHETIC_MODEL
    wire: WireApi = "responses"

    def launch(self, request: LaunchRequest) -> Launch:
        codex_home = _codex_home(request)
        argv = [
            request.executable,
            "exec",
            "--json",
            "--ephemeral",
            "--skip-git-repo-check",
            "--strict-config",
            "--color",
            "never",
            "-C",
            request.workspace,
        ]
        if request.sandboxed:
            argv.append("--dangerously-bypass-approvals-and-sandbox")
        else:
            argv += ["--sandbox", "workspace-write"]
        if request.provider.model:
            argv += ["-m", request.provider.model]
        argv += [*request.extra_args, "--", request.prompt]
        env = {
            "CODEX_HOME": codex_home,
            "CODEX_MANAGED_BY_NPM": "1",
            "NO_COLOR": "1",
        }
        files = [ConfigFile(codex_home + "/config.toml", config_toml(request))]
        if request.provider.model == SYNTHETIC_MODEL:
            files.append(ConfigFile(codex_home + "/corral-models.json", synthetic_catalog()))
        return Launch(
            argv=tuple(argv), env=env_pairs(env), cwd=request.workspace, files=tuple(files)
        )

    def parse_output(self, stdout: str, exit_code: int) -> AgentResult:
        events = json_lines(stdout)
        session = next(
            (e["thread_id"] for e in events if isinstance(e.get("thread_id"), str)), None
        )
        usage = Usage()
        turns = 0
        failure: str | None = None
        text: str | None = None
        calls: list[ToolCall] = []
        for event in events:
            kind = event.get("type")
            if kind == "turn.completed":
                turns += 1
                usage = _add_usage(usage, event.get("usage"))
            elif kind == "turn.failed":
                error = event.get("error")
                message = error.get("message") if isinstance(error, dict) else None
                failure = str(message or "turn failed")
            elif kind == "error" and failure is None:
                failure = str(event.get("message") or "error")
            elif kind == "item.completed" and isinstance(event.get("item"), dict):
                item = event["item"]
                assert isinstance(item, dict)
                if item.get("type") == "agent_message" and isinstance(item.get("text"), str):
                    text = item["text"]
                call = _tool_call(item)
                if call is not None:
                    calls.append(call)
        if failure is None and turns == 0:
            failure = f"codex exited with status {exit_code} without completing a turn"
        if failure is None and exit_code != 0:
            failure = f"codex exited with status {exit_code}"
        return AgentResult(
            status="failed" if failure else "succeeded",
            text=text,
            error=failure,
            usage=usage,
            turns=turns,
            tool_calls=tuple(calls),
            session_id=session,
        )


def _add_usage(total: Usage, raw: object) -> Usage:
    if not isinstance(raw, dict):
        return total
    return Usage(
        input_tokens=total.input_tokens + as_int(raw.get("input_tokens")),
        output_tokens=total.output_tokens + as_int(raw.get("output_tokens")),
        cache_read_tokens=total.cache_read_tokens + as_int(raw.get("cached_input_tokens")),
        cache_write_tokens=total.cache_write_tokens + as_int(raw.get("cache_write_input_tokens")),
    )


def _tool_call(item: Mapping[str, Any]) -> ToolCall | None:
    kind = item.get("type")
    status = item.get("status")
    if kind == "command_execution":
        code = item.get("exit_code")
        return ToolCall("shell", code == 0 if isinstance(code, int) else None)
    if kind == "file_change":
        return ToolCall("apply_patch", status == "completed" if status else None)
    if kind == "mcp_tool_call":
        name = f"mcp__{item.get('server', '?')}__{item.get('tool', '?')}"
        ok = status == "completed" and not item.get("error")
        return ToolCall(name, ok if status else None)
    if kind == "web_search":
        return ToolCall("web_search", None)
    return None
