"""The MCP gateway refuses an oversized JSON-RPC body with 413, journaled, before reading it.

Measured host-side: the journal row, and that the call never reached the
server (its call log is untouched).
"""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from corral.broker.actions import Identity
from corral.broker.journal import Journal, read_rows
from corral.broker.mcp_gateway import MCP_BODY_LIMIT, McpGateway
from corral.broker.mcp_policy import McpPolicy

pytestmark = pytest.mark.timeout(60)


def _post(url: str, body: bytes, chunked: bool) -> int:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=30)
    headers = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    try:
        if chunked:
            chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))
            conn.request("POST", parts.path, body=chunks, headers=headers, encode_chunked=True)
        else:
            conn.request("POST", parts.path, body=body, headers=headers)
        return conn.getresponse().status
    except (ConnectionResetError, BrokenPipeError):
        return -1
    finally:
        conn.close()


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_oversized_mcp_body_is_refused_413_and_journaled(
    demo_policy: McpPolicy, mcp_workspace: Path, tmp_path: Path, chunked: bool
) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "write_marker", "arguments": {"name": "x" * MCP_BODY_LIMIT}},
    }
    journal_path = tmp_path / "journal.sqlite"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    with Journal(journal_path) as journal:
        gateway = McpGateway(
            demo_policy, journal, Identity(run="r1", session="s1", env="agent"), scratch=scratch
        )
        gateway.start()
        try:
            status = _post(gateway.url_for("demo"), json.dumps(call).encode(), chunked)
        finally:
            gateway.close()
    assert status == 413
    rows = [r for r in read_rows(journal_path) if r.kind == "mcp_call"]
    assert [(r.target, r.decision, r.rule) for r in rows] == [("demo/-", "deny", "body-limit")]
    assert not (mcp_workspace / "calls.log").exists()
