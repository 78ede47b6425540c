"""The provider server over loopback, with the official SDKs as clients.

Mini agent loops play the role of Claude Code and Codex: they send what those
CLIs send, really execute the tool calls in a temporary workspace, and the
tests assert on the files that result. Faults are checked by their effect on
the client (the SDK raises, the timing changes), transcripts by reading the
file back.
"""

from __future__ import annotations

import asyncio
import json
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from corral.errors import JournalError, ProviderError
from corral.provider import (
    ExchangeRecord,
    ProviderThread,
    load_scenario,
    parse_scenario,
    serve_provider,
)

pytestmark = pytest.mark.timeout(60)

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"
CORRAL = Path(sys.executable).parent / "corral"
Json = dict[str, Any]


@pytest.fixture
def provider_factory() -> Iterator[Callable[..., ProviderThread]]:
    started: list[ProviderThread] = []

    def make(scenario: Any, **options: Any) -> ProviderThread:
        provider = ProviderThread(scenario, **options)
        provider.start()
        started.append(provider)
        return provider

    yield make
    for provider in started:
        provider.stop()


_CLIENTS: list[anthropic.Anthropic | openai.OpenAI] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    while _CLIENTS:
        _CLIENTS.pop().close()


def _anthropic(url: str, **options: Any) -> anthropic.Anthropic:
    options.setdefault("max_retries", 0)
    client = anthropic.Anthropic(
        base_url=url + "/routes/anthropic",
        api_key="dummy",
        _strict_response_validation=True,
        **options,
    )
    _CLIENTS.append(client)
    return client


def _openai(url: str, **options: Any) -> openai.OpenAI:
    options.setdefault("max_retries", 0)
    client = openai.OpenAI(
        base_url=url + "/v1", api_key="dummy", _strict_response_validation=True, **options
    )
    _CLIENTS.append(client)
    return client


def _schema(*props: str) -> Json:
    return {
        "type": "object",
        "properties": {p: {"type": "string"} for p in props},
        "required": list(props),
    }


# -- a Claude-Code-shaped client -------------------------------------------------------

CLAUDE_TOOLS: list[Any] = [
    {"name": "Bash", "description": "Run a command", "input_schema": _schema("command")},
    {
        "name": "Write",
        "description": "Write a file",
        "input_schema": _schema("file_path", "content"),
    },
    {"name": "Read", "description": "Read a file", "input_schema": _schema("file_path")},
    {
        "name": "Edit",
        "description": "Edit a file",
        "input_schema": _schema("file_path", "old_string", "new_string"),
    },
    {"name": "ToolSearch", "description": "Load deferred tools", "input_schema": _schema("query")},
]


class ClaudeLikeAgent:
    """Executes Bash/Write/Read/Edit for real in `workspace`; MCP tools are deferred."""

    def __init__(self, url: str, workspace: Path) -> None:
        self.client = _anthropic(url)
        self.workspace = workspace
        self.tools: list[Any] = list(CLAUDE_TOOLS)

    def execute(self, name: str, args: Json) -> tuple[Any, bool]:
        if name == "Bash":
            proc = subprocess.run(
                ["bash", "-c", args["command"]],
                check=False,
                cwd=self.workspace,
                capture_output=True,
                text=True,
                timeout=10,
            )
            text = proc.stdout + proc.stderr
            return (
                (f"Exit code {proc.returncode}\n{text}", True) if proc.returncode else (text, False)
            )
        if name == "Write":
            Path(args["file_path"]).write_text(args["content"])
            return f"File created successfully at: {args['file_path']}", False
        if name == "Read":
            return Path(args["file_path"]).read_text(), False
        if name == "Edit":
            path = Path(args["file_path"])
            text = path.read_text()
            if args["old_string"] not in text:
                return "String to replace not found in file.", True
            path.write_text(text.replace(args["old_string"], args["new_string"], 1))
            return f"The file {path} has been updated.", False
        if name == "ToolSearch":
            names = args["query"].removeprefix("select:").split(",")
            for n in names:
                self.tools.append(
                    {"name": n, "input_schema": _schema("text"), "defer_loading": True}
                )
            return [{"type": "tool_reference", "tool_name": n} for n in names], False
        if name == "mcp__demo__echo":
            return args["text"], False
        return f"unknown tool {name}", True

    def run(self, prompt: str, rounds: int = 10) -> str:
        system = f"<env>\nPrimary working directory: {self.workspace}\n</env>"
        deferred = "<available-deferred-tools>\nmcp__demo__echo\n</available-deferred-tools>"
        messages: list[Any] = [
            {
                "role": "user",
                "content": [{"type": "text", "text": deferred}, {"type": "text", "text": prompt}],
            }
        ]
        for _ in range(rounds):
            with self.client.messages.stream(
                model="claude-x",
                max_tokens=1024,
                system=system,
                messages=messages,
                tools=self.tools,
            ) as stream:
                message = stream.get_final_message()
            messages.append(
                {
                    "role": "assistant",
                    "content": [b.model_dump(exclude_none=True) for b in message.content],
                }
            )
            if message.stop_reason != "tool_use":
                return "".join(b.text for b in message.content if b.type == "text")
            results = []
            for block in message.content:
                if block.type == "tool_use":
                    content, is_error = self.execute(block.name, dict(block.input))
                    results.append(
                        {
                            "type": "tool_result",
                            "tool_use_id": block.id,
                            "content": content,
                            "is_error": is_error,
                        }
                    )
            messages.append({"role": "user", "content": results})
        raise AssertionError("the scenario never ended the turn")


