"""Wire formats checked by the official SDKs (strict response validation).

The SDKs talk to the pure core through an in-memory httpx transport: route,
parse, decide, render — the same functions the server calls, without sockets.
Server-only behaviour (truncation, delays, transcripts) is tested in
tests/integration/provider.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from corral.provider.conversation import parse_request
from corral.provider.engine import Failure, PlannedCall, Reply, decide
from corral.provider.scenario import Scenario, parse_scenario
from corral.provider.server import route_for
from corral.provider.wire import (
    CHUNK,
    SseEvent,
    error_body,
    gemini_chunks,
    malform,
    render_json,
    render_stream,
)

LONG = "x" * (3 * CHUNK)


def handler_for(scenario: Scenario) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        route = route_for(request.method, request.url.path, dict(request.url.params))
        assert route is not None and route.family is not None, request.url
        parsed = parse_request(
            route.family, json.loads(request.content), model=route.model, stream=route.stream
        )
        decision = decide(scenario, parsed)
        outcome = decision.outcome
        if isinstance(outcome, Failure):
            body = error_body(parsed.family, outcome.status, outcome.message, outcome.kind)
            return httpx2.Response(outcome.status, json=body)
        common: dict[str, Any] = {
            "model": parsed.model or "m",
            "response_id": "r1",
            "input_tokens": 7,
            "created": 1,
        }
        if parsed.stream:
            events = render_stream(
                parsed.family, outcome, include_usage=parsed.include_usage, **common
            )
            if decision.fault is not None and decision.fault.malformed_at is not None:
                events = malform(events, decision.fault.malformed_at)
            content = b"".join(e.encode() for e in events)
            return httpx2.Response(
                200, headers={"content-type": "text/event-stream"}, content=content
            )
        return httpx2.Response(200, json=render_json(parsed.family, outcome, **common))

    return httpx2.MockTransport(handle)


def anthropic_client(scenario: Scenario) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url="http://provider.test/routes/anthropic",
        api_key="dummy",
        max_retries=0,
        http_client=httpx2.Client(transport=handler_for(scenario)),
        _strict_response_validation=True,
    )


def openai_client(scenario: Scenario) -> openai.OpenAI:
    return openai.OpenAI(
        base_url="http://provider.test/v1",
        api_key="dummy",
        max_retries=0,
        http_client=httpx2.Client(transport=handler_for(scenario)),
        _strict_response_validation=True,
    )


TWO_CALLS = parse_scenario(
    f"""
turns:
  - say: "Let me look. {LONG}"
    calls:
      - shell: "ls -la /tmp && echo {LONG}"
      - tool: "Read|read"
        input: {{file_path: /etc/os-release}}
"""
)
TEXT = parse_scenario("turns: [{say: 'All done.'}]")

ANTHROPIC_TOOLS: list[Any] = [
    {
        "name": "Bash",
        "description": "run",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
    {
        "name": "Read",
        "description": "read",
        "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}},
    },
]
USER: list[Any] = [{"role": "user", "content": "inspect the machine"}]


# -- Anthropic -------------------------------------------------------------------------


def test_anthropic_stream_with_text_and_tool_use() -> None:
    client = anthropic_client(TWO_CALLS)
    with client.messages.stream(
        model="claude-x", max_tokens=64, messages=USER, tools=ANTHROPIC_TOOLS
    ) as stream:
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    assert len(texts) > 1  # delivered as several deltas
    assert "".join(texts) == f"Let me look. {LONG}"
    assert message.stop_reason == "tool_use"
    assert message.model == "claude-x"
    assert message.usage.input_tokens == 7 and message.usage.output_tokens > 1
    uses = [b for b in message.content if b.type == "tool_use"]
    assert [(u.name, u.input) for u in uses] == [
        ("Bash", {"command": f"ls -la /tmp && echo {LONG}"}),
        ("Read", {"file_path": "/etc/os-release"}),
    ]
    assert uses[0].id != uses[1].id


def test_anthropic_raw_event_sequence() -> None:
    client = anthropic_client(TWO_CALLS)
    events = list(
        client.messages.create(
            model="m", max_tokens=8, messages=USER, tools=ANTHROPIC_TOOLS, stream=True
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    deltas = [e.delta.type for e in events if e.type == "content_block_delta"]
    assert "text_delta" in deltas and deltas.count("input_json_delta") > 2
    final = events[-2]
    assert final.type == "message_delta" and final.delta.stop_reason == "tool_use"


def test_anthropic_non_streaming() -> None:
    message = anthropic_client(TWO_CALLS).messages.create(
        model="m", max_tokens=8, messages=USER, tools=ANTHROPIC_TOOLS
    )
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    end = anthropic_client(TEXT).messages.create(model="m", max_tokens=8, messages=USER)
    assert end.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "text", None)) for b in end.content] == [("text", "All done.")]


def test_anthropic_sees_exhaustion_as_a_500_with_the_reason() -> None:
    client = anthropic_client(TEXT)
    history: list[Any] = [
        *USER,
        {"role": "assistant", "content": "All done."},
        {"role": "user", "content": "more"},
    ]
    with pytest.raises(anthropic.InternalServerError) as info:
        client.messages.create(model="m", max_tokens=8, messages=history)
    assert info.value.status_code == 500
    assert "exhausted at turn 1" in str(info.value)


def test_anthropic_malformed_event_makes_the_sdk_raise() -> None:
    broken = parse_scenario("turns: [{say: hello, fault: {malformed_at: 3}}]")
    with (
        pytest.raises(ValueError),
        anthropic_client(broken).messages.stream(model="m", max_tokens=8, messages=USER) as s,
    ):
        s.get_final_message()


# -- OpenAI Responses ------------------------------------------------------------------

CODEX_TOOLS: list[Any] = [
    {
        "type": "function",
        "name": "exec_command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
    {"type": "custom", "name": "apply_patch", "description": "patch"},
    {
        "type": "namespace",
        "name": "mcp__demo__",
        "description": "demo",
        "tools": [
            {"type": "function", "name": "echo", "parameters": {"type": "object", "properties": {}}}
        ],
    },
]
CODEX_TURN = parse_scenario(
    f"""
