"""A minimal model provider for tests, written here and not in corral's provider package.

Just enough Anthropic Messages (streaming SSE, as Claude Code asks for) and
OpenAI Responses (SSE, as Codex asks for): the first reply makes the agent's
own shell tool run `LOOK` (write made.txt, dump what the sandbox can see into
seen.txt), the second ends the turn. `serving()` runs it on a thread and
records every request's path, headers and body.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["LOOK", "Upstream", "serving"]

LOOK = (
    "echo made-by-agent > made.txt; env > seen.txt; "
    "cat /proc/self/environ | tr '\\0' '\\n' >> seen.txt; "
    "cat ~/.claude.json ~/.claude/settings.json ~/.codex/config.toml ~/.codex/auth.json "
    "~/.config/* /etc/environment 2>/dev/null >> seen.txt; "
    "cat /proc/*/cmdline 2>/dev/null | tr '\\0' ' ' >> seen.txt; true"
)


@dataclass
class Upstream:
    """What the test's provider server saw."""

    headers: list[dict[str, str]] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)


def _sse(events: list[tuple[str | None, dict[str, Any]]]) -> bytes:
    out = b""
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        out += f"{head}data: {json.dumps(data)}\n\n".encode()
    return out


def _anthropic_reply(
    body: dict[str, Any],
) -> tuple[list[tuple[str | None, dict[str, Any]]], dict[str, Any]]:
    """(SSE events, JSON message): Bash(LOOK) first, then a final text once a tool ran."""
    tools = {t.get("name") for t in body.get("tools") or []}
    msgs = body.get("messages") or []
    last = msgs[-1].get("content") if msgs else None
    ran = isinstance(last, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in last
    )
    model = str(body.get("model", "m"))
    usage = {"input_tokens": 12, "output_tokens": 7}
    if "Bash" in tools and not ran:
        block: dict[str, Any] = {"type": "tool_use", "id": "toolu_01", "name": "Bash", "input": {}}
        args = json.dumps({"command": LOOK, "description": "look around"})
        stop = "tool_use"
        events: list[tuple[str | None, dict[str, Any]]] = [
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": block},
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "input_json_delta", "partial_json": args},
                },
            ),
        ]
        full = [{**block, "input": json.loads(args)}]
    else:
        stop = "end_turn"
        events = [
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": ""},
                },
            ),
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "Done."},
                },
            ),
        ]
        full = [{"type": "text", "text": "Done."}]
    message: dict[str, Any] = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    stream = [
        ("message_start", {"type": "message_start", "message": message}),
        *events,
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": 7},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return stream, {**message, "content": full, "stop_reason": stop, "usage": usage}


_SHELLS = {"exec_command": "cmd", "shell_command": "command", "shell": "command"}


def _responses_reply(body: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """Responses SSE: the shell tool Codex offers, with LOOK; then a final message."""
    items = body.get("input") or []
    ran = any(isinstance(i, dict) and i.get("type") == "function_call_output" for i in items)
    names = [t.get("name") for t in body.get("tools") or [] if t.get("type") == "function"]
    tool = next((n for n in _SHELLS if n in names), None)
    if tool is not None and not ran:
        arg: Any = ["bash", "-lc", LOOK] if tool == "shell" else LOOK
        item: dict[str, Any] = {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": tool,
            "arguments": json.dumps({_SHELLS[tool]: arg}),
        }
    else:
        item = {
            "id": "msg_1",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
        }
    base: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "model": body.get("model"),
        "status": "in_progress",
        "output": [],
        "usage": None,
        "error": None,
    }
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 19,
    }
    done = {**base, "status": "completed", "output": [item], "usage": usage}
    evs: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"type": "response.created", "response": base}),
        (
            "response.output_item.added",
            {"type": "response.output_item.added", "output_index": 0, "item": item},
        ),
        (
            "response.output_item.done",
            {"type": "response.output_item.done", "output_index": 0, "item": item},
        ),
        ("response.completed", {"type": "response.completed", "response": done}),
    ]
    return [(n, {**d, "sequence_number": i}) for i, (n, d) in enumerate(evs)]


def _app(seen: Upstream) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        seen.paths.append(f"{request.method} {request.path}")
        seen.headers.append({k.lower(): v for k, v in request.headers.items()})
        seen.bodies.append(raw)
        body = json.loads(raw) if raw else {}
        if request.path.endswith("/messages/count_tokens"):
            return web.json_response({"input_tokens": 12})
        if request.path.endswith("/v1/messages"):
            stream, message = _anthropic_reply(body)
            if not body.get("stream"):
                return web.json_response(message)
            return web.Response(body=_sse(stream), content_type="text/event-stream")
        if request.path.endswith("/v1/responses"):
            return web.Response(body=_sse(_responses_reply(body)), content_type="text/event-stream")
        return web.json_response({"error": {"type": "not_found", "message": "no"}}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


Starter = Callable[..., int]


@contextmanager
def serving() -> Iterator[Starter]:
    """`start(seen, host=, port=, ctx=)` starts a server (TLS with `ctx`); its port."""
    """Start the test's provider on `host:port` (TLS with `ctx`); yields a starter."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []

    def start(
        seen: Upstream, host: str = "127.0.0.1", port: int = 0, ctx: ssl.SSLContext | None = None
    ) -> int:
        async def go() -> int:
            runner = web.AppRunner(_app(seen))
            await runner.setup()
            site = web.TCPSite(runner, host, port, ssl_context=ctx)
            await site.start()
            runners.append(runner)
            server = site._server
            assert isinstance(server, asyncio.Server)
            return int(server.sockets[0].getsockname()[1])

        return asyncio.run_coroutine_threadsafe(go(), loop).result(10)

    try:
        yield start
    finally:
        _stop(loop, thread, runners)


def _stop(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, runners: list[web.AppRunner]
) -> None:
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()