def test_claude_like_agent_plays_write_file(
    provider_factory: Callable[..., ProviderThread], tmp_path: Path
) -> None:
    provider = provider_factory(SCENARIOS / "write-file.yaml")
    final = ClaudeLikeAgent(provider.url, tmp_path).run("create hello.txt")
    assert (tmp_path / "hello.txt").read_text() == "hi\n"
    assert final == "Created hello.txt containing 'hi'."
    records = [r for r in provider.records if r.endpoint == "messages"]
    assert [(r.turn, r.kind, r.status, r.stream) for r in records] == [
        (0, "reply", 200, True),
        (1, "reply", 200, True),
    ]
    assert records[0].path.startswith("/routes/anthropic/v1/messages")


def test_claude_like_agent_takes_the_else_branch(
    provider_factory: Callable[..., ProviderThread], tmp_path: Path
) -> None:
    (tmp_path / "hello.txt").mkdir()  # the redirection fails: "Is a directory"
    provider = provider_factory(SCENARIOS / "write-file.yaml")
    final = ClaudeLikeAgent(provider.url, tmp_path).run("create hello.txt")
    assert final == "The command failed; hello.txt was not created."


def test_claude_like_agent_plays_edit_and_mcp(
    provider_factory: Callable[..., ProviderThread], tmp_path: Path
) -> None:
    provider = provider_factory(SCENARIOS / "edit-and-mcp.yaml")
    final = ClaudeLikeAgent(provider.url, tmp_path).run("edit notes and echo")
    assert (tmp_path / "notes.md").read_text() == "# Notes\nstatus: final\n"
    assert final == "notes.md is final and the MCP echo answered."
    kinds = [(r.turn, r.kind) for r in provider.records if r.endpoint == "messages"]
    assert kinds == [
        (0, "reply"),
        (1, "reply"),
        (2, "reply"),
        (3, "prelude"),
        (3, "reply"),
        (4, "reply"),
    ]
    prelude = next(r for r in provider.records if r.kind == "prelude")
    assert prelude.reply["calls"] == [
        {"name": "ToolSearch", "arguments": {"query": "select:mcp__demo__echo"}}
    ]


# -- a Codex-shaped client -------------------------------------------------------------


def test_codex_like_agent_plays_write_file(
    provider_factory: Callable[..., ProviderThread], tmp_path: Path
) -> None:
    provider = provider_factory(load_scenario(SCENARIOS / "write-file.yaml"))
    client = _openai(provider.url)
    tools: list[Any] = [{"type": "function", "name": "exec_command", "parameters": _schema("cmd")}]
    items: list[Any] = [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": f"<cwd>{tmp_path}</cwd>"}],
        },
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "create hello.txt"}],
        },
    ]
    final = None
    for _ in range(5):
        with client.responses.stream(model="gpt-x", input=items, tools=tools) as stream:
            response = stream.get_final_response()
        calls = [i for i in response.output if i.type == "function_call"]
        if not calls:
            final = response.output_text
            break
        for call in calls:
            cmd = json.loads(call.arguments)["cmd"]
            proc = subprocess.run(
                ["bash", "-c", cmd],
                check=False,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=10,
            )
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
            output = f"Process exited with code {proc.returncode}\nOutput:\n{proc.stdout}"
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": output}
            )
    assert (tmp_path / "hello.txt").read_text() == "hi\n"
    assert final == "Created hello.txt containing 'hi'."


