"""Replies in each wire format: lists of SSE events or JSON bodies (pure).

Anthropic Messages (`event:` + `data:` lines: message_start, content_block_*,
message_delta with stop_reason and usage, message_stop), OpenAI Responses
(response.created ... response.completed, with `event:` lines as the real API
sends them), OpenAI Chat Completions (`data:` chunks, tool_calls deltas,
`data: [DONE]`) and Gemini generateContent (`data:` chunks, or one JSON
array without `alt=sse`). Text and tool arguments are split into several
deltas so that clients' accumulators are exercised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from corral.provider.engine import Reply
from corral.provider.scenario import WireFamily

__all__ = [
    "SseEvent",
    "Usage",
    "error_body",
    "estimate_tokens",
    "malform",
    "render_json",
    "render_stream",
]

CHUNK = 24
"""Characters per text / argument delta."""


@dataclass(frozen=True)
class SseEvent:
    data: str
    event: str | None = None

    def encode(self) -> bytes:
        head = f"event: {self.event}\n" if self.event else ""
        return f"{head}data: {self.data}\n\n".encode()


@dataclass(frozen=True)
class Usage:
    input_tokens: int
    output_tokens: int

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


def estimate_tokens(text: str) -> int:
    """A stand-in token count (about four characters per token, at least 1)."""
    return max(1, len(text) // 4)


def reply_usage(reply: Reply, input_tokens: int) -> Usage:
    out = reply.text + "".join(c.raw_input or c.arguments_json for c in reply.calls)
    return Usage(input_tokens, estimate_tokens(out))


def _chunks(text: str, size: int = CHUNK) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _dump(obj: object) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


# -- Anthropic -------------------------------------------------------------------------


def _anthropic_stop(reply: Reply) -> str:
    return "tool_use" if reply.calls else "end_turn"


def _anthropic_blocks(reply: Reply) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.text or not reply.calls:
        blocks.append({"type": "text", "text": reply.text})
    for call in reply.calls:
        blocks.append(
            {
                "type": "tool_use",
                "id": call.call_id,
                "name": call.full_name,
                "input": dict(call.arguments or {}),
            }
        )
    return blocks


def _anthropic_message(reply: Reply, model: str, rid: str, usage: Usage) -> dict[str, Any]:
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _anthropic_blocks(reply),
        "stop_reason": _anthropic_stop(reply),
        "stop_sequence": None,
        "usage": {
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def _anthropic_stream(reply: Reply, model: str, rid: str, usage: Usage) -> list[SseEvent]:
    def ev(kind: str, payload: dict[str, Any]) -> SseEvent:
        return SseEvent(_dump({"type": kind, **payload}), kind)

    start = _anthropic_message(reply, model, rid, Usage(usage.input_tokens, 1))
    start.update(content=[], stop_reason=None)
    events = [ev("message_start", {"message": start}), ev("ping", {})]
    for index, block in enumerate(_anthropic_blocks(reply)):
        if block["type"] == "text":
            events.append(
                ev(
                    "content_block_start",
                    {"index": index, "content_block": {"type": "text", "text": ""}},
                )
            )
            for piece in _chunks(block["text"]):
                delta = {"type": "text_delta", "text": piece}
                events.append(ev("content_block_delta", {"index": index, "delta": delta}))
        else:
            opening = {**block, "input": {}}
            events.append(ev("content_block_start", {"index": index, "content_block": opening}))
            for piece in _chunks(_dump(block["input"])):
                delta = {"type": "input_json_delta", "partial_json": piece}
                events.append(ev("content_block_delta", {"index": index, "delta": delta}))
        events.append(ev("content_block_stop", {"index": index}))
    final: dict[str, Any] = {"stop_reason": _anthropic_stop(reply), "stop_sequence": None}
    events.append(
        ev("message_delta", {"delta": final, "usage": {"output_tokens": usage.output_tokens}})
    )
    events.append(ev("message_stop", {}))
    return events


# -- OpenAI Responses ------------------------------------------------------------------


def _responses_items(reply: Reply, rid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.text or not reply.calls:
        items.append(
            {
                "id": f"msg_{rid}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}
                ],
            }
        )
    for call in reply.calls:
        if call.custom:
            items.append(
                {
                    "id": f"ctc_{call.call_id}",
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": call.call_id,
                    "name": call.name,
                    "input": call.raw_input,
                }
            )
            continue
        item: dict[str, Any] = {
            "id": f"fc_{call.call_id}",
            "type": "function_call",
            "status": "completed",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments_json,
        }
        if call.namespace is not None:
            item["namespace"] = call.namespace
        items.append(item)
    return items


def _responses_object(
    rid: str,
    model: str,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    created: int,
) -> dict[str, Any]:
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "temperature": 1.0,
        "top_p": 1.0,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "text": {"format": {"type": "text"}},
        "usage": None
        if usage is None
        else {
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total,
        },
    }


def _responses_stream(
    reply: Reply, model: str, rid: str, usage: Usage, created: int
) -> list[SseEvent]:
    events: list[SseEvent] = []

    def ev(kind: str, payload: dict[str, Any]) -> None:
        body = {"type": kind, "sequence_number": len(events), **payload}
        events.append(SseEvent(_dump(body), kind))

    items = _responses_items(reply, rid)
    ev(
        "response.created",
        {
            "response": _responses_object(
                rid, model, status="in_progress", output=[], usage=None, created=created
            )
        },
    )
    ev(
        "response.in_progress",
        {
            "response": _responses_object(
                rid, model, status="in_progress", output=[], usage=None, created=created
            )
        },
    )
    for index, item in enumerate(items):
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            ev(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "status": "in_progress", "content": []}},
            )
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            ev("response.content_part.added", {**where, "content_index": 0, "part": empty})
            for piece in _chunks(text):
                ev(
                    "response.output_text.delta",
                    {**where, "content_index": 0, "delta": piece, "logprobs": []},
                )
            ev(
                "response.output_text.done",
                {**where, "content_index": 0, "text": text, "logprobs": []},
            )
            ev(
                "response.content_part.done",
                {**where, "content_index": 0, "part": item["content"][0]},
            )
        elif item["type"] == "function_call":
            ev(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "status": "in_progress", "arguments": ""}},
            )
            for piece in _chunks(item["arguments"]):
                ev("response.function_call_arguments.delta", {**where, "delta": piece})
            ev(
                "response.function_call_arguments.done",
                {**where, "name": item["name"], "arguments": item["arguments"]},
            )
        else:
            ev(
                "response.output_item.added",
                {"output_index": index, "item": {**item, "status": "in_progress", "input": ""}},
            )
            for piece in _chunks(item["input"]):
                ev("response.custom_tool_call_input.delta", {**where, "delta": piece})
            ev("response.custom_tool_call_input.done", {**where, "input": item["input"]})
        ev("response.output_item.done", {"output_index": index, "item": item})
    ev(
        "response.completed",
        {
            "response": _responses_object(
                rid, model, status="completed", output=items, usage=usage, created=created
            )
        },
    )
    return events


# -- OpenAI Chat Completions -----------------------------------------------------------


def _chat_finish(reply: Reply) -> str:
    return "tool_calls" if reply.calls else "stop"


def _chat_usage(usage: Usage) -> dict[str, int]:
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.total,
    }


def _chat_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": c.call_id,
            "type": "function",
            "function": {"name": c.full_name, "arguments": c.raw_input or c.arguments_json},
        }
        for c in reply.calls
    ]


def _chat_json(reply: Reply, model: str, rid: str, usage: Usage, created: int) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.text if reply.text or not reply.calls else None,
    }
    if reply.calls:
        message["tool_calls"] = _chat_tool_calls(reply)
    return {
        "id": rid,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": _chat_finish(reply), "logprobs": None}
        ],
        "usage": _chat_usage(usage),
    }


def _chat_stream(
    reply: Reply, model: str, rid: str, usage: Usage, *, created: int, include_usage: bool
) -> list[SseEvent]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> SseEvent:
        body = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return SseEvent(_dump(body))

    events = [chunk({"role": "assistant", "content": ""})]
    if reply.text:
        events.extend(chunk({"content": piece}) for piece in _chunks(reply.text))
    for index, call in enumerate(_chat_tool_calls(reply)):
        fn = call["function"]
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": fn["name"], "arguments": ""},
        }
        events.append(chunk({"tool_calls": [head]}))
        for piece in _chunks(fn["arguments"]):
            events.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    events.append(chunk({}, _chat_finish(reply)))
    if include_usage:
        body = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [],
            "usage": _chat_usage(usage),
        }
        events.append(SseEvent(_dump(body)))
    events.append(SseEvent("[DONE]"))
    return events


# -- Gemini ----------------------------------------------------------------------------


def _gemini_usage(usage: Usage) -> dict[str, int]:
    return {
        "promptTokenCount": usage.input_tokens,
        "candidatesTokenCount": usage.output_tokens,
        "totalTokenCount": usage.total,
    }


def _gemini_chunk(
    parts: list[dict[str, Any]], model: str, rid: str, finish: Usage | None
) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    body: dict[str, Any] = {"candidates": [candidate], "modelVersion": model, "responseId": rid}
    if finish is not None:
        candidate["finishReason"] = "STOP"
        body["usageMetadata"] = _gemini_usage(finish)
    return body


def _gemini_call_parts(reply: Reply) -> list[dict[str, Any]]:
    return [
        {"functionCall": {"name": c.full_name, "args": dict(c.arguments or {})}}
        for c in reply.calls
    ]


def gemini_chunks(reply: Reply, model: str, rid: str, usage: Usage) -> list[dict[str, Any]]:
    """The streamGenerateContent chunks (the last one carries finishReason and usage)."""
    chunks = (
        [_gemini_chunk([{"text": piece}], model, rid, None) for piece in _chunks(reply.text)]
        if reply.text
        else []
    )
    calls = _gemini_call_parts(reply)
    if calls or not chunks:
        chunks.append(_gemini_chunk(calls or [{"text": ""}], model, rid, usage))
    else:
        chunks[-1] = _gemini_chunk(
            chunks[-1]["candidates"][0]["content"]["parts"], model, rid, usage
        )
    return chunks


def _gemini_json(reply: Reply, model: str, rid: str, usage: Usage) -> dict[str, Any]:
    parts = ([{"text": reply.text}] if reply.text or not reply.calls else []) + _gemini_call_parts(
        reply
    )
    return _gemini_chunk(parts, model, rid, usage)


# -- entry points ----------------------------------------------------------------------


def render_stream(
    family: WireFamily,
    reply: Reply,
    *,
    model: str,
    response_id: str,
    input_tokens: int,
    created: int = 0,
    include_usage: bool = False,
) -> list[SseEvent]:
    """The SSE events of `reply` for a streaming request of `family`."""
    usage = reply_usage(reply, input_tokens)
    match family:
        case "anthropic":
            return _anthropic_stream(reply, model, response_id, usage)
        case "responses":
            return _responses_stream(reply, model, response_id, usage, created)
        case "chat":
            return _chat_stream(
                reply, model, response_id, usage, created=created, include_usage=include_usage
            )
        case "gemini":
            return [SseEvent(_dump(c)) for c in gemini_chunks(reply, model, response_id, usage)]


def render_json(
    family: WireFamily,
    reply: Reply,
    *,
    model: str,
    response_id: str,
    input_tokens: int,
    created: int = 0,
) -> dict[str, Any]:
    """The JSON body of `reply` for a non-streaming request of `family`."""
    usage = reply_usage(reply, input_tokens)
    match family:
        case "anthropic":
            return _anthropic_message(reply, model, response_id, usage)
        case "responses":
            items = _responses_items(reply, response_id)
            return _responses_object(
                response_id, model, status="completed", output=items, usage=usage, created=created
            )
        case "chat":
            return _chat_json(reply, model, response_id, usage, created)
        case "gemini":
            return _gemini_json(reply, model, response_id, usage)


_ANTHROPIC_ERRORS: Mapping[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_GEMINI_STATUS: Mapping[int, str] = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def error_body(
    family: WireFamily | None, status: int, message: str, kind: str | None = None
) -> dict[str, Any]:
    """The error envelope `family`'s clients expect (`kind` defaults from the status)."""
    match family:
        case "anthropic" | None:
            etype = kind or _ANTHROPIC_ERRORS.get(status, "api_error")
            return {"type": "error", "error": {"type": etype, "message": message}}
        case "responses" | "chat":
            etype = kind or ("server_error" if status >= 500 else "invalid_request_error")
            return {"error": {"message": message, "type": etype, "param": None, "code": kind}}
        case "gemini":
            return {
                "error": {
                    "code": status,
                    "message": message,
                    "status": _GEMINI_STATUS.get(status, "UNKNOWN"),
                }
            }


def malform(events: Sequence[SseEvent], index: int) -> list[SseEvent]:
    """`events` with the data of event `index` cut in half (no longer valid JSON)."""
    out = list(events)
    if 0 <= index < len(out):
        data = out[index].data
        broken = data[: max(1, len(data) // 2)] if data.startswith("{") else "{" + data
        out[index] = SseEvent(broken, out[index].event)
    return out
