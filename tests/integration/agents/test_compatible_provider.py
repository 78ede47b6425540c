"""Real agent CLIs against a provider corral did not write: a minimal server in this test.

The server (`compat_server.py`) speaks just enough Anthropic Messages and
OpenAI Responses to make the agent's own shell tool write a file and dump what
the sandbox can see (environment, CLI config files, every process's argv). The
assertions are host-side: the file is in the workspace, the server received
the key in the provider's header, and the key is nowhere the sandbox or its
records reach (workspace, transcripts, journal, launch script, routes).

`test_real_anthropic_offline` is the real-provider path: `--provider
anthropic` as a user runs it, with `https://api.anthropic.com` resolved by the
broker (a host-side test hook) to a local HTTPS server whose certificate a
CA made here signs.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.agents.codex import SYNTHETIC_MODEL
from corral.agents.routes import ProviderChoice, UpstreamOverride, parse_provider
from corral.run.agent_run import AgentRun, run_agent

from .compat_server import Starter, Upstream, serving
from .conftest import require_cli

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_npm, pytest.mark.slow]


@pytest.fixture
def serve() -> Iterator[Starter]:
    with serving() as start:
        yield start


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
    serve: Starter, workspace: Path, state: Path
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
    serve: Starter, workspace: Path, state: Path, tmp_path: Path
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


def test_real_anthropic_offline(
    serve: Starter, workspace: Path, state: Path, tmp_path: Path
) -> None:
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


def test_real_anthropic_offline_refuses_an_upstream_it_cannot_verify(
    serve: Starter, workspace: Path, state: Path, tmp_path: Path
) -> None:
    """Control for the test above: without the test CA the broker's TLS check refuses it."""
    key = "sk-ant-api03-" + secrets.token_hex(16)
    octets = (secrets.randbelow(200) + 20, secrets.randbelow(250) + 1, secrets.randbelow(250) + 1)
    address = "127.{}.{}.{}".format(*octets)
    _, ctx = _test_ca(tmp_path, "api.anthropic.com", address)
    seen = Upstream()
    serve(seen, host=address, port=443, ctx=ctx)
    env = {**os.environ, "ANTHROPIC_API_KEY": key}
    run = _run(
        "claude-code",
        parse_provider("anthropic"),
        workspace,
        state,
        env,
        upstream=UpstreamOverride(address, None),
    )
    assert run.result.status == "failed", run.result
    assert not (workspace / "made.txt").exists()
    # The handshake failed before any request: the key never left the broker.
    assert seen.paths == []
