"""run_agent refuses bad sessions before starting anything."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from corral.agents.runner import run_agent
from corral.errors import AgentError, UsageError

SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "write-file.yaml"


def test_state_dir_inside_the_workspace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="inside the workspace"):
        run_agent(
            "claude-code",
            "x",
            workspace=tmp_path,
            provider=f"synthetic:{SCENARIO}",
            state_dir=tmp_path / ".corral",
        )
    assert not (tmp_path / ".corral").exists()


def test_real_provider_needs_the_sandbox_and_the_key(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    with pytest.raises(UsageError, match="ANTHROPIC_API_KEY"):
        run_agent("claude-code", "x", workspace=tmp_path, provider="anthropic", environ=env)
    with pytest.raises(UsageError, match="only used inside corral"):
        run_agent(
            "claude-code",
            "x",
            workspace=tmp_path,
            provider="anthropic",
            sandbox=False,
            environ={**env, "ANTHROPIC_API_KEY": "sk-x"},
        )
    with pytest.raises(UsageError, match="use --provider openai"):
        run_agent("codex", "x", workspace=tmp_path, provider="anthropic")


def test_missing_cli_is_named(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(AgentError, match=r"install-agents\.sh codex"):
        run_agent(
            "codex",
            "x",
            workspace=ws,
            provider=f"synthetic:{SCENARIO}",
            tools_dir=tmp_path / "no-tools",
            state_dir=tmp_path / "state",
        )
