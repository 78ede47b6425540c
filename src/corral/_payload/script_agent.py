"""corral's built-in *test* agent: a minimal Anthropic-Messages tool loop (stdlib only).

NOT a substitute for Claude Code or Codex. It exists so that corral's own
end-to-end tests exercise the whole path - prompt, broker route, synthetic
provider, tool execution in the agent sandbox, commit, product, verifier -
without depending on an npm CLI. The "script" it follows is the provider's
scenario: it offers the tools `Bash`, `Write`, `Edit` and `Read` (Claude Code's
names, so scenarios written for Claude Code drive it too), runs what the model
asks for in its working directory, and sends back the results until the model
stops asking.

This file is copied into a run's `tools/` directory and executed only inside
the agent sandbox, by the sandbox's own /usr/bin/python3. Environment:
CORRAL_PROVIDER_URL (the broker route, without /v1), CORRAL_PROMPT_FILE,
CORRAL_MODEL, CORRAL_API_KEY (a placeholder the broker replaces),
CORRAL_MCP_SERVERS (JSON: server name -> streamable-HTTP URL; their tools are
offered as `mcp__SERVER__TOOL`, as Claude Code names them).
Output: one JSON object per line on stdout; the last is
`{"type": "result", "is_error": bool, "result": str, "usage": {...}, "num_turns": int}`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

MAX_TURNS = 64
TOOLS = [
    {
        "name": "Bash",
        "description": "Run a shell command in the working directory.",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
    {
        "name": "Write",
        "description": "Write a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["file_path", "content"],
        },
    },
    {
        "name": "Edit",
        "description": "Replace old_string by new_string in a file.",
        "input_schema": {
            "type": "object",
            "properties": {
                "file_path": {"type": "string"},
                "old_string": {"type": "string"},
                "new_string": {"type": "string"},
            },
            "required": ["file_path", "old_string", "new_string"],
        },
    },
    {
        "name": "Read",
        "description": "Read a file.",
        "input_schema": {
            "type": "object",
            "properties": {"file_path": {"type": "string"}},
            "required": ["file_path"],
        },
    },
]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def post(url: str, body: dict[str, Any], key: str) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={
            "content-type": "application/json",
            "anthropic-version": "2023-06-01",
            "x-api-key": key,
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        reply: dict[str, Any] = json.loads(resp.read().decode())
        return reply


def mcp_rpc(url: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One JSON-RPC request to a streamable-HTTP MCP endpoint (stateless, JSON replies)."""
    req = urllib.request.Request(
        url,
        data=json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode(),
        headers={
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
            "mcp-protocol-version": "2025-06-18",
        },
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        reply: dict[str, Any] = json.loads(resp.read().decode())
    if "error" in reply:
        raise RuntimeError(f"MCP error: {reply['error']}")
    result: dict[str, Any] = reply.get("result") or {}
    return result


def mcp_tools(servers: dict[str, str]) -> tuple[list[dict[str, Any]], dict[str, tuple[str, str]]]:
    """The MCP servers' tools as Messages tools (`mcp__SERVER__TOOL`, Claude Code's names)."""
    offered: list[dict[str, Any]] = []
    route: dict[str, tuple[str, str]] = {}
    for server, url in sorted(servers.items()):
        mcp_rpc(
            url,
            "initialize",
            {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "corral-script-agent", "version": "1"},
            },
        )
        for tool in mcp_rpc(url, "tools/list", {}).get("tools", []):
            name = f"mcp__{server}__{tool['name']}"
            route[name] = (url, str(tool["name"]))
            offered.append(
                {
                    "name": name,
                    "description": str(tool.get("description", "")),
                    "input_schema": tool.get("inputSchema") or {"type": "object"},
                }
            )
    return offered, route