turns:
  - say: working
    calls:
      - shell: "echo {LONG}"
      - write_file: {{path: a.txt, content: "hi\\n"}}
      - mcp: {{server: demo, tool: echo, arguments: {{text: yo}}}}
"""
)


def _responses_request(client: openai.OpenAI, stream: bool) -> Any:
    extra: dict[str, Any] = {"tools": CODEX_TOOLS}
    return client.responses.create(model="gpt-x", input="go", stream=stream, extra_body=extra)


def test_responses_stream_with_function_calls() -> None:
    client = openai_client(CODEX_TURN)
    with client.responses.stream(
        model="gpt-x", input="go", extra_body={"tools": CODEX_TOOLS}
    ) as stream:
        kinds = [event.type for event in stream]
        response = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert (
        kinds.count("response.output_item.added") == kinds.count("response.output_item.done") == 4
    )
    assert "response.function_call_arguments.delta" in kinds
    assert response.status == "completed"
    assert response.usage is not None and response.usage.output_tokens > 1
    assert response.output_text == "working"
    items = [(i.type, getattr(i, "name", None)) for i in response.output]
    assert items == [
        ("message", None),
        ("function_call", "exec_command"),
        ("custom_tool_call", "apply_patch"),
        ("function_call", "echo"),
    ]
    shell, patch, mcp = response.output[1:]
    assert shell.type == "function_call" and json.loads(shell.arguments) == {"cmd": f"echo {LONG}"}
    assert patch.type == "custom_tool_call" and patch.input.startswith(
        "*** Begin Patch\n*** Add File: a.txt"
    )
    assert mcp.type == "function_call" and mcp.namespace == "mcp__demo__"
    assert len({shell.call_id, patch.call_id, mcp.call_id}) == 3


def test_responses_raw_stream_and_non_streaming() -> None:
    client = openai_client(CODEX_TURN)
    events = list(_responses_request(client, stream=True))
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in done] == [
        "message",
        "function_call",
        "custom_tool_call",
        "function_call",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    response = _responses_request(client, stream=False)
    assert [i.type for i in response.output] == [
        "message",
        "function_call",
        "custom_tool_call",
        "function_call",
    ]
    assert (
        response.usage is not None
        and response.usage.total_tokens
        == response.usage.input_tokens + response.usage.output_tokens
    )


# -- OpenAI Chat Completions -----------------------------------------------------------

CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": n, "parameters": {"type": "object", "properties": {}}},
    }
    for n in ("bash", "read")
]
CHAT_TURN = parse_scenario(
    f"""
turns:
  - calls:
      - shell: "echo {LONG}"
      - read_file: {{path: /x}}