def test_write_file_shell_fallback_writes_exact_bytes(
    provider_factory: Callable[..., ProviderThread], tmp_path: Path
) -> None:
    content = "line 1\n'quoted' $HOME `x` \\n\n\nno newline at end"
    scenario = parse_scenario(
        json.dumps(
            {"turns": [{"calls": [{"write_file": {"path": "d/e/f.txt", "content": content}}]}]}
        )
    )
    provider = provider_factory(scenario)
    tools: list[Any] = [{"type": "function", "name": "exec_command", "parameters": _schema("cmd")}]
    response = _openai(provider.url).responses.create(
        model="m",
        input="go",
        tools=tools,
    )
    call = response.output[0]
    assert call.type == "function_call"
    cmd = json.loads(call.arguments)["cmd"]
    subprocess.run(["bash", "-c", cmd], cwd=tmp_path, check=True, timeout=10)
    assert (tmp_path / "d/e/f.txt").read_text() == content


# -- endpoints -------------------------------------------------------------------------


def test_health_and_model_endpoints(provider_factory: Callable[..., ProviderThread]) -> None:
    provider = provider_factory(SCENARIOS / "write-file.yaml")
    with httpx2.Client(base_url=provider.url, timeout=5) as http:
        assert http.head("/").status_code == 200
        assert http.head("/routes/anthropic/").status_code == 200
        assert http.get("/api/hello").status_code == 200
        assert http.get("/routes/anthropic/api/hello").status_code == 200
        assert http.get("/v1beta/models").json()["models"][0]["name"] == "models/mock-model"
        missing = http.post("/v2/nothing", json={})
        assert missing.status_code == 404
        bad = http.post("/v1/messages", content=b"{not json")
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
        tokens = http.post("/v1/messages/count_tokens", json={"model": "m", "messages": []})
        assert tokens.json()["input_tokens"] >= 1
        gemini_tokens = http.post("/v1beta/models/g:countTokens", json={"contents": []})
        assert gemini_tokens.json()["totalTokens"] >= 1
    assert [m.id for m in _anthropic(provider.url).models.list()] == ["mock-model"]
    assert [m.id for m in _openai(provider.url).models.list()] == ["mock-model"]
    assert {r.kind for r in provider.records} >= {"meta", "bad_request"}


def test_gemini_endpoints(provider_factory: Callable[..., ProviderThread]) -> None:
    provider = provider_factory(SCENARIOS / "write-file.yaml")
    body = {
        "contents": [{"role": "user", "parts": [{"text": "make hello"}]}],
        "tools": [
            {
                "functionDeclarations": [
                    {"name": "run_shell_command", "parameters": _schema("command")}
                ]
            }
        ],
    }
    base = "/v1beta/models/gemini-x"
    with httpx2.Client(base_url=provider.url, timeout=5) as http:
        plain = http.post(f"{base}:generateContent", json=body).json()
        parts = plain["candidates"][0]["content"]["parts"]
        assert parts[1] == {
            "functionCall": {
                "name": "run_shell_command",
                "args": {"command": "echo hi > hello.txt"},
            }
        }
        sse = http.post(f"{base}:streamGenerateContent", params={"alt": "sse"}, json=body)
        assert sse.headers["content-type"].startswith("text/event-stream")
        chunks = [
            json.loads(line[6:]) for line in sse.text.splitlines() if line.startswith("data: ")
        ]
        assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
        assert chunks[-1]["modelVersion"] == "gemini-x"
        array = http.post(f"{base}:streamGenerateContent", json=body).json()
        assert isinstance(array, list) and array[-1]["usageMetadata"]["totalTokenCount"] > 0


def test_async_api(tmp_path: Path) -> None:
    async def main() -> list[ExchangeRecord]:
        async with serve_provider(
            SCENARIOS / "write-file.yaml", transcript=tmp_path / "t.jsonl"
        ) as server:
            assert server.url.startswith("http://127.0.0.1:") and server.port > 0
            async with httpx2.AsyncClient(base_url=server.url) as http:
                reply = await http.post(
                    "/v1/chat/completions",
                    json={
                        "model": "m",
                        "messages": [{"role": "user", "content": "x"}],
                        "tools": [
                            {
                                "type": "function",
                                "function": {"name": "bash", "parameters": _schema("command")},
                            }
                        ],
                    },
                )
            assert reply.json()["choices"][0]["finish_reason"] == "tool_calls"
            return list(server.records)

    records = asyncio.run(main())
    assert [r.endpoint for r in records] == ["chat.completions"]
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert [json.loads(line)["endpoint"] for line in lines] == ["chat.completions"]


