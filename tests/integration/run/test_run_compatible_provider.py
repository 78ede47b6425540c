"""`corral run` with a mission whose provider is a local server corral did not write.

The mission has no scenario: `provider = "anthropic-compatible:URL"` and
`provider_key = "env:NAME"`. The real Claude Code CLI, driven by the test's own
server (tests/integration/agents/compat_server.py), writes the file the check
wants; the server received the key as `x-api-key`; the key is nowhere in the
run directory (workspace, transcripts, journal, state, run.json, report).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from corral.agents.install import executable_path
from corral.agents.registry import ADAPTERS
from corral.run.agent_port import tools_dir
from tests.integration.agents.compat_server import Upstream, serving
from tests.integration.run.helpers import corral, env_with, journal_ok, new_id

pytestmark = [pytest.mark.requires_sandbox, pytest.mark.requires_npm, pytest.mark.timeout(90)]

MISSION = """+++
agent = "claude-code"
provider = "anthropic-compatible:URL"
provider_key = "env:LOCAL_MODEL_KEY"
max_sessions = 1
[session]
wall_time = "60s"
[[checks]]
name = "made"
run = "grep -qx made-by-agent made.txt"
timeout = "10s"
+++
Write made.txt.
"""


def test_mission_with_a_compatible_provider_passes_and_keeps_the_key(tmp_path: Path) -> None:
    if not executable_path(ADAPTERS["claude-code"], tools_dir()).exists():
        reason = "claude-code is not installed: run scripts/install-agents.sh claude-code"
        if os.environ.get("CORRAL_REQUIRE_ALL") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    key = "sk-local-" + secrets.token_hex(12)
    seen = Upstream()
    with serving() as start:
        port = start(seen)
        url = f"http://127.0.0.1:{port}/v1"
        (tmp_path / "MISSION.md").write_text(MISSION.replace("URL", url), encoding="utf-8")
        rid = new_id()
        proc = corral(
            "run",
            "MISSION.md",
            "--plain",
            "--id",
            rid,
            "--runs-dir",
            str(tmp_path / "runs"),
            cwd=tmp_path,
            timeout=80,
            env=env_with(LOCAL_MODEL_KEY=key),
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = tmp_path / "runs" / rid
    assert (run_dir / "workspace" / "made.txt").read_text(encoding="utf-8") == "made-by-agent\n"
    calls = [h for h, p in zip(seen.headers, seen.paths, strict=True) if p == "POST /v1/messages"]
    assert calls and all(h.get("x-api-key") == key for h in calls)
    seen_txt = (run_dir / "workspace" / "seen.txt").read_text(encoding="utf-8", errors="replace")
    assert "PATH=" in seen_txt
    for path in (p for p in run_dir.rglob("*") if p.is_file()):
        assert key.encode() not in path.read_bytes(), path
    assert key not in proc.stdout + proc.stderr
    assert journal_ok(run_dir / "journal.sqlite")