def call_mcp(url: str, tool: str, args: dict[str, Any]) -> tuple[str, bool]:
    try:
        result = mcp_rpc(url, "tools/call", {"name": tool, "arguments": args})
    except Exception as exc:  # the model sees the error, as with any agent
        return f"error: {exc}", True
    text = "".join(c.get("text", "") for c in result.get("content", []) if c.get("type") == "text")
    return text, bool(result.get("isError"))


def run_tool(name: str, args: dict[str, Any]) -> tuple[str, bool]:
    try:
        if name == "Bash":
            proc = subprocess.run(
                ["/bin/sh", "-c", str(args.get("command", ""))],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            out = (proc.stdout + proc.stderr)[-20000:]
            return f"Exit code {proc.returncode}\n{out}", proc.returncode != 0
        path = str(args.get("file_path", ""))
        if name == "Write":
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(str(args.get("content", "")))
            return f"File written: {path}", False
        if name == "Edit":
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
            old = str(args.get("old_string", ""))
            if old not in text:
                return f"old_string not found in {path}", True
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text.replace(old, str(args.get("new_string", "")), 1))
            return f"File edited: {path}", False
        if name == "Read":
            with open(path, encoding="utf-8") as fh:
                return fh.read()[-20000:], False
        return f"unknown tool {name}", True
    except Exception as exc:  # the model sees the error, as with any agent
        return f"error: {exc}", True


def main() -> int:
    base = os.environ["CORRAL_PROVIDER_URL"].rstrip("/")
    key = os.environ.get("CORRAL_API_KEY", "corral-brokered")
    with open(os.environ["CORRAL_PROMPT_FILE"], encoding="utf-8") as fh:
        prompt = fh.read()
    model = os.environ.get("CORRAL_MODEL") or "mock-model"
    system = f"You are corral's script test agent.\nPrimary working directory: {os.getcwd()}\n"
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    servers = json.loads(os.environ.get("CORRAL_MCP_SERVERS") or "{}")
    try:
        offered, mcp_route = mcp_tools(servers)
    except Exception as exc:
        emit({"type": "result", "is_error": True, "result": f"MCP error: {exc}", "num_turns": 0})
        return 1
    usage = {"input_tokens": 0, "output_tokens": 0}
    text = ""
    for turn in range(1, MAX_TURNS + 1):
        body = {
            "model": model,
            "max_tokens": 4096,
            "system": system,
            "messages": messages,
            "tools": TOOLS + offered,
        }
        try:
            reply = post(base + "/v1/messages", body, key)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            detail = ""
            if isinstance(exc, urllib.error.HTTPError):
                detail = exc.read().decode(errors="replace")[:2000]
            emit(
                {
                    "type": "result",
                    "is_error": True,
                    "result": f"provider error: {exc} {detail}",
                    "usage": usage,
                    "num_turns": turn - 1,
                }
            )
            return 1
        for k in usage:
            usage[k] += int(reply.get("usage", {}).get(k, 0) or 0)
        content = reply.get("content", [])
        emit({"type": "assistant", "content": content})
        messages.append({"role": "assistant", "content": content})
        calls = [b for b in content if b.get("type") == "tool_use"]
        text = "".join(b.get("text", "") for b in content if b.get("type") == "text") or text
        if not calls:
            emit(
                {
                    "type": "result",
                    "is_error": False,
                    "result": text,
                    "usage": usage,
                    "num_turns": turn,
                }
            )
            return 0
        results = []
        for call in calls:
            name = str(call.get("name"))
            if name in mcp_route:
                out, is_error = call_mcp(*mcp_route[name], call.get("input") or {})
            else:
                out, is_error = run_tool(name, call.get("input") or {})
            emit({"type": "tool_result", "name": call.get("name"), "is_error": is_error})
            results.append(
                {
                    "type": "tool_result",
                    "tool_use_id": call.get("id"),
                    "content": out,
                    "is_error": is_error,
                }
            )
        messages.append({"role": "user", "content": results})
    emit(
        {
            "type": "result",
            "is_error": True,
            "result": "too many turns",
            "usage": usage,
            "num_turns": MAX_TURNS,
        }
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