# -- faults ----------------------------------------------------------------------------

USER: list[Any] = [{"role": "user", "content": "hi"}]


def test_failing_provider_surfaces_529(provider_factory: Callable[..., ProviderThread]) -> None:
    provider = provider_factory(SCENARIOS / "failing-provider.yaml")
    with pytest.raises(anthropic.APIStatusError) as info:
        _anthropic(provider.url).messages.create(model="m", max_tokens=8, messages=USER)
    assert info.value.status_code == 529
    assert (
        isinstance(info.value.body, dict) and info.value.body["error"]["type"] == "overloaded_error"
    )
    assert provider.records[-1].kind == "fault" and provider.records[-1].status == 529


def test_500_fault_for_openai_with_default_envelope(
    provider_factory: Callable[..., ProviderThread],
) -> None:
    provider = provider_factory(parse_scenario("fault: {status: 500}\nturns: [{say: x}]"))
    with pytest.raises(openai.InternalServerError, match="injected fault"):
        _openai(provider.url).chat.completions.create(model="m", messages=USER)


def test_fault_on_first_attempt_only_lets_the_retry_succeed(
    provider_factory: Callable[..., ProviderThread],
) -> None:
    provider = provider_factory(
        parse_scenario("turns: [{say: recovered, fault: {status: 529, attempts: 1}}]")
    )
    message = _anthropic(provider.url, max_retries=1).messages.create(
        model="m", max_tokens=8, messages=USER
    )
    assert message.content[0].type == "text" and message.content[0].text == "recovered"
    assert [(r.attempt, r.status) for r in provider.records] == [(1, 529), (2, 200)]


def test_truncated_stream_makes_the_sdks_raise(
    provider_factory: Callable[..., ProviderThread],
) -> None:
    provider = provider_factory(
        parse_scenario(
            "fault: {truncate_after: 4}\nturns: [{say: 'a long reply that never finishes'}]"
        )
    )
    with (
        pytest.raises((anthropic.APIError, httpx2.HTTPError)),
        _anthropic(provider.url).messages.stream(model="m", max_tokens=8, messages=USER) as stream,
    ):
        stream.get_final_message()
    with pytest.raises((openai.APIError, httpx2.HTTPError)):
        list(_openai(provider.url).chat.completions.create(model="m", messages=USER, stream=True))
    with pytest.raises((openai.APIError, httpx2.HTTPError)):
        _openai(provider.url).chat.completions.create(
            model="m", messages=USER
        )  # non-streaming: body cut
    assert all(r.fault == {"truncate_after": 4} for r in provider.records)


def test_malformed_chunk_over_the_wire(provider_factory: Callable[..., ProviderThread]) -> None:
    provider = provider_factory(parse_scenario("turns: [{say: hello, fault: {malformed_at: 0}}]"))
    with pytest.raises(ValueError):
        list(_openai(provider.url).chat.completions.create(model="m", messages=USER, stream=True))


def test_slow_stream_and_first_byte_delay(provider_factory: Callable[..., ProviderThread]) -> None:
    slow = provider_factory(parse_scenario("turns: [{say: 'abc', fault: {event_delay: 0.05}}]"))
    start = time.monotonic()
    events = list(
        _anthropic(slow.url).messages.create(model="m", max_tokens=8, messages=USER, stream=True)
    )
    assert time.monotonic() - start >= 0.05 * (len(events) - 1)
    late = provider_factory(parse_scenario("turns: [{say: late, fault: {first_byte_delay: 0.6}}]"))
    with pytest.raises(anthropic.APITimeoutError):
        _anthropic(late.url, timeout=0.2).messages.create(model="m", max_tokens=8, messages=USER)
    start = time.monotonic()
    _anthropic(late.url).messages.create(model="m", max_tokens=8, messages=USER)
    assert time.monotonic() - start >= 0.6


