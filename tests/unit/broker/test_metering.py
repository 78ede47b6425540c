"""The broker's token meter and per-session budget (pure): what a response used, bounded."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pytest

from corral.broker.actions import Identity, Observation, ProviderCall
from corral.broker.journal import Journal
from corral.broker.metering import (
    JSON_BODY_LIMIT,
    LINE_LIMIT,
    Metered,
    ResponseMeter,
    SessionBudget,
    TokenUsage,
    journal_usage,
)
from corral.provider.engine import Reply
from corral.provider.scenario import WireFamily
from corral.provider.wire import render_json, render_stream, reply_usage
from corral.run.capture import HeadTail
from corral.run.coordinator import session_budget

SSE = [(b"content-type", b"text/event-stream")]
JSON = [(b"content-type", b"application/json")]


def meter(chunks: list[bytes], headers: list[tuple[bytes, bytes]], status: int = 200) -> Metered:
    m = ResponseMeter("POST", "/v1/messages")
    m.start(status, headers)
    for c in chunks:
        m.feed(c)
    return m.result()


def sse(*events: Mapping[str, object]) -> bytes:
    return b"".join(
        f"event: {e.get('type', 'x')}\ndata: {json.dumps(e)}\n\n".encode() for e in events
    )


def test_anthropic_stream_counts_message_start_and_the_cumulative_delta() -> None:
    body = sse(
        {
            "type": "message_start",
            "message": {
                "usage": {
                    "input_tokens": 1200,
                    "output_tokens": 1,
                    "cache_read_input_tokens": 50,
                    "cache_creation_input_tokens": 7,
                }
            },
        },
        {"type": "content_block_delta", "delta": {"text": "usage: lots"}},
        {"type": "message_delta", "usage": {"output_tokens": 40}},
        {"type": "message_delta", "usage": {"output_tokens": 345}},
        {"type": "message_stop"},
    )
    # Split at awkward places: the meter reads what the broker relays, as it comes.
    chunks = [body[i : i + 7] for i in range(0, len(body), 7)]
    got = meter(chunks, SSE)
    assert got.error is None and got.found
    assert got.usage == TokenUsage(1200, 345, 50, 7) and got.usage.total == 1545


@pytest.mark.parametrize("family", ["anthropic", "responses", "chat", "gemini"])
def test_every_wire_the_synthetic_provider_speaks_is_counted(family: WireFamily) -> None:
    reply = Reply(text="hello there, this is a reply")
    expected = reply_usage(reply, 321)
    body = render_json(family, reply, model="m", response_id="r", input_tokens=321)
    got = meter([json.dumps(body).encode()], JSON)
    assert got.error is None and got.usage.total == expected.total
    events = render_stream(
        family, reply, model="m", response_id="r", input_tokens=321, include_usage=True
    )
    got = meter([e.encode() for e in events], SSE)
    assert got.error is None and got.usage.total == expected.total


def test_gemini_and_chat_usage_fields() -> None:
    gem = {
        "usageMetadata": {
            "promptTokenCount": 10,
            "candidatesTokenCount": 5,
            "thoughtsTokenCount": 3,
        }
    }
    assert meter([json.dumps([gem, gem]).encode()], JSON).usage == TokenUsage(10, 8)
    chat = {"usage": {"prompt_tokens": 9, "completion_tokens": 4}}
    assert meter([json.dumps(chat).encode()], JSON).usage == TokenUsage(9, 4)
    resp = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 3, "output_tokens": 2}},
    }
    assert meter([sse(resp)], SSE).usage == TokenUsage(3, 2)


def test_hostile_values_count_as_zero_not_negative() -> None:
    body = {"usage": {"input_tokens": -5000, "output_tokens": True, "cache_read_input_tokens": "9"}}
    assert meter([json.dumps(body).encode()], JSON).usage == TokenUsage(0, 0)


def test_an_overlong_stream_line_is_skipped_in_bounded_memory() -> None:
    m = ResponseMeter("POST", "/v1/messages")
    m.start(200, SSE)
    m.feed(b"data: {" + b"x" * 65536)
    for _ in range(LINE_LIMIT // 65536 + 8):
        m.feed(b"usage" * 13107)
        assert len(m._buf) <= LINE_LIMIT
    m.feed(b"\n" + sse({"type": "message_delta", "usage": {"output_tokens": 5}}))
    got = m.result()
    assert got.skipped_lines == 1 and got.usage == TokenUsage(0, 5) and got.error is None


def test_a_huge_json_body_is_not_kept_and_closes_the_budget() -> None:
    m = ResponseMeter("POST", "/v1/messages")
    m.start(200, JSON)
    for _ in range(JSON_BODY_LIMIT // (1 << 20) + 2):
        m.feed(b" " * (1 << 20))
        assert len(m._buf) <= JSON_BODY_LIMIT
    got = m.result()
    assert got.error is not None and "over" in got.error
    budget = SessionBudget(10**9)
    budget.add(got)
    assert budget.refusal() is not None and "closed" in (budget.refusal() or "")


def test_uncountable_responses_fail_closed_and_exempt_ones_do_not() -> None:
    gz = meter([b"\x1f\x8b..."], [*JSON, (b"content-encoding", b"gzip")])
    assert gz.error is not None and "gzip" in gz.error
    assert meter([b'{"content": []}'], JSON).error is not None  # 2xx without usage
    assert meter([b'{"error": {}}'], JSON, status=429).error is None
    count = ResponseMeter("POST", "/v1/messages/count_tokens")
    count.start(200, JSON)
    count.feed(b'{"input_tokens": 12}')
    assert count.result().error is None
    get = ResponseMeter("GET", "/v1/models")
    get.start(200, JSON)
    get.feed(b'{"data": []}')
    assert get.result().error is None


def test_budget_refuses_once_spent_and_not_before() -> None:
    budget = SessionBudget(100)
    assert not SessionBudget(None).serialised and SessionBudget(None).refusal() is None
    budget.add(Metered(TokenUsage(60, 39), True))
    assert budget.refusal() is None
    budget.add(Metered(TokenUsage(1, 0), True))
    assert budget.refusal() == "token budget spent (100/100 tokens)"
    assert session_budget(None, None, 5) is None
    assert session_budget(50, 1000, 980) == 20
    assert session_budget(None, 10, 99) == 0
    assert session_budget(7, None, 0) == 7


def test_journal_usage_sums_the_broker_outcomes_of_one_session(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    with Journal(path) as j:
        for session, usage in (
            ("1", TokenUsage(10, 5)),
            ("1", TokenUsage(1, 1)),
            ("2", TokenUsage(99, 1)),
        ):
            obs = Observation.of(
                ProviderCall(route="provider", method="POST", path="/v1/messages"),
                Identity(run="r", session=session, env="agent"),
                decision="allow",
                rule="route",
                reason="ok",
            )
            oid = j.append(obs)
            j.record_outcome(oid, 1, 1, {"usage": usage.to_json_dict()})
        denied = Observation.of(
            ProviderCall(route="provider", method="POST", path="/v1/messages"),
            Identity(run="r", session="1", env="agent"),
            decision="deny",
            rule="token-budget",
            reason="spent",
        )
        j.append(denied)
    assert journal_usage(path, "r", "1") == (TokenUsage(11, 6), 1)
    assert journal_usage(path, "r", "2") == (TokenUsage(99, 1), 0)
    assert journal_usage(path, "other", "1") == (TokenUsage(), 0)
    assert journal_usage(path, None, "1") == (TokenUsage(11, 6), 1)


@pytest.mark.parametrize("size", [0, 10, 100, 5000])
def test_capture_keeps_head_marker_and_tail(size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    ht = HeadTail(head=64, tail=32)
    out = b"".join(ht.feed(data[i : i + 17]) for i in range(0, len(data), 17)) + ht.end()
    if size <= 96:
        assert out == data  # nothing dropped: head then tail, no marker
    else:
        assert out.startswith(data[:64]) and out.endswith(data[-32:])
        assert (
            f"[corral: {size - 96} bytes of output dropped here; {size} bytes in all]".encode()
            in out
        )
        assert len(out) < 200
