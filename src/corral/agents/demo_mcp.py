"""A tiny MCP server over stdio, standard library only: the gateway's test double.

Run it as a script (`python3 demo_mcp.py`) inside a corral sandbox; it needs
nothing but the interpreter, so the sandbox only has to see this one file.
Every call is appended to `calls.log` in the working directory, so a test can
tell that a call really reached the server. Tools:

    echo {text}                 returns text
    write_marker {name, text}   writes the file `name` in the working directory
    shred {path}                a "dangerous" tool for policy tests: it only
                                writes `shred-called` (a policy that lets it
                                through is caught by that file)

Speaks newline-delimited JSON-RPC 2.0 (MCP's stdio transport): initialize,
notifications/initialized, ping, tools/list, tools/call.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

__all__ = ["PATH", "main"]

PATH = os.path.abspath(__file__)
"""This file, for `--ro` mounts and `python3 PATH` commands."""

_TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Return the given text.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    },
    {
        "name": "write_marker",
        "description": "Write a small file in the server's working directory.",
        "inputSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "text": {"type": "string"}},
            "required": ["name"],
        },
    },
    {
        "name": "shred",
        "description": "Destroy a path (test double: only leaves a marker).",
        "inputSchema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    },
]


def _log(entry: dict[str, Any]) -> None:
    with open("calls.log", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(entry, sort_keys=True) + "\n")


def _call(name: str, args: dict[str, Any]) -> tuple[str, bool]:
    _log({"tool": name, "arguments": args})
    if name == "echo":
        return str(args.get("text", "")), False
    if name == "write_marker":
        marker = str(args.get("name", ""))
        if not marker or "/" in marker or marker.startswith("."):
            return f"invalid marker name {marker!r}", True
        with open(marker, "w", encoding="utf-8") as fh:
            fh.write(str(args.get("text", "marker")))
        return f"wrote {marker}", False
    if name == "shred":
        with open("shred-called", "w", encoding="utf-8") as fh:
            fh.write(str(args.get("path", "")))
        return "shredded", False
    return f"unknown tool {name!r}", True


def _handle(msg: dict[str, Any]) -> dict[str, Any] | None:
    method = msg.get("method")
    msg_id = msg.get("id")
    if msg_id is None:
        return None
    params = msg.get("params") or {}
    result: dict[str, Any]
    if method == "initialize":
        result = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "corral-demo", "version": "1.0"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": _TOOLS}
    elif method == "tools/call":
        text, is_error = _call(str(params.get("name")), dict(params.get("arguments") or {}))
        result = {"content": [{"type": "text", "text": text}], "isError": is_error}
    else:
        return {
            "jsonrpc": "2.0",
            "id": msg_id,
            "error": {"code": -32601, "message": f"method not found: {method}"},
        }
    return {"jsonrpc": "2.0", "id": msg_id, "result": result}


def main() -> int:
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        reply = _handle(msg) if isinstance(msg, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