"""
)


def test_chat_stream_with_tool_calls_and_usage() -> None:
    client = openai_client(CHAT_TURN)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=USER,
            tools=CHAT_TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 1
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == ["tool_calls"]
    with client.chat.completions.stream(model="m", messages=USER, tools=CHAT_TOOLS) as stream:
        completion = stream.get_final_completion()
    calls = completion.choices[0].message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("bash", {"command": f"echo {LONG}"}),
        ("read", {"file_path": "/x"}),
    ]
    assert completion.choices[0].finish_reason == "tool_calls"


def test_chat_non_streaming_and_text() -> None:
    completion = openai_client(TEXT).chat.completions.create(model="m", messages=USER)
    assert completion.choices[0].message.content == "All done."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens == 7


def test_chat_malformed_chunk_makes_the_sdk_raise() -> None:
    broken = parse_scenario("turns: [{say: hello, fault: {malformed_at: 1}}]")
    stream = openai_client(broken).chat.completions.create(model="m", messages=USER, stream=True)
    with pytest.raises(ValueError):
        list(stream)


def test_openai_sees_exhaustion() -> None:
    client = openai_client(TEXT)
    history: list[Any] = [
        *USER,
        {"role": "assistant", "content": "All done."},
        {"role": "user", "content": "?"},
    ]
    with pytest.raises(openai.InternalServerError, match="exhausted at turn 1"):
        client.chat.completions.create(model="m", messages=history)


# -- Gemini (no SDK in the venv: shape checks) -----------------------------------------


def test_gemini_chunks_and_json() -> None:
    reply = Reply(
        "hello " * 10, (PlannedCall("", "run_shell_command", arguments={"command": "ls"}),)
    )
    from corral.provider.wire import Usage

    chunks = gemini_chunks(reply, "gemini-x", "r", Usage(5, 6))
    assert all(c["candidates"][0]["content"]["role"] == "model" for c in chunks)
    assert "finishReason" not in chunks[0]["candidates"][0]
    last = chunks[-1]
    assert last["candidates"][0]["finishReason"] == "STOP"
    assert last["usageMetadata"] == {
        "promptTokenCount": 5,
        "candidatesTokenCount": 6,
        "totalTokenCount": 11,
    }
    assert last["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}
    ]
    text = "".join(
        p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"]
    )
    assert text == reply.text
    body = render_json("gemini", reply, model="g", response_id="r", input_tokens=1)
    assert [list(p) for p in body["candidates"][0]["content"]["parts"]] == [
        ["text"],
        ["functionCall"],
    ]
    sse = render_stream("gemini", Reply("hi"), model="g", response_id="r", input_tokens=1)
    assert len(sse) == 1 and json.loads(sse[0].data)["candidates"][0]["finishReason"] == "STOP"


# -- small pure pieces -----------------------------------------------------------------


def test_error_envelopes_per_family() -> None:
    assert error_body("anthropic", 529, "busy") == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy"},
    }
    assert (
        error_body("chat", 500, "x", "scenario_exhausted")["error"]["type"] == "scenario_exhausted"
    )
    assert error_body("responses", 400, "bad")["error"]["type"] == "invalid_request_error"
    assert error_body("gemini", 429, "slow") == {
        "error": {"code": 429, "message": "slow", "status": "RESOURCE_EXHAUSTED"}
    }


def test_malform_breaks_exactly_one_event() -> None:
    events = [SseEvent('{"a":1}', "x"), SseEvent('{"b":2}', "y"), SseEvent("[DONE]")]
    out = malform(events, 1)
    assert out[0] == events[0] and out[2] == events[2]
    assert out[1].event == "y"
    with pytest.raises(ValueError):
        json.loads(out[1].data)
    assert malform(events, 9) == events
    assert SseEvent("{}", "message_stop").encode() == b"event: message_stop\ndata: {}\n\n"


def _routes() -> Iterator[tuple[str, str, dict[str, str], str | None]]:
    yield "POST", "/v1/messages", {"beta": "true"}, "messages"
    yield "POST", "/routes/anthropic/v1/messages", {}, "messages"
    yield "POST", "/a/b/v1/responses", {}, "responses"
    yield "POST", "/v1/chat/completions", {}, "chat.completions"
    yield "POST", "/v1/messages/count_tokens", {}, "count_tokens"
    yield "POST", "/v1beta/models/gemini-2.5-pro:generateContent", {}, "generateContent"
    yield (
        "POST",
        "/p/v1beta/models/g:streamGenerateContent",
        {"alt": "sse"},
        "streamGenerateContent",
    )
    yield "POST", "/v1beta/models/g:countTokens", {}, "count_tokens"
    yield "GET", "/v1/models", {}, "models"
    yield "GET", "/x/v1/models/claude-x", {}, "model"
    yield "HEAD", "/", {}, "head"
    yield "HEAD", "/routes/anthropic/anything", {}, "head"
    yield "GET", "/routes/anthropic/api/hello", {}, "hello"
    yield "GET", "/v1/messages", {}, None
    yield "POST", "/v2/messages", {}, None
    yield "DELETE", "/v1/models", {}, None


@pytest.mark.parametrize(("method", "path", "query", "endpoint"), list(_routes()))
def test_routes(method: str, path: str, query: dict[str, str], endpoint: str | None) -> None:
    route = route_for(method, path, query)
    assert (route.endpoint if route else None) == endpoint


def test_gemini_route_carries_model_and_mode() -> None:
    route = route_for("POST", "/v1beta/models/gemini-x:streamGenerateContent", {})
    assert route is not None and route.family == "gemini" and route.model == "gemini-x"
    assert route.stream and not route.sse
