"""Real agent CLIs against a provider corral did not write: a minimal server in this test.

The server speaks just enough Anthropic Messages (streaming SSE, as Claude
Code asks for) and OpenAI Responses (SSE, as Codex asks for): its first reply
makes the agent's own shell tool write a file and dump what the sandbox can
see (environment, CLI config files); its second reply ends the turn. The
assertions are host-side: the file is in the workspace, the server received
the key in the provider's header, and the key is nowhere the sandbox or its
records reach (workspace, transcripts, journal, launch script, routes).

`test_real_anthropic_offline` is the real-provider path: `--provider
anthropic` as a user runs it, with `https://api.anthropic.com` resolved by the
broker (a host-side test hook) to a local HTTPS server whose certificate a
CA made here signs.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import secrets
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from corral.agents.codex import SYNTHETIC_MODEL
from corral.agents.routes import ProviderChoice, UpstreamOverride, parse_provider
from corral.run.agent_run import AgentRun, run_agent

from .conftest import require_cli

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_npm, pytest.mark.slow]

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


@pytest.fixture
def serve() -> Iterator[Any]:
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

    yield start
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def _records(run: AgentRun, workspace: Path) -> list[Path]:
    """Every file the sandbox wrote or corral recorded about it."""
    out = [p for p in workspace.rglob("*") if p.is_file()]
    out += [p for p in run.state_dir.rglob("*") if p.is_file()]
    return out


def _assert_key_confined(run: AgentRun, workspace: Path, key: str) -> None:
    seen = (workspace / "seen.txt").read_text(encoding="utf-8", errors="replace")
    assert "PATH=" in seen  # the dump really ran inside the sandbox
    for path in _records(run, workspace):
        data = path.read_bytes()
        assert key.encode() not in data, path
        assert key[8:].encode() not in data, path


def _run(
    agent: str,
    provider: ProviderChoice,
    workspace: Path,
    state: Path,
    environ: dict[str, str],
    **kw: Any,
) -> AgentRun:
    require_cli(agent)
    try:
        return run_agent(
            agent,
            "Do the task.",
            workspace=workspace,
            provider=provider,
            timeout_s=60,
            state_dir=state,
            environ=environ,
            **kw,
        )
    finally:
        # run_agent hands the broker its key through corral's own environment.
        for name in ("CORRAL_PROVIDER_KEY", "ANTHROPIC_API_KEY"):
            os.environ.pop(name, None)


def test_claude_code_on_an_anthropic_compatible_server(
    serve: Any, workspace: Path, state: Path
) -> None:
    key = "sk-local-" + secrets.token_hex(12)
    seen = Upstream()
    port = serve(seen)
    choice = parse_provider(f"anthropic-compatible:http://127.0.0.1:{port}", "env:LOCAL_LLM_KEY")
    env = {**os.environ, "LOCAL_LLM_KEY": key}
    run = _run("claude-code", choice, workspace, state, env)
    assert (workspace / "made.txt").read_text(encoding="utf-8") == "made-by-agent\n", run.result
    model_calls = [
        h for h, p in zip(seen.headers, seen.paths, strict=True) if p.endswith("/v1/messages")
    ]
    assert model_calls and all(h.get("x-api-key") == key for h in model_calls)
    assert all("authorization" not in h for h in seen.headers)
    _assert_key_confined(run, workspace, key)


def test_codex_on_an_openai_compatible_server(
    serve: Any, workspace: Path, state: Path, tmp_path: Path
) -> None:
    key = "sk-local-" + secrets.token_hex(12)
    key_file = tmp_path / "key"
    key_file.write_text(key + "\n", encoding="utf-8")
    seen = Upstream()
    port = serve(seen)
    # Written the way OpenAI-compatible servers document it, with /v1.
    choice = parse_provider(f"openai-compatible:http://127.0.0.1:{port}/v1", f"file:{key_file}")
    run = _run("codex", choice, workspace, state, dict(os.environ), model=SYNTHETIC_MODEL)
    assert (workspace / "made.txt").read_text(encoding="utf-8") == "made-by-agent\n", (
        run.result,
        seen.paths,
    )
    calls = [h for h, p in zip(seen.headers, seen.paths, strict=True) if p == "POST /v1/responses"]
    assert calls and all(h.get("authorization") == f"Bearer {key}" for h in calls)
    _assert_key_confined(run, workspace, key)


def _test_ca(tmp_path: Path, name: str, address: str) -> tuple[Path, ssl.SSLContext]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "corral test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(leaf_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName(name), x509.IPAddress(ipaddress.ip_address(address))]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = tmp_path / "ca.pem"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    chain = tmp_path / "leaf.pem"
    chain.write_bytes(
        leaf.public_bytes(serialization.Encoding.PEM)
        + leaf_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(chain)
    return ca_pem, ctx


def test_real_anthropic_offline(serve: Any, workspace: Path, state: Path, tmp_path: Path) -> None:
    key = "sk-ant-api03-" + secrets.token_hex(16)
    # A loopback address of its own, so port 443 is this test's alone.
    octets = (secrets.randbelow(200) + 20, secrets.randbelow(250) + 1, secrets.randbelow(250) + 1)
    address = "127.{}.{}.{}".format(*octets)
    ca_pem, ctx = _test_ca(tmp_path, "api.anthropic.com", address)
    seen = Upstream()
    serve(seen, host=address, port=443, ctx=ctx)
    env = {**os.environ, "ANTHROPIC_API_KEY": key}
    run = _run(
        "claude-code",
        parse_provider("anthropic"),
        workspace,
        state,
        env,
        upstream=UpstreamOverride(address, str(ca_pem)),
    )
    assert (workspace / "made.txt").read_text(encoding="utf-8") == "made-by-agent\n", (
        run.result,
        seen.paths,
    )
    calls = [h for h, p in zip(seen.headers, seen.paths, strict=True) if p.endswith("/v1/messages")]
    assert calls and all(h.get("x-api-key") == key for h in calls)
    assert all(h.get("host", "").startswith("api.anthropic.com") for h in calls)
    _assert_key_confined(run, workspace, key)
    routes = json.loads((run.state_dir / "routes.json").read_text(encoding="utf-8"))
    assert routes["routes"]["anthropic"]["upstream"] == "https://api.anthropic.com"