def test_exhausted_scenario_is_an_http_500(provider_factory: Callable[..., ProviderThread]) -> None:
    provider = provider_factory(parse_scenario("name: short\nturns: [{say: only}]"))
    history: list[Any] = [
        *USER,
        {"role": "assistant", "content": "only"},
        {"role": "user", "content": "again"},
    ]
    with pytest.raises(anthropic.InternalServerError) as info:
        _anthropic(provider.url).messages.create(model="m", max_tokens=8, messages=history)
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"] == {
        "type": "scenario_exhausted",
        "message": "scenario 'short' exhausted at turn 1: its script has 1 turn(s)"
        " and the client asked for another reply",
    }
    assert provider.records[-1].kind == "error" and provider.records[-1].turn == 1


# -- recording -------------------------------------------------------------------------


class Refusing:
    def on_exchange(self, record: ExchangeRecord) -> None:
        raise JournalError("journal is full")


def test_observer_failure_refuses_the_reply(
    provider_factory: Callable[..., ProviderThread],
) -> None:
    provider = provider_factory(SCENARIOS / "write-file.yaml", observers=[Refusing()])
    with pytest.raises(anthropic.InternalServerError, match="could not record"):
        _anthropic(provider.url).messages.create(
            model="m", max_tokens=8, messages=USER, tools=CLAUDE_TOOLS
        )


def test_transcript_file_has_one_line_per_exchange(
    provider_factory: Callable[..., ProviderThread], tmp_path: Path
) -> None:
    seen: list[ExchangeRecord] = []

    class Collect:
        def on_exchange(self, record: ExchangeRecord) -> None:
            seen.append(record)

    transcript = tmp_path / "transcript.jsonl"
    provider = provider_factory(
        SCENARIOS / "write-file.yaml", transcript=transcript, observers=[Collect()]
    )
    ClaudeLikeAgent(provider.url, tmp_path).run("go")
    rows = [json.loads(line) for line in transcript.read_text().splitlines()]
    assert len(rows) == len(seen) == 2
    assert rows[0]["label"] == "write hello.txt"
    assert rows[0]["reply"]["calls"] == [
        {"name": "Bash", "arguments": {"command": "echo hi > hello.txt"}}
    ]
    assert rows[1]["reply"] == {"text": "Created hello.txt containing 'hi'."}
    assert set(rows[0]) >= {"time", "endpoint", "model", "turn", "reply", "status", "kind"}


def test_a_defect_in_the_core_is_a_recorded_500(
    provider_factory: Callable[..., ProviderThread], monkeypatch: pytest.MonkeyPatch
) -> None:
    import corral.provider.server as server_module

    def broken(*args: object) -> None:
        raise RuntimeError("engine bug")

    monkeypatch.setattr(server_module, "decide", broken)
    provider = provider_factory(SCENARIOS / "write-file.yaml")
    with pytest.raises(anthropic.InternalServerError, match="engine bug"):
        _anthropic(provider.url).messages.create(model="m", max_tokens=8, messages=USER)
    assert provider.records[-1].kind == "error" and provider.records[-1].status == 500


def test_port_in_use_is_a_provider_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        provider = ProviderThread(SCENARIOS / "write-file.yaml", port=port)
        with pytest.raises(ProviderError, match="cannot listen"):
            provider.start()
        provider.stop()


# -- CLI -------------------------------------------------------------------------------


def _read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    return proc.stdout.readline() if ready else ""


def test_cli_serve_and_stop(tmp_path: Path) -> None:
    transcript = tmp_path / "cli.jsonl"
    argv = [str(CORRAL), "provider", "serve", "--scenario", str(SCENARIOS / "write-file.yaml")]
    with subprocess.Popen(
        [*argv, "--transcript", str(transcript)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            line = _read_line(proc, 20)
            assert line.startswith("corral provider listening on http://127.0.0.1:"), line
            url = line.split()[-1]
            message = _anthropic(url).messages.create(
                model="m", max_tokens=8, messages=USER, tools=CLAUDE_TOOLS
            )
            assert message.stop_reason == "tool_use"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert json.loads(transcript.read_text().splitlines()[0])["turn"] == 0


def test_cli_rejects_an_invalid_scenario(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("turns:\n  - say: hi\n    calls: [{shell: ls, tool: Bash}]\n")
    for args in (["check", str(bad)], ["serve", "--scenario", str(bad)]):
        proc = subprocess.run(
            [str(CORRAL), "provider", *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert proc.returncode == 2
        assert f"{bad}:3:" in proc.stderr and "turns[0].calls[0]" in proc.stderr
