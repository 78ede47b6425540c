"""Fixtures for agent tests: installed CLIs, an MCP policy with the demo server, journals."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from corral.agents import demo_mcp
from corral.agents.install import default_tools_dir, executable_path
from corral.agents.registry import get_adapter
from corral.broker.journal import JournalRow, read_rows
from corral.broker.mcp_policy import McpPolicy, parse_mcp_policy

SCENARIOS = Path(__file__).parent / "scenarios"
REPO_SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


def require_cli(name: str) -> None:
    """Skip (or fail under CORRAL_REQUIRE_ALL=1) when the pinned CLI is not installed."""
    adapter = get_adapter(name)
    if executable_path(adapter, default_tools_dir()).exists():
        return
    reason = f"{name} is not installed (scripts/install-agents.sh {name})"
    if os.environ.get("CORRAL_REQUIRE_ALL") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def state(tmp_path: Path) -> Path:
    return tmp_path / "state"


@pytest.fixture
def mcp_workspace(tmp_path: Path) -> Path:
    path = tmp_path / "mcp-ws"
    path.mkdir()
    return path


@pytest.fixture
def demo_policy(mcp_workspace: Path) -> McpPolicy:
    """The demo MCP server (stdlib only), `shred` denied, marker names restricted."""
    return parse_mcp_policy(
        {
            "servers": {
                "demo": {
                    "command": ["python3", demo_mcp.PATH],
                    "ro": [str(Path(demo_mcp.PATH).parent)],
                    "workspace": str(mcp_workspace),
                    "deny_tools": ["shred"],
                    "arguments": {"write_marker": {"name": {"allow": "^[a-z0-9-]{1,32}$"}}},
                }
            }
        }
    )


def rows(journal: Path) -> list[JournalRow]:
    return read_rows(journal)


def transcript(state_dir: Path) -> list[dict[str, object]]:
    """The synthetic provider's exchanges (one per request it received)."""
    path = state_dir / "provider.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


Check = Callable[[Path], None]
